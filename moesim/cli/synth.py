"""`moesim synth`: write a synthetic routing trace with a real model's geometry."""

from __future__ import annotations

import click

# The most tokens one synth run writes: its plan alone holds ~26 bytes a token before any routing is drawn
# (traces/synthetic.py plan_tokens; 10^9 tokens would allocate 7.45 GiB in one array).
MAX_TOKENS = 100_000_000


@click.command("synth")
@click.option("--preset", required=True, metavar="NAME",
              help="Model preset: qwen3-next-80b-a3b, qwen3-30b-a3b, qwen3-235b-a22b, mixtral-8x7b, deepseek-v3, "
                   "olmoe-1b-7b, gpt-oss-120b.")
@click.option("--tokens", required=True, type=click.IntRange(max=MAX_TOKENS),
              help=f"Tokens in all (each token has every MoE layer); at most {MAX_TOKENS:,}.")
@click.option("--seqs", default=1, show_default=True, type=int, help="Sequences the tokens are split into.")
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed; same seed, same trace.")
@click.option("--domains", default=None, metavar="A,B,...",
              help="Topic domains, e.g. code,prose,math,medical (the default); 'none' for no domain structure.")
@click.option("--candidates", default=None, type=int, metavar="M",
              help="Scored experts stored per row (default: the preset's, e.g. 32).")
@click.option("--prefill", default=0, show_default=True, type=int,
              help="Mark the first P positions of every sequence as prefill (the rest decode).")
@click.option("--layout", type=click.Choice(["ranked", "sparse"]), default="ranked", show_default=True,
              help="ranked: compact (ranked candidates and their logits); sparse: every candidate's id and logit "
                   "as lists, and lse (more bytes; the same replays).")
# hidden: 2 is the only generator; command lines recorded with --generator 2 still run, and 1 (the original
# numpy generator, removed) is refused with one line
@click.option("--generator", type=int, default=2, hidden=True)
@click.option("--lookahead", is_flag=True,
              help="Also write the lookahead column: per row, a noisy copy of the next MoE layer's selection "
                   "(synthetic; noise calibrated to a traced model, docs/synthetic.md).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Trace file to write (Parquet).")
def command(preset, tokens, seqs, seed, domains, candidates, prefill, layout, generator, lookahead, output):
    """Write a SYNTHETIC trace: the geometry of a real model, routing from a
    small generative model (per-layer Zipf popularity, domain-specific
    experts with topic switches, sticky experts across tokens, a dominant first
    choice). The metadata says synthetic: true. See docs/synthetic.md."""
    from moesim.cli.output import echo
    from moesim.traces.synthetic import parse_domains, synthesize

    # The metadata records the canonical equivalent command line (not argv), so the file is reproducible.
    path = synthesize(preset, tokens, seqs=seqs, seed=seed, domains=parse_domains(domains), path=output,
                      candidates=candidates, prefill=prefill, layout=layout, generator=generator,
                      lookahead=lookahead)
    echo(f"wrote {path} (synthetic, {preset}, {tokens} tokens in {seqs} sequence(s), seed {seed})")

