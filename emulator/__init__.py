"""The emulator: the model's exact outputs under a cache policy, and the perplexity they give.

Data flow: model -> emulator -> quality results -> sweep / report. Each MoE layer's router
output for every token of a run goes through the replay's state machine (the same semantics as
``moesim simulate``, untimed: fetch latency idealized); a substituted expert runs in place of the
missed one with the missed one's gate weight, a dropped one contributes nothing. The replay is
called from one place, ``emulator.policy``. See docs/emulator.md.
"""

__all__ = ["Emulator", "EmulationSetup", "PolicyRun", "emulate", "load_emulator"]


def __getattr__(name):
    # lazily: reading quality results (emulator.quality, by the sweep and the report) must not load the run module
    if name in __all__:
        from moesim.emulator import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
