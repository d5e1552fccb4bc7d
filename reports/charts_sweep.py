"""Charts of a sweep: hit rate against cache size per eviction policy, time per token against
substituted mass (Pareto front and named presets marked), speed-up over fetch-all per policy, and
per-layer hit rates. Input: the report's normalized sweep rows (``load_results`` in report.py):
one row per config with size (fraction of experts), size_label, policy, preset, eviction, miss,
hit_rate, substitution_rate, mass_per_step, s_per_token, speedup, pareto; rows replayed with --ci
also carry <statistic>_low/_high, drawn as error bars (docs/uncertainty.md)."""

from __future__ import annotations

from typing import Any

from moesim.reports.charts import EVICTION_ORDER, PLOT_WIDTH, Figure, check_rows, title

MISS_ORDER = ["fetch-all", "threshold:0.15", "first-choice", "substitute", "drop", "cpu"]
SHAPES = ["circle", "square", "triangle-up", "diamond", "cross", "triangle-down", "triangle-left", "stroke"]


def has_intervals(frame, column: str) -> bool:
    """The frame has the bounds of ``column`` (``<column>_low``/``_high``) on at least one row."""
    low = f"{column}_low"
    return low in frame.columns and f"{column}_high" in frame.columns and frame[low].is_not_null().any()


ERROR_BAR: dict[str, Any] = dict(clip=True, ticks=True, thickness=1.2)


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
    intervals = has_intervals(frame, "hit_rate")
    if intervals:
        frame = frame.with_columns((100 * pl.col("hit_rate_low")).alias("low_pct"),
                                   (100 * pl.col("hit_rate_high")).alias("high_pct"))
    order = _evictions(frame["eviction"].unique().to_list())
    x = alt.X("size_pct:Q", title="cache budget (% of each layer's experts)", scale=alt.Scale(zero=True))
    y = alt.Y("hit_pct:Q", title="hit rate (% of expert requests)", scale=alt.Scale(domain=[0, 100]))
    # the legend shows lines (a band layer would otherwise turn its symbols into faded squares)
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=2.5, symbolOpacity=1) if intervals else alt.Undefined
    color = alt.Color("eviction:N", title="eviction", sort=order, legend=legend)
    tooltip = ["eviction:N", alt.Tooltip("size_pct:Q", format=".2f", title="budget (%)"),
               alt.Tooltip("hit_pct:Q", format=".2f", title="hit rate (%)"), "method:N"]
    base = alt.Chart(frame).encode(x=x, y=y, color=color)
    line = base.mark_line(strokeWidth=1.8).encode(tooltip=tooltip)
    # points where a replay measured the curve; a one-pass (stack-distance) curve is exact at every size
    points = base.transform_filter("datum.method != 'stack-distance'").mark_point(filled=True, size=30) \
        .encode(tooltip=tooltip)
    layers = [line, points]
    if intervals:
        bounds = alt.Chart(frame.filter(pl.col("hit_rate_low").is_not_null())).encode(x=x, color=color)
        # the one-pass LRU curve has an interval at every size: a band; replayed points get error bars
        layers.insert(0, bounds.transform_filter("datum.method == 'stack-distance'").mark_area(opacity=0.18)
                      .encode(y="low_pct:Q", y2="high_pct:Q"))
        layers.append(bounds.transform_filter("datum.method != 'stack-distance'").mark_errorbar(**ERROR_BAR)
                      .encode(y=alt.Y("low_pct:Q", title="hit rate (% of expert requests)"), y2="high_pct:Q"))
    if marks:
        rules = pl.DataFrame({"size_pct": [100 * m for m in marks]})
        layers.insert(0, alt.Chart(rules).mark_rule(color="#bbb", strokeDash=[2, 2]).encode(x="size_pct:Q"))
    sub = f"{source}; dotted lines: the budgets of the tables" if marks else source
    chart = alt.layer(*layers).properties(
        width=PLOT_WIDTH, height=340,
        title=title("Hit rate against cache budget, fetch-all", synthetic,
                    [sub, "bands and bars: confidence intervals (docs/uncertainty.md)"] if intervals else sub))
    caption = ("Share of expert requests that hit the GPU cache when every miss is fetched, against the cache "
               f"budget, per eviction policy ({source}). Cold start, except static, which pins each layer's most "
               "requested experts of the whole trace from the first token (so it can beat Belady's cold start at "
               "large budgets); Belady evicts with knowledge of the future, the bound for the other policies.")
    if intervals:
        caption += (" Shaded bands (LRU, every size) and error bars (replayed points): percentile-bootstrap "
                    "confidence intervals over the trace's sequences or blocks of tokens, the cache state of the one "
                    "replay taken as given.")
    return Figure("hit_rate_vs_budget", chart, caption)


