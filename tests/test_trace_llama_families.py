"""llama.cpp tracer vs PyTorch tracer, family by family (no network).

For every family both tracers support, a tiny random transformers checkpoint is
converted to an f32 GGUF by the converter that ships with the pinned llama.cpp
(tests/fixtures/llama_convert.py; all families in one subprocess per session), the
same token ids are traced by both tracers, and the test requires: the same routing
metadata (what tests each architecture mapping of traces/tracers/llama.py: gating,
normalization, scaling, groups, selection bias, shared experts, layers), identical
top-k sets for every (token, layer), and gate weights within 1e-4.

Precision: with an f32 KV cache and no flash attention llama.cpp's router logits
are ~1e-5 from transformers', so even the rank order of the k selected experts
agrees. With llama.cpp's defaults (f16 KV cache, flash attention auto) they move by
~1e-2, which can swap two selected experts of nearly equal score: that run checks
the sets only.

The checkpoints differ from tests/fixtures/tiny_moe.FAMILY_CONFIGS where llama.cpp
cannot run the transformers config as transformers does (docs/tracers.md):
Qwen2-MoE, Qwen3-MoE and Qwen3-Next are all-MoE (llama.cpp's graphs have no
``mlp_only_layers``); the config.json of DeepSeek-V3, dots.llm1 and MiniMax-M2
names ``scoring_func: sigmoid`` as the released checkpoints' does (transformers 5
does not save it; without it llama.cpp routes DeepSeek-V3 by softmax and cannot
route the other two); GLM-4.5's tokenizer has the special tokens its converter
looks up by name; OLMoE uses rms_norm_eps 1e-5, as released (the
converter writes 1e-5 whatever the config says); gpt-oss's YaRN has ``truncate:
true`` (llama.cpp always rounds the YaRN correction range; with the released
``truncate: false`` the router logits are ~2e-3 apart from position 1 on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch", reason="the [torch] extra (torch, transformers) is not installed")
pytest.importorskip("transformers", reason="the [torch] extra (transformers) is not installed")
pytest.importorskip("llama_cpp", reason="the [llama] extra (llama-cpp-python) is not installed")
gguf = pytest.importorskip("gguf", reason="the [llama] extra (gguf) is not installed")

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import llama_convert  # noqa: E402
import tiny_moe  # noqa: E402

from moesim.cli import cli  # noqa: E402
from moesim.traces import TraceFile, gating, load_routing  # noqa: E402
from moesim.traces.tracers import record_router, trace_hf, trace_llama  # noqa: E402

SEQ_LEN = 48
MAX_TOKENS = 96
GENERATE = 6
PRECISE = dict(kv_type="f32", flash_attn=False)

# family -> (config overrides for llama.cpp, extra config.json keys, converter arguments)
LLAMA_FAMILIES = {
    "qwen3_moe": (dict(mlp_only_layers=[]), {}, []),
    "qwen3_next": (dict(mlp_only_layers=[]), {}, ["--no-mtp"]),
    "qwen2_moe": (dict(mlp_only_layers=[]), {}, []),
    "mixtral": ({}, {}, []),
    "olmoe": (dict(rms_norm_eps=1e-5), {}, []),
    "deepseek_v3": ({}, {"scoring_func": "sigmoid"}, []),
    "gpt_oss": (dict(rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                          beta_slow=1.0, original_max_position_embeddings=4096, truncate=True)),
                {}, []),
    "deepseek_v2": ({}, {}, []),
    "glm4_moe": ({}, {}, []),
    "dots1": ({}, {"scoring_func": "sigmoid"}, []),
    "granitemoe": ({}, {}, []),
    "minimax_m2": ({}, {"scoring_func": "sigmoid"}, []),
}
# GLM's converter looks these special tokens up by name
TOKENIZER_EXTRA = {"glm4_moe": tiny_moe.GLM_SPECIAL}
# metadata both tracers must agree on
META_KEYS = ("family", "moe_layers", "dense_layers", "n_experts", "top_k", "gating", "norm_topk_prob",
             "routed_scaling_factor", "n_group", "topk_group", "n_shared_experts")


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """{family: (model dir, model, tokenizer, GGUF path or the converter's error)}: every
    family converted once per session, in one converter process."""
    conv, why = llama_convert.find_converter()
    if conv is None:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("families")
    built, jobs = {}, []
    for family, (over, extra, args) in LLAMA_FAMILIES.items():
        tok = tiny_moe.make_tokenizer(extra_special=TOKENIZER_EXTRA.get(family, ()))
        model_dir, model, _ = tiny_moe.build(family, d / family, tokenizer=tok, seed=7, **over)
        if extra:
            cfg = json.loads((model_dir / "config.json").read_text())
            (model_dir / "config.json").write_text(json.dumps({**cfg, **extra}, indent=2))
        out = d / f"{family}.gguf"
        built[family] = (model_dir, model, tok, out)
        jobs.append(dict(model=str(model_dir), out=str(out), outtype="f32", args=args))
    failed = llama_convert.convert(conv, jobs)
    return {f: (md, m, t, failed.get(str(out), out)) for f, (md, m, t, out) in built.items()}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    d = tmp_path_factory.mktemp("texts")
    (d / "prose.txt").write_text(tiny_moe.PROSE)
    (d / "code.txt").write_text(tiny_moe.CODE)
    return [str(d / "prose.txt"), str(d / "code.txt")]


def _family(converted, family):
    model_dir, model, tok, gguf_path = converted[family]
    if not isinstance(gguf_path, Path):
        pytest.fail(f"the llama.cpp converter failed on the tiny {family}: {gguf_path}")
    return model_dir, model, tok, gguf_path


@pytest.fixture(scope="module", params=sorted(LLAMA_FAMILIES))
def traced(request, converted, texts, tmp_path_factory):
    family = request.param
    model_dir, model, tok, gguf_path = _family(converted, family)
    d = tmp_path_factory.mktemp(f"traced-{family}")
    kw = dict(domains=["prose", "code"], seq_len=SEQ_LEN, max_tokens=MAX_TOKENS, dense=True)
    hf = trace_hf(model_dir, texts, d / "hf.parquet", model=model, tokenizer=tok, **kw)
    ll = trace_llama(gguf_path, texts, d / "llama.parquet", n_batch=SEQ_LEN, **PRECISE, **kw)
    return dict(family=family, dir=d, gguf=gguf_path, model=model, tok=tok, hf=hf, llama=ll, kw=kw)


def _cols(path, cols):
    t = pq.read_table(path, columns=cols)
    return {c: np.asarray(t.column(c).to_pylist()) for c in cols}


def _by_expert(sel, w):
    """Rows' (ids, weights) sorted by expert id: compares weights whatever the rank order."""
    order = np.argsort(sel, axis=-1)
    return np.take_along_axis(sel, order, -1), np.take_along_axis(w, order, -1)


def test_same_routing_metadata(traced):
    a, b = TraceFile(traced["hf"]).meta, TraceFile(traced["llama"]).meta
    for key in META_KEYS:
        assert getattr(b, key) == pytest.approx(getattr(a, key)), key
    if a.selection_bias is None:
        assert b.selection_bias is None
    else:
        np.testing.assert_allclose(np.asarray(b.selection_bias), np.asarray(a.selection_bias), atol=1e-7)
    assert b.bytes_per_expert["bf16"] == a.bytes_per_expert["bf16"]
    assert b.tracer["name"] == "moesim.llama_cpp"


def test_same_topk_sets_order_and_weights(traced):
    a, b = _cols(traced["hf"], ["seq", "pos", "layer", "token", "selected", "weights", "logits"]), \
        _cols(traced["llama"], ["seq", "pos", "layer", "token", "selected", "weights", "logits"])
    for key in ("seq", "pos", "layer", "token"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert len(a["seq"]) == 2 * MAX_TOKENS * len(TraceFile(traced["hf"]).meta.moe_layers)
    np.testing.assert_array_equal(np.sort(a["selected"], -1), np.sort(b["selected"], -1))
    sa, wa = _by_expert(a["selected"], a["weights"])
    sb, wb = _by_expert(b["selected"], b["weights"])
    np.testing.assert_allclose(wb, wa, atol=1e-4, rtol=0)
    np.testing.assert_allclose(b["logits"], a["logits"], atol=1e-3, rtol=0)


def test_decoded_routing_agrees_in_rank_order(traced):
    """Decoded (moesim ranks each row's experts by gate weight; the engines' own column
    order is not comparable: transformers' DeepSeek router uses an unsorted topk): with an
    f32 KV cache the rank order agrees too, except between experts whose weights tie."""
    ra, rb = load_routing(traced["hf"]), load_routing(traced["llama"])
    np.testing.assert_array_equal(np.sort(ra.sel, -1), np.sort(rb.sel, -1))
    _, wa = _by_expert(ra.sel, ra.w)
    _, wb = _by_expert(rb.sel, rb.w)
    np.testing.assert_allclose(wb, wa, atol=1e-4)
    differ = (ra.sel != rb.sel).any(axis=-1)
    for idx in zip(*np.nonzero(differ)):
        assert np.diff(np.sort(ra.w[idx])).min() < 1e-5, f"row {idx}: rank order differs without a tie"


def test_default_llama_settings_same_topk_sets_but_near_ties(traced):
    """llama.cpp as it runs by default (f16 KV cache, flash attention auto), micro-batched:
    router logits move by ~1e-2, which reorders selected experts of nearly equal score
    (so sets, not order) and, on a few rows, swaps the k-th expert for one whose score
    was within 0.05 of it: those rows must be such near-ties, and rare (< 2%)."""
    out = traced["dir"] / "default.parquet"
    trace_llama(traced["gguf"], *_texts_of(traced), out, n_batch=16, n_ubatch=8, **traced["kw"])
    a, b = _cols(traced["hf"], ["token", "layer", "selected", "logits"]), _cols(out, ["token", "selected"])
    np.testing.assert_array_equal(a["token"], b["token"])
    sa, sb = np.sort(a["selected"], -1), np.sort(b["selected"], -1)
    differ = np.flatnonzero((sa != sb).any(axis=1))
    assert len(differ) <= 0.02 * len(sa), f"{len(differ)} of {len(sa)} rows select another set"
    meta = TraceFile(traced["hf"]).meta
    for r in differ:
        bias = None
        if meta.selection_bias is not None:
            bias = np.asarray(meta.selection_bias)[list(meta.moe_layers).index(a["layer"][r])][None, :]
        score = gating.selection_scores(a["logits"][r][None, :], meta.gating, bias)[0]
        kth = score[sa[r]].min()
        swapped = np.setdiff1d(sb[r], sa[r])
        assert (score[swapped] >= kth - 0.05).all(), f"row {r}: {swapped} replaced a clearly better expert"


def _texts_of(traced):
    return (TraceFile(traced["hf"]).meta.source["texts"],)


def test_generate_records_decode_rows_routed_as_transformers(traced):
    """--generate N: N greedy decode steps after the prefill; transformers, run on the same
    prompt and then fed the same generated ids one at a time through its KV cache
    (record_router), routes every decode row the same way."""
    texts = _texts_of(traced)[0][:1]
    out = traced["dir"] / "generate.parquet"
    trace_llama(traced["gguf"], texts, out, seq_len=SEQ_LEN, max_tokens=SEQ_LEN, generate=GENERATE, dense=True,
                **PRECISE)
    b = load_routing(out)
    assert b.n_tokens == SEQ_LEN + GENERATE and b.n_sequences == 1
    assert (b.phase[:SEQ_LEN] == 0).all() and (b.phase[SEQ_LEN:] == 1).all()
    np.testing.assert_array_equal(b.pos, np.arange(SEQ_LEN + GENERATE))
    model = traced["model"]
    ids = b.token.astype(np.int64)
    ref = traced["dir"] / "generate-hf.parquet"
    with torch.no_grad(), record_router(model, ref, layout="dense"):
        cache = model(input_ids=torch.from_numpy(ids[None, :SEQ_LEN]), use_cache=True).cache
        for t in ids[SEQ_LEN:]:
            cache = model(input_ids=torch.tensor([[int(t)]]), cache=cache, use_cache=True).cache
    a = load_routing(ref)
    np.testing.assert_array_equal(a.phase, b.phase)
    np.testing.assert_array_equal(a.token, b.token)
    np.testing.assert_array_equal(np.sort(a.sel, -1), np.sort(b.sel, -1))
    _, wa = _by_expert(a.sel, a.w)
    _, wb = _by_expert(b.sel, b.w)
    np.testing.assert_allclose(wb, wa, atol=1e-4)


def test_cli_generate(converted, texts, tmp_path):
    _, _, _, gguf_path = _family(converted, "qwen3_moe")
    out = tmp_path / "gen.parquet"
    res = CliRunner().invoke(cli, ["trace", "llama", str(gguf_path), "--text", texts[0], "--seq-len", "32",
                                   "--max-tokens", "64", "--generate", "3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    r = load_routing(out)
    assert r.n_tokens == 64 + 2 * 3 and r.n_sequences == 2
    assert int((r.phase == 1).sum()) == 2 * 3
    assert TraceFile(out).meta.source["generate"] == 3


def _header_only_gguf(path: Path, arch: str, experts: int, groups: int = 0) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(2)
    if groups:
        w.add_expert_group_count(groups)
        w.add_expert_group_used_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch,experts,groups,message", [
    ("phimoe", 16, 0, "GGUF architecture 'phimoe' is not supported by moesim trace llama: llama.cpp routes PhiMoE"),
    ("arctic", 16, 0, "MoE architecture 'arctic' is not supported by moesim trace llama"),
    ("llama", 0, 0, "not an MoE model (architecture 'llama' with no experts)"),
    ("dots1", 16, 0, "names no expert gating function (dots1.expert_gating_func)"),
    ("deepseek2", 16, 4, "group-limited DeepSeek-V2 routing is not supported"),
])
def test_refuses_unsupported_architectures_in_one_line(tmp_path, arch, experts, groups, message):
    path = _header_only_gguf(tmp_path / "m.gguf", arch, experts, groups)
    (tmp_path / "t.txt").write_text("hello world")
    res = CliRunner().invoke(cli, ["trace", "llama", str(path), "--text", str(tmp_path / "t.txt"),
                                   "-o", str(tmp_path / "x.parquet")])
    assert res.exit_code == 2
    assert message in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.parquet").exists()
