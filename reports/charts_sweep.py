"""Charts of a sweep: hit rate against cache size per eviction policy, time per token against
substituted mass (Pareto front and named presets marked), speed-up over fetch-all per policy, and
per-layer hit rates. Input: the report's normalized sweep rows (``load_results`` in report.py):
one row per config with size (fraction of experts), size_label, policy, preset, eviction, miss,
hit_rate, substitution_rate, mass_per_step, s_per_token, speedup, pareto."""

from __future__ import annotations

from typing import Any

from moesim.reports.charts import EVICTION_ORDER, Figure, check_rows, title

MISS_ORDER = ["fetch-all", "threshold:0.15", "first-choice", "substitute", "drop", "cpu"]
SHAPES = ["circle", "square", "triangle-up", "diamond", "cross", "triangle-down", "triangle-left", "stroke"]


def _evictions(names) -> list[str]:
    known = [e for e in EVICTION_ORDER if e in names]
    return known + sorted(set(names) - set(known))


def hit_rate_curve_chart(curve, *, synthetic: bool, source: str, marks=None) -> Figure:
    """``curve``: eviction, size (fraction of experts), hit_rate (0..1). ``marks``: sizes to draw as
    light vertical rules (the sweep's budgets)."""
    import altair as alt
    import polars as pl

    frame = check_rows(curve.with_columns((100 * pl.col("size")).alias("size_pct"),
                                          (100 * pl.col("hit_rate")).alias("hit_pct")), "hit-rate curve")
    if "method" not in frame.columns:
        frame = frame.with_columns(pl.lit("replay").alias("method"))
    order = _evictions(frame["eviction"].unique().to_list())
    x = alt.X("size_pct:Q", title="cache budget (% of each layer's experts)", scale=alt.Scale(zero=True))
    y = alt.Y("hit_pct:Q", title="hit rate (% of expert requests)", scale=alt.Scale(domain=[0, 100]))
    color = alt.Color("eviction:N", title="eviction", sort=order)
    tooltip = ["eviction:N", alt.Tooltip("size_pct:Q", format=".2f", title="budget (%)"),
               alt.Tooltip("hit_pct:Q", format=".2f", title="hit rate (%)"), "method:N"]
    base = alt.Chart(frame).encode(x=x, y=y, color=color)
    line = base.mark_line(strokeWidth=1.8).encode(tooltip=tooltip)
    # points where a replay measured the curve; a one-pass (stack-distance) curve is exact at every size
    points = base.transform_filter("datum.method != 'stack-distance'").mark_point(filled=True, size=30) \
        .encode(tooltip=tooltip)
    layers = [line, points]
    if marks:
        rules = pl.DataFrame({"size_pct": [100 * m for m in marks]})
        layers.insert(0, alt.Chart(rules).mark_rule(color="#bbb", strokeDash=[2, 2]).encode(x="size_pct:Q"))
    chart = alt.layer(*layers).properties(
        width=560, height=320,
        title=title("Hit rate against cache budget, fetch-all", synthetic,
                    f"{source}; dotted lines: the budgets of the tables" if marks else source))
    caption = ("Share of expert requests that hit the GPU cache when every miss is fetched, against the cache "
               f"budget, per eviction policy ({source}). Cold start, except static, which pins each layer's most "
               "requested experts of the whole trace from the first token (so it can beat Belady's cold start at "
               "large budgets); Belady evicts with knowledge of the future, the bound for the other policies.")
    return Figure("hit_rate_vs_budget", chart, caption)


