"""`moesim coupling`: how well one MoE layer's experts predict the next layer's."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, echo, echo_json
from moesim.errors import MoesimError

_LABELS = {
    "next-layer": "next-layer (transitions l -> l+1, sum)",
    "next-layer-best": "next-layer-best (transitions, max)",
    "frequency": "frequency (l+1's most requested)",
    "prev-token": "prev-token (l+1 at the token before)",
    "lookahead": "lookahead (the trace's column)",
    "chance": "chance (predict/E)",
}


@click.command("coupling")
@click.argument("trace", type=click.Path(dir_okay=False, path_type=str))
@click.option("--train-tokens", type=int, default=None,
              help="Learn the transition and popularity statistics on the first N tokens (in (seq, pos) order) "
                   "and measure on the rest. Default: half of the tokens.")
@click.option("--predict", type=int, default=None,
              help="Experts each predictor names for layer l+1 (default: top-k; prev-token and lookahead name at "
                   "most k).")
@click.option("--layer-range", default=None, metavar="FIRST-LAST",
              help="Only the MoE layers whose original index lies in FIRST..LAST (e.g. to leave out layers a "
                   "source duplicated).")
@click.option("--layers", "per_layer", is_flag=True, help="Also print the recall of every layer pair.")
@FORMAT_OPTION
def command(trace, train_tokens, predict, layer_range, per_layer, fmt):
    """Layer-to-layer predictability of TRACE's routing: for each MoE layer l and
    each token after the training prefix, predict the experts of layer l+1 from
    the experts of layer l (transition counts learned on the prefix: the
    next-layer prefetcher's signal), from layer l+1's most requested experts
    (frequency), from the previous token's experts at layer l+1 (prev-token) and,
    when the trace has one, from its lookahead column. Recall = share of the
    selected experts that were predicted (docs/coupling.md)."""
    from moesim.reports.coupling import coupling_trace

    d = coupling_trace(trace, train_tokens=train_tokens, predict=predict, layers=_range(layer_range))
    if fmt == "json":
        echo_json(d)
        return
    for line in render(d, per_layer):
        echo(line)


def _range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    a, sep, b = text.partition("-")
    try:
        lo, hi = int(a), int(b)
    except ValueError:
        lo, hi = 0, -1
    if not sep or lo > hi or lo < 0:
        raise MoesimError(f"--layer-range must be FIRST-LAST with 0 <= FIRST <= LAST, got {text!r}")
    return lo, hi


def render(d: dict, per_layer: bool = False) -> list[str]:
    out = [
        f"{d['trace']} ({d['model']}, {'SYNTHETIC trace' if d['synthetic'] else 'real routing'}): "
        f"{d['n_layers']} MoE layers x {d['experts']} experts, top-{d['top_k']}",
        f"trained on the first {d['train_tokens']} tokens, measured on {d['test_tokens']}; "
        f"each predictor names {d['predict']} experts of layer l+1",
        "",
        f"{'predictor':<38} {'recall':>7} {'gate-weighted':>13} {'beyond freq':>11} {'steps':>9}",
    ]
    for name, v in d["predictors"].items():
        rec = "-" if v["recall"] is None else f"{v['recall']:.3f}"
        wr = "-" if v["weighted_recall"] is None else f"{v['weighted_recall']:.3f}"
        steps = "-" if v["steps"] is None else str(v["steps"])
        bf = "-" if v["beyond_frequency"] is None else f"{v['beyond_frequency']:.3f}"
        out.append(f"{_LABELS.get(name, name):<38} {rec:>7} {wr:>13} {bf:>11} {steps:>9}")
    lift = d["lift_over_frequency"]
    out.append("")
    out.append("next-layer / frequency: " + ("-" if lift is None else f"{lift:.2f}x"))
    if per_layer:
        names = list(d["predictors"])
        out.append("")
        out.append(f"{'layers':<10} " + " ".join(f"{n:>10}" for n in names))
        for row in d["layers"]:
            cells = " ".join(f"{'-' if row[n] is None else format(row[n], '.3f'):>10}" for n in names)
            out.append(f"{str(row['layer']) + '->' + str(row['next']):<10} {cells}")
    return out
