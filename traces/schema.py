"""Arrow schema of a v1 trace: one row per (sequence, token position, MoE layer).

A frequency-only trace (layout ``counts``) has one row per (request, MoE layer)
instead, with ``pos`` = 0 and a ``counts`` column of E integers.
"""

from __future__ import annotations

import pyarrow as pa

from moesim.traces.meta import METADATA_KEY, TraceMeta

KEY_COLUMNS = ("seq", "pos", "layer")
REQUIRED_COLUMNS = ("seq", "pos", "layer", "phase")
DENSE_COLUMNS = ("logits",)
SPARSE_COLUMNS = ("top_ids", "top_logits", "lse")
COUNTS_COLUMNS = ("counts",)
LAYOUT_COLUMNS = {"dense": DENSE_COLUMNS, "sparse": SPARSE_COLUMNS, "counts": COUNTS_COLUMNS}


def required_columns(meta: TraceMeta) -> tuple[str, ...]:
    """Columns a trace with this metadata must have. The phase of a counts row is
    optional: MoE-Infinity-style counts cover a whole request, prompt and output."""
    keys = KEY_COLUMNS if meta.layout == "counts" else REQUIRED_COLUMNS
    return (*keys, *LAYOUT_COLUMNS[meta.layout])


def arrow_schema(meta: TraceMeta, *, domain: bool, token: bool, selected: bool, weights: bool,
                 phase: bool = True) -> pa.Schema:
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
    else:
        fields.append(pa.field("counts", pa.list_(pa.int32(), meta.n_experts), nullable=False))
    if selected:
        fields.append(pa.field("selected", pa.list_(pa.int16(), meta.top_k), nullable=False))
    if weights:
        fields.append(pa.field("weights", pa.list_(pa.float32(), meta.top_k), nullable=False))
    return pa.schema(fields, metadata={METADATA_KEY: meta.to_json().encode()})
