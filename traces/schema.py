"""Arrow schema of a trace: one row per (sequence, token position, MoE layer).

A frequency-only trace (layout ``counts``) has one row per (request, MoE layer)
instead, with ``pos`` = 0 and a ``counts`` column of E integers. The ``ranked``
layout (schema version 2) stores move-to-front codes of the ranked candidates
and only the scores the gate weights need (docs/trace-format.md).
"""

from __future__ import annotations

import pyarrow as pa

from moesim.traces.meta import METADATA_KEY, TraceMeta

KEY_COLUMNS = ("seq", "pos", "layer")
REQUIRED_COLUMNS = ("seq", "pos", "layer", "phase")
DENSE_COLUMNS = ("logits",)
SPARSE_COLUMNS = ("top_ids", "top_logits", "lse")
COUNTS_COLUMNS = ("counts",)
RANKED_COLUMNS = ("ranked_ids",)
LAYOUT_COLUMNS = {"dense": DENSE_COLUMNS, "sparse": SPARSE_COLUMNS, "counts": COUNTS_COLUMNS,
                  "ranked": RANKED_COLUMNS}


def required_columns(meta: TraceMeta) -> tuple[str, ...]:
    """Columns a trace with this metadata must have. The phase of a counts row is
    optional: MoE-Infinity-style counts cover a whole request, prompt and output.
    A ranked trace also needs its gate scores: ``gate_gaps`` with a ``logit_scale``,
    else ``gate_logits`` unless it stores ``weights`` (checked by the reader)."""
    keys = KEY_COLUMNS if meta.layout == "counts" else REQUIRED_COLUMNS
    cols = LAYOUT_COLUMNS[meta.layout]
    if meta.layout == "ranked" and meta.logit_scale is not None:
        cols = (*cols, "gate_gaps", "gate_gaps_high")
    return (*keys, *cols)


def gate_column(meta: TraceMeta, weights: bool) -> str | None:
    """The ranked layout's gate-score column: ``gate_gaps`` (integer gaps in ``logit_scale`` units
    between the k first-ranked logits), ``gate_logits`` (the logits of the selected experts), or
    none when the trace stores the weights themselves."""
    if meta.logit_scale is not None:
        return "gate_gaps"
    return None if weights else "gate_logits"


def arrow_schema(meta: TraceMeta, *, domain: bool, token: bool, selected: bool, weights: bool,
                 phase: bool = True, lookahead: bool = False) -> pa.Schema:
    fields = [
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("pos", pa.int32(), nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
    ]
    if phase or meta.layout != "counts":
        fields.append(pa.field("phase", pa.dictionary(pa.int8(), pa.string()), nullable=False))
    if domain:
        fields.append(pa.field("domain", pa.dictionary(pa.int16(), pa.string())))
    if token:
        fields.append(pa.field("token", pa.int32()))
    if meta.layout == "dense":
        fields.append(pa.field("logits", pa.list_(pa.float32(), meta.n_experts), nullable=False))
    elif meta.layout == "sparse":
        m = meta.n_candidates
        fields += [
            pa.field("top_ids", pa.list_(pa.int16(), m), nullable=False),
            pa.field("top_logits", pa.list_(pa.float32(), m), nullable=False),
            pa.field("lse", pa.float32(), nullable=False),
        ]
    elif meta.layout == "ranked":
        from moesim.traces.ranked import code_width

        fields.append(pa.field("ranked_ids", pa.binary(meta.n_candidates * code_width(meta.n_experts)),
                               nullable=False))
        gate = gate_column(meta, weights)
        if gate == "gate_gaps":
            # low bytes; the high bytes only in the rare rows with a gap >= 256 (null elsewhere: no bytes)
            fields += [pa.field("gate_gaps", pa.binary(meta.top_k - 1), nullable=False),
                       pa.field("gate_gaps_high", pa.binary(meta.top_k - 1))]
        elif gate == "gate_logits":
            fields.append(pa.field("gate_logits", pa.list_(pa.float32(), meta.top_k), nullable=False))
    else:
        fields.append(pa.field("counts", pa.list_(pa.int32(), meta.n_experts), nullable=False))
    if selected:
        fields.append(pa.field("selected", pa.list_(pa.int16(), meta.top_k), nullable=False))
    if weights:
        fields.append(pa.field("weights", pa.list_(pa.float32(), meta.top_k), nullable=False))
    if lookahead:
        # the next MoE layer's router applied to this layer's input; null where unknown (the last layer)
        fields.append(pa.field("lookahead", pa.list_(pa.int16(), meta.top_k)))
    return pa.schema(fields, metadata={METADATA_KEY: meta.to_json().encode()})
