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


def profile(routing: Routing, trace: str | None = None) -> dict:
    """The routing profile of a decoded trace as a JSON-ready dict (keys: docs/profile.md)."""
    r = routing
    T, L, k = r.sel.shape
    E = r.n_experts
    counts = expert_counts(r.sel, E)
    reuse = reuse_per_layer(r.sel, consecutive_pairs(r.seq, r.pos))
    path = trace if trace is not None else (str(r.path) if r.path is not None else None)
    doc = _from_counts(r.meta, counts, reuse, path)
    doc.update(sequences=int(r.n_sequences), domain_similarity=domain_similarity(r), gate=gate_stats(r.w))
    return doc


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
                    evictions=TABLE3_EVICTIONS) -> dict:
    """The second study's Table 3: the fetch-all hit rate of each eviction at one budget,
    overall and per layer (cold start, one cache per layer, every sequence back to back)."""
    from moesim.simulator import SimConfig, simulate

    rows: dict[int, dict[str, float]] = {}
    overall: dict[str, float] = {}
    n_slots = None
    for ev in evictions:
        res = simulate(routing, SimConfig(eviction=ev, miss="fetch-all", budget=budget, slots=slots))
        n_slots = res.slots_per_layer
        overall[ev] = res.totals()["hit_rate"]
        for row in res.layer_rows():
            rows.setdefault(row["layer"], {"layer": row["layer"]})[ev] = row["hit_rate"]
    return {"budget": budget, "slots_per_layer": n_slots, "miss": "fetch-all", "hit_rate": overall,
            "layers": list(rows.values())}


def _num(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def profile_trace(path, budget: float | None = None, slots: int | None = None) -> dict:
    """Load (selections and weights only) and profile a trace file; with a budget (or
    slots), add the Table-3 hit rates under ``cache``. A frequency-only trace (expert
    counts without time order) gets the statistics counts allow: no reuse, gate or cache."""
    from moesim.errors import MoesimError
    from moesim.traces.reader import TraceFile
    from moesim.traces.routing import decode
    from moesim.traces.routing import expert_counts as file_counts

    tf = TraceFile(path)
    if tf.meta.frequency_only:
        if budget is not None or slots is not None:
            raise MoesimError(f"{path}: a frequency-only trace has no time order, so cache hit rates cannot be "
                              "replayed; profile it without --budget/--slots")
        counts = file_counts(tf)
        return _from_counts(tf.meta, counts, np.full(counts.shape[0], np.nan), str(path))
    # The profile needs only the k selected experts; keeping k candidates saves memory on wide traces.
    routing = decode(tf, candidates=tf.meta.top_k)
    doc = profile(routing, trace=str(path))
    if budget is not None or slots is not None:
        doc["cache"] = cache_hit_rates(routing, budget, slots)
    return doc


__all__ = ["profile", "profile_trace", "cache_hit_rates", "expert_counts", "consecutive_pairs", "reuse_per_layer",
           "working_set",
           "domain_similarity", "gate_stats"]
