"""Stream compaction for the synthetic generator's kernel: keep a row's elements that pass a test, in
order. LLVM does not vectorize these loops (each store's place depends on the tests before it), so on
a CPU with AVX-512 each block of 16 elements is one register-to-register ``vpcompressd`` and one
full-width store; elsewhere, and for the last E mod 16 elements, the same plain loop as before.

Measured on this project's 2-core AMD EPYC (Zen 4) machine, a row of 128 elements: the list of own
draws (~10% kept) and the key list (~30%) take ~20 ns instead of ~89 ns (scratch loop). The compress
is used in its register form on purpose: LLVM's generic ``llvm.masked.compressstore`` becomes the
memory form of the instruction, which is microcoded on Zen 4 (~4x slower than the plain loop).

The full-width store writes 16 lanes at the output position n; n never exceeds the block's start j,
so the store stays inside the block being read (or before it) and inside the array.
"""

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, config
from numba.core.extending import intrinsic


def _avx512() -> bool:
    """Does numba compile for a CPU with AVX-512F? (A named target, e.g. NUMBA_CPU_NAME=generic for a
    portable cache, counts only with the feature listed in NUMBA_CPU_FEATURES.)"""
    if getattr(config, "CPU_NAME", None):  # numba's config sets its attributes at run time
        features = getattr(config, "CPU_FEATURES", None) or ""
    else:
        features = llvm_binding.get_host_cpu_features().flatten()
    return "+avx512f" in features.split(",")


AVX512 = _avx512()

_I32 = ir.IntType(32)
_V32 = ir.VectorType(_I32, 16)
_V8 = ir.VectorType(ir.IntType(8), 16)
_V1 = ir.VectorType(ir.IntType(1), 16)


def _at(context, builder, aty, a, i, vty):
    """A pointer to 16 elements of array a from element i, typed as the vector vty."""
    arr = context.make_array(aty)(context, builder, a)
    return builder.bitcast(builder.gep(arr.data, [i]), vty.as_pointer())


def _splat(builder, x):
    v = builder.insert_element(ir.Constant(_V32, None), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_V32, None), ir.Constant(_V32, None))


def _compress_store(builder, vals, mask, dst, n):
    """Store the lanes of vals that mask keeps, in order, at dst; return n + their count."""
    compress = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32, [_V32, _V32, _V1]),
                                              "llvm.x86.avx512.mask.compress.v16i32")
    builder.store(builder.call(compress, [vals, ir.Constant(_V32, None), mask]), dst, align=4)
    ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(16), [ir.IntType(16)]),
                                           "llvm.ctpop.i16")
    kept = builder.zext(builder.call(ctpop, [builder.bitcast(mask, ir.IntType(16))]), ir.IntType(64))
    return builder.add(n, kept)


def _vector_of(a, dtype) -> bool:
    """Can a be read 16 elements at a time from its data pointer (1-D, C-contiguous, of dtype)?"""
    return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == dtype


@intrinsic
def _flags16(typingctx, flags, j, out, n):
    """out[n:] = the indices j .. j + 15 whose flags (uint8) are set; returns n + their count."""

    def codegen(context, builder, sig, args):
        fl, o = args[0], args[2]
        jj, nn = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (1, 3))
        v = builder.load(_at(context, builder, sig.args[0], fl, jj, _V8), align=1)
        mask = builder.icmp_unsigned("!=", v, ir.Constant(_V8, None))
        idx = builder.add(_splat(builder, builder.trunc(jj, _I32)), ir.Constant(_V32, list(range(16))))
        return _compress_store(builder, idx, mask, _at(context, builder, sig.args[2], o, nn, _V32), nn)

    if _vector_of(flags, types.uint8) and _vector_of(out, types.int32):  # else: no signature, a typing error
        return types.int64(flags, j, out, n), codegen
    return None


@intrinsic
def _below16(typingctx, keys, j, n, th):
    """keys[n:] = keys[j .. j + 15] below th (int32, in place, n <= j); returns n + their count."""

    def codegen(context, builder, sig, args):
        k = args[0]
        jj, nn = (context.cast(builder, args[i], sig.args[i], types.int64) for i in (1, 2))
        t = context.cast(builder, args[3], sig.args[3], types.int32)
        v = builder.load(_at(context, builder, sig.args[0], k, jj, _V32), align=4)
        mask = builder.icmp_signed("<", v, _splat(builder, t))
        return _compress_store(builder, v, mask, _at(context, builder, sig.args[0], k, nn, _V32), nn)

    if _vector_of(keys, types.int32):
        return types.int64(keys, j, n, th), codegen
    return None


@njit(inline="always")
def _flagged_from(flags, j, E, out, n):
    """The plain loop from element j on, n kept so far."""
    for i in range(j, E):  # branch-free
        out[n] = i
        n += flags[i] != 0
    return n


@njit(inline="always")
def _below_from(keys, j, E, th, n):
    for i in range(j, E):  # branch-free
        keys[n] = keys[i]
        n += keys[i] < th
    return n


@njit(inline="always")
def flagged_plain(flags, E, out):
    """out[:n] = the indices j < E with flags[j] != 0, in order; returns n (out: int32 [>= E])."""
    return _flagged_from(flags, 0, E, out, 0)


@njit(inline="always")
def below_plain(keys, E, th):
    """Keep keys[:E] below th at the front of keys, in order; returns how many (int32 keys)."""
    return _below_from(keys, 0, E, th, 0)


@njit(inline="always")
def flagged_avx512(flags, E, out):
    n = 0
    for j in range(0, E - E % 16, 16):
        n = _flags16(flags, j, out, n)
    return _flagged_from(flags, E - E % 16, E, out, n)


@njit(inline="always")
def below_avx512(keys, E, th):
    n = 0
    for j in range(0, E - E % 16, 16):
        n = _below16(keys, j, n, th)
    return _below_from(keys, E - E % 16, E, th, n)


# what the kernel calls: chosen once, for the CPU numba compiles for
flagged = flagged_avx512 if AVX512 else flagged_plain
below = below_avx512 if AVX512 else below_plain