def pareto_chart(rows, *, synthetic: bool, priced_as: str) -> Figure:
    """Time per token against substituted mass per step, one panel per cache size."""
    import altair as alt
    import polars as pl

    frame = rows.filter(pl.col("s_per_token").is_not_null()).with_columns(
        (1e3 * pl.col("s_per_token")).alias("ms_per_token"),
        pl.col("preset").fill_null(""),
    )
    names = sorted({p for p in frame["preset"].to_list() if p})
    frame = frame.with_columns(pl.col("preset").is_in(names[1::2]).alias("label_below")).select(
        "policy", "preset", "label_below", "eviction", "miss", "size", "size_label", "ms_per_token", "mass_per_step",
        "speedup", "hit_rate", "pareto")
    check_rows(frame, "time vs mass")
    misses = [m for m in MISS_ORDER if m in frame["miss"].unique().to_list()]
    misses += sorted(set(frame["miss"].unique().to_list()) - set(misses))
    evictions = _evictions(frame["eviction"].unique().to_list())
    # sqrt: the useful policies sit near zero mass, next to never-fetching ones near 1
    x = alt.X("mass_per_step:Q", title="substituted gate mass per step (sqrt scale)",
              scale=alt.Scale(type="sqrt", domain=[0, max(0.05, float(frame["mass_per_step"].max() or 0))]))
    y = alt.Y("ms_per_token:Q", title="time per token (ms)", scale=alt.Scale(zero=True))
    tooltip = ["policy:N", "preset:N", alt.Tooltip("ms_per_token:Q", format=".2f", title="ms per token"),
               alt.Tooltip("mass_per_step:Q", format=".4f", title="mass per step"),
               alt.Tooltip("speedup:Q", format=".2f", title="speed-up vs fetch-all"),
               alt.Tooltip("hit_rate:Q", format=".1%", title="hit rate")]
    base = alt.Chart().encode(x=x, y=y)
    points = base.mark_point(filled=True, size=45, opacity=0.75).encode(
        color=alt.Color("miss:N", title="miss policy", sort=misses),
        shape=alt.Shape("eviction:N", title="eviction", sort=evictions, scale=alt.Scale(range=SHAPES)),
        tooltip=tooltip,
    )
    front = base.transform_filter("datum.pareto").mark_line(color="black", strokeWidth=1.2, interpolate="step-after",
                                                             opacity=0.7).encode(order="mass_per_step:Q")
    preset = base.transform_filter("datum.preset != ''")
    rings = preset.mark_point(size=220, color="black", strokeWidth=1.5, filled=False).encode(tooltip=tooltip)
    # alternate labels above and below so neighbouring presets (quality-first, speed-first) stay readable
    label: dict[str, Any] = dict(align="left", dx=9, fontSize=11, fontWeight="bold")
    labels_above = preset.transform_filter("!datum.label_below").mark_text(dy=-8, **label).encode(text="preset:N")
    labels_below = preset.transform_filter("datum.label_below").mark_text(dy=12, **label).encode(text="preset:N")
    sizes = frame.select("size", "size_label").unique().sort("size")["size_label"].to_list()
    chart = alt.layer(points, front, rings, labels_above, labels_below, data=frame).properties(
        width=260, height=280).facet(
        column=alt.Column("size_label:N", title=None, sort=sizes),
    ).properties(title=title("Time per token against substituted gate mass", synthetic,
                             f"priced as {priced_as}; black line: Pareto front of each budget; "
                             "ringed: named presets"))
    caption = ("Each point is one policy configuration: the time per decoded token on the priced machine against "
               "the substituted gate mass per step (a proxy for the perplexity cost; r ~ 0.92 in the published "
               "study). Points on the black line are Pareto-optimal within their budget (no other config is both "
               "faster and substitutes less mass); ringed points are the named presets.")
    return Figure("time_vs_mass", chart, caption)


