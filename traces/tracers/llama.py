"""llama.cpp tracer (llama-cpp-python): an eval callback copies every MoE layer's router
tensors out of the compute graph while a GGUF model runs teacher-forced over texts.

Per MoE layer ``il`` llama.cpp names the router tensors ``ffn_moe_logits-<il>`` (f32,
ggml ``[n_expert, n_tokens]`` = numpy ``(tokens, experts)``; ``ffn_moe_logits_biased``
when the router has a bias, as in gpt-oss), ``ffn_moe_topk-<il>`` (i32 selected ids)
and the gate weights ``ffn_moe_weights-<il>`` then its ``_softmax``/``_norm``/``_scaled``
steps: the last one computed is what the experts are weighted with.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from moesim.costmodel.models import QUANT_BITS
from moesim.errors import MoesimError
from moesim.files import check_output, regular_file
from moesim.traces.tracers.recorder import Capture, RouterRecorder
from moesim.traces.tracers.texts import source_meta, split_sequences

TRACER_NAME = "moesim.llama_cpp"
TRACER_VERSION = "1"
INSTALL_HINT = "llama-cpp-python is not installed: pip install 'moesim[llama]' (compiles llama.cpp, ~5 minutes)"

# GGUF architecture -> (moesim family = transformers model_type, the gating llama.cpp's graph applies).
# None: the graph reads {arch}.expert_gating_func from the header (deepseek2: softmax when absent).
ARCHS: dict[str, tuple[str, str | None]] = {
    "qwen3moe": ("qwen3_moe", "softmax"),
    "qwen3next": ("qwen3_next", "softmax"),
    "qwen2moe": ("qwen2_moe", "softmax"),
    # softmax, top-k, then always renormalized: the softmax over the k selected logits
    "llama": ("mixtral", "softmax_topk"),
    "olmoe": ("olmoe", "softmax"),
    "deepseek2": ("deepseek_v3", None),
    "glm4moe": ("glm4_moe", None),
    "dots1": ("dots1", None),
    "minimax-m2": ("minimax_m2", None),
    # softmax then renormalized: Granite's softmax over the k selected logits
    "granitemoe": ("granitemoe", "softmax_topk"),
    # LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT is hard-coded in the graph: the GGUF has no gating key
    "gpt-oss": ("gpt_oss", "softmax_topk"),
}
# MoE architectures the pinned llama.cpp runs but moesim does not trace: why (docs/tracers.md).
UNSUPPORTED: dict[str, str] = {
    "phimoe": "llama.cpp routes PhiMoE with a renormalized softmax, not the model's sparsemixer gating",
    "dbrx": "not checked against transformers (its DBRX router, transformer.blocks.<i>.ffn.router, returns "
            "the logits alone)",
    "jamba": "hybrid Mamba model, not checked against transformers",
    "llama4": "not checked against transformers (top-k of the logits, the sigmoid of the k scales the expert "
              "input; transformers' router sits at feed_forward.router and returns (scores, logits))",
}
# llama_expert_gating_func_type: 1 softmax, 2 sigmoid, 3 softmax over the k selected (gpt-oss)
GATING_FUNC = {1: "softmax", 2: "sigmoid", 3: "softmax_topk"}
# gguf LlamaFileType names -> moesim quantization keys
FILE_TYPES = {"ALL_F32": "f32", "MOSTLY_F16": "fp16", "MOSTLY_BF16": "bf16", "MOSTLY_Q8_0": "q8_0",
              "MOSTLY_Q4_K_M": "q4_k_m", "MOSTLY_MXFP4_MOE": "mxfp4"}
WEIGHT_STEPS = ("ffn_moe_weights", "ffn_moe_weights_softmax", "ffn_moe_weights_norm", "ffn_moe_weights_scaled")
# Which graph tensor holds the router logits, by preference. With the gating applied to the
# top-k weights (gpt-oss) build_moe_ffn sets probs = logits and names that same tensor
# ffn_moe_probs, so neither ffn_moe_logits (when biased) nor ffn_moe_logits_biased is seen.
LOGITS = ("ffn_moe_logits_biased", "ffn_moe_logits")
LOGITS_SOFTMAX_WEIGHT = ("ffn_moe_probs",)

GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32 = 0, 1, 26
KV_TYPES = {"f16": GGML_TYPE_F16, "f32": GGML_TYPE_F32}


class _GgmlTensor(ctypes.Structure):
    # struct ggml_tensor from ggml.h (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def import_llama():
    try:
        import llama_cpp
        from llama_cpp import _ggml
    except ImportError:
        raise MoesimError(INSTALL_HINT) from None
    lib = _ggml.libggml
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    return llama_cpp, lib


def _read_tensor(lib, t: _GgmlTensor, ptr: int) -> np.ndarray:
    """A 2-D f32/i32 tensor (possibly a strided view) as a numpy array [ne1, ne0]."""
    dtype = {GGML_TYPE_F32: np.float32, GGML_TYPE_I32: np.int32}.get(t.type)
    if dtype is None:
        raise MoesimError(f"tensor {t.name.decode()} has ggml type {t.type}, expected f32 or i32")
    ne = [int(x) for x in t.ne]
    nb = [int(x) for x in t.nb]
    if ne[2] * ne[3] != 1 and not (ne[0] == 1 and ne[3] == 1):
        raise MoesimError(f"tensor {t.name.decode()} has unexpected shape {ne}")
    if ne[0] == 1:  # weights come as [1, k, n]: drop the leading 1
        ne, nb = ne[1:] + [1], nb[1:] + [nb[3]]
    if ne[0] == 0 or ne[1] == 0:
        return np.empty((ne[1], ne[0]), dtype=dtype)
    size = (ne[0] - 1) * nb[0] + (ne[1] - 1) * nb[1] + nb[0]
    buf = np.empty(size, dtype=np.uint8)
    lib.ggml_backend_tensor_get(ptr, buf.ctypes.data, 0, size)
    return np.ndarray(shape=(ne[1], ne[0]), dtype=dtype, buffer=buf, strides=(nb[1], nb[0])).copy()


class _Collector:
    """Holds the eval callback; gathers each layer's tensors per micro-batch, in order."""

    def __init__(self, llama_cpp, lib, logits_names: tuple[str, ...] = LOGITS):
        self.lib = lib
        self.logits_names = logits_names
        self.wanted = {*logits_names, "ffn_moe_topk", *WEIGHT_STEPS}
        self.parts: dict[tuple[str, int], list[np.ndarray]] = {}
        self.error: BaseException | None = None
        self.weight_steps: set[str] = set()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, tensor_ptr, ask, user_data):
        try:
            t = _GgmlTensor.from_address(tensor_ptr)
            name, _, il = t.name.decode(errors="replace").rpartition("-")
            if name not in self.wanted or not il.isdigit():
                return False
            if ask:
                return True
            self.parts.setdefault((name, int(il)), []).append(_read_tensor(self.lib, t, tensor_ptr))
        except BaseException as exc:  # an exception must not cross the C boundary
            self.error = exc
        return True

    def take(self) -> dict[int, Capture]:
        """The captures of everything decoded since the last call, micro-batches concatenated."""
        if self.error is not None:
            raise MoesimError(f"reading llama.cpp router tensors failed: {self.error}")
        got = {key: np.concatenate(v, axis=0) for key, v in self.parts.items()}
        self.parts = {}
        layers = sorted({il for (name, il) in got if name in self.logits_names})
        caps = {}
        for il in layers:
            logits = next(got[(name, il)] for name in self.logits_names if (name, il) in got)
            w = None
            for step in WEIGHT_STEPS:
                w = got.get((step, il), w)
            caps[il] = Capture(logits, got.get(("ffn_moe_topk", il)), w)
        self.weight_steps = {name for (name, _) in got if name in WEIGHT_STEPS}
        return caps


