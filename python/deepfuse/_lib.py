"""Loads the compiled kernel library (libdeepfuse_capi.so) with ctypes and declares its C ABI.

The library is built by ``pip install .`` (scikit-build-core, python/CMakeLists.txt) from
deepfuse's own kernel sources. It holds no PyTorch code; :mod:`deepfuse.ops` registers the
torch.library ops that call it. Loading is lazy: importing :mod:`deepfuse` works without it (the
schemas and fake implementations are pure Python), and the first GPU call loads it.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

_LIB_NAME = "libdeepfuse_capi.so"
_lib: Optional[ctypes.CDLL] = None

_P = ctypes.c_void_p
_I = ctypes.c_int
_F = ctypes.c_float
_I64P = ctypes.POINTER(ctypes.c_int64)

# name: (restype, argtypes)
_SIGNATURES = {
    "df_last_error": (ctypes.c_char_p, []),
    "df_abi_version": (_I, []),
    "df_plan_fields": (_I, []),
    "df_kv_page_size": (_I, []),
    "df_qkv_fused_max_tokens": (_I, []),
    "df_swiglu_fused_counters": (_I, []),
    "df_pack_swiglu": (_I, [_P, _P, _P, _P, _P, _P, _I, _I, _P]),
    "df_swiglu_fused": (_I, [_P, _P, _P, _P, _P, _I, _F, _P, _P, _I, _I, _I, _P]),
    "df_silu_and_mul": (_I, [_P, _P, _I, _I, _P]),
    "df_add_rms_norm": (_I, [_P, _P, _P, _P, _I, _I, _F, _P]),
    "df_pack_qkv": (_I, [_P, _P, _I, _I, _P]),
    "df_qkv_rope_fused": (_I, [_P, _P, _F, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _I, _P]),
    "df_rope_kv_append": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I, _P]),
    "df_plan_decode_attention": (_I, [_I, _I, _I, _I, _I, _I, _I, _I64P]),
    "df_decode_attention": (_I, [_I64P, _P, _P, _P, _P, _P, _I, _P, _P, _F, _I, _P]),
    "df_sampling_slot_bytes": (_I, []),
    "df_sampling_workspace_bytes": (ctypes.c_int64, [_I, _I]),
    "df_sample": (_I, [_P, _P, _P, _P, _I, _I, _P]),
    "df_measure_copy_bandwidth": (_I, [ctypes.c_int64, _I, _P, ctypes.POINTER(ctypes.c_double)]),
    "df_read_ceiling": (_I, [_I, ctypes.c_double, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double),
                             _I64P]),
    "df_physically_possible": (_I, [ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_int64]),
}

ABI_VERSION = 2


class DeepfuseLibraryError(RuntimeError):
    """The compiled kernel library is missing or does not match this Python package."""


class DeepfuseKernelError(RuntimeError):
    """A kernel launcher refused its arguments or a launch failed."""


def library_path() -> str:
    """Where the compiled library is expected: next to this file, as the wheel installs it."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def lib() -> ctypes.CDLL:
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is None:
        path = library_path()
        if not os.path.exists(path):
            raise DeepfuseLibraryError(
                f"deepfuse's compiled kernels ({_LIB_NAME}) are not at {path}: install the package with "
                "`pip install .` from the repository root (needs the CUDA toolkit), not by putting "
                "python/ on sys.path")
        handle = ctypes.CDLL(path)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        if handle.df_abi_version() != ABI_VERSION:
            raise DeepfuseLibraryError(f"{path} has C ABI {handle.df_abi_version()}, this package expects {ABI_VERSION}; reinstall")
        _lib = handle
    return _lib


def available() -> bool:
    """True when the compiled library can be loaded."""
    try:
        lib()
        return True
    except (DeepfuseLibraryError, OSError):
        return False


def check(status: int, what: str) -> None:
    """Raises DeepfuseKernelError naming `what` when a C ABI call returned non-zero."""
    if status != 0:
        message = lib().df_last_error().decode(errors="replace")
        raise DeepfuseKernelError(f"deepfuse: {what} failed ({message}, code {status})")
