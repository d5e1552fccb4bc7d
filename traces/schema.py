"""Arrow schema of a v1 trace: one row per (sequence, token position, MoE layer)."""

from __future__ import annotations

import pyarrow as pa

from moesim.traces.meta import METADATA_KEY, TraceMeta

KEY_COLUMNS = ("seq", "pos", "layer")
REQUIRED_COLUMNS = ("seq", "pos", "layer", "phase")
DENSE_COLUMNS = ("logits",)
SPARSE_COLUMNS = ("top_ids", "top_logits", "lse")
OPTIONAL_COLUMNS = ("domain", "token", "selected", "weights")


def arrow_schema(meta: TraceMeta, *, domain: bool, token: bool, selected: bool, weights: bool) -> pa.Schema:
    fields = [
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("pos", pa.int32(), nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
        pa.field("phase", pa.dictionary(pa.int8(), pa.string()), nullable=False),
    ]
    if domain:
        fields.append(pa.field("domain", pa.dictionary(pa.int16(), pa.string())))
    if token:
        fields.append(pa.field("token", pa.int32()))
    if meta.layout == "dense":
        fields.append(pa.field("logits", pa.list_(pa.float32(), meta.n_experts), nullable=False))
    else:
        m = meta.n_candidates
        fields += [
            pa.field("top_ids", pa.list_(pa.int16(), m), nullable=False),
            pa.field("top_logits", pa.list_(pa.float32(), m), nullable=False),
            pa.field("lse", pa.float32(), nullable=False),
        ]
    if selected:
        fields.append(pa.field("selected", pa.list_(pa.int16(), meta.top_k), nullable=False))
    if weights:
        fields.append(pa.field("weights", pa.list_(pa.float32(), meta.top_k), nullable=False))
    return pa.schema(fields, metadata={METADATA_KEY: meta.to_json().encode()})