def _baseline_name(rows) -> str:
    names = sorted({b for b in rows["baseline"].to_list() if b}) if "baseline" in rows.columns else []
    return ", ".join(names) or "the baseline"


def _off_chart(frame, limit: float) -> list[str]:
    """The configs slower than the plotted range, named (with their time) for the subtitle."""
    import polars as pl

    off = frame.filter(pl.col("ms_per_token") > limit).sort("ms_per_token")
    if off.height == 0:
        return []
    names = [f"{p}{f' [{n}]' if n else ''} {ms:.1f} ms" for p, n, ms in
             off.unique(["policy", "preset"], maintain_order=True).select("policy", "preset", "ms_per_token").rows()]
    return _lines(f"off the chart, slower than {limit:.1f} ms: " + "; ".join(names), 110)


def _lines(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False)  # a policy name (static-layers) stays whole


def pareto_chart(rows, *, synthetic: bool, priced_as: str) -> Figure:
    """Time per token against substituted mass per step, one panel per cache size (stacked), each time axis
    cut just above the panel's baseline (slower configs are named above the panel, not plotted)."""
    import altair as alt
    import polars as pl

    intervals = has_intervals(rows, "s_per_token") and has_intervals(rows, "mass_per_step")
    bounds = [(1e3 * pl.col("s_per_token_low")).alias("ms_low"), (1e3 * pl.col("s_per_token_high")).alias("ms_high"),
              pl.col("mass_per_step_low").alias("mass_low"), pl.col("mass_per_step_high").alias("mass_high")] \
        if intervals else []
    frame = rows.filter(pl.col("s_per_token").is_not_null()).with_columns(
        (1e3 * pl.col("s_per_token")).alias("ms_per_token"),
        pl.col("preset").fill_null(""),
        pl.when(pl.col("keeps_first_choice")).then(pl.lit("kept")).otherwise(pl.lit("may lose"))
        .alias("first_choice"),
        *bounds,
    )
    names = sorted({p for p in frame["preset"].to_list() if p})
    frame = frame.with_columns(pl.col("preset").is_in(names[1::2]).alias("label_below"),
                               (pl.col("fits_in_vram").fill_null(True) if "fits_in_vram" in frame.columns
                                else pl.lit(True)).alias("fits")).select(
        "policy", "preset", "label_below", "eviction", "miss", "size", "size_label", "ms_per_token", "mass_per_step",
        "speedup", "hit_rate", "pareto", "first_choice", "fits",
        *(["ms_low", "ms_high", "mass_low", "mass_high"] if intervals else []))
    check_rows(frame, "time vs mass")
    misses = [m for m in MISS_ORDER if m in frame["miss"].unique().to_list()]
    misses += sorted(set(frame["miss"].unique().to_list()) - set(misses))
    evictions = _evictions(frame["eviction"].unique().to_list())
    # sqrt: the useful policies sit near zero mass, next to never-fetching ones further out
    x_scale = alt.Scale(type="sqrt", domain=[0, max(0.02, 1.05 * float(frame["mass_per_step"].max() or 0))],
                        nice=False)
    color = alt.Color("miss:N", title="miss policy", sort=misses)
    shape = alt.Shape("eviction:N", title="eviction", sort=evictions, scale=alt.Scale(range=SHAPES))
    dash = alt.StrokeDash("first_choice:N", title="Pareto front, 1st choice",
                          scale=alt.Scale(domain=["kept", "may lose"], range=[[1, 0], [5, 3]]))
    tooltip = ["policy:N", "preset:N", alt.Tooltip("ms_per_token:Q", format=".2f", title="ms per token"),
               alt.Tooltip("mass_per_step:Q", format=".4f", title="mass per step"),
               alt.Tooltip("speedup:Q", format=".2f", title="speed-up"),
               alt.Tooltip("hit_rate:Q", format=".1%", title="hit rate"),
               alt.Tooltip("first_choice:N", title="1st choice")]
    label: dict[str, Any] = dict(align="left", dx=10, fontSize=12, fontWeight="bold")
    panels = []
    sizes = frame.select("size", "size_label").unique().sort("size").rows()
    for i, (size, size_label) in enumerate(sizes):
        part = frame.filter(pl.col("size") == size)
        # the baseline runs without a policy: configs slower than it (everything on the CPU, llama.cpp's layer
        # placement) would stretch the axis and squeeze the configs worth comparing into a sliver
        base = part.filter(pl.col("speedup").is_not_null() & ((pl.col("speedup") - 1.0).abs() < 1e-12))
        limit = 1.08 * float((base if base.height else part)["ms_per_token"].max())
        shown = part.filter(pl.col("ms_per_token") <= limit)
        low = 0.92 * float(shown["ms_per_token"].min())  # not from zero: these differ by a few percent
        x_title = X_MASS if i == len(sizes) - 1 else None
        y_title = "time per token (ms; axis not from 0)"
        y_scale = alt.Scale(zero=False, domain=[low, limit], nice=False)
        x = alt.X("mass_per_step:Q", scale=x_scale, title=x_title)
        y = alt.Y("ms_per_token:Q", title=y_title, scale=y_scale)
        enc = alt.Chart(shown).encode(x=x, y=y)
        points = enc.mark_point(filled=True, size=70, opacity=0.8, stroke="white", strokeWidth=0.6).encode(
            color=color, shape=shape, tooltip=tooltip)
        front = enc.transform_filter("datum.pareto").mark_line(
            strokeWidth=1.4, interpolate="step-after", opacity=0.8, color="black").encode(
            order="mass_per_step:Q", strokeDash=dash)
        preset = enc.transform_filter("datum.preset != ''")
        rings = preset.mark_point(size=260, color="black", strokeWidth=1.5, filled=False).encode(tooltip=tooltip)
        # alternate labels above and below so neighbouring presets (quality-first, speed-first) stay readable
        above = preset.transform_filter("!datum.label_below").mark_text(dy=-9, **label).encode(text="preset:N")
        below = preset.transform_filter("datum.label_below").mark_text(dy=13, **label).encode(text="preset:N")
        bars = []
        if intervals:
            # behind the points, light: with many configs the bars would otherwise hide them
            ranged = alt.Chart(shown.filter(pl.col("ms_low").is_not_null())).encode(color=color)
            bar = ranged.mark_errorbar(**ERROR_BAR, opacity=0.45)
            bars = [bar.encode(x=x, y=alt.Y("ms_low:Q", scale=y_scale, title=y_title), y2="ms_high:Q"),
                    bar.encode(y=y, x=alt.X("mass_low:Q", scale=x_scale, title=x_title), x2="mass_high:Q")]
        off = _off_chart(part, limit)
        unfit = part.filter(~pl.col("fits"))
        if unfit.height:
            off = [f"WARNING: this cache does not fit in the machine's VRAM ({unfit.height} of {part.height} "
                   "configs): their times describe a machine that does not exist"] + off
        panels.append(alt.layer(*bars, points, front, rings, above, below).properties(
            width=PLOT_WIDTH, height=300,
            title=alt.TitleParams(size_label, subtitle=off or alt.Undefined, anchor="start", fontSize=13,
                                  subtitleColor="#555")))
    chart = alt.vconcat(*panels, spacing=18).resolve_scale(x="shared", color="shared", shape="shared").properties(
        title=title("Time per token against substituted gate mass", synthetic,
                    [f"priced as {priced_as}; ringed: named presets",
                     "black lines: Pareto fronts (solid: policies that keep the router's first choice, "
                     "dashed: may lose it)"] + (["error bars: confidence intervals of time and mass "
                                                 "(docs/uncertainty.md)"] if intervals else [])))
    caption = ("Each point is one policy configuration: the time per decoded token on the priced machine against "
               "the substituted (and dropped) gate mass per step. Mass ranks policies by quality only among those "
               "that always run the router's first choice (the substitution study: r ~ 0.92 with the perplexity "
               "increase there); the two classes have separate Pareto fronts (solid and dashed: no other config of "
               "the class is both faster and loses less mass). Ringed points are the named presets. Each budget's "
               f"time axis ends just above its baseline ({_baseline_name(rows)}); slower configs are named above "
               "the panel.")
    if intervals:
        caption += (" Error bars: percentile-bootstrap confidence intervals of the time and the mass over the "
                    "trace's sequences or blocks of tokens (the cache state of the one replay taken as given); "
                    "configs whose time bars overlap are not resolved by this trace.")
    return Figure("time_vs_mass", chart, caption)


