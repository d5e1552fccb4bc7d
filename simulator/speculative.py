"""Speculative and multi-token-prediction decoding: a step verifies G drafted tokens plus one per sequence.

A verifying step runs the target model on G + 1 positions of each sequence at once, so each MoE layer reads the
union of their experts, exactly as a lock-step batch reads its members' (simulator/batch.py builds the union, ranks
it and sums the members' weights into the mass a substitution loses). Of the G drafted tokens a fraction A is
accepted on average: step s yields 1 + a_s tokens per sequence, a_s = floor((s + 1) A G) - floor(s A G) (the
accepted drafts spread evenly, so every run of steps yields 1 + A G tokens per step to within one), and the next step
starts right after the yielded tokens. The trace's own tokens stand for the drafts: a step reads the experts of the
G + 1 trace tokens from its start, those past the accepted ones are read again at the next step (rejected drafts are
re-verified there). A per-step acceptance from a trace column is not read (the trace format has none).

``simulate_speculative`` replays the union steps with the ordinary kernel and counts yielded tokens: seconds per
token = seconds / yielded tokens, and the gate mass is the sum over each union expert's members (from the decision
record)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from moesim.errors import MoesimError
from moesim.simulator.batch import _union, lock_step_members
from moesim.simulator.config import SimConfig
from moesim.traces.routing import Routing


def accepted_schedule(n_steps: int, drafted: int, accept: float) -> np.ndarray:
    """Drafted tokens accepted at each of ``n_steps`` steps: floor((s + 1) A G) - floor(s A G)."""
    s = np.arange(n_steps + 1, dtype=np.float64)
    cum = np.floor(s * accept * drafted + 1e-9).astype(np.int64)
    return np.diff(cum)


def check_speculative(drafted, accept) -> tuple[int, float]:
    if isinstance(drafted, bool) or not isinstance(drafted, (int, np.integer)) or drafted < 0:
        raise MoesimError(f"--speculative must be a whole number of drafted tokens >= 0 (got {drafted!r})")
    if accept is None:
        raise MoesimError("--speculative G needs --accept A, the fraction of drafted tokens accepted")
    a = float(accept)
    if not (math.isfinite(a) and 0.0 <= a <= 1.0):
        raise MoesimError(f"--accept must be a fraction in [0, 1] (got {accept!r})")
    return int(drafted), a


def speculative_members(seq: np.ndarray, drafted: int, accept: float, batch: int = 1
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(members [steps, batch x (G + 1)] token indices, -1 where none; each step's group; tokens each step yields).

    Sequences are grouped ``batch`` at a time in id order as lock_step_members groups them; every member sequence
    of a group verifies the G + 1 tokens from its cursor and advances by the step's yield (1 + accepted drafts),
    until every member has ended."""
    lock, groups = lock_step_members(seq, batch)  # [positions, batch]: the token index of each member's position
    width = drafted + 1
    rows, row_groups, yields = [], [], []
    for g in np.unique(groups):
        block = lock[groups == g]  # [n, batch]
        n = block.shape[0]
        lengths = (block >= 0).sum(axis=0)
        acc = accepted_schedule(n, drafted, accept)
        pos = 0
        s = 0
        while pos < n:
            row = np.full(batch * width, -1, np.int64)
            got = 0
            for j in range(batch):
                for i in range(width):
                    if pos + i < lengths[j]:
                        row[j * width + i] = block[pos + i, j]
                step = 1 + int(acc[s])
                got += max(0, min(step, int(lengths[j]) - pos))
            rows.append(row)
            row_groups.append(g)
            yields.append(got)
            pos += 1 + int(acc[s])
            s += 1
    return np.stack(rows), np.asarray(row_groups, np.int32), np.asarray(yields, np.int64)


def speculative_routing(routing: Routing, drafted: int, accept: float | None, batch: int = 1
                        ) -> tuple[Routing, np.ndarray, np.ndarray, np.ndarray]:
    """The union routing of speculative steps (G = ``drafted``, A = ``accept``, ``batch`` sequences in lock step),
    the gate mass per union expert (sum over its members), the member tokens [steps, batch x (G + 1)] and the tokens
    each step yields."""
    drafted, accept = check_speculative(drafted, accept)
    if batch < 1:
        raise MoesimError(f"batch must be >= 1, got {batch}")
    if batch > routing.n_sequences:
        raise MoesimError(f"batch {batch} needs at least {batch} sequences; the trace has {routing.n_sequences}")

    def union():
        members, group, yields = speculative_members(routing.seq, drafted, accept, batch)
        usel, uw, uwm, ucand = _union(routing.sel, routing.w, routing.cand, members, routing.n_experts)
        first = np.where(members >= 0, members, np.iinfo(np.int64).max).min(axis=1)
        phase = np.where(members >= 0, routing.phase[np.maximum(members, 0)], 1)
        decode = (phase == 1).all(axis=1).astype(np.int8)
        r = Routing(meta=routing.meta, seq=group, pos=routing.pos[first], phase=decode, domain=routing.domain[first],
                    domain_names=routing.domain_names, token=None, sel=usel, w=uw, cand=ucand,
                    digest=f"{routing.digest}:spec{drafted}:{accept:g}:batch{batch}", path=routing.path)
        return r, uwm, members, yields

    return routing.derived(("speculative", drafted, accept, batch), union)


def simulate_speculative(routing: Routing, config: SimConfig, drafted: int, accept: float | None, *, cost=None):
    """Replay ``config`` with speculative steps (each verifies G + 1 tokens per sequence of its batch); tokens per
    second count the yielded tokens. ``config.warmup_tokens`` counts tokens: the steps before the first one that
    verifies a token past them are warm-up. Returns the SimResult with ``extra["speculative"]``."""
    from moesim.policies.miss import OUTCOMES
    from moesim.simulator.driver import simulate

    spec, wm, members, yields = speculative_routing(routing, drafted, accept, config.batch)
    last = members.max(axis=1)
    warm_steps = int((last < config.warmup_tokens).sum())
    if warm_steps >= len(yields):
        raise MoesimError(f"warmup_tokens={config.warmup_tokens} leaves none of the trace's "
                          f"{routing.n_tokens} tokens to count")
    flat = dataclasses.replace(config, batch=1, warmup_tokens=warm_steps, speculative=0, accept=None)
    res = simulate(spec, flat, cost=cost, record=True)
    assert res.decisions is not None
    lost = np.isin(res.decisions.outcome, [OUTCOMES.index("substitute"), OUTCOMES.index("drop")])
    step_mass = np.where(lost, wm, 0.0).sum(axis=2)  # [steps, L]
    res.token_mass = step_mass.sum(axis=1)
    res.mass = step_mass[warm_steps:].sum(axis=0)
    res.step_members = yields
    res.counted_tokens = int(yields[warm_steps:].sum())
    res.config = config
    res.extra["speculative"] = {"drafted": drafted, "accept": accept, "steps": int(len(yields)),
                                "verified_per_seq": drafted + 1,
                                "tokens_per_step": float(yields[warm_steps:].sum() / (len(yields) - warm_steps))}
    if cost is not None:
        res.attach_timing(cost, ram_cap=res.timing["host_ram_tier_experts"] if res.timing else None)
    return res
