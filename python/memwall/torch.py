"""memwall.torch.AdamW: a torch.optim.Optimizer whose state lives in memwall's offload engine
(host DRAM or NVMe), updated by the engine's C pipeline. docs/python.md has the full story.

Why this layout:
- The engine works on ONE flat fp32 array of weights and one of gradients per engine (its
  subgroups cut that flat space). So at construction each parameter's storage is moved into
  a flat buffer per param group (p.data becomes a view of it; the values are unchanged) and
  each p.grad becomes a view of a flat gradient buffer: autograd then accumulates straight
  into the array the engine reads, with no copy per step, and for an all-DRAM fp32 run the
  engine's master weights ARE the parameters (updated in place, no copy either).
- One engine per param group: the engine applies one (lr, betas, eps, weight_decay) per step,
  and a group is exactly the set of parameters that shares them. Each group's values are read
  at every step, so LR schedulers work.
- torch.optim.AdamW's per-parameter behaviour: a parameter whose gradient is None at step() is
  not touched, and each parameter has its own step count (state['step'], which its bias
  correction uses). Here the counts are kept per parameter and the engine is given a table of
  them when they differ from its own (mw_offload_set_tensor_steps: a tensor is skipped, or
  updated as its own step number). Since p.grad stays a view of the flat buffer, "None" is
  tracked: a post-accumulate-grad hook marks a parameter whose gradient autograd wrote, and
  zero_grad(set_to_none=True) clears the marks. A parameter frozen when the optimizer is built
  has no state (as in torch) until it first has a gradient; then the group's engine is rebuilt
  with it added at the end (the others' state carried over).
- overlap=True: a post-accumulate-grad hook on each parameter reports its range to the engine
  once its gradient is final, so NVMe prefetch and updates start during backward. That is only
  correct if nothing touches the gradients between backward and step (clip_grad_norm_, a
  GradScaler's unscale) and if we know which backward() is the last before step(). Both are
  learned on the first step, which never overlaps: if the gradients were modified after
  backward (their version counter moved) or the hyper-parameters changed between backward and
  step, overlap stays off; the number of backward() calls per step (gradient accumulation) is
  counted. Later steps that break what was learned raise a RuntimeError that says what to do.
  The step is armed expecting the parameters that had gradients at the previous step; a
  parameter expected to be skipped is not reported by its hook, so the table can still be
  corrected at step() for every subgroup whose update has not begun.
"""
import atexit
import fcntl
import mmap
import os
import re
import shutil
import tempfile
import time
import warnings
import weakref

import torch

from . import _lib
from ._offload import Offload, OffloadAdamW, clip_grad_norm_, offload  # noqa: F401 (whole-state offload)
from ._activations import NvmeActivations  # noqa: F401 (offload(activations=...))

__all__ = ["AdamW", "sweep_stale_state", "offload", "Offload", "OffloadAdamW", "clip_grad_norm_",
           "NvmeActivations"]


def _close_at_exit(ref):
    """Interpreter exit: close an optimizer still alive (trace written, NVMe state removed)."""
    opt = ref()
    if opt is not None:
        try:
            opt.close()
        except Exception:  # noqa: BLE001 - at exit there is no caller to tell
            pass

_STATES = {"dram": "all=dram", "nvme": "optim=nvme"}
_MOMENTS = {"fp32": ("fp32", torch.float32), "bf16": ("bf16", torch.bfloat16), "8bit": ("8bit", None)}


def _nbytes_region(moments, n):
    return {"fp32": 4 * n, "bf16": 2 * n, "8bit": n}[moments]


_WFMT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_HUGE = 2 << 20


def _host_flat(n, dtype):
    """A flat CPU tensor of n zero elements in its own private anonymous mapping, 2 MiB-aligned
    and madvised for transparent huge pages, and that mapping with the tensor's byte offset in it.

    Why not torch.empty: the update streams these arrays once per step, and with 4 KiB pages
    (torch's allocator: 64-byte aligned, no MADV_HUGEPAGE) it runs 5-10 % slower; and a mapping
    of our own can give its pages back to the OS (zero_grad: MADV_DONTNEED reads back as zeros),
    so the gradients cost no memory between zero_grad() and the next backward, as torch's
    set_to_none does. Untouched pages cost nothing either: the zeros are the kernel's."""
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    m = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE)  # fd -1: anonymous
    raw = torch.frombuffer(m, dtype=torch.uint8)  # holds the mapping's buffer: it outlives the tensor
    off = -raw.data_ptr() % _HUGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, off, nbytes)
    except (OSError, AttributeError):  # THP off or unsupported: small pages still work
        pass
    return raw[off:off + nbytes].view(dtype), m, off


# ---------------------------------------------------------------------- state directories of dead runs
# Each engine's NVMe directory is DIR/memwall-g<group>-p<pid>-<random> (mkdtemp), and the engine's
# store holds DIR/.../memwall.lock, flock'ed and naming its pid, while it is open (the same lock
# file the C trainer's runs hold: src/core/fsutil.c). A process killed before close() leaves
# its directory, with the whole optimizer state in it, behind.
_STATE_DIR = re.compile(r"^memwall-g\d+-(?:p(\d+)-)?")
_STORE_LOCK = "memwall.lock"
_LOCKLESS_AGE_S = 60.0  # a directory without a lock file may be one being created right now


def _pid_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, another user's
        return True
    return True


def _dir_bytes(path):
    n = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                n += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return n