X_MASS = "substituted + dropped gate mass per (token, layer) step (sqrt scale)"


def speedup_chart(rows, *, synthetic: bool, priced_as: str) -> Figure:
    """Speed-up over the sweep's baseline per policy, a dot per cache size."""
    import altair as alt
    import polars as pl

    baseline = _baseline_name(rows)
    intervals = has_intervals(rows, "speedup")
    frame = rows.filter(pl.col("speedup").is_not_null()).with_columns(
        pl.when(pl.col("preset").is_not_null()).then(pl.col("policy") + "  [" + pl.col("preset") + "]")
        .otherwise(pl.col("policy")).alias("row"),
        pl.when(pl.col("keeps_first_choice")).then(pl.lit("kept")).otherwise(pl.lit("may lose"))
        .alias("first_choice")).select("row", "policy", "preset", "size", "size_label", "speedup", "s_per_token",
                                       "first_choice", *(["speedup_low", "speedup_high"] if intervals else []))
    check_rows(frame, "speed-up")
    order = (frame.group_by("row").agg(pl.col("speedup").max().alias("best"))
             .sort(["best", "row"], descending=[True, False])["row"].to_list())
    sizes = frame.select("size", "size_label").unique().sort("size")["size_label"].to_list()
    dots = alt.Chart(frame).mark_point(filled=True, size=70).encode(
        x=alt.X("speedup:Q", title=f"speed-up over {baseline} (x, same budget)", scale=alt.Scale(zero=False)),
        y=alt.Y("row:N", title=None, sort=order, axis=alt.Axis(labelLimit=360)),
        color=alt.Color("size_label:N", title="budget", sort=sizes, scale=alt.Scale(scheme="viridis")),
        shape=alt.Shape("first_choice:N", title="1st choice", sort=["kept", "may lose"],
                        scale=alt.Scale(range=["circle", "diamond"])),
        tooltip=["policy:N", "preset:N", "size_label:N", alt.Tooltip("speedup:Q", format=".2f"),
                 alt.Tooltip("ms_per_token:Q", format=".2f", title="ms per token")],
    ).transform_calculate(ms_per_token="datum.s_per_token * 1000")
    one = alt.Chart(pl.DataFrame({"x": [1.0]})).mark_rule(color="#d62728", strokeDash=[4, 3]).encode(x="x:Q")
    layers = [one, dots]
    if intervals:
        layers.insert(1, alt.Chart(frame.filter(pl.col("speedup_low").is_not_null())).mark_errorbar(**ERROR_BAR).encode(
            x=alt.X("speedup_low:Q", title=f"speed-up over {baseline} (x, same budget)", scale=alt.Scale(zero=False)),
            x2="speedup_high:Q", y=alt.Y("row:N", title=None, sort=order),
            color=alt.Color("size_label:N", title="budget", sort=sizes, scale=alt.Scale(scheme="viridis"))))
    sub = f"priced as {priced_as}; dashed line: the baseline, {baseline} (1x); [name]: named preset"
    chart = alt.layer(*layers).properties(
        width=PLOT_WIDTH, height=alt.Step(18),
        title=title("Speed-up per policy", synthetic,
                    [sub, "error bars: paired confidence intervals (docs/uncertainty.md)"] if intervals else sub))
    caption = (f"Time per token of the baseline ({baseline}, the same for every row and table) divided by the "
               "policy's, at the same budget, one dot per budget; policies sorted by their best speed-up. Above 1 "
               "the policy is faster than the baseline; identical replays have identical speed-ups. Diamonds: "
               "policies that may substitute or drop the router's first choice (their speed comes at a quality "
               "cost that substituted mass does not rank).")
    if intervals:
        caption += (" Error bars: paired percentile-bootstrap confidence intervals (the row and the baseline "
                    "resampled with the same sequences or blocks of tokens, the cache state of each one replay taken "
                    "as given).")
    return Figure("speedup", chart, caption)


