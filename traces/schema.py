"""Arrow schema of a trace: one row per (sequence, token position, MoE layer).

A frequency-only trace (layout ``counts``) has one row per (request, MoE layer)
instead, with ``pos`` = 0 and a ``counts`` column of E integers. The ``ranked``
layout (schema version 3) stores the ranked candidates and their logits as
fixed-size binary rows (docs/trace-format.md); its version 2 is still read.
"""

from __future__ import annotations

import pyarrow as pa

from moesim.errors import MoesimError
from moesim.traces.meta import METADATA_KEY, TraceMeta

KEY_COLUMNS = ("seq", "pos", "layer")
REQUIRED_COLUMNS = ("seq", "pos", "layer", "phase")
DENSE_COLUMNS = ("logits",)
SPARSE_COLUMNS = ("top_ids", "top_logits", "lse")
COUNTS_COLUMNS = ("counts",)
RANKED_COLUMNS = ("ranked_ids", "ranked_logits")
LAYOUT_COLUMNS = {"dense": DENSE_COLUMNS, "sparse": SPARSE_COLUMNS, "counts": COUNTS_COLUMNS,
                  "ranked": RANKED_COLUMNS}


def required_columns(meta: TraceMeta) -> tuple[str, ...]:
    """Columns a trace with this metadata must have. The phase of a counts row is
    optional: MoE-Infinity-style counts cover a whole request, prompt and output.
    A version-2 ranked trace has ``ranked_ids`` and its gate scores: ``gate_gaps`` with a
    ``logit_scale``, else ``gate_logits`` unless it stores ``weights`` (checked by the reader)."""
    keys = KEY_COLUMNS if meta.layout == "counts" else REQUIRED_COLUMNS
    cols = LAYOUT_COLUMNS[meta.layout]
    if meta.layout == "ranked" and meta.schema_version == 2:
        cols = ("ranked_ids",) + (("gate_gaps", "gate_gaps_high") if meta.logit_scale is not None else ())
    return (*keys, *cols)


def byte_stream_split(schema: pa.Schema) -> list[str]:
    """The leaf columns written with Parquet's BYTE_STREAM_SPLIT encoding: the float scores and the ranked
    layout's binary rows (a list's leaf is ``NAME.list.element``: the top-level name alone does not apply)."""
    out = []
    for f in schema:
        if f.name in ("logits", "top_logits", "weights", "gate_logits"):
            out.append(f"{f.name}.list.element")
        elif f.name in ("lse", "ranked_ids", "ranked_logits"):
            out.append(f.name)
    return out


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

        if meta.schema_version != 3:
            raise MoesimError(f"ranked traces are written as schema version 3 (version {meta.schema_version} "
                              "is read only)")
        m = meta.n_candidates
        fields += [pa.field("ranked_ids", pa.binary(m * code_width(meta.n_experts)), nullable=False),
                   pa.field("ranked_logits", pa.binary(4 * m), nullable=False)]
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