def _stale_owner(path, name_pid):
    """The pid of the dead process that left state directory `path`, or None when it may be in
    use (its lock is held, its pid is alive or unknown, or it is too new to judge)."""
    lock = os.path.join(path, _STORE_LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:
        return None
    if fd is None:  # no engine opened it (yet): only its name says whose it is
        try:
            young = time.time() - os.stat(path).st_mtime < _LOCKLESS_AGE_S
        except OSError:
            return None
        return name_pid if name_pid and not young and not _pid_alive(name_pid) else None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # held: an engine has it open
        try:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            pid = int(text) if text.isdigit() else name_pid
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return pid if pid and not _pid_alive(pid) else None


def sweep_stale_state(nvme_dir):
    """Removes the state directories that memwall.torch optimizers of processes no longer alive
    left in nvme_dir ("d1:d2": each), and returns them as a list of (path, pid, bytes). A
    directory is taken only when its store lock (memwall.lock) is free and names a pid that is
    not alive (or, with no lock file, when its name's pid is not alive and it is a minute old).
    AdamW(state="nvme") calls this on its nvme_dir and reports what it removed (a warning)."""
    swept = []
    for d in str(nvme_dir).split(":"):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            m = _STATE_DIR.match(name)
            path = os.path.join(d, name)
            if not m or os.path.islink(path) or not os.path.isdir(path):
                continue
            pid = _stale_owner(path, int(m.group(1)) if m.group(1) else None)
            if pid is None:
                continue
            size = _dir_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                swept.append((path, pid, size))
    return swept


def _read_regions(g, first, n, regions):
    """The committed state of regions over [first, first + n) of g's engine, each subgroup read
    once (uint8 tensors, one per region)."""
    outs = [torch.empty(_region_nbytes(g, r, first, n), dtype=torch.uint8) for r in regions]
    ptrs = (_lib.ctypes.c_void_p * len(regions))(*[t.data_ptr() for t in outs])
    ids = (_lib.ctypes.c_int * len(regions))(*regions)
    _lib.check(_lib.lib().mw_offload_read_regions(g.handle, first, n, len(regions), ids, ptrs),
               f"reading the state of param group {g.gi}")
    return outs


def _write_regions(g, first, n, regions, srcs, what):
    """Overwrites regions over [first, first + n) of g's engine from srcs (CPU tensors of the
    regions' bytes); each subgroup written once, and not read first when the call covers all of
    its regions."""
    g.wait_write_back()  # a master write refreshes the host working copy
    srcs = [t.detach().contiguous().cpu() for t in srcs]
    for r, t in zip(regions, srcs):
        want = _region_nbytes(g, r, first, n)
        if t.numel() * t.element_size() != want:
            raise ValueError(f"memwall.torch.AdamW: {what}: {t.numel() * t.element_size()} bytes for region "
                             f"{_REGION_NAMES[r]} of elements [{first}, {first + n}), expected {want}")
    ptrs = (_lib.ctypes.c_void_p * len(regions))(*[t.data_ptr() for t in srcs])
    ids = (_lib.ctypes.c_int * len(regions))(*regions)
    _lib.check(_lib.lib().mw_offload_write_regions(g.handle, first, n, len(regions), ids, ptrs),
               f"restoring {what}")


_REGION_NAMES = {_lib.R_MASTER: "master", _lib.R_EXP_AVG: "exp_avg", _lib.R_EXP_AVG_SCALE: "exp_avg_scale",
                 _lib.R_EXP_AVG_SQ: "exp_avg_sq", _lib.R_EXP_AVG_SQ_SCALE: "exp_avg_sq_scale"}


def _slice_region(t, region, first, n):
    """The part of a whole group's region t (flat, in its dtype; 8-bit scales as uint8 bytes)
    that covers elements [first, first + n)."""
    if region in (_lib.R_EXP_AVG_SCALE, _lib.R_EXP_AVG_SQ_SCALE):
        b = first // _lib.Q8_BLOCK
        return t.view(torch.float32)[b:b + -(-n // _lib.Q8_BLOCK)]
    return t[first:first + n]


def _region_nbytes(g, region, first, n):
    """Bytes of region over [first, first + n): as mw_offload_read_raw sizes them."""
    if region == _lib.R_MASTER:
        return 4 * n
    if region in (_lib.R_EXP_AVG, _lib.R_EXP_AVG_SQ):
        return _nbytes_region(g.moments, n)
    return 4 * (-(-n // _lib.Q8_BLOCK)) if g.moments == "8bit" else 0


class _Group:
    """The engine of one param group: flat weight/gradient buffers and the handle.

    Its parameters (`params`, engine order; `layout`: their positions in the param group) are
    those that required grad or had a gradient when it was built, plus any that got a gradient
    later (a rebuild appends them); the group's others have no state, as in torch. A group with
    none has no engine (handle None) until one of them gets a gradient.

    fp32 parameters: p.data and p.grad are views of the flat buffers (no copies; with
    state="dram" the engine's master weights are the parameters). bf16/fp16 parameters: p.data
    is a view of a flat bf16/fp16 buffer (the engine's working copy, written in the update's
    pass), the fp32 master weights are the engine's (DRAM or NVMe), and the gradients stay
    torch's own tensors, converted into the engine's fp32 gradient buffer when final. So do the
    gradients of fp32 parameters that do not require grad (no hook can mark them: `viewed`).

    Copy path (CUDA parameters; CPU parameters with _copy_path=True, which is how it is tested
    here): the parameters stay where they are; the flat buffers are host copies (pinned for
    CUDA). Gradients are copied into the host buffer (on a side stream, then synchronised),
    and after the step the updated working copy is copied back to the parameters with
    non-blocking copies on the side stream, which the compute stream then waits for (the
    ZeRO-Offload data path); the host buffer is not touched again before that copy is done."""

    def __init__(self, opt, gi, group, order=None):
        self.gi = gi  # no reference to opt: the gradient hooks hold groups, and must not hold the optimizer
        if order is None:
            order = [i for i, p in enumerate(group["params"]) if p.requires_grad or p.grad is not None]
        self.layout = list(order)
        self.params = [group["params"][i] for i in self.layout]
        self.moments = opt._moments
        self.handle = _lib.ctypes.c_void_p()
        self.dirs = []
        self.hook_handles = []
        self.begun = False
        self.wb_event = None     # CUDA: the write-back copies of the last step
        n = len(self.params)
        self.counts = [0] * n         # torch's state['step'] per parameter
        self.live = [False] * n       # fp32 views: autograd wrote the gradient since zero_grad(set_to_none)
        self.prev_live = [True] * n   # which parameters had gradients at the last step (overlap's expectation)
        self.sent = (0,) * n          # the engine's table: per parameter its lag behind the engine's own step
                                      # number, None = skipped; None as a whole: not known (set it)
        self.late = None              # overlap: a step table that could not be corrected (reported at step)
        self.reset_step()
        self.total = 0
        if not n:  # no engine until one of the group's parameters has a gradient
            self.numel, self.first, self.viewed, self.gviews = [], [], [], []
            self.lowp = self.copy = self.own_grads = self.alias = self.release = False
            self.sg_size = 0
            return
        dev = self.params[0].device
        for k, p in enumerate(self.params):
            where = f"parameter {self.layout[k]} of param group {gi} (shape {tuple(p.shape)})"
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError(f"memwall.torch.AdamW: {where} is on {p.device}; parameters must be on the CPU or "
                                 f"a CUDA device")
            if p.device != dev:
                raise ValueError(f"memwall.torch.AdamW: {where} is on {p.device} but parameter 0 of the group is on "
                                 f"{dev}; one device per param group")
            if p.dtype not in _WFMT:
                raise TypeError(f"memwall.torch.AdamW: {where} is {p.dtype}; parameters must be torch.float32, "
                                f"torch.bfloat16 or torch.float16")
            if p.dtype != self.params[0].dtype:
                raise TypeError(f"memwall.torch.AdamW: {where} is {p.dtype} but parameter 0 of the group is "
                                f"{self.params[0].dtype}; put parameters of different dtypes in different param groups")
            if p.is_sparse:
                raise ValueError(f"memwall.torch.AdamW: {where} is a sparse tensor; only dense parameters are supported")
        self.dtype = self.params[0].dtype
        self.lowp = self.dtype != torch.float32
        self.device = dev
        self.cuda = dev.type == "cuda"
        self.copy = self.cuda or bool(opt._copy_path)
        self.own_grads = self.lowp or self.copy   # p.grad is torch's tensor, not a view of self.g
        # fp32 parameters whose p.grad is a view of self.g: those a hook can mark (requires_grad)
        self.viewed = [not self.own_grads and p.requires_grad for p in self.params]
        self.stream = torch.cuda.Stream(device=dev) if self.cuda else None
        self.numel = [p.numel() for p in self.params]
        self.first = []
        off = 0
        for m in self.numel:
            self.first.append(off)
            off += m
        self.total = off
        # The flat buffers; parameters (and fp32 gradients) become views of them (not on the
        # copy path).
        if self.cuda:  # pinned for the copies to and from the device
            self.w = torch.empty(self.total, dtype=self.dtype, pin_memory=True)
            self.g = torch.zeros(self.total, dtype=torch.float32, pin_memory=True)
            self.gmap = None
        else:
            self.w, _, _ = _host_flat(self.total, self.dtype)
            self.g, self.gmap, self.goff = _host_flat(self.total, torch.float32)
        self.gviews = []
        with torch.no_grad():
            for k, (p, a, m) in enumerate(zip(self.params, self.first, self.numel)):
                self.w[a:a + m].copy_(p.detach().reshape(-1))
                if not self.copy:
                    p.data = self.w[a:a + m].view(p.shape)
                gv = self.g[a:a + m].view(p.shape)
                if p.grad is not None:
                    self._check_grad(p, p.grad, k)
                    gv.copy_(p.grad)
                    self.live[k] = True
                if self.viewed[k]:
                    p.grad = gv
                self.gviews.append(gv)
        self.ptrs = [p.data_ptr() for p in self.params]
        self.pversions = [p._version for p in self.params]
        L = _lib.lib()
        self._numel_arr = (_lib.ctypes.c_uint64 * len(self.numel))(*self.numel)
        # Each engine names its NVMe objects the same way: one private directory per engine
        # under each NVMe directory (removed by free()), named with our pid (sweep_stale_state).
        nvme = None
        if opt._nvme_dirs:
            try:
                for d in opt._nvme_dirs:
                    self.dirs.append(tempfile.mkdtemp(prefix=f"memwall-g{gi}-p{os.getpid()}-", dir=d))
            except OSError as e:
                self.remove_dirs()
                raise OSError(e.errno, f"memwall.torch.AdamW: cannot create the state directory of param group "
                                       f"{gi} in {e.filename}: {e.strerror}") from e
            self.nvme_b = ":".join(self.dirs).encode()  # must outlive the engine
            nvme = self.nvme_b
        rc = L.mw_pyapi_create(_lib.ctypes.byref(self.handle), len(self.numel), self._numel_arr, None,
                               _STATES[opt._state].encode(), _MOMENTS[opt._moments][0].encode(),
                               _WFMT[self.dtype].encode(), nvme, opt._subgroup_size, opt._buffer_count,
                               opt._threads, opt._dram_budget, opt._nvme_budget, self.w.data_ptr(),
                               self.g.data_ptr(), opt._trace_handle)
        if rc < 0:
            self.remove_dirs()
        _lib.check(rc, f"creating the offload engine of param group {gi} ({self.total} parameters)")
        buf = (_lib.ctypes.c_double * len(_lib.STATS_FIELDS))()
        L.mw_pyapi_stats(self.handle, buf, len(buf))
        self.sg_size = int(buf[_lib.STATS_FIELDS.index("subgroup_size")])
        # alias: the engine's fp32 master is self.w itself (all-DRAM fp32): never written to it
        self.alias = opt._state == "dram" and not self.lowp
        # release_grads: the engine gives each subgroup's gradient pages back once its update has
        # read them (only our own mapping: never pinned memory)
        self.release = bool(opt._release_grads) and self.gmap is not None
        if self.release:  # and the staging buffers between steps (NVMe state; a no-op in DRAM)
            _lib.check(L.mw_offload_set_release(self.handle, 1, 1),
                       f"releasing the gradients of param group {gi}")
        if self.lowp:  # the fp32 master starts from the parameters' values
            self.push_all()

    # ------------------------------------------------------------------ helpers
    def hp(self, group):
        b1, b2 = group["betas"]
        return (float(group["lr"]), float(b1), float(b2), float(group["eps"]), float(group["weight_decay"]))

    def where(self, k):
        return f"parameter {self.layout[k]} of param group {self.gi} (shape {tuple(self.params[k].shape)})"

    def _check_grad(self, p, grad, k):
        where = self.where(k)
        if grad.is_sparse:
            raise RuntimeError(f"memwall.torch.AdamW does not support sparse gradients ({where}); "
                               f"use dense gradients (e.g. nn.Embedding(..., sparse=False))")
        if grad.device != p.device or grad.dtype != self.dtype:
            raise RuntimeError(f"memwall.torch.AdamW: the gradient of {where} is {grad.dtype} on {grad.device}; "
                               f"expected {self.dtype} on {p.device}")
        if not grad.is_contiguous():
            raise RuntimeError(f"memwall.torch.AdamW does not support non-contiguous gradients ({where}, strides "
                               f"{grad.stride()}); assign p.grad = p.grad.contiguous() before step()")

    def chunks(self):
        """(first, n) of each subgroup: the state is read and written one subgroup at a time."""
        return [(a, min(self.sg_size, self.total - a)) for a in range(0, self.total, self.sg_size)]

    def live_now(self, k):
        """Whether parameter k has a gradient now, in torch's terms (torch would step it). An fp32
        view counts when autograd wrote it since zero_grad(set_to_none=True) (its hook), or when
        it is not all zeros (written in place by hand: torch would have None there, and no
        program that runs on torch can tell the two apart)."""
        p = self.params[k]
        if not self.viewed[k]:
            return p.grad is not None
        if p.grad is None:
            return False
        return p.grad is not self.gviews[k] or self.live[k] or bool(self.gviews[k].any())

    def adopt_grad(self, k):
        """Puts parameter k's gradient into the engine's buffer. fp32: makes p.grad the view of
        the flat buffer again (copying a gradient autograd or the user put elsewhere, e.g. after
        module.zero_grad(set_to_none=True)); low precision: converts it to fp32. None: zeros."""
        p, gv = self.params[k], self.gviews[k]
        grad = p.grad
        if grad is gv:
            return
        if grad is None:
            gv.zero_()
            if self.viewed[k]:
                p.grad = gv
                self.live[k] = False  # None until autograd writes it again
            return
        self._check_grad(p, grad, k)
        gv.copy_(grad)  # CUDA: a synchronous copy into pinned memory (the hook reports it next)
        if self.viewed[k]:
            p.grad = gv

    def fetch_grads(self, ks):
        """adopt_grad for several parameters; CUDA: the copies run on the side stream after the
        work queued so far, and are waited for once."""
        if not self.cuda:
            for k in ks:
                self.adopt_grad(k)
            return
        for k in ks:
            if self.params[k].grad is not None:
                self._check_grad(self.params[k], self.params[k].grad, k)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for k in ks:
                grad = self.params[k].grad
                if grad is None:
                    self.gviews[k].zero_()
                else:
                    self.gviews[k].copy_(grad, non_blocking=True)
        self.stream.synchronize()

    def wait_write_back(self):
        """The host working copy may be written again (CUDA: the last write-back is done)."""
        if self.wb_event is not None:
            self.wb_event.synchronize()
            self.wb_event = None

    def pull(self, ks):
        """Copy path: the parameters' current values into the host working copy."""
        if self.copy:
            self.wait_write_back()
            with torch.no_grad():
                for k in ks:
                    a, n = self.first[k], self.numel[k]
                    self.w[a:a + n].copy_(self.params[k].detach().reshape(-1))

    def write_back(self):
        """Copy path: the host working copy (the updated weights) into the parameters."""
        if self.copy:
            with torch.no_grad():
                if self.cuda:
                    self.stream.wait_stream(torch.cuda.current_stream(self.device))
                    with torch.cuda.stream(self.stream):
                        for p, a, n in zip(self.params, self.first, self.numel):
                            p.detach().copy_(self.w[a:a + n].view(p.shape), non_blocking=True)
                    torch.cuda.current_stream(self.device).wait_stream(self.stream)
                    self.wb_event = self.stream.record_event()
                else:
                    for p, a, n in zip(self.params, self.first, self.numel):
                        p.detach().copy_(self.w[a:a + n].view(p.shape))
        self.pversions = [p._version for p in self.params]

    def note_hook(self, k):
        """Records the gradients' version right after parameter k's hook."""
        if self.own_grads:
            gr = self.params[k].grad
            self.gver[k] = (id(gr), gr._version)
        else:
            self.gversion = self.g._version

    def hooked(self):
        return any(self.hooks)

    def grads_modified(self):
        """Whether a gradient changed after its hook (clipping, unscaling, a manual edit)."""
        if not self.own_grads:
            return self.gversion is not None and self.gversion != self.g._version
        for p, v in zip(self.params, self.gver):
            if v is not None and (p.grad is None or (id(p.grad), p.grad._version) != v):
                return True
        return False

    def _master_matches(self, k):
        """Low precision: whether parameter k holds exactly the rounding of the engine's master
        (then a change of version, e.g. model.load_state_dict of the same values, is no change)."""
        a, n = self.first[k], self.numel[k]
        m = torch.empty(n, dtype=torch.float32)
        _lib.check(_lib.lib().mw_offload_read_raw(self.handle, _lib.R_MASTER, a, n, m.data_ptr()),
                   f"reading the master weights of param group {self.gi}")
        return torch.equal(m.to(self.dtype), self.w[a:a + n])

    def check_storage(self):
        for k, p in enumerate(self.params):
            if p.data_ptr() != self.ptrs[k]:
                raise RuntimeError(f"memwall.torch.AdamW: the storage of parameter {self.layout[k]} of param group "
                                   f"{self.gi} was "
                                   f"replaced after the optimizer was created (p.data = ..., module.to(...)); "
                                   f"create the optimizer after moving the model")

    def sync_params(self):
        """Parameters changed outside the optimizer (model.load_state_dict, p.copy_) since the
        last step: push them into the engine's master weights (a no-op when the master is the
        parameter itself: all-DRAM fp32)."""
        L = _lib.lib()
        self.check_storage()
        for k, p in enumerate(self.params):
            if p._version != self.pversions[k]:
                a, n = self.first[k], self.numel[k]
                self.pull([k])
                if not (self.lowp and self._master_matches(k)):
                    src = self.w[a:a + n].float() if self.lowp else self.w[a:a + n]
                    _lib.check(L.mw_offload_set_master(self.handle, a, n, src.data_ptr()),
                               f"pushing parameter {k} of param group {self.gi} into the engine")
                self.pversions[k] = p._version

    def push_all(self):
        self.pull(range(len(self.params)))
        src = self.w.float() if self.lowp else self.w
        _lib.check(_lib.lib().mw_offload_set_master(self.handle, 0, self.total, src.data_ptr()),
                   f"pushing the parameters of param group {self.gi} into the engine")
        self.pversions = [p._version for p in self.params]

    # ------------------------------------------------------------------ per-parameter steps
    def set_table(self, stepped):
        """Tells the engine which parameters the coming update steps (stepped[k]) and as which
        step number each: its own count + 1, torch's state['step'] after this step. Nothing is
        called when the engine's table already says so (a parameter's lag behind the engine's
        own number does not change while it is stepped each time)."""
        committed = int(_lib.lib().mw_offload_committed_steps(self.handle))
        want = tuple((committed - c) if s else None for c, s in zip(self.counts, stepped))
        if want == self.sent:
            return
        if self.moments == "8bit":
            self._check_blocks(want)
        if all(x == 0 for x in want):
            arr = None
        else:
            arr = (_lib.ctypes.c_uint64 * len(want))(*[(c + 1) if s else 0 for c, s in zip(self.counts, stepped)])
        _lib.check(_lib.lib().mw_offload_set_tensor_steps(self.handle, len(want), arr),
                   f"setting the step of each parameter of param group {self.gi}")
        self.sent = want

    def _check_blocks(self, want):
        """8-bit moments: parameters that share a 256-element block (one scale) step alike."""
        for k in range(1, len(want)):
            if want[k] != want[k - 1] and self.first[k] % _lib.Q8_BLOCK:
                def what(x):
                    return "has no gradient" if x is None else f"is at step {int(_lib.lib().mw_offload_committed_steps(self.handle)) + 1 - x}"
                raise ValueError(
                    f"memwall.torch.AdamW(moment_dtype='8bit'): {self.where(k - 1)} {what(want[k - 1])} but "
                    f"{self.where(k)} {what(want[k])}, and they share a block of {_lib.Q8_BLOCK} elements of "
                    f"the 8-bit moments (one scale), which cannot be stepped in part. Put parameters that are "
                    f"not stepped together in separate param groups, or use moment_dtype='fp32' or 'bf16'")

    # ------------------------------------------------------------------ the step
    def begin(self, arm, hp):
        self.wait_write_back()
        self.sync_params()
        _lib.check(_lib.lib().mw_pyapi_backward_begin(self.handle, 1 if arm else 0, *hp, 1.0),
                   f"starting the step of param group {self.gi}")
        self.begun = True
        self.armed_hp = hp if arm else None

    def report(self, k):
        _lib.check(_lib.lib().mw_offload_grad_ready(self.handle, self.first[k], self.numel[k]),
                   f"reporting the gradient of parameter {k} of param group {self.gi}")
        self.reported[k] = True

    def reset_step(self):
        n = len(self.params)
        self.begun, self.armed_hp = False, None
        self.hooks = [0] * n
        self.reported = [False] * n
        self.gversion = None
        self.gver = [None] * n
        self.probe_hp = None

    def step(self, hp, only=None):
        """Runs (or finishes) the update of this group's parameters that have gradients (the
        others stay as they are, as torch leaves them; with `only`, a set of positions in the
        param group, just those); on failure recovers and raises."""
        if not self.handle:
            return
        L = _lib.lib()
        live = [self.live_now(k) and (only is None or self.layout[k] in only) for k in range(len(self.params))]
        if not self.begun:
            if not any(live):
                self.check_storage()
                return  # nothing to update: no pass over the state at all
            self.set_table(live)
            self.begin(False, hp)
        else:
            try:
                self.set_table(live)
            except _lib.MemwallError as e:
                if e.code != -16:  # EBUSY: a subgroup with a parameter whose gradient went away had begun
                    raise
                self.late = ("a gradient was removed (p.grad = None) after backward() had reported it")
        stepped = [s is not None for s in self.sent]
        # a reported range may be being updated right now: only the others
        self.fetch_grads([k for k in range(len(self.params)) if not self.reported[k] and stepped[k]])
        rc = L.mw_offload_backward_end(self.handle)
        if rc >= 0:
            armed = self.armed_hp is not None
            rc = L.mw_pyapi_step(self.handle, 1 if armed else 0, *hp, 1.0)
        self.reset_step()
        if rc < 0:
            msg = L.mw_error_msg()
            msg = msg.decode(errors="replace") if msg else os.strerror(-rc)
            L.mw_offload_recover(self.handle)
            retry = ("run backward again, then retry the step: release_grads has dropped the gradients of the "
                     "subgroups already updated" if self.release else "the step can be retried")
            text = (f"memwall: the step of param group {self.gi} failed: {msg} (the previous step's state "
                    f"is intact; {retry})")
            if -rc in (5, 28, 122):  # EIO, ENOSPC, EDQUOT
                raise OSError(-rc, text)
            raise _lib.MemwallError(rc, text)
        for k, s in enumerate(stepped):
            if s:
                self.counts[k] += 1
        self.prev_live = live
        self.write_back()

    def zero_grad(self, set_to_none):
        for k, p in enumerate(self.params):
            if self.viewed[k]:
                continue
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        if not self.params or self.own_grads:
            return
        self.clear_grads()
        for k, p in enumerate(self.params):
            if self.viewed[k]:
                if p.grad is not self.gviews[k]:
                    # torch zeroes a gradient it has (set_to_none=False) and leaves None as None
                    self.live[k] = p.grad is not None
                    p.grad = self.gviews[k]
                if set_to_none:
                    self.live[k] = False
        self.hooks = [0] * len(self.params)

    def clear_grads(self):
        """Zeroes the flat gradient buffer: its whole pages go back to the OS (MADV_DONTNEED on
        a private anonymous mapping: they read back as zeros and cost no memory until the next
        backward writes them), the partial page at its end is zeroed in place."""
        if self.gmap is None:
            self.g.zero_()
            return
        nbytes = 4 * self.total
        whole = nbytes // mmap.PAGESIZE * mmap.PAGESIZE  # goff is 2 MiB-aligned
        if whole:
            self.gmap.madvise(mmap.MADV_DONTNEED, self.goff, whole)
        self.g[whole // 4:].zero_()  # also moves the version counter, as zero_() would

    def reattach(self):
        """After a failed rebuild: the parameters are views of this group's buffers again (they
        still hold the same values and gradients)."""
        with torch.no_grad():
            for k, p in enumerate(self.params):
                if not self.copy:
                    p.data = self.w[self.first[k]:self.first[k] + self.numel[k]].view(p.shape)
                if self.viewed[k] and p.grad is not None:
                    p.grad = self.gviews[k]

    def remove_dirs(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.dirs = []

    def free(self):
        for h in self.hook_handles:
            h.remove()
        self.hook_handles = []
        self.wait_write_back()
        if self.handle:
            _lib.lib().mw_offload_free(self.handle)
            self.handle = _lib.ctypes.c_void_p()
        self.remove_dirs()


class AdamW(torch.optim.Optimizer):
    """AdamW (torch.optim.AdamW's update, amsgrad=False) with the optimizer state in memwall's
    offload engine.

    state:        "dram" (master weights = the parameters, moments in host memory) or "nvme"
                  (fp32 master weights and moments on NVMe under nvme_dir; two slots, so a
                  failed write never loses the last committed step)
    nvme_dir:     directory for the NVMe state (must exist); several as "d1:d2" (striped)
    subgroup_size, buffer_count: the engine's pipeline grain and staging buffers (docs/offload.md)
    moment_dtype: "fp32" (bitwise torch's state layout), "bf16" or "8bit"
    overlap:      start updates during backward (see the module docstring for when it engages)
    trace:        path of a Chrome/Perfetto trace written by close() (read by `memwall report`)
    threads:      optimizer kernel threads (default: OpenMP's)
    dram_budget, nvme_budget: bytes the engine may use on each tier (None: what is available)
    release_grads: give the gradients' memory back to the OS as soon as each subgroup's update has
                  read them (fp32 CPU parameters; p.grad then reads zeros after step(), and a
                  failed step needs a new backward before it is retried). Saves the gradients'
                  size from the resident set between steps and part of it during an overlapped
                  backward.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 state="dram", nvme_dir=None, subgroup_size=None, buffer_count=None,
                 moment_dtype="fp32", overlap=True, trace=None, threads=None,
                 dram_budget=None, nvme_budget=None, release_grads=False, _copy_path=False):
        if not 0.0 <= float(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {betas}; each must be in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if state not in _STATES:
            raise ValueError(f"memwall.torch.AdamW: state={state!r}; expected 'dram' or 'nvme'")
        if moment_dtype not in _MOMENTS:
            raise ValueError(f"memwall.torch.AdamW: moment_dtype={moment_dtype!r}; expected 'fp32', 'bf16' or '8bit'")
        if state == "nvme":
            if not nvme_dir:
                raise ValueError("memwall.torch.AdamW: state='nvme' needs nvme_dir, a directory on the NVMe drive")
            for d in str(nvme_dir).split(":"):
                if not os.path.isdir(d):
                    raise FileNotFoundError(f"memwall.torch.AdamW: nvme_dir {d!r} does not exist or is not a "
                                            f"directory; create it first (mkdir -p {d})")
        for name, v in (("subgroup_size", subgroup_size), ("buffer_count", buffer_count), ("threads", threads),
                        ("dram_budget", dram_budget), ("nvme_budget", nvme_budget)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"memwall.torch.AdamW: {name}={v!r}; expected a positive integer or None")
        self._state, self._moments = state, moment_dtype
        self._nvme_dirs = str(nvme_dir).split(":") if state == "nvme" else []
        self._subgroup_size, self._buffer_count = subgroup_size or 0, buffer_count or 0
        self._threads = threads or 0
        self._dram_budget, self._nvme_budget = dram_budget or 0, nvme_budget or 0
        self._overlap = bool(overlap)
        self._release_grads = bool(release_grads)
        self._copy_path = _copy_path  # testing: CPU parameters through the CUDA data path
        self._mode = "probe" if overlap else "off"   # probe -> on | off (see the module docstring)
        self._accum = 0                             # backward() calls per step, learned when probing
        self.overlap_off_reason = None if overlap else "overlap=False"
        self._groups = []
        # state directories that optimizers of dead processes left in nvme_dir: removed, reported
        self.swept_state_dirs = sweep_stale_state(nvme_dir) if state == "nvme" else []
        if self.swept_state_dirs:
            warnings.warn("memwall.torch.AdamW: removed the state directories of optimizers whose process is gone: " +
                          ", ".join(f"{p} (pid {pid}, {b / 2**20:.1f} MiB)" for p, pid, b in self.swept_state_dirs),
                          RuntimeWarning, stacklevel=2)
        self._trace_path = trace
        self._trace_handle = None
        _lib.lib()
        if trace:
            h = _lib.ctypes.c_void_p()
            _lib.check(_lib.lib().mw_trace_init(_lib.ctypes.byref(h), 0), "creating the trace recorder")
            self._trace_handle = h
            _lib.lib().mw_trace_meta(h, b"source", b"memwall.torch.AdamW")
        self._ready = False
        atexit.register(_close_at_exit, weakref.ref(self))
        try:
            super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
            self._ready = True
            for gi, group in enumerate(self.param_groups):
                self._add_engine(gi, group)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ construction
    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        if getattr(self, "_ready", False):
            self._add_engine(len(self.param_groups) - 1, self.param_groups[-1])

    def _add_engine(self, gi, group):
        g = _Group(self, gi, group)
        self._groups.append(g)
        self._hook(g)

    def _hook(self, g):
        """Post-accumulate-grad hooks on g's parameters that require grad: they mark a gradient
        autograd wrote (fp32 views) and, with overlap, report it."""
        me = weakref.ref(self)  # a hook must not keep the optimizer (its engines, NVMe files) alive

        def make_hook(k):
            def hook(p):
                opt = me()
                if opt is not None:
                    opt._on_grad(g, k)
            return hook
        for k, p in enumerate(g.params):
            if p.requires_grad and (self._overlap or g.viewed[k]):
                g.hook_handles.append(p.register_post_accumulate_grad_hook(make_hook(k)))

    def _late(self, gi):
        """Positions of the param group's parameters outside its engine that have a gradient now
        (frozen when the optimizer was built, unfrozen since): torch would step them."""
        inside = set(self._groups[gi].layout)
        return [i for i, p in enumerate(self.param_groups[gi]["params"]) if i not in inside and p.grad is not None]

    def _rebuild(self, gi, order, carry=True):
        """Replaces param group gi's engine by one over the parameters at `order` (positions in
        the group; the old engine's first, in its order), carrying their state over (carry) or
        starting it fresh (a state load follows)."""
        old = self._groups[gi]
        if carry and old.handle:
            if order[:len(old.layout)] != old.layout:
                raise AssertionError("memwall.torch.AdamW: a rebuild must keep the engine's parameters first")
            if self._moments == "8bit" and old.total % _lib.Q8_BLOCK and any(old.counts):
                raise ValueError(
                    f"memwall.torch.AdamW(moment_dtype='8bit'): parameter {order[len(old.layout)]} of param group "
                    f"{gi} got its first gradient after the optimizer was built, and the group's {old.total} "
                    f"parameters with state end inside a block of {_lib.Q8_BLOCK} elements of the 8-bit moments, "
                    f"which it would share; create the optimizer after unfreezing it, put it in a param group of its "
                    f"own, or use moment_dtype='fp32' or 'bf16'")
            if not old.begun:
                old.wait_write_back()
                old.sync_params()  # the master must hold what the parameters hold now
        old.wait_write_back()
        had = {pos: old.live_now(k) for k, pos in enumerate(old.layout)}  # before p.grad moves
        new = _Group(self, gi, self.param_groups[gi], order)
        for k, pos in enumerate(new.layout):  # whether each has a gradient, whichever engine holds it
            if pos in had:
                new.live[k] = had[pos]
        try:
            for k, pos in enumerate(new.layout):  # a probing step's hooks (overlap), before the step
                if pos in had:
                    new.hooks[k] = old.hooks[old.layout.index(pos)]
            new.probe_hp = old.probe_hp
            if carry and old.handle:
                n = len(old.params)
                new.counts[:n] = old.counts
                new.prev_live[:n] = old.prev_live
                regions = ([_lib.R_MASTER] if old.lowp else []) + [r for r, _, _ in self._regions(old) if r != _lib.R_MASTER]
                for a, m in old.chunks():
                    _write_regions(new, a, m, regions, _read_regions(old, a, m, regions),
                                   f"the state of param group {gi}")
                if new.lowp:
                    new.write_back()
        except BaseException:
            new.free()
            old.reattach()
            raise
        new.sent = None
        self._groups[gi] = new
        self._hook(new)
        old.free()
        return new

    # ------------------------------------------------------------------ overlap
    def _on_grad(self, g, k):
        g.live[k] = True
        if self._mode == "off":
            return
        g.adopt_grad(k)
        g.hooks[k] += 1
        g.note_hook(k)
        if self._mode == "probe":
            if g.probe_hp is None:
                g.probe_hp = g.hp(self.param_groups[g.gi])
            return
        if g.hooks[k] > self._accum:
            self._mode = "off"
            raise RuntimeError(
                f"memwall.torch.AdamW(overlap=True): {g.hooks[k]} backward() calls before step(), but the first "
                f"step had {self._accum}; this step's update of param group {g.gi} already started with the "
                f"gradients of the first {self._accum}. Use overlap=False when the number of backward() calls "
                f"per step varies (overlap is now off)")
        if g.hooks[k] == self._accum:
            if not g.begun:  # armed expecting the parameters that had gradients last time
                g.set_table(g.prev_live)
                g.begin(True, g.hp(self.param_groups[g.gi]))
            if g.sent[k] is not None:  # else not reported: the table can still be corrected at step()
                g.report(k)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # parameters with their first gradient since their group's engine was built (unfrozen):
        # the engine is rebuilt with them, now, or after this step when it has begun
        later = []
        for gi in range(len(self.param_groups)):
            late = self._late(gi)
            if late and self._groups[gi].begun:
                later.append((gi, late))
            elif late:
                self._rebuild(gi, self._groups[gi].layout + late)
        hps = [g.hp(self.param_groups[g.gi]) for g in self._groups]
        late_msg = None
        if self._mode == "probe":
            hooked = [g for g in self._groups if g.hooked()]
            modified = any(g.grads_modified() for g in hooked)
            changed = any(g.probe_hp is not None and g.probe_hp != hp for g, hp in zip(self._groups, hps))
            self._accum = max((max(g.hooks) for g in hooked), default=0)
            self._mode = "on" if hooked and not modified and not changed else "off"
            self.overlap_off_reason = (
                "gradients were modified after backward (clipping, unscaling)" if modified else
                "lr/betas/eps/weight_decay changed between backward() and step()" if changed else
                None if hooked else "no gradient hooks fired")
        elif self._mode == "on":
            for g, hp in zip(self._groups, hps):
                if g.begun and (g.grads_modified() or g.armed_hp != hp):
                    late_msg = ("the gradients were modified after backward (e.g. clip_grad_norm_)"
                                if g.grads_modified() else
                                "lr/betas/eps/weight_decay changed between backward() and step()")
        for g, hp in zip(self._groups, hps):
            g.step(hp)
            if g.late:
                late_msg = late_msg or g.late
                g.late = None
        for gi, late in later:  # their first step, alone (the others' was just taken)
            try:
                g = self._rebuild(gi, self._groups[gi].layout + late)
            except Exception as e:
                raise RuntimeError(
                    f"memwall.torch.AdamW: param group {gi} took this step (its update had begun during backward, "
                    f"overlap) without parameters {late}, which have their first gradient; adding them to its "
                    f"engine failed: {e}. The group's other parameters are stepped: run backward again before the "
                    f"next step(), which adds them") from e
            g.step(g.hp(self.param_groups[gi]), only=set(late))
        if late_msg:
            self._mode = "off"
            raise RuntimeError(f"memwall.torch.AdamW(overlap=True): {late_msg}, but the update had already started "
                               f"during backward with the values of that time, and this step used them. Use "
                               f"overlap=False for this training loop (overlap is now off)")
        return loss

    def zero_grad(self, set_to_none=True):
        """fp32 parameters: zeroes the flat gradient buffers, and p.grad stays a view of them
        whatever set_to_none says (autograd accumulates in place; the engine reads them without
        a copy), but with set_to_none=True the optimizer counts them as None: a parameter whose
        gradient autograd does not write again before step() is not stepped, as in torch.
        bf16/fp16 parameters and parameters without state: torch's behaviour."""
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW: zero_grad() between backward() and step() with overlap=True: "
                               "the update has already started with these gradients; call step() first or use "
                               "overlap=False")
        for gi, g in enumerate(self._groups):
            g.zero_grad(set_to_none)
            inside = set(g.layout)
            for i, p in enumerate(self.param_groups[gi]["params"]):
                if i not in inside and p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()

    # ------------------------------------------------------------------ state
    def _regions(self, g):
        """(region, bytes per element or None for 8-bit scales, name) of one group's state."""
        return self._region_list(g.lowp) if g.params else []

    def _region_list(self, lowp):
        mom = self._moments
        per = {"fp32": 4, "bf16": 2, "8bit": 1}[mom]
        out = [(_lib.R_MASTER, 4, "master")] if lowp else []
        out.append((_lib.R_EXP_AVG, per, "exp_avg"))
        if mom == "8bit":
            out.append((_lib.R_EXP_AVG_SCALE, None, "exp_avg_scale"))
        out.append((_lib.R_EXP_AVG_SQ, per, "exp_avg_sq"))
        if mom == "8bit":
            out.append((_lib.R_EXP_AVG_SQ_SCALE, None, "exp_avg_sq_scale"))
        return out

    @staticmethod
    def _region_bytes(per, first, n):
        return per * n if per is not None else 4 * (-(-n // _lib.Q8_BLOCK))

    def _master_source(self, g):
        """What a state write puts into the master region, so that it covers every region of each
        subgroup (nothing read first): the fp32 parameters themselves, or None when the engine's
        master IS them (all-DRAM fp32: nothing to write). The copy path pulls them first."""
        if g.lowp or g.alias:
            return None
        g.pull(range(len(g.params)))
        return g.w

    def state_dict(self):
        """torch.optim.AdamW's layout ({'state': {i: {'step', 'exp_avg', 'exp_avg_sq'}},
        'param_groups': [...]}) with fp32 or bf16 moments exactly as stored; 8-bit moments are
        kept per group under 'memwall' (their block scales span parameters). As in torch, a
        parameter has an entry once it has been stepped ('step': its own count), bf16/fp16 ones
        from the start (their fp32 'master'). Each subgroup is read once."""
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.state_dict() between backward() and step() with overlap=True")
        state, groups, extra, layouts = {}, [], [], []
        idx = 0
        mom = self._moments
        for g, group in zip(self._groups, self.param_groups):
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(idx, idx + len(group["params"])))
            groups.append(packed)
            layouts.append(list(g.layout))
            q8 = {}
            if g.handle:
                stepped = [c > 0 for c in g.counts]
                regions = [_lib.R_MASTER] if g.lowp else []
                if mom != "8bit" and any(stepped):
                    regions += [_lib.R_EXP_AVG, _lib.R_EXP_AVG_SQ]
                if mom == "8bit" and any(stepped):
                    q8 = {"exp_avg": torch.empty(g.total, dtype=torch.uint8),
                          "exp_avg_scale": torch.empty(-(-g.total // _lib.Q8_BLOCK), dtype=torch.float32),
                          "exp_avg_sq": torch.empty(g.total, dtype=torch.uint8),
                          "exp_avg_sq_scale": torch.empty(-(-g.total // _lib.Q8_BLOCK), dtype=torch.float32)}
                    regions += [_lib.R_EXP_AVG, _lib.R_EXP_AVG_SCALE, _lib.R_EXP_AVG_SQ, _lib.R_EXP_AVG_SQ_SCALE]
                # per parameter outputs, filled one subgroup at a time
                dt = {_lib.R_MASTER: torch.float32, _lib.R_EXP_AVG: _MOMENTS[mom][1], _lib.R_EXP_AVG_SQ: _MOMENTS[mom][1]}
                per = {r: [] for r in regions}
                for k, p in enumerate(g.params):
                    for r in regions:
                        keep = r == _lib.R_MASTER or (mom != "8bit" and stepped[k])
                        per[r].append(torch.empty(g.numel[k], dtype=dt[r]) if keep else None)
                for a, n in g.chunks() if regions else []:
                    bufs = dict(zip(regions, _read_regions(g, a, n, regions)))
                    if q8:
                        s8 = a // _lib.Q8_BLOCK
                        q8["exp_avg"][a:a + n] = bufs[_lib.R_EXP_AVG]
                        q8["exp_avg_sq"][a:a + n] = bufs[_lib.R_EXP_AVG_SQ]
                        sc = bufs[_lib.R_EXP_AVG_SCALE].view(torch.float32)
                        q8["exp_avg_scale"][s8:s8 + sc.numel()] = sc
                        sc = bufs[_lib.R_EXP_AVG_SQ_SCALE].view(torch.float32)
                        q8["exp_avg_sq_scale"][s8:s8 + sc.numel()] = sc
                    for k in range(len(g.params)):
                        lo, hi = max(g.first[k], a), min(g.first[k] + g.numel[k], a + n)
                        if lo >= hi:
                            continue
                        for r in regions:
                            out = per[r][k] if r in dt else None
                            if out is not None:
                                out[lo - g.first[k]:hi - g.first[k]] = bufs[r].view(dt[r])[lo - a:hi - a]
                for k, p in enumerate(g.params):
                    if not stepped[k] and not g.lowp:
                        continue
                    s = {"step": torch.tensor(float(g.counts[k]))}
                    if g.lowp:  # the fp32 master is not the parameter: it is part of the state
                        s["master"] = per[_lib.R_MASTER][k].view(p.shape)
                    if mom != "8bit" and stepped[k]:
                        s["exp_avg"] = per[_lib.R_EXP_AVG][k].view(p.shape)
                        s["exp_avg_sq"] = per[_lib.R_EXP_AVG_SQ][k].view(p.shape)
                    state[idx + g.layout[k]] = s
            extra.append(q8)
            idx += len(group["params"])
        return {"state": state, "param_groups": groups,
                "memwall": {"format": 2, "moment_dtype": mom, "groups": extra, "layouts": layouts}}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this class (or of torch.optim.AdamW, for fp32 moments).
        The parameters themselves come from the model's own state dict, loaded before or after.
        Each subgroup is written once (and, on NVMe, not read)."""
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.load_state_dict() between backward() and step() with overlap=True")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"memwall.torch.AdamW.load_state_dict: {len(groups)} param groups in the state dict, "
                             f"{len(self.param_groups)} in the optimizer")
        mw = state_dict.get("memwall", {})
        saved_mom = mw.get("moment_dtype", "fp32")
        if saved_mom != self._moments:
            raise ValueError(f"memwall.torch.AdamW.load_state_dict: the state dict has {saved_mom} moments, this "
                             f"optimizer stores {self._moments} (moment_dtype must match)")
        mom = self._moments
        for gi, (group, saved) in enumerate(zip(self.param_groups, groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"memwall.torch.AdamW.load_state_dict: param group {gi} has {len(saved['params'])} "
                                 f"parameters in the state dict, {len(group['params'])} in the optimizer")
        plans = []  # everything checked and assembled before the engines change
        for gi, (group, saved) in enumerate(zip(self.param_groups, groups)):
            states = [state_dict["state"].get(i) for i in saved["params"]]  # by position in the group
            g = self._groups[gi]
            # the engine holds the parameters with state in the dict (in the saved order, which the
            # 8-bit moments' blocks follow), then those it holds now
            saved_layout = (mw.get("layouts") or [None] * len(groups))[gi]
            if saved_layout is not None and (
                    not isinstance(saved_layout, (list, tuple)) or len(set(saved_layout)) != len(saved_layout) or
                    any(not isinstance(i, int) or not 0 <= i < len(group["params"]) for i in saved_layout)):
                raise ValueError(f"memwall.torch.AdamW.load_state_dict: the layout of param group {gi} names "
                                 f"parameters the optimizer's group does not have")
            if saved_layout is None:
                saved_layout = g.layout + [i for i, s in enumerate(states) if s is not None and i not in set(g.layout)]
            order = list(saved_layout) + [i for i in g.layout if i not in set(saved_layout)]
            params = [group["params"][i] for i in order]
            numel = [p.numel() for p in params]
            first = [sum(numel[:k]) for k in range(len(numel))]
            total = sum(numel)
            mine = [states[i] for i in order]
            counts = [int(s["step"]) if s is not None and "step" in s else 0 for s in mine]
            srcs = {}
            lowp = bool(params) and params[0].dtype != torch.float32
            if lowp:
                master = torch.empty(total, dtype=torch.float32)
                for k, (p, s) in enumerate(zip(params, mine)):
                    src = s["master"] if s is not None and "master" in s else p
                    master[first[k]:first[k] + numel[k]] = src.detach().reshape(-1).float().cpu()
                srcs[_lib.R_MASTER] = master
            if mom == "8bit":
                q8 = mw["groups"][gi] if any(counts) else {}
                nsc = -(-total // _lib.Q8_BLOCK)
                for r, key, nb in ((_lib.R_EXP_AVG, "exp_avg", total), (_lib.R_EXP_AVG_SCALE, "exp_avg_scale", 4 * nsc),
                                   (_lib.R_EXP_AVG_SQ, "exp_avg_sq", total),
                                   (_lib.R_EXP_AVG_SQ_SCALE, "exp_avg_sq_scale", 4 * nsc)):
                    t = q8[key].detach().cpu().contiguous() if key in q8 else torch.zeros(nb, dtype=torch.uint8)
                    if t.numel() * t.element_size() != nb:
                        raise ValueError(f"memwall.torch.AdamW.load_state_dict: {key} of param group {gi} has "
                                         f"{t.numel() * t.element_size()} bytes, expected {nb}")
                    srcs[r] = t.view(torch.uint8).reshape(-1)
            else:
                dt = _MOMENTS[mom][1]
                for key, r in (("exp_avg", _lib.R_EXP_AVG), ("exp_avg_sq", _lib.R_EXP_AVG_SQ)):
                    flat = torch.zeros(total, dtype=dt)
                    for k, s in enumerate(mine):
                        if s is None or counts[k] == 0:
                            continue
                        t = s[key]
                        if t.dtype != dt:
                            raise ValueError(f"memwall.torch.AdamW.load_state_dict: {key} of parameter {order[k]} "
                                             f"of param group {gi} is {t.dtype}, expected {dt}")
                        if t.numel() != numel[k]:
                            raise ValueError(f"memwall.torch.AdamW.load_state_dict: {key} of parameter {order[k]} "
                                             f"of param group {gi} has {t.numel()} elements, expected {numel[k]}")
                        flat[first[k]:first[k] + numel[k]] = t.detach().reshape(-1).cpu()
                    srcs[r] = flat
            plans.append((order, counts, srcs))
        for gi, ((order, counts, srcs), group, saved) in enumerate(zip(plans, self.param_groups, groups)):
            g = self._groups[gi]
            if order != g.layout:
                g = self._rebuild(gi, order, carry=False)
            if g.handle:
                if not g.lowp:
                    src = self._master_source(g)
                    if src is not None:
                        srcs[_lib.R_MASTER] = src
                regions = list(srcs)
                for a, n in g.chunks():
                    _write_regions(g, a, n, regions, [_slice_region(srcs[r], r, a, n) for r in regions],
                                   f"the state of param group {gi}")
                g.write_back()  # bf16/fp16: the parameters now round the master (copy path: copied to them)
                g.counts = counts
                g.sent = None
                g.prev_live = [True] * len(g.params)
            for key, v in saved.items():
                if key != "params":
                    group[key] = tuple(v) if key == "betas" else v
        self._mode = "probe" if self._overlap else "off"

    # ------------------------------------------------------------------ streamed state files
    _MAGIC = b"MWTORCH1"

    def _file_chunks(self, g, chunk_elems):
        """Chunks of g's flat space for the streamed files: whole subgroups when chunk_elems
        allows (each subgroup read or written once), else chunk_elems (a multiple of 256)."""
        chunk = max(_lib.Q8_BLOCK, chunk_elems // _lib.Q8_BLOCK * _lib.Q8_BLOCK)
        if chunk >= g.sg_size:
            chunk = chunk // g.sg_size * g.sg_size
        return [(a, min(chunk, g.total - a)) for a in range(0, g.total, chunk)]

    def save_state(self, path, chunk_elems=1 << 24):
        """Writes the optimizer state to `path` one chunk at a time (at most chunk_elems
        elements of each region in memory), unlike state_dict(), which materialises all of it.
        Layout: b"MWTORCH1", a little-endian u64 header length, a JSON header (groups'
        hyper-parameters, sizes, each parameter's step, formats), then each group's regions in
        order (master for bf16/fp16 parameters, exp_avg, its 8-bit scales, exp_avg_sq, its scales)
        as stored. Written to path + ".tmp" and renamed, so a crash leaves the previous file intact.
        Each chunk of every region is read at once (each subgroup once when chunk_elems is at
        least the subgroup size) and written at its place in the file."""
        import json
        import struct
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.save_state() between backward() and step() with overlap=True")
        groups = []
        for g, group in zip(self._groups, self.param_groups):
            hp = {k: v for k, v in group.items() if k != "params" and isinstance(v, (int, float, str, bool, tuple,
                                                                                     list, type(None)))}
            groups.append({"hparams": hp, "numel": g.numel, "dtype": _WFMT[g.dtype] if g.handle else None,
                           "step": max(g.counts, default=0), "steps": g.counts, "layout": g.layout})
        header = json.dumps({"format": 2, "moment_dtype": self._moments, "groups": groups}).encode()
        tmp = str(path) + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self._MAGIC + struct.pack("<Q", len(header)) + header)
            base = f.tell()
            for g in self._groups:
                if not g.handle:
                    continue
                regs = self._regions(g)
                starts, pos = [], base
                for _, per, _ in regs:
                    starts.append(pos)
                    pos += self._region_bytes(per, 0, g.total)
                for a, n in self._file_chunks(g, chunk_elems):
                    bufs = _read_regions(g, a, n, [r for r, _, _ in regs])
                    for (_, per, _), start, t in zip(regs, starts, bufs):
                        f.seek(start + self._region_bytes(per, 0, a))
                        f.write(t.numpy().tobytes())
                base = pos
            f.seek(base)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def load_state(self, path, chunk_elems=1 << 24):
        """Restores a save_state() file one chunk at a time; the parameters themselves come from
        the model's own checkpoint (fp32) or from the file's master weights (bf16/fp16)."""
        import json
        import struct
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.load_state() between backward() and step() with overlap=True")
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) != 16 or head[:8] != self._MAGIC:
                raise ValueError(f"memwall.torch.AdamW.load_state: {path} is not a memwall.torch state file")
            (hlen,) = struct.unpack("<Q", head[8:])
            if hlen > 1 << 30:
                raise ValueError(f"memwall.torch.AdamW.load_state: {path}: header length {hlen} is not plausible")
            try:
                meta = json.loads(f.read(hlen))
            except ValueError as e:
                raise ValueError(f"memwall.torch.AdamW.load_state: {path}: bad header ({e})") from None
            if meta.get("moment_dtype") != self._moments:
                raise ValueError(f"memwall.torch.AdamW.load_state: {path} has {meta.get('moment_dtype')} moments, "
                                 f"this optimizer stores {self._moments} (moment_dtype must match)")
            gs = meta.get("groups", [])
            if len(gs) != len(self._groups):
                raise ValueError(f"memwall.torch.AdamW.load_state: {path} has {len(gs)} param groups, the optimizer "
                                 f"{len(self._groups)}")
            layouts = []
            base = f.tell()
            end = f.seek(0, os.SEEK_END)
            pos = base
            for gi, m in enumerate(gs):  # checked against the file before the engines change
                g, gp = self._groups[gi], self.param_groups[gi]["params"]
                layout = m.get("layout", g.layout)
                if (not isinstance(layout, list) or any(not isinstance(i, int) or not 0 <= i < len(gp) for i in layout)
                        or len(set(layout)) != len(layout)):
                    raise ValueError(f"memwall.torch.AdamW.load_state: param group {gi} of {path} names parameters "
                                     f"the optimizer's group does not have")
                extra = [i for i in g.layout if i not in set(layout)]
                if extra and g.handle:
                    raise ValueError(f"memwall.torch.AdamW.load_state: {path} holds the state of {len(layout)} "
                                     f"parameters of param group {gi}, and the optimizer has state for parameters "
                                     f"{extra} besides (they had gradients since, or required grad when it was built "
                                     f"and were frozen when the file was written); build the optimizer with the "
                                     f"same parameters frozen, or use state_dict() / load_state_dict()")
                params = [gp[i] for i in layout]
                numel = [p.numel() for p in params]
                if m.get("numel") != numel or (params and m.get("dtype") != _WFMT.get(params[0].dtype)):
                    raise ValueError(f"memwall.torch.AdamW.load_state: param group {gi} of {path} has other "
                                     f"parameters (sizes or dtype) than the optimizer's")
                layouts.append(layout)
                lowp = bool(params) and params[0].dtype != torch.float32
                for _, per, name in self._region_list(lowp) if params else []:
                    pos += self._region_bytes(per, 0, sum(numel))
                    if pos > end:
                        raise ValueError(f"memwall.torch.AdamW.load_state: {path} ends inside {name} of param "
                                         f"group {gi} (truncated file)")
            if pos != end:
                raise ValueError(f"memwall.torch.AdamW.load_state: {path} has bytes past the state (another file?)")
            for gi, (m, group, layout) in enumerate(zip(gs, self.param_groups, layouts)):
                g = self._groups[gi]
                if layout != g.layout:
                    g = self._rebuild(gi, layout, carry=False)
                if g.handle:
                    regs = self._regions(g)
                    starts = []
                    for _, per, _ in regs:
                        starts.append(base)
                        base += self._region_bytes(per, 0, g.total)
                    src = self._master_source(g)
                    regions = [r for r, _, _ in regs] + ([_lib.R_MASTER] if src is not None else [])
                    for a, n in self._file_chunks(g, chunk_elems):
                        datas = []
                        for (_, per, _), start in zip(regs, starts):
                            nb = self._region_bytes(per, a, n)
                            f.seek(start + self._region_bytes(per, 0, a))
                            datas.append(torch.frombuffer(bytearray(f.read(nb)), dtype=torch.uint8)
                                         if nb else torch.empty(0, dtype=torch.uint8))
                        if src is not None:
                            datas.append(src[a:a + n])
                        _write_regions(g, a, n, regions, datas, f"the state of param group {gi}")
                    g.write_back()  # bf16/fp16: the parameters now round the master (copy path: copied to them)
                    steps = m.get("steps", [int(m["step"])] * len(g.params))
                    g.counts = [int(c) for c in steps]
                    g.sent = None
                    g.prev_live = [True] * len(g.params)
                for k, v in m["hparams"].items():
                    group[k] = tuple(v) if k == "betas" else v
        self._mode = "probe" if self._overlap else "off"

    # ------------------------------------------------------------------ reporting and teardown
    def stats(self):
        """The engines' counters and plan, summed over param groups (docs/python.md)."""
        out = dict.fromkeys(_lib.STATS_FIELDS, 0.0)
        buf = (_lib.ctypes.c_double * len(_lib.STATS_FIELDS))()
        for g in self._groups:
            if not g.handle:
                continue
            n = _lib.lib().mw_pyapi_stats(g.handle, buf, len(buf))
            for i in range(n):
                f = _lib.STATS_FIELDS[i]
                out[f] = max(out[f], buf[i]) if f in ("steps", "subgroup_size") else out[f] + buf[i]
        out["overlap"] = self._mode == "on"
        return out

    def _inject_write_failure(self, group, k):
        """Testing: the k-th NVMe write of param group `group`'s engine from now fails (-EIO)
        after writing half its bytes (memwall/offload.h)."""
        _lib.lib().mw_offload_inject_write_failure(self._groups[group].handle, k)

    def write_trace(self):
        """Writes the trace (trace=...) collected so far."""
        if self._trace_handle is None:
            raise RuntimeError("memwall.torch.AdamW: no trace requested (pass trace='run/trace.json')")
        d = os.path.dirname(os.path.abspath(self._trace_path))
        os.makedirs(d, exist_ok=True)
        _lib.check(_lib.lib().mw_trace_write(self._trace_handle, str(self._trace_path).encode()),
                   f"writing the trace {self._trace_path}")

    def close(self):
        """Frees the engines (their NVMe files and memory) and writes the trace, if any. The
        parameters keep their last values. Called by __del__ too."""
        for g in getattr(self, "_groups", []):
            g.free()
        self._groups = []
        th = getattr(self, "_trace_handle", None)
        if th is not None:
            try:
                self.write_trace()
            finally:
                _lib.lib().mw_trace_free(th)
                self._trace_handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at interpreter teardown
            pass
