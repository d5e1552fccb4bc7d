"""The emulator's GGUF-style quantizers: block structure (distinct values per sub-block), error ordering, and
llama.cpp's recipes (which matrix gets which type)."""

import pytest

torch = pytest.importorskip("torch", reason="the [torch] extra (torch) is not installed")

from moesim.emulator.quantize import quantize, tensor_type, use_more_bits  # noqa: E402
from moesim.errors import MoesimError  # noqa: E402

# (type, sub-block size, most distinct values in one sub-block)
LAYOUTS = [("q8_0", 32, 255), ("q6_k", 16, 64), ("q5_k", 32, 32), ("q4_k", 32, 16), ("q3_k", 16, 8), ("q2_k", 16, 4)]


@pytest.mark.parametrize("kind,sub,levels", LAYOUTS)
def test_sub_blocks_hold_at_most_2_to_the_bits_values(kind, sub, levels):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(4, 64, 256, generator=g)
    q = quantize(torch, w, kind)
    assert q.shape == w.shape and q.dtype == w.dtype
    assert max(len(torch.unique(b)) for b in q.reshape(-1, sub)) <= levels


def test_error_grows_as_bits_shrink():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(2, 128, 512, generator=g)
    err = [float((quantize(torch, w, k) - w).norm() / w.norm()) for k, _, _ in LAYOUTS]
    assert err == sorted(err) and err[0] < 0.01 and err[-1] > 0.2


def test_zeros_stay_zero_and_bad_sizes_are_refused():
    assert torch.count_nonzero(quantize(torch, torch.zeros(1, 4, 256), "q4_k")) == 0
    with pytest.raises(MoesimError, match="256-blocks"):
        quantize(torch, torch.zeros(1, 3, 100), "q2_k")


def test_recipes_follow_llama_cpp():
    assert [use_more_bits(i, 48) for i in range(8)] == [True] * 6 + [False, False]
    assert tensor_type("q4_k_m", "down", 0, 48) == "q6_k" and tensor_type("q4_k_m", "down", 6, 48) == "q4_k"
    assert tensor_type("q2_k", "gate_up", 3, 48) == "q2_k" and tensor_type("q2_k", "down", 3, 48) == "q3_k"
    with pytest.raises(MoesimError, match="quantizes experts as"):
        tensor_type("iq4_xs", "down", 0, 48)
