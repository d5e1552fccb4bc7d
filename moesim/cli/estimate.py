"""`moesim estimate`: the analytic bandwidth model, no trace needed."""

from __future__ import annotations

import click

from moesim.cli.output import FINITE, FORMAT_OPTION, FiniteRange, echo_json, echo_kv, human_bytes

FRACTION = FiniteRange(0.0, 1.0)


@click.command("estimate")
@click.option("--model", "model", required=True,
              help="Model preset name, TOML path or GGUF file (header and tensor index only; "
                   "see `moesim models list`).")
@click.option("--quant", default=None, help="Quantization mix: bf16, fp16, fp8, q8_0, q4_k_m, q4_k, iq4_xs, mxfp4, ... "
                                             "(default: the model's native format; a GGUF: its own tensors).")
@click.option("--hw", "hw", required=True, help="Hardware preset name or TOML path (see `moesim hw list`).")
@click.option("--vram-hit", type=FRACTION, default=None,
              help="Fraction of expert reads served from VRAM (default: what fits, see below).")
@click.option("--ram-hit", type=FRACTION, default=None,
              help="Fraction of the VRAM misses found in host RAM; the rest come from NVMe (default: what fits).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sequences decoded in lock step; each layer reads the union of their experts.")
@click.option("--miss", type=click.Choice(["fetch", "cpu", "hybrid"]), default=None,
              help="Experts not in VRAM: copy them to the GPU (fetch), compute them on the CPU where they lie "
                   "(cpu, llama.cpp-style), or compute them on the CPU and upload them into the cache in the "
                   "background (hybrid: expert-cache engines). Default: the engine's (fetch under ideal).")
@click.option("--engine", default=None,
              help="Engine profile: ideal (pure bandwidth), llama.cpp, llama.cpp-expert-cache, mixtral-offloading, "
                   "ktransformers, imp, or a TOML file: its per-layer, per-step and per-miss costs, CPU hand-off, NVMe "
                   "read size and write-back. Default: the machine file's [engine] (a calibrated machine), else "
                   "ideal.")
@click.option("--n-cpu-moe", "cpu_moe_layers", type=click.IntRange(min=0), default=None,
              help="llama.cpp --n-cpu-moe N: the experts of N MoE layers stay in host RAM, computed by the CPU.")
@click.option("--dense", type=click.Choice(["auto", "vram", "ram", "nvme"]), default="auto", show_default=True,
              help="Where the non-expert weights live (auto: VRAM if they fit, else split with the CPU).")
@click.option("--cold", is_flag=True, help="Nothing cached: every active byte, dense weights included, is read "
                                           "from NVMe (sets --vram-hit 0 --ram-hit 0 --dense nvme).")
@click.option("--context", type=click.IntRange(min=0), default=0, show_default=True,
              help="Tokens of context per sequence: each decoded token reads their KV cache, and the KV cache of "
                   "every sequence of the batch takes VRAM and host RAM before the experts do (0: not counted).")
@click.option("--zipf", type=FiniteRange(min=0.0), default=0.0, show_default=True,
              help="Per-layer expert popularity skew for the defaults (0: uniform access).")
@click.option("--union", type=FINITE, default=None,
              help="Distinct experts read per layer per step (default: expected union of --batch selections).")
@click.option("--prefill", "prefill", type=click.IntRange(min=0), default=0,
              help="Also cost a prompt of this many tokens (compute- or memory-bound, whichever is slower).")
@click.option("--speculative", type=click.IntRange(min=0), default=0, show_default=True, metavar="G",
              help="Speculative / multi-token-prediction decoding: a step verifies G drafted tokens plus one per "
                   "sequence, reading the union of their experts.")
@click.option("--accept", type=FRACTION, default=None, metavar="A",
              help="Fraction of drafted tokens accepted (a step yields 1 + A·G tokens per sequence; needed with "
                   "--speculative).")
