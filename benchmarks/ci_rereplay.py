"""How much does it matter that --ci re-weights the units of one replay instead of replaying them?

The bootstrap of moesim's --ci (docs/uncertainty.md) takes each unit's counts from a replay of the trace,
so every unit keeps the cache state it was counted with: after the units before it (--ci-method single),
or after half the trace with the cold start as a fixed offset (--ci-method rotated, the default). This
script measures what that costs on a trace, for a few policies at one budget:

- orders: the trace replayed with its units in every order (all of them for up to 5 units, else --orders
  random ones). The tokens are the same, so any spread comes from the cache state alone;
- re-replay bootstrap: resample b draws the same units as --ci's resample b (same seed, same draws) and
  *replays* them concatenated in draw order; its percentile interval against --ci's from the same draws,
  and the mean |difference| between the two values of each resample.

    python benchmarks/ci_rereplay.py traces/qwen3next.parquet --budget 0.25 --resamples 200
    python benchmarks/ci_rereplay.py traces/qwen3next.parquet --unit block

Prints one line per (policy, statistic): the full-trace value, the range over orders, the intervals of
the two --ci methods and of the re-replay bootstrap, and each method's mean |difference| from the
re-replayed resamples.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

import moesim
from moesim.costmodel.pricing import price_trace
from moesim.simulator import SimConfig, simulate
from moesim.simulator.bootstrap import CI, SEED, percentile_interval, resampled_sums
from moesim.simulator.rotation import warm_unit_sums
from moesim.simulator.units import replay_statistics, replay_units
from moesim.traces.routing import Routing

POLICIES = {
    "fetch-all preset (lru / fetch-all)": dict(eviction="lru", miss="fetch-all"),
    "quality-first (freq / threshold:0.15 / admit 0.5)": dict(eviction="freq", miss="threshold:0.15", admit=0.5),
    "speed-first (freq / first-choice / admit 0.5)": dict(eviction="freq", miss="first-choice", admit=0.5),
    "static / first-choice": dict(eviction="static", miss="first-choice"),
}
STATS = {"hit_rate": ("hit %", 100.0), "mass_per_step": ("mass/step", 1.0), "s_per_token": ("ms/token", 1e3)}


def subset(r: Routing, pieces: list[np.ndarray], tag: str) -> Routing:
    """The tokens of ``pieces`` (index arrays) back to back, each piece its own sequence."""
    idx = np.concatenate(pieces)
    seq = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(pieces)])
    return Routing(meta=r.meta, seq=seq, pos=r.pos[idx], phase=r.phase[idx], domain=r.domain[idx],
                   domain_names=r.domain_names, token=None, sel=np.ascontiguousarray(r.sel[idx]),
                   w=np.ascontiguousarray(r.w[idx]), cand=np.ascontiguousarray(r.cand[idx]), digest=f"{r.digest}:{tag}")


def stats(res) -> dict[str, float]:
    t = res.totals()
    return {"hit_rate": t["hit_rate"], "mass_per_step": t["mass_per_step"], "s_per_token": res.timing["s_per_token"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--level", type=float, default=95.0)
    ap.add_argument("--unit", choices=["auto", "sequence", "block"], default="auto")
    ap.add_argument("--orders", type=int, default=24, help="random orders when the trace has more than 5 units")
    args = ap.parse_args()

    routing = moesim.load_trace(args.trace)
    ci = CI(args.level, args.resamples, args.unit)
    first = SimConfig(budget=args.budget)
    units = replay_units(routing, first, ci.unit)
    pieces = [np.flatnonzero(units.ids == u) for u in range(units.n)]
    cost, priced_as, _ = price_trace(routing.meta, cache_experts=first.slots_per_layer(routing.n_experts)
                                     * routing.n_layers)
    print(f"{args.trace}: {units.describe()}, budget {args.budget:g}, priced as {priced_as}; "
          f"{ci.level:g}% intervals from {ci.resamples} resamples (seed {SEED})")
    rng = np.random.default_rng(SEED)
    draws = [rng.integers(0, units.n, size=units.n) for _ in range(ci.resamples)]
    if units.n <= 5:
        orders = [list(p) for p in itertools.permutations(range(units.n))]
    else:
        order_rng = np.random.default_rng(SEED + 1)
        orders = [list(range(units.n))] + [list(order_rng.permutation(units.n)) for _ in range(args.orders - 1)]
    def span(iv, scale):
        return f"{scale * iv[0]:.4g}..{scale * iv[1]:.4g}"

    print(f"{'policy':<32} {'statistic':<9} {'value':>7} {'orders':>16} {'--ci single':>16} {'--ci rotated':>16} "
          f"{'re-replayed':>16} {'|diff| single':>13} {'|diff| rotated':>14}")
    t0 = time.perf_counter()
    for name, kw in POLICIES.items():
        config = SimConfig(budget=args.budget, **kw)
        res = simulate(routing, config, cost=cost)
        full = stats(res)
        reps = {}
        for method in ("single", "rotated"):
            sums, offset, _ = warm_unit_sums(routing, config, replay_units(routing, config, ci.unit), res, cost, method)
            reps[method] = replay_statistics(resampled_sums(sums, ci.resamples) + offset)
        by_order = [stats(simulate(subset(routing, [pieces[u] for u in o], f"order{i}"), config, cost=cost))
                    for i, o in enumerate(orders)]
        again = [stats(simulate(subset(routing, [pieces[u] for u in d], f"boot{b}"), config, cost=cost))
                 for b, d in enumerate(draws)]
        for key, (label, scale) in STATS.items():
            vals = np.array([x[key] for x in again])
            o = [x[key] for x in by_order]
            cells = [span(percentile_interval(reps[m][key], ci.level), scale) for m in ("single", "rotated")]
            diffs = [scale * float(np.mean(np.abs(vals - reps[m][key]))) for m in ("single", "rotated")]
            print(f"{name[:32]:<32} {label:<9} {scale * full[key]:7.4g} {span((min(o), max(o)), scale):>16} "
                  f"{cells[0]:>16} {cells[1]:>16} {span(percentile_interval(vals, ci.level), scale):>16} "
                  f"{diffs[0]:13.3g} {diffs[1]:14.3g}")
    print(f"({len(POLICIES) * (len(orders) + len(draws) + 2)} replays in {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
