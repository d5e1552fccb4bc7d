"""Charts of quality results (``moesim emulate --grid ... -o quality.parquet``): measured perplexity
increase against substituted gate mass per policy, and the next-token KL divergence against the mass
moved off the router's choice (substituted + displaced by rerouting), each split into policies that
always run the router's first choice and those that may substitute it, with Pearson r and n of each
class."""

from __future__ import annotations

from moesim.reports.charts import Figure, check_rows, title

CLASSES = {True: "always fetches the first choice", False: "may substitute the first choice"}


def mass_dppl_chart(quality, stats: dict, *, model: str) -> Figure:
    """``quality``: rows with policy, size label, mass_per_step, dppl_pct, fetches_first.
    ``stats``: {fetches_first: {"r": r, "n": n}} (emulator.quality.class_stats)."""
    import altair as alt
    import polars as pl

    frame = check_rows(quality.with_columns(
        pl.col("fetches_first").replace_strict(CLASSES, return_dtype=pl.Utf8).alias("class"),
        pl.when(pl.col("budget").is_not_null()).then(pl.format("budget {}", pl.col("budget")))
        .otherwise(pl.format("{} slots", pl.col("slots"))).alias("size"),
    ).select("policy", "size", "class", "mass_per_step", "dppl_pct", "hit_rate", "ppl"), "mass vs dppl")
    legend = [f"{CLASSES[c]}: Pearson r = {_r(stats[c]['r'])}, n = {stats[c]['n']}" for c in (True, False)]
    chart = alt.Chart(frame).mark_point(filled=True, size=45, opacity=0.8).encode(
        x=alt.X("mass_per_step:Q", title="substituted gate mass per step (closed loop)"),
        y=alt.Y("dppl_pct:Q", title="perplexity increase (%)"),
        color=alt.Color("class:N", title="policy class", sort=[CLASSES[True], CLASSES[False]]),
        shape=alt.Shape("size:N", title="cache size"),
        tooltip=["policy:N", "size:N", "class:N", alt.Tooltip("mass_per_step:Q", format=".4f"),
                 alt.Tooltip("dppl_pct:Q", format="+.3f", title="dppl %"), alt.Tooltip("ppl:Q", format=".4f")],
    ).properties(width=560, height=340, title=title(f"Perplexity increase against substituted mass: {model}", False,
                                                     legend))
    caption = ("Each point is one policy emulated on the model (moesim emulate): the measured perplexity increase "
               "over the unmodified model on the same tokens, against the substituted gate mass per step the policy "
               "caused. Pearson r and n per class are over the configs with nonzero mass (zero mass changes no "
               "output). " + " ".join(legend) + ".")
    return Figure("dppl_vs_mass", chart, caption)


def mass_kl_chart(quality, stats: dict, *, model: str, moved: str) -> Figure:
    """``quality``: rows with a measured ``kl`` and ``moved_per_step`` (emulator.quality.moved_mass, which
    names ``moved``: "substituted" or "displaced + substituted"). ``stats``: class_stats of those two."""
    import altair as alt
    import polars as pl

    frame = check_rows(quality.filter(pl.col("kl").is_not_null()).with_columns(
        pl.col("fetches_first").replace_strict(CLASSES, return_dtype=pl.Utf8).alias("class"),
        pl.when(pl.col("budget").is_not_null()).then(pl.format("budget {}", pl.col("budget")))
        .otherwise(pl.format("{} slots", pl.col("slots"))).alias("size"),
    ).select("policy", "size", "class", "moved_per_step", "kl", "top1_agreement", "dppl_pct"), "mass vs KL")
    legend = [f"{CLASSES[c]}: Pearson r = {_r(stats[c]['r'])}, n = {stats[c]['n']}" for c in (True, False)]
    chart = alt.Chart(frame).mark_point(filled=True, size=45, opacity=0.8).encode(
        x=alt.X("moved_per_step:Q", title=f"{moved} gate mass per step (closed loop)"),
        y=alt.Y("kl:Q", title="KL divergence from the unmodified model (nats per token)"),
        color=alt.Color("class:N", title="policy class", sort=[CLASSES[True], CLASSES[False]]),
        shape=alt.Shape("size:N", title="cache size"),
        tooltip=["policy:N", "size:N", "class:N", alt.Tooltip("moved_per_step:Q", format=".4f", title="mass/step"),
                 alt.Tooltip("kl:Q", format=".5f", title="KL"),
                 alt.Tooltip("top1_agreement:Q", format=".4f", title="top-1 agreement"),
                 alt.Tooltip("dppl_pct:Q", format="+.3f", title="dppl %")],
    ).properties(width=560, height=340, title=title(f"Next-token KL divergence against {moved} mass: {model}", False,
                                                     legend))
    caption = ("Each point is one policy emulated on the model (moesim emulate): the mean KL divergence of its "
               "next-token distribution from the unmodified model's on the same tokens, against the gate mass per "
               f"step it moved off the router's choice ({moved}"
               + (": the router's weights of the experts rerouted away plus those substituted or dropped" if
                  moved != "substituted" else "; no config here reroutes") + "). Pearson r and n per class are over "
               "the configs with nonzero mass. " + " ".join(legend) + ".")
    return Figure("kl_vs_mass", chart, caption)


def _r(r: float) -> str:
    return "n/a" if r != r else f"{r:.3f}"
