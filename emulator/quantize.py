"""Round-to-nearest, group-wise quantization of expert weights the way GGUF formats store them, so that the
emulator can run a lowbit:Q miss on a Q-quantized copy of the expert and measure what it costs in perplexity.

The block layouts are ggml's (ggml-common.h / ggml-quants.c, quantize_row_*_ref): weights are quantized along a
matrix row (the input dimension) in super-blocks of QK_K = 256 weights,

- Q8_0: blocks of 32, one fp16 scale, 8-bit signed values (type-0: x = d·q);
- Q6_K: 16 sub-blocks of 16, 6-bit values in [-32, 31], 8-bit signed sub-block scales, one fp16 super scale;
- Q4_K (Q5_K): 8 sub-blocks of 32, 4-bit (5-bit) values, a 6-bit scale and a 6-bit min per sub-block relative
  to fp16 super-block scales d and dmin (type-1: x = d·sc·q − dmin·m);
- Q3_K: 16 sub-blocks of 16, 3-bit values in [-4, 3], 6-bit signed sub-block scales, one fp16 super scale;
- Q2_K: 16 sub-blocks of 16, 2-bit values, 4-bit scales and mins relative to fp16 d and dmin (type-1).

A faithful simplification, not a bit-exact port: each sub-block's scale (and min) is the round-to-nearest one
(max-abs for type-0, the range for type-1) where ggml searches a few candidate scales (make_qx_quants,
make_qkx2_quants) for a smaller error; the sub-block scales are then quantized to their bits as ggml does and
the values re-rounded with the quantized scales. A row shorter than 256 (the emulator's small models) is grouped
with the next ones into super-blocks of 256 consecutive weights of the row-major matrix; llama.cpp would store
such a tensor in a legacy 32-block fallback format instead (llama-quant.cpp, convert_incompatible_tensor).

Which matrix gets which type follows llama.cpp's recipes (llama-quant.cpp llama_tensor_get_type): q4_k_m puts
ffn_down at Q6_K on the layers ``use_more_bits`` picks and Q4_K elsewhere, q2_k puts ffn_down at Q3_K and the
rest at Q2_K, q4_k and q8_0 are uniform.
"""

from __future__ import annotations

from moesim.errors import MoesimError

QK_K = 256
# tensor type of (gate/up, down) matrices per recipe; "q6_k|q4_k" = use_more_bits layers | the others
RECIPES = {"q8_0": ("q8_0", "q8_0"), "q4_k": ("q4_k", "q4_k"), "q4_k_m": ("q4_k", "q6_k|q4_k"),
           "q2_k": ("q2_k", "q3_k")}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's choice of the layers whose ffn_down gets more bits in the _M recipes."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_type(quant: str, matrix: str, i_layer: int, n_layers: int) -> str:
    """The ggml type recipe ``quant`` stores ``matrix`` ("gate_up" or "down") of MoE layer ``i_layer`` in."""
    if quant not in RECIPES:
        raise MoesimError(f"the emulator quantizes experts as {', '.join(RECIPES)}; lowbit:{quant} is not one of them")
    t = RECIPES[quant][0 if matrix == "gate_up" else 1]
    if "|" in t:
        more, other = t.split("|")
        return more if use_more_bits(i_layer, n_layers) else other
    return t


def _fp16(torch, x):
    return x.to(torch.float16).to(torch.float32)


def _type0(torch, x, sub: int, qmin: int, qmax: int, scale_bits: int | None):
    """Signed values x = d·sc·q: sub-blocks of ``sub`` weights, super-blocks of 256 (rows of x). As ggml's
    make_qx_quants, a sub-block's largest-magnitude weight maps to qmin (the longer end of the signed range);
    the K-quants' signed sub-block scales are rounded to ``scale_bits`` bits the same way."""
    g = x.reshape(x.shape[0], -1, sub)
    if scale_bits is None:  # Q8_0: d = amax / 127, one fp16 scale per 32-block
        d = _fp16(torch, g.abs().amax(dim=-1) / qmax)
    else:
        idx = g.abs().argmax(dim=-1, keepdim=True)
        scale = torch.gather(g, -1, idx)[..., 0] / qmin
        smin = -(2 ** (scale_bits - 1))
        big = torch.gather(scale, -1, scale.abs().argmax(dim=-1, keepdim=True))  # the super-block's largest scale
        inv = torch.where(big != 0, smin / torch.where(big != 0, big, 1.0), 0.0)
        sc = torch.round(inv * scale).clamp(smin, -smin - 1)
        d = _fp16(torch, torch.where(inv != 0, 1.0 / torch.where(inv != 0, inv, 1.0), 0.0)) * sc
    q = torch.where(d[..., None] != 0, torch.round(g / torch.where(d != 0, d, 1.0)[..., None]), 0.0).clamp(qmin, qmax)
    return (q * d[..., None]).reshape(x.shape)


def _type1(torch, x, sub: int, bits: int, scale_bits: int):
    """Unsigned values x = d·sc·q − dmin·m (min ≤ 0 as ggml clamps it), scales and mins of scale_bits bits."""
    g = x.reshape(x.shape[0], -1, sub)
    lo = g.amin(dim=-1).clamp(max=0.0)
    hi = g.amax(dim=-1)
    qmax = 2 ** bits - 1
    smax = 2 ** scale_bits - 1
    scale = (hi - lo) / qmax
    m = -lo
    d = _fp16(torch, scale.amax(dim=-1, keepdim=True) / smax)
    dmin = _fp16(torch, m.amax(dim=-1, keepdim=True) / smax)
    sc = torch.where(d > 0, torch.round(scale / torch.where(d > 0, d, 1.0)), 0.0).clamp(0, smax)
    mq = torch.where(dmin > 0, torch.round(m / torch.where(dmin > 0, dmin, 1.0)), 0.0).clamp(0, smax)
    ds, ms = d * sc, dmin * mq
    q = torch.where(ds[..., None] > 0, torch.round((g + ms[..., None]) / torch.where(ds > 0, ds, 1.0)[..., None]),
                    0.0).clamp(0, qmax)
    return (q * ds[..., None] - ms[..., None]).reshape(x.shape)


def quantize(torch, w, kind: str):
    """``w`` (any shape whose last dimension is a matrix row) quantized as ggml type ``kind`` and dequantized back
    to w's dtype."""
    x = w.detach().to(torch.float32)
    flat = x.reshape(-1)
    block = 32 if kind == "q8_0" else QK_K
    if flat.numel() % block:
        raise MoesimError(f"an expert matrix of {flat.numel()} weights is not a whole number of {block}-blocks")
    rows = flat.reshape(-1, block)
    if kind == "q8_0":
        out = _type0(torch, rows, 32, -127, 127, None)
    elif kind == "q6_k":
        out = _type0(torch, rows, 16, -32, 31, 8)
    elif kind == "q3_k":
        out = _type0(torch, rows, 16, -4, 3, 6)
    elif kind == "q4_k":
        out = _type1(torch, rows, 32, 4, 6)
    elif kind == "q5_k":
        out = _type1(torch, rows, 32, 5, 6)
    elif kind == "q2_k":
        out = _type1(torch, rows, 16, 2, 4)
    else:
        raise MoesimError(f"unknown ggml tensor type {kind!r}")
    return out.reshape(w.shape).to(w.dtype)
