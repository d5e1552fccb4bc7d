"""The ``moesim`` command: a thin Click layer over the library API.

Commands live one per module and load lazily, so ``moesim --help`` and simple
commands start without importing numba. Every command module defines a Click
command (or group) named ``command``. Errors a user can cause surface as one
line on stderr and exit code 2; never a traceback.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import click

from moesim import __version__
from moesim.errors import MoesimError

# name -> (module, one-line help shown in `moesim --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("moesim.cli.info", "Describe a trace: model, geometry, tokens, layout, provenance."),
    "validate": ("moesim.cli.info", "Read a whole trace and check every row."),
    "profile": ("moesim.cli.profile", "Routing statistics: reuse, working set, domains, gate weights."),
    "coupling": ("moesim.cli.coupling", "How well one MoE layer's experts predict the next layer's (prefetching)."),
    "synth": ("moesim.cli.synth", "Write a synthetic trace with a real model's geometry."),
    "compact": ("moesim.cli.compact", "Rewrite a trace in the compact ranked layout (same replays, fewer bytes)."),
    "import": ("moesim.cli.importers", "Convert other tools' routing traces to moesim traces."),
    "policies": ("moesim.cli.policies", "List the eviction and miss policies the replay knows."),
    "simulate": ("moesim.cli.simulate", "Replay a trace through one cache policy."),
    "sweep": ("moesim.cli.sweep", "Rank a grid of cache policies on a trace: parallel, resumable, paper tables."),
    "mrc": ("moesim.cli.mrc", "Hit rate at every cache size (LRU in one pass; other policies on a grid)."),
    "trace": ("moesim.cli.trace", "Record router logits from a real model (transformers or llama.cpp)."),
    "export": ("moesim.cli.export", "Write a static placement as llama.cpp flags, a pin list or JSON."),
    "verify": ("moesim.cli.verify", "Replay an engine's cache policy on its trace; predicted vs realized hit rate."),
    "hw": ("moesim.cli.hw", "Hardware presets: list, show (with defaults and their basis), probe this machine."),
    "calibrate": ("moesim.cli.calibrate", "Fit a machine file's rates to measured runs (llama-bench or CSV)."),
    "models": ("moesim.cli.models", "Model presets: geometry, parameters, bytes per expert and per token."),
    "estimate": ("moesim.cli.estimate", "Analytic seconds per token for a model on a machine, no trace needed."),
    "emulate": ("moesim.cli.emulate", "Run a model under a cache policy and measure the perplexity it costs."),
    "report": ("moesim.cli.report", "HTML report, PNG/SVG charts and paper tables from a sweep or a trace."),
}


class MoesimGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        cmd = getattr(module, "commands", {}).get(name) or module.command
        return cmd

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        from moesim.files import tracking_inputs

        try:
            # Python warnings (a library's) are held back: after an error only its one line is printed; after
            # success each distinct warning is one line too
            with tracking_inputs(), warnings.catch_warnings(record=True) as caught:
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            _warnings(caught)
        except MoesimError as exc:
            _fail(str(exc), 2)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _fail(" ".join(exc.format_message().split()) + hint, 2)
        except click.ClickException as exc:
            _fail(" ".join(exc.format_message().split()), exc.exit_code)
        except RecursionError:
            # a parser that recursed on absurdly nested input; the importers catch their own
            _fail("input nested too deeply to read", 2)
        except (click.Abort, KeyboardInterrupt):
            _fail("interrupted", 130)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(1)
        except Exception as exc:
            # an OS error no writer or reader turned into a MoesimError (a full disk deep inside a
            # library, a vanished file): still one line. Anything else is a bug: its traceback helps.
            from moesim.files import os_errno, os_error_message

            if os_errno(exc) is None:
                raise
            where = getattr(exc, "filename", None)
            _fail((f"{where}: " if where else "") + os_error_message(exc), 2)
        sys.exit(rv if isinstance(rv, int) else 0)


def _warnings(caught) -> None:
    from moesim.textsafe import term

    for text in dict.fromkeys(f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught):
        click.echo(f"moesim: warning: {term(text)}", err=True)


def _fail(message: str, code: int):
    from moesim.textsafe import term

    click.echo(f"moesim: error: {term(message)}", err=True)
    sys.exit(code)


@click.group(cls=MoesimGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="moesim")
def cli():
    """moesim: replay MoE router traces through simulated expert caches.

    Which expert-caching policy should an offloading engine run, for this
    model, this GPU and this much VRAM? moesim answers from recorded router
    logits in seconds.
    """


def main():
    cli.main(prog_name="moesim")
