"""ctypes bindings of libmemwall.so: the offload engine (memwall/offload.h), its flat wrappers
(memwall/pyapi.h), the error message and the trace recorder.

Why ctypes and not a compiled extension module: the library already is a C ABI with scalar and
pointer arguments, so a binding needs no compiler at import time, no per-Python-version build
and no CPython API; ctypes releases the GIL around every call, so the engine's threads and the
caller's threads run in parallel. The cost is about a microsecond per call, and this package
makes a handful of calls per parameter tensor per step (docs/python.md).

The library is looked up in $MEMWALL_LIB (a path; the build tree's libmemwall.so for the
tests), else next to this file (where `pip install ./python` puts it).
"""
import ctypes
import os

PYAPI_VERSION = 2

# enum mw_offload_region
R_MASTER, R_EXP_AVG, R_EXP_AVG_SCALE, R_EXP_AVG_SQ, R_EXP_AVG_SQ_SCALE = 0, 1, 2, 3, 4
NO_DECAY = 0x1
Q8_BLOCK = 256
STATS_FIELDS = ("steps", "nvme_read_bytes", "nvme_write_bytes", "step_s", "kernel_s", "io_wait_s",
                "cpu_updates", "n_subgroups", "subgroup_size", "dram_bytes", "nvme_bytes", "staging_bytes")

# memwall/optim.h: the bare kernels, for the tests' reference and the benchmark's bandwidth limit
# (the package itself drives the offload engine)
OPTIM_F32, OPTIM_BF16, OPTIM_F16, OPTIM_Q8 = 1, 2, 3, 4  # enum mw_optim_dtype


class OptimFormat(ctypes.Structure):  # struct mw_optim_format
    _fields_ = [("grad", ctypes.c_int), ("moments", ctypes.c_int), ("weights_out", ctypes.c_int)]


class AdamwHP(ctypes.Structure):  # struct mw_adamw_hp
    _fields_ = [("lr", ctypes.c_double), ("beta1", ctypes.c_double), ("beta2", ctypes.c_double),
                ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double), ("step", ctypes.c_int64),
                ("grad_scale", ctypes.c_float)]


class OptimSlice(ctypes.Structure):  # struct mw_optim_slice
    _fields_ = [("n", ctypes.c_size_t), ("offset", ctypes.c_size_t)] + \
               [(k, ctypes.c_void_p) for k in ("master", "grad", "m", "v", "m_scale", "v_scale", "weights_out")]


class OptimExec(ctypes.Structure):  # struct mw_optim_exec
    _fields_ = [("nthreads", ctypes.c_int), ("simd", ctypes.c_int), ("flags", ctypes.c_uint)]


# The whole-state session (memwall/pyapi.h, mw_pysession_*; memwall.torch.offload)
UNIT_ACQUIRE, UNIT_RELEASE = 0, 1  # MW_NET_UNIT_ACQUIRE / RELEASE
E_BUDGET, E_OVERFLOW = -10001, -10004  # MW_EBUDGET (a budget too small), MW_EOVERFLOW (inf/NaN gradients)
# mw_foreign_init_fn: int (*)(void *user, int unit, float *dst, uint64_t n)
INIT_UNIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64)
SESSION_STATS_FIELDS = ("steps", "n_params", "n_units", "planned_dram_peak", "weights_resident_peak",
                        "weight_bytes_fetched", "grad_bytes_written", "fetch_wait_s", "optimizer_nvme_read_bytes",
                        "optimizer_nvme_write_bytes", "subgroup_size", "prefetch_depth", "weight_bytes_handed_over",
                        "grads_kept_in_dram")


_lib = None