def speedup_chart(rows, *, synthetic: bool, priced_as: str) -> Figure:
    """Speed-up over fetch-all (same eviction and budget) per policy, a dot per cache size."""
    import altair as alt
    import polars as pl

    frame = rows.filter(pl.col("speedup").is_not_null()).with_columns(
        pl.when(pl.col("preset").is_not_null()).then(pl.col("policy") + "  [" + pl.col("preset") + "]")
        .otherwise(pl.col("policy")).alias("row")).select("row", "policy", "preset", "size", "size_label", "speedup",
                                                          "s_per_token")
    check_rows(frame, "speed-up")
    order = (frame.group_by("row").agg(pl.col("speedup").max().alias("best"))
             .sort(["best", "row"], descending=[True, False])["row"].to_list())
    sizes = frame.select("size", "size_label").unique().sort("size")["size_label"].to_list()
    dots = alt.Chart(frame).mark_point(filled=True, size=60).encode(
        x=alt.X("speedup:Q", title="speed-up over fetch-all (x, same eviction and budget)",
                scale=alt.Scale(zero=False)),
        y=alt.Y("row:N", title=None, sort=order, axis=alt.Axis(labelLimit=320)),
        color=alt.Color("size_label:N", title="budget", sort=sizes, scale=alt.Scale(scheme="viridis")),
        tooltip=["policy:N", "preset:N", "size_label:N", alt.Tooltip("speedup:Q", format=".2f"),
                 alt.Tooltip("ms_per_token:Q", format=".2f", title="ms per token")],
    ).transform_calculate(ms_per_token="datum.s_per_token * 1000")
    one = alt.Chart(pl.DataFrame({"x": [1.0]})).mark_rule(color="#d62728", strokeDash=[4, 3]).encode(x="x:Q")
    chart = alt.layer(one, dots).properties(
        width=480, height=alt.Step(15),
        title=title("Speed-up over fetch-all per policy", synthetic,
                    f"priced as {priced_as}; dashed line: fetch-all (1x); [name]: named preset"))
    caption = ("Time per token of fetch-all divided by the policy's, with the same eviction and budget, one dot per "
               "budget; policies sorted by their best speed-up. Above 1 the policy is faster than fetching every "
               "miss (it substitutes, computes on the CPU or keeps a better cache).")
    return Figure("speedup", chart, caption)


def layer_heatmap(rows, layers, *, synthetic: bool) -> Figure:
    """Per-layer hit rate of the fetch-all config of each eviction and of the named presets, per size."""
    import altair as alt
    import polars as pl

    chosen = rows.filter((pl.col("miss") == "fetch-all") & pl.col("admit").is_null() & (pl.col("batch") == 1)
                         | pl.col("preset").is_not_null())
    chosen = chosen.with_columns(
        pl.when(pl.col("preset").is_not_null()).then(pl.col("policy") + "  [" + pl.col("preset") + "]")
        .otherwise(pl.col("policy")).alias("row"))
    frame = layers.select("row_key", "layer", "hit_rate") \
        .join(chosen.select("row_key", "row", "size", "size_label"), on="row_key", how="inner") \
        .select("row", "size", "size_label", "layer", (100 * pl.col("hit_rate")).alias("hit_pct"))
    check_rows(frame, "layer heatmap")
    row_order = chosen.sort(["preset", "eviction"], nulls_last=False)["row"].unique(maintain_order=True).to_list()
    sizes = frame.select("size", "size_label").unique().sort("size")["size_label"].to_list()
    n_layers = frame["layer"].n_unique()
    chart = alt.Chart(frame).mark_rect().encode(
        x=alt.X("layer:O", title="MoE layer (model's layer index)",
                axis=alt.Axis(labelAngle=0, values=_tick_values(sorted(frame["layer"].unique().to_list())))),
        y=alt.Y("row:N", title=None, sort=row_order, axis=alt.Axis(labelLimit=320)),
        color=alt.Color("hit_pct:Q", title="hit rate (%)", scale=alt.Scale(scheme="viridis")),
        tooltip=["row:N", "size_label:N", "layer:O", alt.Tooltip("hit_pct:Q", format=".2f", title="hit rate (%)")],
    ).properties(width=max(240, 12 * n_layers), height=alt.Step(16)).facet(
        row=alt.Row("size_label:N", title=None, sort=sizes, header=alt.Header(labelAngle=0, labelAlign="left")),
    ).properties(title=title("Hit rate per MoE layer", synthetic,
                             "fetch-all with each eviction, and the named presets [name]"))
    caption = ("Hit rate of every MoE layer, per budget, for fetch-all under each eviction policy and for the "
               "named presets. Layers whose routing is less predictable show as darker columns.")
    return Figure("layer_hit_rate", chart, caption)


def _tick_values(layers: list[int]) -> list[int]:
    step = max(1, len(layers) // 12)
    return layers[::step]


__all__ = ["hit_rate_curve_chart", "pareto_chart", "speedup_chart", "layer_heatmap"]
