"""Synthetic routing traces with a real model's geometry (generative model: docs/synthetic.md).

Per (layer, domain) a fixed popularity score for each expert; per sequence a sticky
state (an AR(1) drift of every expert's score) that makes experts persist across tokens;
per token independent Gumbel noise, shared with probability ``couple`` between an expert and its
successor at the next layer (layer coupling). The router's logits are that score over a temperature,
quantized to a coarse grid; the trace stores the best M of them plus the exact
log-sum-exp over all E, computed from the same full logits.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from moesim.errors import MoesimError
from moesim.traces import gating
from moesim.traces.meta import TraceMeta
from moesim.traces.synth_presets import PRESETS, RoutingKnobs, preset_names
from moesim.traces.writer import TraceWriter

GENERATOR = "moesim-synth"
GENERATOR_VERSION = 2  # generator 1 (numpy, ~10x slower, no layer coupling) was removed; its files still read
CHUNK_ROWS_2 = 1 << 16  # generator 2: about this many (token, layer) rows per kernel call (any size: same trace)
# generator 2 with layer coupling: at most this many (token, layer, expert) per call (the chunks, hence the
# written batches, of the sparse layout's files depend on it)
LINKED_DRAWS = 2 << 20
BLOCK = 16  # generator 2: tokens a kernel thread walks its layers with at a time (any number: same trace)
PARTS = 0  # generator 2: layer ranges made in parallel (0: one per numba thread; any number: same trace)
_QMAX = 1 << 20  # stored logits are integers q * grid with |q| < _QMAX
_DOMAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _rng(seed: int, *tags: str) -> np.random.Generator:
    """An independent stream per purpose, so e.g. the popularity of 'code' experts
    does not change when the token count or the list of domains does."""
    words = [seed & 0xFFFFFFFF, seed >> 32] + [zlib.crc32(t.encode()) for t in tags]
    return np.random.default_rng(words)


def check_args(preset: str, tokens: int, seqs: int, seed: int, domains, prefill: int = 0) -> None:
    if preset not in PRESETS:
        raise MoesimError(f"unknown synth preset {preset!r} (known: {', '.join(preset_names())})")
    if not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise MoesimError(f"--tokens must be at least 1, got {tokens!r}")
    if not isinstance(seqs, (int, np.integer)) or seqs < 1:
        raise MoesimError(f"--seqs must be at least 1, got {seqs!r}")
    if seqs > tokens:
        raise MoesimError(f"--seqs ({seqs}) cannot exceed --tokens ({tokens}): every sequence needs a token")
    if not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= 1 << 63:
        raise MoesimError(f"--seed must be a non-negative integer, got {seed!r}")
    if prefill < 0:
        raise MoesimError(f"--prefill must be >= 0, got {prefill}")
    if domains is not None:
        if len(set(domains)) != len(domains):
            raise MoesimError(f"--domains lists a domain twice: {','.join(domains)}")
        bad = [d for d in domains if not _DOMAIN_NAME.match(d)]
        if bad:
            raise MoesimError(f"bad domain name {bad[0]!r} (letters, digits, '_', '-', '.')")


def parse_domains(text: str | None) -> list[str] | None:
    """CLI form: 'code,prose,math' -> names; 'none' -> [] (no domain structure); None -> preset default."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    names = [x.strip() for x in text.split(",")]
    if any(not x for x in names):
        raise MoesimError(f"--domains must be comma-separated names without empty entries, got {text!r}")
    return names


