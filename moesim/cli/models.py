"""`moesim models list` and `moesim models show`: the model presets."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, echo, echo_json, echo_kv, human_bytes
from moesim.errors import MoesimError


@click.group("models")
def models():
    """Model presets: MoE geometry, parameters, bytes per expert and per token.

    Every command that takes --model accepts a preset name or the path of a TOML
    file written like the presets (costmodel/presets/models/*.toml)."""


@models.command("list")
@FORMAT_OPTION
def models_list(fmt):
    """List the model presets: geometry, parameters, q4_k_m bytes."""
    from moesim.cli.hw import _table
    from moesim.costmodel.models import load_model, model_names

    rows = []
    for name in model_names():
        m = load_model(name)
        rows.append({"name": name, "hf_id": m.hf_id, "moe_layers": m.n_moe_layers, "experts": m.n_experts,
                     "top_k": m.top_k, "shared": m.n_shared_experts, "total_b": m.total_params() / 1e9,
                     "active_b": m.active_params(m.active_params_convention) / 1e9,
                     "published": f"{m.total_params_b:g}B/{m.active_params_b:g}B",
                     "expert_q4_k_m": m.bytes_per_expert("q4_k_m"), "file_q4_k_m": m.file_bytes("q4_k_m"),
                     "native_quant": m.native_quant})
    if fmt == "json":
        echo_json(rows)
        return
    for r in rows:
        r["expert_h"] = human_bytes(r["expert_q4_k_m"])
        r["file_h"] = human_bytes(r["file_q4_k_m"])
    _table(rows, [("name", "name"), ("moe_layers", "MoE layers"), ("experts", "experts"), ("top_k", "top-k"),
                  ("shared", "shared"), ("total_b", "total B"), ("active_b", "active B"),
                  ("published", "published"), ("expert_h", "expert q4_k_m"), ("file_h", "file q4_k_m"),
                  ("native_quant", "native")])
    click.echo("\nParameters derived from the architecture; 'active' uses each vendor's counting convention "
               "(`moesim models show NAME`).")


@models.command("show")
@click.argument("name")
@click.option("--quant", "quants", multiple=True,
              help="Quantizations to list bytes for (repeatable; default bf16, q8_0, q4_k_m and the native one).")
@FORMAT_OPTION
def models_show(name, quants, fmt):
    """Show preset NAME (or a TOML file): geometry, parameters by group, bytes per expert and per decoded token."""
    from moesim.costmodel.models import load_model

    m = load_model(name)
    s = m.summary()
    if quants:
        for q in quants:
            if q not in m.quant_names():
                raise MoesimError(f"unknown quantization {q!r} (known: {', '.join(m.quant_names())})")
        for key, fn in (("bytes_per_expert", m.bytes_per_expert), ("dense_bytes_per_token", m.dense_bytes_per_token),
                        ("active_bytes_per_token", m.active_bytes_per_token),
                        ("expert_bytes_total", m.expert_bytes_total), ("file_bytes", m.file_bytes)):
            s[key] = {q: fn(q) for q in quants}
    if fmt == "json":
        echo_json(s)
        return
    p = s["params"]
    a = dict(s["attention"])
    echo_kv([
        ("name", f"{s['name']} ({s['hf_id']})"), ("family", s["family"]), ("source", s["source"]),
        ("layers", f"{s['layers']} ({s['moe_layers']} MoE"
                   + (f", dense {s['dense_layers']}" if s["dense_layers"] else "") + ")"),
        ("experts", f"{s['experts']} routed, top-{s['top_k']}, {s['shared_experts']} shared; gating {s['gating']}"),
        ("hidden / expert FFN", f"{s['hidden_size']} / {s['moe_intermediate_size']}"),
        ("vocabulary", s["vocab_size"]),
        ("attention", ", ".join(f"{k}={v}" for k, v in a.items())),
        ("native format", s["native_quant"]),
        ("parameters", f"{p['total'] / 1e9:.2f}B total (published {s['published']['total_params_b']:g}B)"),
        ("active per token", f"{p['active_with_embeddings'] / 1e9:.2f}B with embeddings, "
                             f"{p['active_without_embedding_table'] / 1e9:.2f}B without the embedding table, "
                             f"{p['active_without_embeddings'] / 1e9:.2f}B without table and LM head "
                             f"(published {s['published']['active_params_b']:g}B, "
                             f"{s['published']['active_params_convention']})"),
        ("by group", {k: f"{v / 1e9:.3f}B" for k, v in p["by_group"].items()}),
        ("params/expert", s["params_per_expert"]),
    ])
    click.echo("")
    rows = [("quant", "bytes/expert", "dense bytes/token", "active bytes/token", "all experts", "file")]
    for q in s["bytes_per_expert"]:
        rows.append((q, human_bytes(s["bytes_per_expert"][q]), human_bytes(s["dense_bytes_per_token"][q]),
                     human_bytes(s["active_bytes_per_token"][q]), human_bytes(s["expert_bytes_total"][q]),
                     f"{human_bytes(s['file_bytes'][q])} ({s['file_bytes'][q] / 1e9:.1f} GB)"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        echo("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    click.echo(f"\nKV cache read per token at 4096 context (fp16): {human_bytes(s['kv_bytes_per_token_at_4096'])}")


command = models