class MemwallError(RuntimeError):
    """A failure reported by libmemwall: `code` is the negative errno / MW_E* code."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _path():
    p = os.environ.get("MEMWALL_LIB")
    if p:
        return p
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmemwall.so")


def lib():
    """Loads and declares the library once."""
    global _lib
    if _lib is not None:
        return _lib
    path = _path()
    if not os.path.exists(path):
        raise ImportError(f"memwall: the C library {path} does not exist; install the package with "
                          f"`pip install ./python` from the repository root, or set MEMWALL_LIB to a "
                          f"libmemwall.so built with `make build`")
    L = ctypes.CDLL(path)
    P, u64, i32, f64, f32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_double, ctypes.c_float
    sig = {
        "mw_pyapi_version": (i32, []),
        "mw_error_msg": (ctypes.c_char_p, []),
        "mw_pyapi_create": (i32, [ctypes.POINTER(P), ctypes.c_uint32, P, P, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.c_char_p, ctypes.c_char_p, u64, i32, i32, u64, u64, P, P, P]),
        "mw_pyapi_backward_begin": (i32, [P, i32, f64, f64, f64, f64, f64, f32]),
        "mw_pyapi_step": (i32, [P, i32, f64, f64, f64, f64, f64, f32]),
        "mw_pyapi_stats": (i32, [P, P, i32]),
        "mw_offload_free": (None, [P]),
        "mw_offload_grad_ready": (i32, [P, u64, u64]),
        "mw_offload_backward_end": (i32, [P]),
        "mw_offload_recover": (i32, [P]),
        "mw_offload_committed_steps": (u64, [P]),
        "mw_offload_set_committed_steps": (i32, [P, u64]),
        "mw_offload_read_raw": (i32, [P, i32, u64, u64, P]),
        "mw_offload_write_raw": (i32, [P, i32, u64, u64, P]),
        "mw_offload_set_master": (i32, [P, u64, u64, P]),
        "mw_offload_inject_write_failure": (None, [P, u64]),
        "mw_offload_set_release": (i32, [P, i32, i32]),
        "mw_offload_read_regions": (i32, [P, u64, u64, i32, P, P]),
        "mw_offload_write_regions": (i32, [P, u64, u64, i32, P, P]),
        "mw_offload_set_tensor_steps": (i32, [P, ctypes.c_uint32, P]),
        "mw_pysession_open": (i32, [ctypes.POINTER(P), i32, P, P, i32, P, i32, P, i32, P, P, P, INIT_UNIT_FN, P,
                                    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, u64, i32, i32, u64, i32, i32]),
        "mw_pysession_close": (None, [P]),
        "mw_pysession_params": (P, [P]),
        "mw_pysession_grads": (P, [P]),
        "mw_pysession_n_params": (u64, [P]),
        "mw_pysession_unit_range": (i32, [P, i32, ctypes.POINTER(u64), ctypes.POINTER(u64)]),
        "mw_pysession_pass_begin": (i32, [P, i32]),
        "mw_pysession_unit": (i32, [P, i32, i32, i32]),
        "mw_pysession_backward_begin": (i32, [P, i32, i32]),
        "mw_pysession_grad_ready": (i32, [P, i32]),
        "mw_pysession_unit_trim": (i32, [P, i32, u64, u64, i32]),
        "mw_pysession_backward_end": (i32, [P]),
        "mw_pysession_grad_norm": (i32, [P, ctypes.POINTER(f64)]),
        "mw_pysession_step": (i32, [P, f64, f64, f64, f64, f64, f64]),
        "mw_pysession_finish": (i32, [P]),
        "mw_pysession_unit_read": (i32, [P, i32, P]),
        "mw_pysession_unit_write": (i32, [P, i32, P]),
        "mw_pysession_stats": (i32, [P, P, i32]),
        # the session's commit records and resume (pyapi.h, "resume"; memwall.torch.offload(resume=, trace=))
        "mw_pysession_open2": (i32, [ctypes.POINTER(P), i32, P, P, i32, P, i32, P, i32, P, P, P, INIT_UNIT_FN, P,
                                     ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, u64, i32, i32, u64, i32, i32,
                                     i32, P]),
        "mw_pysession_resumable": (i32, [P]),
        "mw_pysession_state_read": (i32, [P, u64, u64, P, P]),
        "mw_pysession_state_write": (i32, [P, u64, u64, P, P, ctypes.c_int64]),
        "mw_pysession_end": (i32, [P]),
        "mw_trace_init": (i32, [ctypes.POINTER(P), ctypes.c_size_t]),
        "mw_trace_write": (i32, [P, ctypes.c_char_p]),
        "mw_trace_free": (None, [P]),
        "mw_trace_meta": (None, [P, ctypes.c_char_p, ctypes.c_char_p]),
        "mw_adamw_step": (i32, [ctypes.POINTER(OptimFormat), ctypes.POINTER(AdamwHP), ctypes.POINTER(OptimSlice),
                                ctypes.POINTER(OptimExec)]),
        "mw_optim_bandwidth_pass": (i32, [ctypes.POINTER(OptimFormat), ctypes.POINTER(OptimSlice),
                                          ctypes.POINTER(OptimExec)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(L, name)
        f.restype, f.argtypes = res, args
    v = L.mw_pyapi_version()
    if v != PYAPI_VERSION:
        raise ImportError(f"memwall: {path} speaks pyapi version {v}, this package needs {PYAPI_VERSION}; "
                          f"reinstall with `pip install ./python`")
    _lib = L
    return L


def check(rc, what):
    """Raises MemwallError (OSError for I/O-like errno codes) with the library's message."""
    if rc >= 0:
        return rc
    msg = lib().mw_error_msg()
    msg = msg.decode(errors="replace") if msg else ""
    text = f"memwall: {what} failed: {msg or os.strerror(-rc)}"
    if -rc in (5, 28, 2, 13, 30, 122):  # EIO, ENOSPC, ENOENT, EACCES, EROFS, EDQUOT
        raise OSError(-rc, text)
    raise MemwallError(rc, text)


# ---- activations on NVMe: the spill store of saved tensors (memwall/pyapi.h, mw_pyacts_*; _activations.py) ----
ACTS_STATS_FIELDS = ("live", "live_bytes", "peak_live_bytes", "bytes_written", "bytes_read", "puts", "reads",
                     "write_wait_s", "read_wait_s", "staging_bytes", "direct")
_acts_declared = False


def acts_lib():
    """lib(), with the spill store's functions declared (once)."""
    global _acts_declared
    L = lib()
    if not _acts_declared:
        P, u64, i32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
        for name, (res, args) in {
            "mw_pyacts_open": (i32, [ctypes.POINTER(P), ctypes.c_char_p, u64, u64, u64]),
            "mw_pyacts_close": (None, [P]),
            "mw_pyacts_put": (i32, [P, P, u64, ctypes.POINTER(u64)]),
            "mw_pyacts_room": (u64, [u64]),
            "mw_pyacts_bytes": (i32, [P, u64, ctypes.POINTER(u64)]),
            "mw_pyacts_read_start": (i32, [P, u64, P, u64]),
            "mw_pyacts_read_wait": (i32, [P, u64]),
            "mw_pyacts_drop": (i32, [P, u64]),
            "mw_pyacts_flush": (i32, [P]),
            "mw_pyacts_stats": (i32, [P, P, i32]),
        }.items():
            f = getattr(L, name)
            f.restype, f.argtypes = res, args
        _acts_declared = True
    return L