@FORMAT_OPTION
def estimate(model, quant, hw, vram_hit, ram_hit, batch, miss, engine, cpu_moe_layers, dense, cold, context, zipf,
             union, prefill, speculative, accept, fmt):
    """Seconds per token from bandwidths alone: a what-if calculator with no trace.

    Decode is bandwidth-bound: each step reads the dense weights once, and per MoE
    layer its experts from VRAM, host RAM or NVMe, each at the effective bandwidth of
    its path plus a per-transfer latency. Defaults when hit fractions are not given:
    "what fits" -- VRAM keeps the dense weights, then as many experts as fit after the
    reserve; host RAM holds as many of the rest as fit; with --zipf 0 every expert is
    equally likely, so the hit fraction of a tier is the share of expert bytes it holds;
    when host RAM left after the KV cache cannot hold a step's working set, host
    reads go to NVMe (the page cache is flushed every step).
    """
    from moesim.costmodel.timing import estimate as run

    if cold:
        vram_hit, ram_hit, dense = 0.0, 0.0, "nvme"
    d = run(model, quant, hw, vram_hit=vram_hit, ram_hit=ram_hit, batch=batch, miss=miss, dense=dense,
            context=context, zipf=zipf, union=union, prefill_tokens=prefill, engine=engine,
            cpu_moe_layers=cpu_moe_layers, speculative=speculative, accept=accept)
    if fmt == "json":
        echo_json(d)
        return
    fits = d["what_fits"]
    rf = d["reads_fraction"]
    default_note = (" (default: what fits" + (f", zipf {zipf:g}" if zipf else ", uniform access") + ")") \
        if d["defaults"] else ""
    rows = [
        ("model / quant / hw", f"{d['model']} / {d['quant']} / {d['hw']} (engine {d['engine']})"),
        ("tokens/s", f"{d['tok_per_s']:.4g}" + (f" aggregate ({d['tok_per_s_per_seq']:.4g} per sequence)"
                                                 if batch > 1 else "")),
        ("ms/token", f"{1e3 * d['s_per_token']:.4g}" + (f" ({d['bound']}-bound)" if d["bound"] == "compute" else "")),
        ("expert reads", f"{d['experts_read_per_layer']:.4g} per layer per step; VRAM {rf['vram']:.1%}, "
                         f"host RAM {rf['ram']:.1%}, NVMe {rf['nvme']:.1%}{default_note}"),
        ("what fits", f"{fits['vram_expert_slots']} experts in VRAM, {fits['ram_expert_slots']} in host RAM, "
                      f"of {fits['total_experts']}"),
        ("dense weights", f"{d['dense_placement']} ({human_bytes(d['dense_bytes_per_token'])} per token)"),
        ("misses", {"fetch": "copied to the GPU", "cpu": "computed on the CPU",
                    "hybrid": "computed on the CPU, uploaded into the cache in the background"}[d["miss"]]),
        ("bytes/token", {k: human_bytes(v) for k, v in d["bytes_per_token"].items() if v}),
        ("time/step (ms)", {k: 1e3 * v for k, v in d["time_per_step"].items() if v}),
    ]
    mem = d["memory"]
    if context or mem["swap_bytes"] or mem["thrash"]:
        rows.append(("memory", f"KV cache {human_bytes(mem['kv_bytes_vram'])} in VRAM, "
                               f"{human_bytes(mem['kv_bytes_host'])} in host RAM; host RAM left for experts "
                               f"{human_bytes(mem['host_cache_bytes'])}"
                               + (f"; step working set {human_bytes(mem['working_set_bytes'])} does not fit: "
                                  "host reads from NVMe" if mem["thrash"] else "")
                               + (f"; {human_bytes(mem['swap_bytes'])} swapped in every step"
                                  if mem["swap_bytes"] else "")))
    if speculative:
        sp = d["speculative"]
        rows.append(("speculative", f"{sp['verified_per_seq']} tokens verified per sequence per step, "
                                    f"{sp['tokens_per_step']:.4g} yielded per step (accept {sp['accept']:g})"))
    if "prefill" in d:
        pf = d["prefill"]
        rows.append(("prefill", f"{pf['tokens']} tokens in {1e3 * pf['seconds']:.4g} ms ({pf['tok_per_s']:.4g} tok/s)"))
    echo_kv(rows)


command = estimate
