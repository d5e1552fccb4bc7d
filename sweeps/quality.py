"""Sweep rows joined with quality results (``moesim emulate --grid ... -o quality.parquet``).

A sweep row and a quality row describe the same policy and cache size when the row's ``grid_key`` (its
config as the grid names it, before a holdout folds in: sweeps/holdout.py; ``config_key`` in older files) equals
the quality row's ``config_key`` (``SimConfig.key()``), and the same model when their ``model_id`` is (both name the
checkpoint as ``moesim trace hf`` does). Where a config was emulated its measured dppl is shown;
for the policies that always run the router's first choice, the rest get the model's mass fit
(emulator.quality.mass_fit), labelled an estimate with its r and n; the others stay empty. The
next-token KL divergence and top-1 agreement are joined where measured only (no estimate).
"""

from __future__ import annotations

import math

from moesim.errors import MoesimError


def attach_quality(rows, quality, source="the quality results"):
    """Sweep rows + ``dppl_pct`` (measured where the config was emulated for the trace's model; for
    the always-fetch-first class otherwise the mass fit's estimate), ``dppl_source`` ("measured",
    the fit's label, or null) and ``dppl_shown`` (the table cell: "~" marks an estimate). Rows of a
    model the quality results do not cover stay empty; quality results of none of the rows' models
    are refused (``source`` names them)."""
    import polars as pl

    from moesim.emulator.quality import mass_fit
    from moesim.sweeps.ranking import keeps_first_choice

    theirs = set(quality["model_id"].to_list())
    ours = {m for m in rows["model_id"].to_list() if m is not None} if rows.height else set()
    if ours and not ours & theirs:
        raise MoesimError(f"{source}: quality results of {', '.join(sorted(map(repr, theirs)))}, not of the "
                          f"sweep's model {', '.join(sorted(map(repr, ours)))}: no dppl to join (emulate the "
                          "trace's model, or name it with emulate --model-id)")

    setups = quality.group_by("model_id").agg(pl.col("setup_key").n_unique().alias("n"))
    many = setups.filter(pl.col("n") > 1)
    if many.height:
        raise MoesimError(f"the quality results hold several emulation setups (texts, dtype, window...) for model "
                          f"{many['model_id'][0]}; keep one per model")
    measured = {(r["model_id"], r["config_key"]): r for r in quality.iter_rows(named=True)}
    fits: dict = {}
    vals, srcs, shown, kls, top1s = [], [], [], [], []
    for r in rows.iter_rows(named=True):
        # the policy as the grid names it: a sweep's holdout (sweeps/holdout.py) changes the replayed config's key
        # (its warm-up, static's prefix), not the policy whose quality was measured
        q = measured.get((r["model_id"], r.get("grid_key") or r["config_key"]))
        v = q["dppl_pct"] if q is not None else None
        kls.append(q.get("kl") if q is not None else None)
        top1s.append(q.get("top1_agreement") if q is not None else None)
        fk = (r["model_id"], r["budget"], r["slots"])
        if fk not in fits:
            fits[fk] = mass_fit(quality, r["model_id"], r["budget"], r["slots"])
        fit = fits[fk]
        if v is not None:
            vals.append(v), srcs.append("measured"), shown.append(f"{v:+.2f}")
        elif fit is not None and keeps_first_choice(r["miss"], r.get("reroute")) and r["mass_per_step"] is not None \
                and math.isfinite(r["mass_per_step"]):
            e = fit.estimate(r["mass_per_step"])
            vals.append(e), srcs.append(fit.label()), shown.append(f"~{e:+.2f}")
        else:
            vals.append(None), srcs.append(None), shown.append(None)
    return rows.with_columns(pl.Series("dppl_pct", vals, dtype=pl.Float64),
                             pl.Series("dppl_source", srcs, dtype=pl.Utf8),
                             pl.Series("dppl_shown", shown, dtype=pl.Utf8),
                             pl.Series("kl", kls, dtype=pl.Float64),
                             pl.Series("top1_agreement", top1s, dtype=pl.Float64))


def within(rows, max_dppl: float | None = None, max_kl: float | None = None, **ranking):
    """Only the rows whose dppl % (measured or estimated) is at most ``max_dppl`` and whose measured
    KL divergence is at most ``max_kl`` (either limit optional), re-ranked (``ranking``: annotate's
    baseline and rank_by, as the sweep ranked them)."""
    import polars as pl

    from moesim.sweeps.ranking import annotate

    kept = rows
    if max_dppl is not None:
        kept = kept.filter(pl.col("dppl_pct").is_not_null() & (pl.col("dppl_pct") <= max_dppl))
    if max_kl is not None:
        kept = kept.filter(pl.col("kl").is_not_null() & (pl.col("kl") <= max_kl))
    return annotate(kept, **ranking)