def plan_tokens(tokens: int, seqs: int, n_domains: int, knobs: RoutingKnobs, weights: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seq, pos, domain code) per token, ordered by (seq, pos). Sequences get tokens//seqs tokens
    (the first tokens%seqs one more); each is cut into topic segments of geometric length
    (mean ``topic_len``); a segment's domain is drawn by weight, never the same as the previous one."""
    lengths = np.full(seqs, tokens // seqs, dtype=np.int64)
    lengths[: tokens % seqs] += 1
    seq = np.repeat(np.arange(seqs, dtype=np.int32), lengths)
    pos = (np.arange(tokens) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
    dom = np.zeros(tokens, dtype=np.int16)
    p = weights / weights.sum()
    # rng.choice(n_domains, p=x) is cdf = x.cumsum(), cdf /= cdf[-1], then the uniform rng.random() searched
    # in cdf (numpy's Generator.choice): the same draws without its per-call checks, ~10x faster per segment
    first = _choice_cdf(p)
    after = [_choice_cdf(_without(p, d)) for d in range(n_domains)] if n_domains > 1 else []
    mean = 1.0 / max(float(knobs.topic_len), 1.0)
    start = 0
    for n in map(int, lengths):
        d = int(first.searchsorted(rng.random(), side="right"))
        t = 0
        while t < n:
            seg = int(rng.geometric(mean))
            dom[start + t: start + min(n, t + seg)] = d
            t += seg
            if n_domains > 1:
                d = int(after[d].searchsorted(rng.random(), side="right"))
        start += n
    return seq, pos, dom


def _without(p: np.ndarray, d: int) -> np.ndarray:
    """The domain weights p with domain d's set to zero, renormalized."""
    q = p.copy()
    q[d] = 0.0
    return q / q.sum()


def _choice_cdf(p: np.ndarray) -> np.ndarray:
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf


def _zipf_profile(rng: np.random.Generator, L: int, E: int, cutoff: float) -> np.ndarray:
    """[L, E]: -log(rank) - cutoff * rank / E for an independent random ranking of the experts per layer
    (a Zipf law with an exponential cutoff, in log space)."""
    ranks = np.argsort(np.argsort(-rng.random((L, E)), axis=1), axis=1) + 1.0
    return -np.log(ranks) - cutoff * ranks / E


def base_scores(seed: int, L: int, E: int, domain_names: list[str], knobs: RoutingKnobs) -> np.ndarray:
    """[D, L, E] float32: per layer and domain, log-popularity of each expert (mean 0 over experts)."""
    shared = _zipf_profile(_rng(seed, "shared"), L, E, knobs.cutoff)
    out = np.empty((len(domain_names), L, E), dtype=np.float64)
    for i, name in enumerate(domain_names):
        dk = knobs.domain(name)
        own = _zipf_profile(_rng(seed, "domain", name), L, E, knobs.cutoff)
        out[i] = knobs.zipf_shared * dk.shared * shared + dk.zipf * own
    out -= out.mean(axis=2, keepdims=True)
    return out.astype(np.float32)


def command_line(preset, tokens, seqs, seed, domains, path, candidates=None, prefill=0, layout="ranked",
                 lookahead=False) -> str:
    parts = ["moesim synth", f"--preset {preset}", f"--tokens {tokens}", f"--seqs {seqs}", f"--seed {seed}"]
    if domains is not None:
        parts.append(f"--domains {','.join(domains) if domains else 'none'}")
    if candidates is not None:
        parts.append(f"--candidates {candidates}")
    if prefill:
        parts.append(f"--prefill {prefill}")
    if layout != "ranked":
        parts.append(f"--layout {layout}")
    if lookahead:
        parts.append("--lookahead")
    parts.append(f"-o {path}")
    return " ".join(parts)


LAYOUTS = ("ranked", "sparse")


def synthesize(preset: str, tokens: int, seqs: int = 1, seed: int = 0, domains: list[str] | None = None,
               path: str | os.PathLike = "synthetic.parquet", *, candidates: int | None = None, prefill: int = 0,
               knobs: RoutingKnobs | None = None, command: str | None = None, layout: str = "ranked",
               generator: int = GENERATOR_VERSION, lookahead: bool = False) -> Path:
    """Write a synthetic trace and return its path: the compact ``ranked`` layout (the default:
    the ranked candidates and their logits) or the ``sparse`` layout (every candidate's id and logit
    as lists, and the log-sum-exp over all E; same routing, same logits, same replays).

    ``domains``: None -> the preset's default domains; [] -> no domain structure (no domain column).
    ``candidates``: M stored per row (default: the preset's, capped at E). The first ``prefill``
    positions of every sequence are marked phase 'prefill', the rest 'decode'.
    ``knobs`` overrides the preset's routing knobs (calibration experiments). ``generator``: 2, the
    only one (generator 1, the original numpy one, was removed; the files it wrote read as any
    other). ``lookahead``: also write the lookahead column, a noisy
    copy of the next layer's selection (knob ``lookahead_noise``)."""
    from moesim import __version__
    from moesim.costmodel.models import load_model

    check_args(preset, tokens, seqs, seed, domains, prefill)
    if layout not in LAYOUTS:
        raise MoesimError(f"unknown synthetic trace layout {layout!r} (use {' or '.join(LAYOUTS)})")
    if generator != GENERATOR_VERSION:
        raise MoesimError(f"generator {generator!r} is not available: generator 1 (the original numpy one) was "
                          f"removed in favour of generator {GENERATOR_VERSION}, the default (traces it wrote still "
                          "read and replay as before, but cannot be rebuilt)" if generator == 1 else
                          f"unknown generator {generator!r} (use {GENERATOR_VERSION})")
    tokens, seqs, seed, prefill = int(tokens), int(seqs), int(seed), int(prefill)
    model = load_model(preset)
    kn = knobs if knobs is not None else PRESETS[preset]
    L, E, k = len(model.moe_layers), model.n_experts, model.top_k
    M = min(E, kn.candidates) if candidates is None else int(candidates)
    M = max(M, k) if candidates is None else M
    if not (k <= M <= E):
        raise MoesimError(f"--candidates must be between top-k={k} and E={E} for {preset}, got {M}")
    use_domains = list(kn.default_domains) if domains is None else list(domains)
    with_column = bool(use_domains)
    names = use_domains if with_column else ["general"]
    weights = np.array([kn.domain(d).weight for d in names], dtype=np.float64)
    if (weights <= 0).any():
        raise MoesimError("every domain needs a positive weight")

    seq, pos, dom = plan_tokens(tokens, seqs, len(names), kn, weights, _rng(seed, "layout"))
    base = base_scores(seed, L, E, names, kn)
    sigmoid = model.gating == "sigmoid"
    ranked = layout == "ranked"
    path = Path(path)
    meta = TraceMeta(
        model_id=model.hf_id or model.name, family=model.family, n_experts=E, top_k=k,
        moe_layers=model.moe_layers, gating=model.gating, norm_topk_prob=model.norm_topk_prob, layout=layout,
        n_candidates=M, routed_scaling_factor=model.routed_scaling_factor,
        n_shared_experts=model.n_shared_experts,
        dense_layers=model.dense_layers, bytes_per_expert=model.bytes_per_expert_table(),
        n_group=model.n_group, topk_group=model.topk_group, synthetic=True,
        tracer={"name": GENERATOR, "version": f"{__version__} (generator {generator})"},
        source={
            "preset": preset, "tokens": tokens, "seqs": seqs, "seed": seed,
            "domains": use_domains, "prefill": prefill, "candidates": M,
            "command": command or command_line(preset, tokens, seqs, seed, domains, path, candidates, prefill,
                                               layout, lookahead),
            "generator": generator, "knobs": kn.to_dict(),
            "note": "synthetic routing from a generative model calibrated to published statistics; "
                    "not recorded from the model",
        },
    )
    layers = np.asarray(model.moe_layers, dtype=np.int16)
    phase_codes = np.where(pos < prefill, 0, 1).astype(np.int8)  # codes into PHASES
    look_key = np.uint64(_rng(seed, "lookahead").integers(0, 2**63))
    # the chunks (but the last) are of one size; the writer converts (copies) its layer column, so one array serves
    layer_rows = functools.cache(lambda c: np.tile(layers, c))

    def batches(chunks) -> Iterator[dict]:
        """The writer's columns of each chunk."""
        for rows, ids, top_q, logits, q_full, lse in chunks:
            c = rows.stop - rows.start
            extra: dict = {}
            if sigmoid:
                x = q_full.astype(np.float64) * kn.grid
                sel, w = _sigmoid_route(x, k, model.n_group, model.topk_group, model.routed_scaling_factor)
                extra = {"selected": sel, "weights": w}
            if lookahead:
                extra["lookahead"] = lookahead_ids(ids, top_q, k, L, rows.start, look_key, kn.lookahead_noise,
                                                   kn.grid)
            if with_column:
                extra["domain"] = np.repeat(dom[rows], L)
            if ranked:
                extra.update(_ranked_columns(ids, logits, model.gating))
            else:
                extra.update(top_ids=ids, top_logits=logits, lse=lse.astype(np.float32))
            yield dict(seq=np.repeat(seq[rows], L), pos=np.repeat(pos[rows], L), layer=layer_rows(c),
                       phase=np.repeat(phase_codes[rows], L), **extra)

    # two stages, each on its own cores: the generator thread runs the kernel (all cores but one), sorts each
    # row's candidate keys and unpacks them, this thread makes the columns, checks and writes them (one core;
    # where the CPU time balances: docs/synthetic.md)
    gen_threads, threads = _thread_split()
    keys = _keys_v2(base, seq, pos, dom, kn, seed, M, full=sigmoid, lse=not ranked, weights=weights,
                    buffers=AHEAD + 2)
    made = batches(_ahead(_unpacked(_sorted(_numba_threads_in(keys, gen_threads)), M, kn.grid), AHEAD))
    with threads, TraceWriter(path, meta, domains=use_domains if with_column else None, selected=sigmoid,
                              weights=sigmoid, lookahead=lookahead) as writer:
        for batch in made:
            writer.write(**batch)
    return path


def _chunks_v2(base, seq, pos, dom, kn: RoutingKnobs, seed: int, M: int, *, full: bool, lse: bool,
               weights: np.ndarray):
    """Generator 2 (traces/synth_kernel.py): the same model with counter-based random numbers,
    jitted and parallel over layers: yield (token slice, ranked ids [n, M], their q [n, M], their logits
    [n, M], every q [n, E] or None, lse [n] or None)."""
    return _unpacked(_sorted(_keys_v2(base, seq, pos, dom, kn, seed, M, full=full, lse=lse, weights=weights,
                                      buffers=1)), M, kn.grid)


def _keys_v2(base, seq, pos, dom, kn: RoutingKnobs, seed: int, M: int, *, full: bool, lse: bool,
             weights: np.ndarray, buffers: int):
    """Generator 2's kernel calls: yield (token slice, candidate keys [n, width] (unsorted rows), every q
    [n, E] or None, lse [n] or None). The keys are scratch (~15 MB a chunk), ``buffers`` of them used in
    turn: a consumer may hold at most ``buffers - 1`` chunks besides the one being made (one: done with a
    chunk before asking for the next; through _ahead(depth): depth + 2)."""
    from moesim.traces import synth_kernel as kern

    _passive_omp()
    D, L, E = base.shape
    if E > 1 << kern.ID_BITS:
        raise MoesimError(f"the synthetic generator handles up to {1 << kern.ID_BITS} experts, not {E}")
    T = len(seq)
    key = np.uint64(_rng(seed, "tokens-v2").integers(0, 2**63))
    ntab, gtab = _quantile_tables()
    newseq = np.ones(T, dtype=np.bool_)
    newseq[1:] = (pos[1:] == 0) | (seq[1:] != seq[:-1])
    rho = min(max(float(kn.rho), 0.0), 0.9999)
    innov = float(np.sqrt(1.0 - rho ** 2) * kn.drift)
    z = np.zeros((L, E), dtype=np.float32)  # the drift, in each layer's rank order
    width = min(E + 1, M + 24)
    thr = np.full(L, np.iinfo(np.int32).max, dtype=np.int32)
    link16 = coupling_link16(kn.couple)
    order, base_r = rank_layout(base, weights, link16)
    bounds = layer_split(L, PARTS or _numba_threads_now())
    chunk = max(1, CHUNK_ROWS_2 // L)
    if link16:
        chunk = max(1, min(chunk, LINKED_DRAWS // (L * E)))
    # reused buffers, not fresh pages every chunk
    keys_bufs = [np.empty((min(chunk, T) * L, width), dtype=np.int32) for _ in range(min(buffers, -(-T // chunk)))]
    counts_buf = np.empty(min(chunk, T) * L, dtype=np.int32)
    for n, start in enumerate(range(0, T, chunk)):
        c = min(chunk, T - start)
        keys, counts = keys_bufs[n % len(keys_bufs)][:c * L], counts_buf[:c * L]
        q_full = np.empty((c * L, E) if full else (0, E), dtype=np.int32)
        lse_out = np.empty(c * L if lse else 0, dtype=np.float64)
        f32 = np.float32
        with np.errstate(over="ignore"):  # the counters wrap around by design (only seen with NUMBA_DISABLE_JIT=1)
            kern.generate(key, start, L, base_r, order, dom[start:start + c].astype(np.int64),
                          newseq[start:start + c], z, f32(rho), f32(innov), f32(kn.drift), f32(kn.noise),
                          f32(1.0 / kn.temperature), f32(kn.offset), f32(1.0 / kn.grid), ntab, gtab, thr, M, width,
                          keys, counts, q_full, float(kn.grid), lse_out, link16, bounds, BLOCK)
        yield slice(start, start + c), keys, q_full if full else None, lse_out if lse else None


def _sorted(keyed):
    """_keys_v2's chunks with each row of candidate keys sorted (numpy's vectorized sort, in place)."""
    for item in keyed:
        item[1].sort(axis=1)
        yield item


def _unpacked(keyed, M: int, grid: float):
    """_sorted chunks with the candidate keys unpacked into ranked ids [n, M] int16, their q [n, M] and
    their logits q * grid [n, M] float32."""
    from moesim.traces.synth_unpack import unpack
    for rows, keys, q_full, lse in keyed:
        ids, top_q, logits = unpack(keys, M, float(grid))
        yield rows, ids, top_q, logits, q_full, lse


def lookahead_ids(ids: np.ndarray, top_q: np.ndarray, k: int, L: int, t0: int, key, noise: float,
                  grid: float) -> np.ndarray:
    """The synthetic lookahead column of the token-major rows [c * L] that start at token t0: per row the
    k best of the next layer's M candidates after adding Gumbel(0, ``noise``) noise to their logits
    (traces/synth_kernel.py lookahead_rows), -1 on the last layer."""
    from moesim.traces.synth_kernel import lookahead_rows

    out = np.empty((ids.shape[0], k), dtype=np.int16)
    with np.errstate(over="ignore"):  # as in _keys_v2
        lookahead_rows(ids, top_q, k, L, t0, np.uint64(key), np.float32(noise / grid), _quantile_tables()[1], out)
    return out


def coupling_link16(couple: float) -> int:
    """The probability ``couple`` that an expert takes its predecessor's draws, in 1/65536."""
    if not 0.0 <= couple <= 1.0:
        raise MoesimError(f"couple must be a probability in [0, 1], got {couple}")
    return int(round(couple * 65536))


def coupling_order(base: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[L, E] int32: each layer's experts by popularity (base [D, L, E] averaged over the domains by their
    weights), most popular first; the expert of rank j at layer l >= 1 is the successor of rank j at l - 1
    and takes its random draws with probability ``couple`` (layer coupling; docs/synthetic.md)."""
    pop = np.tensordot(weights / weights.sum(), base.astype(np.float64), axes=1)  # [L, E]
    return np.argsort(-pop, axis=1, kind="stable").astype(np.int32)


def rank_layout(base: np.ndarray, weights: np.ndarray, link16: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's expert order per layer (order [L, E], rank -> expert: coupling_order with coupling, the
    identity without) and base [D, L, E] permuted into it (C-contiguous)."""
    _, L, E = base.shape
    order = coupling_order(base, weights) if link16 else np.tile(np.arange(E, dtype=np.int32), (L, 1))
    return order, np.ascontiguousarray(np.take_along_axis(base, np.broadcast_to(order, base.shape), axis=2))


def layer_split(L: int, parts: int) -> np.ndarray:
    """Generator 2's layer ranges made in parallel (bounds [P + 1]); the trace does not depend on them."""
    parts = max(1, min(parts, L))
    return np.array([round(p * L / parts) for p in range(parts + 1)], dtype=np.int64)


def _numba_threads_now() -> int:
    import numba

    return numba.get_num_threads()


AHEAD = 2  # chunks the generator thread may run ahead of the writer


def _passive_omp() -> None:
    """numba's OpenMP threads otherwise spin between kernel calls, taking a core from the other stage (read
    when numba starts its threads: before any parallel call or set_num_threads)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _thread_split() -> tuple[int, contextlib.AbstractContextManager]:
    """(numba threads of the generator thread, a context running this thread's numba calls, the writer's
    move-to-front coder and the lookahead column, on one). On 2 cores the kernel alone on one core and the
    writer on the other take ~20% less CPU than a kernel parallel over both cores sharing them with the
    writer, and finish ~1.35x sooner (docs/synthetic.md)."""
    import numba

    _passive_omp()
    return max(1, numba.get_num_threads() - 1), _numba_threads(1)  # of the threads numba may use here


@contextlib.contextmanager
def _numba_threads(n: int):
    """numba's thread count of the calling thread (thread-local) set to n, restored on leaving."""
    import numba

    old = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _numba_threads_in(chunks, n: int):
    """Iterate chunks with numba's thread count of the iterating thread set to n (restored at the end)."""
    with _numba_threads(n):
        yield from chunks


def _ahead(chunks, depth: int = 2):
    """Run a chunk generator in a thread, ``depth`` chunks ahead, so that generating (numba and
    numpy release the GIL) overlaps with encoding and compressing the previous chunks."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        """Hand item over unless the consumer stopped (then never block: it joins this thread)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run():
        try:
            for item in chunks:
                if not put(item):
                    getattr(chunks, "close", lambda: None)()  # its clean-up in this thread, now
                    return
            put(done)
        except BaseException as exc:  # handed to the consumer
            put(exc)

    t = threading.Thread(target=run, name="moesim-synth", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()


_TABLES: dict = {}


def _quantile_tables():
    if not _TABLES:
        from moesim.traces.synth_kernel import tables

        _TABLES["t"] = tables()
    return _TABLES["t"]


def _ranked_columns(ids: np.ndarray, logits: np.ndarray, gating_name: str) -> dict:
    """The ranked layout's columns from the best M (ids, logits) per row, ranked by (logit desc, id asc): for
    sigmoid gating re-ranked by the decoder's own selection score (sigmoid saturates: distinct logits can
    tie)."""
    if gating_name == "sigmoid":
        order = gating.rank_order(ids, gating.selection_scores(logits, gating_name, None))
        ids, logits = np.take_along_axis(ids, order, axis=1), np.take_along_axis(logits, order, axis=1)
    return {"ranked_ids": ids, "ranked_logits": logits}


def _sigmoid_route(x: np.ndarray, k: int, n_group: int, topk_group: int, scale: float):
    """DeepSeek-V3 routing of logits x [n, E] (no selection bias): group-limited top-k of sigmoid
    scores; weights = the selected sigmoid scores normalized, times the routed scaling factor."""
    s = gating.sigmoid(x)
    if n_group > 1:
        sel = gating.group_limited_topk(s, k, n_group, topk_group)
    else:
        sel, _ = gating.rank_rows(np.broadcast_to(np.arange(x.shape[1]), x.shape), s)
        sel = sel[:, :k]
    w = np.take_along_axis(s, sel, axis=1)
    w = w / w.sum(axis=1, keepdims=True) * scale
    sel, w = gating.order_selected(sel, w)
    return sel.astype(np.int16), w.astype(np.float32)


__all__ = ["synthesize", "check_args", "parse_domains", "plan_tokens", "base_scores", "command_line", "GENERATOR",
           "GENERATOR_VERSION"]