def gguf_meta(path: Path) -> dict:
    """Model facts from the GGUF header and tensor table (``gguf`` package)."""
    try:
        from gguf import GGUFReader, LlamaFileType
    except ImportError:
        raise MoesimError("the gguf package is not installed: pip install 'moesim[llama]'") from None
    try:
        r = GGUFReader(str(path))
    except Exception as exc:  # the reader raises bare ValueErrors and struct errors on a damaged file
        raise MoesimError(f"{path}: not a readable GGUF file ({exc})") from None

    def val(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v

    arch = val("general.architecture", "")
    kv = {k.split(".", 1)[1]: val(k) for k in r.fields if k.startswith(arch + ".")}
    tensors = {t.name: t for t in r.tensors}
    out = {"arch": arch, "kv": kv, "name": val("general.name"), "file_type": None, "bias": {}, "bytes": {}}
    ft = val("general.file_type")
    if ft is not None:
        try:
            out["file_type"] = FILE_TYPES.get(LlamaFileType(int(ft)).name, LlamaFileType(int(ft)).name.lower())
        except ValueError:
            pass
    for name, t in tensors.items():
        if name.endswith(".exp_probs_b.bias"):
            out["bias"][int(name.split(".")[1])] = np.asarray(t.data, dtype=np.float64).reshape(-1)
    E = int(kv.get("expert_count") or 0)
    for name, t in tensors.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[2] in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps") \
                and parts[3] == "weight" and E:
            layer = int(parts[1])
            d = out["bytes"].setdefault(layer, [0, 0])
            d[0] += int(t.n_bytes) // E
            d[1] += int(t.n_elements) // E
    return out


def _routing(g: dict) -> tuple[str, str]:
    """(family, gating) as llama.cpp's graph routes this GGUF's architecture."""
    family, gating = ARCHS[g["arch"]]
    if gating is None:
        func = g["kv"].get("expert_gating_func")
        gating = GATING_FUNC[int(func)] if func else "softmax"   # check_supported: only deepseek2 may omit it
        if family == "deepseek_v3" and gating != "sigmoid":
            family = "deepseek_v2"  # the deepseek2 architecture also runs DeepSeek-V2 (softmax routing)
    return family, gating


def check_supported(g: dict, path: Path) -> None:
    """Refuse, in one line, a GGUF whose routing this tracer does not know."""
    arch, kv = g["arch"], g["kv"]
    experts = int(kv.get("expert_count") or 0)
    if arch in UNSUPPORTED:
        raise MoesimError(f"{path}: GGUF architecture {arch!r} is not supported by moesim trace llama: "
                          f"{UNSUPPORTED[arch]} (docs/tracers.md)")
    if arch not in ARCHS:
        what = "MoE architecture" if experts else "architecture"
        raise MoesimError(f"{path}: {what} {arch!r} is not supported by moesim trace llama (supported: "
                          f"{', '.join(sorted(ARCHS))}; docs/tracers.md)")
    if experts < 2:
        raise MoesimError(f"{path}: not an MoE model (architecture {arch!r} with no experts)")
    func = kv.get("expert_gating_func")
    if func and int(func) not in GATING_FUNC:
        raise MoesimError(f"{path}: llama.cpp expert gating function {int(func)} is not supported "
                          f"(supported: softmax, sigmoid, softmax over the top-k)")
    if not func and ARCHS[arch][1] is None and arch != "deepseek2":
        raise MoesimError(f"{path}: the GGUF names no expert gating function ({arch}.expert_gating_func): "
                          "llama.cpp cannot route it")
    if _routing(g)[0] == "deepseek_v2" and int(kv.get("expert_group_count") or 1) > 1:
        raise MoesimError(f"{path}: group-limited DeepSeek-V2 routing is not supported: llama.cpp scores each "
                          "expert group by its top-2 sum (DeepSeek-V3's rule), the model by its best expert "
                          "(group_limited_greedy)")


def _meta_fields(g: dict, path: Path, layers: list[int], top_k_seen: int, weight_steps: set[str]) -> dict:
    kv = g["kv"]
    family, gating = _routing(g)
    # the multi-token-prediction layers a GGUF may append are not run when decoding
    n_layers = int(kv.get("block_count") or (max(layers) + 1)) - int(kv.get("nextn_predict_layers") or 0)
    norm = "ffn_moe_weights_norm" in weight_steps or gating == "softmax_topk"
    scale = float(kv.get("expert_weights_scale") or 1.0)
    shared = int(kv.get("expert_shared_count") or 0)
    if not shared and any(k.startswith("expert_shared_feed_forward_length") for k in kv):
        shared = 1
    fields = {
        "model_id": str(g["name"] or path.stem),
        "family": family,
        "n_experts": int(kv.get("expert_count") or 0) or None,
        "top_k": int(kv.get("expert_used_count") or top_k_seen),
        "moe_layers": layers,
        "dense_layers": [i for i in range(n_layers) if i not in set(layers)],
        "gating": gating,
        "norm_topk_prob": bool(norm),
        "routed_scaling_factor": scale,
        "n_shared_experts": shared,
        "n_group": int(kv.get("expert_group_count") or 1),
        "topk_group": int(kv.get("expert_group_used_count") or 1),
        "bytes_per_expert": _bytes_per_expert(g, layers),
    }
    if fields["n_experts"] is None:
        del fields["n_experts"]
    return fields


def _bytes_per_expert(g: dict, layers: list[int]) -> dict[str, int]:
    sizes = [g["bytes"][i] for i in layers if i in g["bytes"]]
    if not sizes:
        return {}
    nbytes, params = sizes[0]
    out = {"bf16": int(round(params * QUANT_BITS["bf16"] / 8))}
    out[g["file_type"] or "gguf"] = int(nbytes)
    return out


_LOG_CALLBACK = None


def _silence(llama_cpp) -> None:
    """Drop llama.cpp's log output. The C side keeps the pointer: the ctypes callback must
    live as long as the process (freed, the next log line from any llama.cpp call crashes)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


def trace_llama(gguf_path: str | os.PathLike, texts: Sequence[str], out: str | os.PathLike, *,
                domains: Sequence[str] | None = None, seq_len: int = 512, max_tokens: int | None = None,
                candidates: int | None = None, dense: bool = False, n_batch: int = 512, n_ubatch: int | None = None,
                n_threads: int | None = None, kv_type: str = "f16", flash_attn: bool | None = None,
                model_id: str | None = None, generate: int = 0,
                progress: Callable[[int, int], None] | None = None) -> Path:
    """Teacher-forced llama.cpp passes over ``texts`` (sequences of ``seq_len`` tokens, each
    decoded in batches of ``n_batch`` tokens with output logits requested for every token);
    writes the trace ``out``. ``generate`` N > 0: after each sequence's prefill, N greedy
    decode steps (the argmax token, end-of-text not special), each fed back and recorded
    as a ``decode`` row of the same sequence. ``kv_type`` (KV cache: llama.cpp's default
    f16, or f32) and ``flash_attn`` (None: llama.cpp decides) change attention precision:
    llama.cpp's defaults put router logits ~1e-2 away from an f32 transformers run of the
    same weights, f32 KV without flash attention ~1e-5."""
    path = Path(gguf_path)
    if not path.exists():
        raise MoesimError(f"{gguf_path}: no such GGUF file")
    regular_file(path, "GGUF file")
    check_output(out, [path, *texts])
    llama_cpp, lib = import_llama()
    g = gguf_meta(path)
    check_supported(g, path)
    _silence(llama_cpp)
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise MoesimError(f"{gguf_path}: llama.cpp cannot load this model")
    collector = _Collector(llama_cpp, lib, LOGITS_SOFTMAX_WEIGHT if g["arch"] == "gpt-oss" else LOGITS)
    ctx = batch = None
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        bos = int(llama_cpp.llama_vocab_bos(vocab)) if llama_cpp.llama_vocab_get_add_bos(vocab) else None

        def tokenize(text: str) -> list[int]:
            data = text.encode("utf-8")
            cap = len(data) + 16
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, True)
            if n < 0:
                cap = -n
                buf = (llama_cpp.llama_token * cap)()
                n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, False, True)
            return list(buf[:n])

        if generate < 0:
            raise MoesimError(f"--generate must be 0 or more, got {generate}")
        seqs = split_sequences(texts, domains, tokenize, seq_len, max_tokens, bos=bos)
        n_batch = max(1, min(n_batch, seq_len))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = max(seq_len + generate, 16)
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch or n_batch, n_batch)
        cparams.n_seq_max = 1
        if n_threads:
            cparams.n_threads = cparams.n_threads_batch = int(n_threads)
        if kv_type not in KV_TYPES:
            raise MoesimError(f"unknown KV cache type {kv_type!r} (expected {', '.join(KV_TYPES)})")
        cparams.type_k = cparams.type_v = KV_TYPES[kv_type]
        if flash_attn is not None:
            cparams.flash_attn_type = 1 if flash_attn else 0
        cparams.cb_eval = collector.callback
        cparams.cb_eval_user_data = None
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise MoesimError(f"{gguf_path}: llama.cpp cannot create a context for this model")
        batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        src = source_meta(texts, domains, seq_len, max_tokens, seqs)
        src.update(gguf=str(path.resolve()), n_batch=n_batch, n_ubatch=int(cparams.n_ubatch), kv_type=kv_type,
                   flash_attn={None: "auto", True: "on", False: "off"}[flash_attn], generate=int(generate))
        doms = sorted({s.domain for s in seqs if s.domain is not None}) or None
        rec = None
        try:
            done = 0
            for si, s in enumerate(seqs):
                llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
                for start in range(0, len(s.tokens), n_batch):
                    chunk = s.tokens[start:start + n_batch]
                    caps = _decode(llama_cpp, ctx, batch, chunk, start, collector)
                    if rec is None:
                        rec = _recorder(out, g, path, caps, collector, candidates, dense, doms, src, model_id)
                    n = len(chunk)
                    rec.add(seq=np.full(n, si, dtype=np.int32), pos=np.arange(start, start + n),
                            captures=caps, token=np.asarray(chunk, dtype=np.int32), phase="prefill",
                            domain=s.domain)
                pos = len(s.tokens)
                assert rec is not None   # opened by the prefill above: a sequence has at least one token
                for _ in range(generate):
                    tok = _greedy(llama_cpp, ctx, n_vocab)
                    caps = _decode(llama_cpp, ctx, batch, [tok], pos, collector)
                    rec.add(seq=np.full(1, si, dtype=np.int32), pos=np.arange(pos, pos + 1), captures=caps,
                            token=np.asarray([tok], dtype=np.int32), phase="decode", domain=s.domain)
                    pos += 1
                done += len(s.tokens) + generate
                if progress is not None:
                    progress(done, src["tokens"] + generate * len(seqs))
        except BaseException:
            if rec is not None:
                rec.abort()
            raise
        if rec is None:
            raise MoesimError(f"{path}: no tokens to trace")
        rec.close()
    finally:
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return Path(out)


def _decode(llama_cpp, ctx, batch, tokens: list[int], start: int, collector: _Collector) -> dict[int, Capture]:
    n = len(tokens)
    batch.n_tokens = n
    for i, tok in enumerate(tokens):
        batch.token[i] = tok
        batch.pos[i] = start + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1   # every row an output: else the last layer routes only the kept rows
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise MoesimError(f"llama.cpp failed to decode a batch (llama_decode returned {rc})")
    caps = collector.take()
    if not caps:
        raise MoesimError(f"llama.cpp ran no MoE layer (no {' or '.join(collector.logits_names)} tensor seen): "
                          "is this an MoE model?")
    for il, c in caps.items():
        if c.logits is None or c.logits.shape[0] != n:
            raise MoesimError(f"layer {il}: captured router logits for "
                              f"{None if c.logits is None else c.logits.shape[0]} tokens, expected {n}")
    return caps


def _greedy(llama_cpp, ctx, n_vocab: int) -> int:
    """The argmax token of the last decoded row's output logits."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
    if not ptr:
        raise MoesimError("llama.cpp returned no output logits to generate from")
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))


def _recorder(out, g, path, caps, collector, candidates, dense, doms, src, model_id) -> RouterRecorder:
    layers = sorted(caps)
    first = caps[layers[0]]
    k_seen = first.selected.shape[1] if first.selected is not None else 0
    fields = _meta_fields(g, path, layers, k_seen, collector.weight_steps)
    if model_id:
        fields["model_id"] = model_id
    import llama_cpp

    fields["tracer"] = {"name": TRACER_NAME, "version": TRACER_VERSION,
                        "llama_cpp_python": getattr(llama_cpp, "__version__", "?")}
    fields["source"] = src
    fields["synthetic"] = False
    bias = {il: g["bias"][il] for il in layers if il in g["bias"]}
    return RouterRecorder(out, fields, layout="dense" if dense else "sparse", candidates=candidates,
                          domains=doms, selection_bias=bias)


__all__ = ["trace_llama", "gguf_meta"]
