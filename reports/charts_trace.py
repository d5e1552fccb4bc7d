"""Charts of one trace: hit rate and substitutions over tokens with the domain segments, expert
overlap between domains, and the gate-weight distribution. Every builder aggregates first
(rolling windows sampled at a few hundred tokens, histograms, a D x D matrix)."""

from __future__ import annotations

import numpy as np

from moesim.reports.charts import PLOT_WIDTH, Figure, check_rows, title
from moesim.reports.profile import GATE_THRESHOLD
from moesim.simulator.counters import COUNTER_NAMES

SERIES_POINTS = 400
MAX_RULES = 60
MAX_SEGMENTS = 2000  # domain runs drawn one by one; more are binned
X_TITLE = "normalized gate weight w (sums to 1 over the k selected experts)"
GATE_BIN = 0.025  # 0.15 is a bin edge, so the threshold line never splits a bar

_C = {name: i for i, name in enumerate(COUNTER_NAMES)}


def rolling_window(n_tokens: int) -> int:
    """Tokens per rolling window: about 1/40 of the trace, at least 16 (shorter is all noise)."""
    return max(16, min(n_tokens, n_tokens // 40))


def token_series(result, label: str, window: int, points: int = SERIES_POINTS):
    """Rolling hit rate and substitution rate (% of the window's requests) of one replay,
    sampled at <= ``points`` steps. A sample at step t covers steps (t - window, t]."""
    import polars as pl

    c = result.token_counts
    req = np.concatenate([[0], np.cumsum(c[:, _C["requests"]])])
    hits = np.concatenate([[0], np.cumsum(c[:, _C["hits"]])])
    subs = np.concatenate([[0], np.cumsum(c[:, _C["substitutions"]] + c[:, _C["drops"]])])
    mass = np.concatenate([[0.0], np.cumsum(result.token_mass)])
    T = len(c)
    window = min(window, T)
    ends = np.unique(np.linspace(window, T, min(points, T - window + 1)).round().astype(np.int64))
    starts = ends - window
    r = (req[ends] - req[starts]).astype(np.float64)
    r[r == 0] = np.nan
    L = len(result.layer_ids)
    return pl.DataFrame({
        "policy": [label] * len(ends),
        "token": ends - 1,
        "hit_rate_pct": 100 * (hits[ends] - hits[starts]) / r,
        "substituted_pct": 100 * (subs[ends] - subs[starts]) / r,
        "mass_per_step": (mass[ends] - mass[starts]) / (window * L),
    })


def domain_segments(routing, max_segments: int = MAX_SEGMENTS):
    """Runs of consecutive tokens with the same (sequence, domain): start, end (exclusive), domain.
    Beyond MAX_DOMAINS domains, those with fewer tokens are "(other domains)"; beyond ``max_segments``
    runs, the strip is drawn in equal bins of tokens, each labelled with its most common domain (a
    strip of 640 pixels cannot show more)."""
    import polars as pl

    from moesim.reports.profile import MAX_DOMAINS, top_domains

    raw = np.asarray(routing.domain).astype(np.int64)
    seq = np.asarray(routing.seq)
    T = len(raw)
    kept, _ = top_domains(raw, MAX_DOMAINS)
    labels = [routing.domain_names[c] for c in kept] + ["(no domain)", "(other domains)"]
    lut = np.full(len(routing.domain_names) + 1, len(labels) - 1, dtype=np.int64)  # index -1: no domain
    lut[kept] = np.arange(len(kept))
    lut[-1] = len(labels) - 2
    dom = lut[raw]
    seq_start = np.concatenate([[False], seq[1:] != seq[:-1]])
    change = np.flatnonzero((dom[1:] != dom[:-1]) | seq_start[1:]) + 1
    if len(change) + 1 > max_segments:
        width = -(-T // (max_segments // 2))
        bins = np.arange(T) // width
        hist = np.zeros((int(bins[-1]) + 1, len(labels)), dtype=np.int64)
        np.add.at(hist, (bins, dom), 1)
        label = hist.argmax(axis=1)
        new_seq = np.zeros(len(label), dtype=bool)
        new_seq[bins[seq_start]] = True
        new_seq[0] = False
        keep = np.concatenate([[True], (label[1:] != label[:-1]) | new_seq[1:]])
        starts = np.flatnonzero(keep) * width
        ends = np.concatenate([starts[1:], [T]])
        return pl.DataFrame({"start": starts, "end": ends, "domain": [labels[i] for i in label[keep]],
                             "new_sequence": new_seq[keep]})
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [T]])
    return pl.DataFrame({"start": starts, "end": ends, "domain": [labels[i] for i in dom[starts]],
                         "new_sequence": seq_start[starts]})


def rolling_chart(series, segments, *, synthetic: bool, window: int, budget_note: str) -> Figure:
    """Two stacked panels over tokens (hit rate, substituted share) with a strip of domain segments
    on top and a rule at every domain or sequence boundary."""
    import altair as alt
    import polars as pl

    check_rows(series, "rolling series")
    check_rows(segments, "domain segments")
    has_domains = segments["domain"].n_unique() > 1 or segments["domain"][0] != "(no domain)"
    T = int(segments["end"].max())
    x_scale = alt.Scale(domain=[0, T], nice=False, zero=True)
    x_title = "token (replay order: sequence, then position)"
    bounds = segments.filter(pl.col("start") > 0)
    dense = bounds.height > MAX_RULES
    if dense:  # a rule per topic change would hide the lines: keep the sequence starts, the strip shows the rest
        bounds = bounds.filter(pl.col("new_sequence"))
    rule_note = ("solid lines: new sequences (domain changes: the strip)" if dense
                 else "dashed lines: domain changes, solid lines: new sequences" if bounds.height
                 else "one sequence, no domain changes")
    rules = alt.Chart(bounds).mark_rule(strokeWidth=0.8).encode(
        x=alt.X("start:Q", scale=x_scale),
        # a new sequence starts from a cold context: a solid line; a topic change inside one: dashed
        strokeDash=alt.condition("datum.new_sequence", alt.value([1, 0]), alt.value([3, 3])),
        color=alt.condition("datum.new_sequence", alt.value("#333"), alt.value("#999")),
        tooltip=[alt.Tooltip("start:Q", title="boundary at token"), alt.Tooltip("domain:N", title="next domain"),
                 alt.Tooltip("new_sequence:N", title="new sequence")],
    )
    strip = alt.Chart(segments).mark_rect().encode(
        x=alt.X("start:Q", scale=x_scale, axis=None),
        x2="end:Q",
        color=alt.Color("domain:N", title="domain", scale=alt.Scale(scheme="set2")),
        tooltip=["domain:N", alt.Tooltip("start:Q", title="first token"), alt.Tooltip("end:Q", title="end token")],
    ).properties(width=PLOT_WIDTH, height=16, title=alt.TitleParams("domain of each token" if has_domains
                                                                    else "no domain column: sequences only",
                                                                    fontSize=12, anchor="start", fontWeight="normal"))
    policy = alt.Color("policy:N", title="policy")

    def panel(field_name: str, y_title: str, domain=None, bottom=True):
        x_axis = alt.Axis(title=x_title) if bottom else alt.Axis(title=None, labels=False)
        line = alt.Chart(series).mark_line(strokeWidth=1.4).encode(
            x=alt.X("token:Q", scale=x_scale, axis=x_axis),
            y=alt.Y(f"{field_name}:Q", title=y_title,
                    scale=alt.Scale(domain=domain) if domain else alt.Undefined),
            color=policy,
            tooltip=["policy:N", "token:Q", alt.Tooltip(f"{field_name}:Q", format=".2f", title=y_title)],
        )
        return alt.layer(rules, line).properties(width=PLOT_WIDTH, height=180)

    panels = alt.vconcat(
        panel("hit_rate_pct", "hit rate (% of requests)", [0, 100], bottom=False),
        panel("substituted_pct", "substituted or dropped (% of requests)"),
        spacing=8,
    )
    chart = alt.vconcat(strip, panels, spacing=6).resolve_scale(color="independent").properties(
        title=title("Hit rate and substitutions over the trace", synthetic,
                    f"rolling window of {window} tokens; {budget_note}; {rule_note}"))
    lines_said = {
        True: "solid vertical lines mark a new sequence (the cache re-warms); domain changes are too many to draw "
              "and show in the strip",
        False: "vertical lines mark a change of domain (dashed) or a new sequence (solid), where the cache has to "
               "re-warm" if bounds.height else "there is one sequence and no domain change",
    }[dense]
    caption = (f"Rolling hit rate and share of substituted or dropped requests over the trace, in windows of "
               f"{window} tokens, for the named policies ({budget_note}). The strip on top colours each token by "
               f"its domain; {lines_said}.")
    return Figure("rolling_hit_rate", chart, caption)


def similarity_chart(sim: dict, *, synthetic: bool) -> Figure:
    """The profile's D x D weighted-Jaccard matrix of expert use between domains."""
    import altair as alt
    import polars as pl

    names = sim["domains"]
    rows = [{"a": a, "b": b, "similarity": float(sim["matrix"][i][j])}
            for i, a in enumerate(names) for j, b in enumerate(names)]
    frame = check_rows(pl.DataFrame(rows), "domain similarity")
    base = alt.Chart(frame).encode(
        x=alt.X("a:N", title="domain", sort=names, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("b:N", title="domain", sort=names),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("similarity:Q", title="weighted Jaccard", scale=alt.Scale(domain=[0, 1], scheme="blues")),
        tooltip=["a:N", "b:N", alt.Tooltip("similarity:Q", format=".3f")],
    )
    text = base.mark_text(fontSize=14).encode(
        text=alt.Text("similarity:Q", format=".2f"),
        color=alt.condition("datum.similarity > 0.6", alt.value("white"), alt.value("black")),
    )
    shown = (f"; the {len(names)} domains with the most tokens of {sim['domains_total']}"
             if sim.get("domains_total") else "")
    chart = alt.layer(cells, text).properties(
        width=PLOT_WIDTH, height=max(240, 60 * len(names)),
        title=title("Expert overlap between domains", synthetic,
                    "weighted Jaccard of expert-request shares, mean over layers (1 = same experts, 0 = disjoint)"
                    + shown))
    caption = ("How much two domains use the same experts: per layer, the weighted Jaccard similarity of the "
               "domains' expert-request distributions, averaged over layers (definition: docs/profile.md). "
               "Low values mean a cache warmed on one domain misses on the other" + shown + ".")
    return Figure("domain_similarity", chart, caption)


def gate_histogram_frame(w: np.ndarray):
    """Per gate-weight bin, the share (%) of first choices and, apart, of the other selected experts (each
    group sums to 100%: first choices are only 1/k of all selections, and would vanish on a common scale)."""
    import polars as pl

    w = np.asarray(w, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, int(round(1 / GATE_BIN)) + 1)
    first, _ = np.histogram(w[..., 0].ravel(), bins=edges)
    rest, _ = np.histogram(w[..., 1:].ravel(), bins=edges)
    frames = []
    for name, counts in (("first choice (rank 1)", first), ("ranks 2..k", rest)):
        total = max(int(counts.sum()), 1)
        frames.append(pl.DataFrame({"rank": [name] * len(counts), "lo": edges[:-1], "hi": edges[1:],
                                    "share_pct": 100 * counts / total, "count": counts}))
    return pl.concat(frames)


def gate_chart(w: np.ndarray, *, synthetic: bool, threshold: float = GATE_THRESHOLD) -> Figure:
    import altair as alt
    import polars as pl

    frame = check_rows(gate_histogram_frame(w), "gate weights")
    w64 = np.asarray(w, dtype=np.float64)
    above = 100 * float((w64 >= threshold).mean())
    above_rest = 100 * float((w64[..., 1:] >= threshold).mean()) if w64.shape[-1] > 1 else float("nan")
    rule_data = pl.DataFrame({"w": [threshold], "label": [f"0.15 rule: fetch if w >= {threshold:g}"]})

    def panel(name: str, colour: str, bottom: bool):
        bars = alt.Chart(frame).transform_filter(alt.datum.rank == name).mark_bar(
            color=colour, stroke="white", strokeWidth=0.3).encode(
            x=alt.X("lo:Q", title=X_TITLE if bottom else None, scale=alt.Scale(domain=[0, 1]), bin="binned",
                    axis=alt.Axis(labels=bottom)),
            x2="hi:Q",
            y=alt.Y("share_pct:Q", title=f"% of {'first choices' if name.startswith('first') else 'ranks 2..k'}"),
            tooltip=["rank:N", alt.Tooltip("lo:Q", title="from w"), alt.Tooltip("hi:Q", title="to w"),
                     alt.Tooltip("share_pct:Q", format=".2f", title="% of the group"), "count:Q"],
        )
        rule = alt.Chart(rule_data).mark_rule(color="#d62728", strokeWidth=2, strokeDash=[6, 3]).encode(x="w:Q")
        layers = [bars, rule]
        if not bottom:
            layers.append(alt.Chart(rule_data).mark_text(align="left", dx=5, dy=6, color="#d62728", baseline="top")
                          .encode(x="w:Q", y=alt.value(0), text="label:N"))
        return alt.layer(*layers).properties(width=PLOT_WIDTH, height=170,
                                             title=alt.TitleParams(name, fontSize=13, anchor="start"))

    chart = alt.vconcat(panel("first choice (rank 1)", "#4c78a8", False), panel("ranks 2..k", "#f58518", True),
                        spacing=10).properties(
        title=title("Gate-weight distribution of the selected experts", synthetic,
                    f"{above:.1f}% of selected experts have w >= {threshold:g} ({above_rest:.1f}% of ranks 2..k); "
                    f"mean first-choice weight {float(w64[..., 0].mean()):.3f}"))
    caption = (f"Distribution of the normalized gate weights of every selected expert (all tokens and layers): "
               f"first choices (top) and the other selected experts (bottom), each panel in % of its own group "
               f"(first choices are 1 in k selections). The dashed line is the 0.15 rule's threshold: a miss below "
               f"it (and not the first choice) is substituted instead of fetched; {above:.1f}% of all selected "
               "experts lie at or above it.")
    return Figure("gate_weights", chart, caption)


__all__ = ["token_series", "domain_segments", "rolling_chart", "rolling_window", "similarity_chart",
           "gate_histogram_frame", "gate_chart"]
