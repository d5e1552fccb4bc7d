"""Routing statistics of a decoded trace: temporal reuse, popularity, working set,
per-domain expert overlap and gate-weight spread. Exact definitions: docs/profile.md."""

from __future__ import annotations

import numpy as np

from moesim.traces.routing import Routing

WORKING_SET_SHARE = 0.95
GATE_THRESHOLD = 0.15
SIMILARITY_MEASURE = "weighted_jaccard"
MAX_DOMAINS = 24  # domains compared and charted by name (the rest: "other domains"), by tokens
# Steps per block when comparing consecutive selections: bounds the [n, L, k, k] temporary.
_PAIR_BLOCK = 4096


def expert_counts(sel: np.ndarray, n_experts: int) -> np.ndarray:
    """[L, E]: how many steps of each layer selected each expert."""
    T, L, k = sel.shape
    flat = (np.arange(L, dtype=np.int64)[None, :, None] * n_experts + sel.astype(np.int64)).reshape(-1)
    return np.bincount(flat, minlength=L * n_experts).reshape(L, n_experts)


def consecutive_pairs(seq: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Indices t such that tokens t and t+1 are positions p and p+1 of the same sequence."""
    seq, pos = np.asarray(seq), np.asarray(pos)
    return np.flatnonzero((seq[1:] == seq[:-1]) & (pos[1:] == pos[:-1].astype(np.int64) + 1))


def reuse_per_layer(sel: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """[L]: mean over consecutive pairs of |S_t ∩ S_t+1| / k (NaN when there are no pairs)."""
    T, L, k = sel.shape
    if len(pairs) == 0:
        return np.full(L, np.nan)
    shared = np.zeros(L, dtype=np.int64)
    for start in range(0, len(pairs), _PAIR_BLOCK):
        p = pairs[start:start + _PAIR_BLOCK]
        a, b = sel[p], sel[p + 1]
        # The k experts of a step are distinct, so counting equal (i, j) pairs counts the intersection.
        shared += (a[:, :, :, None] == b[:, :, None, :]).sum(axis=(0, 2, 3))
    return shared / (len(pairs) * k)


def shared_per_pair(sel: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """[pairs]: |S_t ∩ S_t+1| summed over layers, for each consecutive pair t."""
    out = np.zeros(len(pairs), dtype=np.int64)
    for start in range(0, len(pairs), _PAIR_BLOCK):
        p = pairs[start:start + _PAIR_BLOCK]
        out[start:start + len(p)] = (sel[p][:, :, :, None] == sel[p + 1][:, :, None, :]).sum(axis=(1, 2, 3))
    return out


def working_set(counts: np.ndarray, share: float = WORKING_SET_SHARE) -> np.ndarray:
    """[L]: the fewest experts whose requests cover >= share of the layer's requests."""
    srt = -np.sort(-counts, axis=1)
    cum = np.cumsum(srt, axis=1)
    total = cum[:, -1:]
    # Integer test where possible (share = 0.95 -> 20 * cum >= 19 * total), so no float rounding decides.
    num, den = _as_fraction(share)
    covered = cum * den >= total * num
    return covered.argmax(axis=1) + 1


def _as_fraction(x: float) -> tuple[int, int]:
    from fractions import Fraction

    f = Fraction(x).limit_denominator(10_000)
    return f.numerator, f.denominator


def top_domains(codes: np.ndarray, limit: int = MAX_DOMAINS) -> tuple[list[int], int]:
    """(domain codes present in ``codes``, at most ``limit``, the ones with the most tokens, in code order;
    how many domains are present in all)."""
    counts = np.bincount(codes[codes >= 0].astype(np.int64))
    present = np.flatnonzero(counts)
    if len(present) > limit:
        present = np.sort(present[np.argsort(-counts[present], kind="stable")[:limit]])
    return [int(c) for c in present], int(np.count_nonzero(counts))


def domain_similarity(r: Routing, limit: int = MAX_DOMAINS) -> dict:
    """Weighted Jaccard similarity of the domains' expert-request distributions, per layer, averaged over layers.

    For domains a, b and one layer, p_a(e) = share of domain a's requests in that layer that went to expert e;
    similarity = sum_e min(p_a, p_b) / sum_e max(p_a, p_b): 1 for identical use, 0 for disjoint expert sets.
    Only domains with at least one token appear; tokens without a domain are left out. A trace with more than
    ``limit`` domains (one per prompt, say) compares the ``limit`` with the most tokens; ``domains_total`` then
    says how many there are (the matrix costs D^2 x L x E, and no chart shows thousands of rows)."""
    codes = np.asarray(r.domain)
    present, total = top_domains(codes, limit)
    names = [r.domain_names[c] for c in present]
    if not present:
        return {"measure": SIMILARITY_MEASURE, "domains": [], "matrix": []}
    E = r.n_experts
    dist = np.stack([expert_counts(r.sel[codes == c], E).astype(np.float64) for c in present])  # [D, L, E]
    dist /= dist.sum(axis=2, keepdims=True)
    D = len(present)
    matrix = np.eye(D)
    for a in range(D):
        for b in range(a + 1, D):
            lo = np.minimum(dist[a], dist[b]).sum(axis=1)
            hi = np.maximum(dist[a], dist[b]).sum(axis=1)
            matrix[a, b] = matrix[b, a] = float(np.mean(lo / hi))
    out: dict[str, object] = {"measure": SIMILARITY_MEASURE, "domains": names, "matrix": matrix.tolist()}
    if total > len(present):
        out["domains_total"] = total
    return out


def gate_stats(w: np.ndarray) -> dict:
    w64 = np.asarray(w, dtype=np.float64)
    return {
        "mean_first_choice_weight": float(w64[:, :, 0].mean()),
        f"fraction_weight_ge_{GATE_THRESHOLD}": float((w64 >= GATE_THRESHOLD).mean()),
    }


def profile(routing: Routing, trace: str | None = None, ci=None) -> dict:
    """The routing profile of a decoded trace as a JSON-ready dict (keys: docs/profile.md); with ``ci``
    (a simulator.bootstrap.CI), the intervals of ``profile_intervals`` under the key ``ci``."""
    r = routing
    T, L, k = r.sel.shape
    E = r.n_experts
    counts = expert_counts(r.sel, E)
    pairs = consecutive_pairs(r.seq, r.pos)
    reuse = reuse_per_layer(r.sel, pairs)
    path = trace if trace is not None else (str(r.path) if r.path is not None else None)
    doc = _from_counts(r.meta, counts, reuse, path)
    doc.update(sequences=int(r.n_sequences), domain_similarity=domain_similarity(r), gate=gate_stats(r.w))
    if ci is not None:
        doc["ci"] = profile_intervals(r, ci, pairs)
    return doc


PROFILE_METHOD = ("percentile bootstrap over units of the trace: the reuse and gate statistics are sums over its "
                  "tokens (no replay); the cache hit rates come from replays, units re-weighted, not re-replayed in a "
                  "new order (cache_method: how each unit's cache state was counted)")
# The profile's statistics without an interval, and why (docs/uncertainty.md).
NO_INTERVAL = {
    "reuse_chance_marginal": "a sum of squared expert frequencies, not a ratio of sums over units; a resample that "
                             "repeats a unit inflates it",
    "working_set_95": "a quantile of the expert-count distribution, not a ratio of sums over units; a resample that "
                      "repeats a unit shrinks it",
    "domain_similarity": "domains are nested in sequences: resampling sequences changes which domains are compared",
    "layers": "per-layer values: only the trace-wide statistics get intervals",
}


def profile_intervals(r: Routing, ci, pairs: np.ndarray | None = None) -> dict:
    """Percentile-bootstrap intervals of the profile's ratio statistics over the trace's sequences (blocks of
    tokens for a single sequence; simulator/units.py): the reuse at the next token (shared experts / (pairs x
    L x k), each pair in the unit of its first token) and the two gate statistics (per step and per
    selected expert); the others are listed in ``without_interval`` with the reason."""
    from moesim.simulator.bootstrap import SEED, percentile_interval, ratio, resampled_sums
    from moesim.simulator.units import assign

    T, L, k = r.sel.shape
    units = assign(r.seq, 0, ci.unit)
    pairs = consecutive_pairs(r.seq, r.pos) if pairs is None else pairs
    ids = units.ids

    def per_unit(index, values):
        return np.bincount(ids[index], weights=np.asarray(values, np.float64), minlength=units.n)

    tokens = np.arange(T)
    w = np.asarray(r.w, np.float64)
    cols = np.stack([
        per_unit(pairs, shared_per_pair(r.sel, pairs)), per_unit(pairs, np.full(len(pairs), L * k)),
        per_unit(tokens, w[:, :, 0].sum(axis=1)), per_unit(tokens, np.full(T, L)),
        per_unit(tokens, (w >= GATE_THRESHOLD).sum(axis=(1, 2))), per_unit(tokens, np.full(T, L * k)),
    ], axis=1)
    out: dict = {"level": ci.level, "resamples": ci.resamples, "seed": SEED, "unit": units.kind, "units": units.n,
                 "block_steps": units.block_steps, "described": units.describe(), "method": PROFILE_METHOD,
                 "cache_method": ci.method,
                 "intervals": {}, "without_interval": dict(NO_INTERVAL)}
    if units.n < 2:
        from moesim.reports.tables import single_unit

        out["no_interval"] = single_unit(units.kind, units.describe())
        return out
    reps = resampled_sums(cols, ci.resamples)
    names = ("reuse_next_token", "gate.mean_first_choice_weight", f"gate.fraction_weight_ge_{GATE_THRESHOLD}")
    for i, name in enumerate(names):
        iv = percentile_interval(ratio(reps[:, 2 * i], reps[:, 2 * i + 1]), ci.level)
        if iv is not None:
            out["intervals"][name] = list(iv)
    return out


def _from_counts(meta, counts: np.ndarray, reuse: np.ndarray, path) -> dict:
    """The statistics that need only per-layer request counts (and the reuse, when known)."""
    L, E = counts.shape
    k = meta.top_k
    T = int(counts[0].sum() // k)
    f = counts / T
    chance_marginal = (f ** 2).sum(axis=1) / k
    ws = working_set(counts) / E
    layers = [
        {"layer": int(meta.moe_layers[i]), "reuse_next_token": _num(reuse[i]),
         "reuse_chance_marginal": float(chance_marginal[i]), "working_set_95": float(ws[i])}
        for i in range(L)
    ]
    return {
        "trace": path,
        "model": meta.model_id,
        "synthetic": bool(meta.synthetic),
        "frequency_only": bool(meta.frequency_only),
        "tokens": T,
        "sequences": None,
        "n_layers": int(L),
        "experts": int(E),
        "top_k": int(k),
        "reuse_next_token": _num(np.mean(reuse)),
        "reuse_chance_uniform": k / E,
        "reuse_chance_marginal": float(chance_marginal.mean()),
        "working_set_95": float(ws.mean()),
        "layers": layers,
        "domain_similarity": {"measure": SIMILARITY_MEASURE, "domains": [], "matrix": []},
        "gate": None,
    }


TABLE3_EVICTIONS = ("lru", "lfu", "static", "belady")


def cache_hit_rates(routing: Routing, budget: float | None = None, slots: int | None = None,
                    evictions=TABLE3_EVICTIONS, ci=None) -> dict:
    """The second study's Table 3: the fetch-all hit rate of each eviction at one budget,
    overall and per layer (cold start, one cache per layer, every sequence back to back). With ``ci``,
    ``hit_rate_interval`` holds each eviction's [low, high] from its replay's hits per unit."""
    from moesim.simulator import SimConfig, simulate
    from moesim.simulator.rotation import warm_unit_sums
    from moesim.simulator.units import replay_intervals, replay_units

    rows: dict[int, dict[str, float]] = {}
    overall: dict[str, float] = {}
    intervals: dict[str, list | None] = {}
    n_slots = None
    for ev in evictions:
        config = SimConfig(eviction=ev, miss="fetch-all", budget=budget, slots=slots)
        res = simulate(routing, config)
        n_slots = res.slots_per_layer
        overall[ev] = res.totals()["hit_rate"]
        for row in res.layer_rows():
            rows.setdefault(row["layer"], {"layer": row["layer"]})[ev] = row["hit_rate"]
        if ci is not None:
            sums, offset, _ = warm_unit_sums(routing, config, replay_units(routing, config, ci.unit), res,
                                             method=ci.method)
            iv = replay_intervals(sums, ci, timed=False, offset=offset)["hit_rate"]
            intervals[ev] = list(iv) if iv is not None else None
    out: dict[str, object] = {"budget": budget, "slots_per_layer": n_slots, "miss": "fetch-all",
                               "hit_rate": overall, "layers": list(rows.values())}
    if ci is not None:
        out["hit_rate_interval"] = intervals
    return out


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def profile_trace(path, budget: float | None = None, slots: int | None = None, ci=None) -> dict:
    """Load (selections and weights only) and profile a trace file; with a budget (or
    slots), add the Table-3 hit rates under ``cache``. A frequency-only trace (expert
    counts without time order) gets the statistics counts allow: no reuse, gate or cache.
    ``ci`` (a simulator.bootstrap.CI) adds intervals (``profile``, ``cache_hit_rates``)."""
    from moesim.errors import MoesimError
    from moesim.traces.reader import TraceFile
    from moesim.traces.routing import decode
    from moesim.traces.routing import expert_counts as file_counts

    tf = TraceFile(path)
    if tf.meta.frequency_only:
        if budget is not None or slots is not None:
            raise MoesimError(f"{path}: a frequency-only trace has no time order, so cache hit rates cannot be "
                              "replayed; profile it without --budget/--slots")
        if ci is not None:
            raise MoesimError(f"{path}: a frequency-only trace has only expert counts, no sequences or tokens to "
                              "resample; profile it without --ci")
        counts = file_counts(tf)
        return _from_counts(tf.meta, counts, np.full(counts.shape[0], np.nan), str(path))
    # The profile needs only the k selected experts; keeping k candidates saves memory on wide traces.
    routing = decode(tf, candidates=tf.meta.top_k)
    doc = profile(routing, trace=str(path), ci=ci)
    if budget is not None or slots is not None:
        doc["cache"] = cache_hit_rates(routing, budget, slots, ci=ci)
    if ci is not None:  # the interval object last, after cache: the documented key order stays a prefix
        doc["ci"] = doc.pop("ci")
    return doc


__all__ = ["profile", "profile_trace", "cache_hit_rates", "profile_intervals", "shared_per_pair", "NO_INTERVAL",
           "expert_counts", "consecutive_pairs", "reuse_per_layer",
           "working_set",
           "domain_similarity", "gate_stats"]