def layer_heatmap(rows, layers, *, synthetic: bool) -> Figure:
    """Per-layer hit rate of the fetch-all config of each eviction and of the named presets, per size."""
    import altair as alt
    import polars as pl

    # static-layers pins whole layers: its layers hit 0% or 100% by construction, which would set the colour
    # scale and flatten every other row; it is left out (its hit rate is the share of pinned layers)
    chosen = rows.filter(((pl.col("miss") == "fetch-all") & pl.col("admit").is_null() & (pl.col("batch") == 1)
                          | pl.col("preset").is_not_null()) & (pl.col("eviction") != "static-layers"))
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
        color=alt.Color("hit_pct:Q", title="hit rate (%)", scale=alt.Scale(scheme="viridis", zero=False, nice=False)),
        tooltip=["row:N", "size_label:N", "layer:O", alt.Tooltip("hit_pct:Q", format=".2f", title="hit rate (%)")],
    ).properties(width=max(PLOT_WIDTH, 12 * n_layers), height=alt.Step(18)).facet(
        row=alt.Row("size_label:N", title=None, sort=sizes, header=alt.Header(labelAngle=0, labelAlign="left")),
    ).properties(title=title("Hit rate per MoE layer", synthetic,
                             "fetch-all with each eviction, and the named presets [name]"))
    caption = ("Hit rate of every MoE layer, per budget, for fetch-all under each eviction policy and for the "
               "named presets; the colour scale spans the lowest to the highest layer hit rate shown. Layers whose "
               "routing is less predictable show as darker columns. The llama.cpp preset (static-layers) is left "
               "out: it pins whole layers, so each layer hits 0% or 100% by construction.")
    return Figure("layer_hit_rate", chart, caption)


def _tick_values(layers: list[int]) -> list[int]:
    step = max(1, len(layers) // 12)
    return layers[::step]


__all__ = ["hit_rate_curve_chart", "pareto_chart", "speedup_chart", "layer_heatmap"]
