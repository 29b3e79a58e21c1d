"""Arrays passed to kernels as raw addresses in an int64 frame.

Numba's dispatcher type-checks and unboxes every argument of a call; a hot call that needs a
dozen arrays takes instead one int64 array holding their addresses and lengths and views them
again with `view_*`. Contract: whoever writes an address into a frame keeps that array
alive, C-contiguous and of the dtype the reader expects for as long as the frame can be read, and
rewrites the frame when the array is replaced. Kernels trust the addresses.
"""

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from ..errors import InternalError


def address(a: np.ndarray, dtype) -> int:
    """The data address of `a`, checked to be a C-contiguous array of `dtype`."""
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise InternalError(f"address: expected a C-contiguous {np.dtype(dtype)} array, got {got}")
    return a.__array_interface__["data"][0]


@intrinsic
def as_pointer(typingctx, addr):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())
    return types.voidptr(types.int64), codegen


@intrinsic
def prefetch_address(typingctx, addr):
    """A hint to fetch the cache line at `addr` (an int64) for reading: never faults, changes
    nothing; lets a kernel overlap the misses of lines it will read soon."""
    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [ptr.type], fnty=fnty)
        # read, keep in every cache level, data cache
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(types.int64), codegen


@njit(cache=True, nogil=True, inline="always")
def prefetch(a, i):
    """`prefetch_address` of a[i] (1-D a) when i is inside it."""
    if 0 <= i < a.shape[0]:
        prefetch_address(a.ctypes.data + i * a.itemsize)


@njit(cache=True, nogil=True, inline="always")
def view_i32(addr, n):
    return carray(as_pointer(addr), n, np.int32)


@njit(cache=True, nogil=True, inline="always")
def view_u16(addr, n):
    return carray(as_pointer(addr), n, np.uint16)


@njit(cache=True, nogil=True, inline="always")
def view_i32_2d(addr, rows, cols):
    return carray(as_pointer(addr), (rows, cols), np.int32)


@njit(cache=True, nogil=True, inline="always")
def view_i64(addr, n):
    return carray(as_pointer(addr), n, np.int64)


@njit(cache=True, nogil=True, inline="always")
def view_i64_2d(addr, rows, cols):
    return carray(as_pointer(addr), (rows, cols), np.int64)


@njit(cache=True, nogil=True, inline="always")
def view_f64(addr, n):
    return carray(as_pointer(addr), n, np.float64)


@intrinsic
def borrowed(typingctx, a):
    """A view of array `a` that owns no reference (a null meminfo): passing it to inlined helpers
    and reading it out of named tuples costs no reference counting (numba's atomic increments and
    decrements per array per call, which it does not remove inside loops). The caller keeps `a`
    alive while the view is used (`keep_alive` after the last use of a local array)."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        view = context.make_array(a)(context, builder, value=args[0])
        view.meminfo = ir.Constant(view.meminfo.type, None)
        view.parent = ir.Constant(view.parent.type, None)
        return view._getvalue()

    return a(a), codegen


@njit(cache=True, nogil=True, inline="always")
def keep_alive(a):
    """A use of `a` at this point, so that numba releases it no earlier (see `borrowed`)."""
    return a.shape[0]
