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
- overlap=True: a post-accumulate-grad hook on each parameter reports its range to the engine
  once its gradient is final, so NVMe prefetch and updates start during backward. That is only
  correct if nothing touches the gradients between backward and step (clip_grad_norm_, a
  GradScaler's unscale) and if we know which backward() is the last before step(). Both are
  learned on the first step, which never overlaps: if the gradients were modified after
  backward (their version counter moved) or the hyper-parameters changed between backward and
  step, overlap stays off; the number of backward() calls per step (gradient accumulation) is
  counted. Later steps that break what was learned raise a RuntimeError that says what to do.
"""
import atexit
import mmap
import os
import shutil
import tempfile
import weakref

import torch

from . import _lib

__all__ = ["AdamW"]


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


class _Group:
    """The engine of one param group: flat weight/gradient buffers and the handle.

    fp32 parameters: p.data and p.grad are views of the flat buffers (no copies; with
    state="dram" the engine's master weights are the parameters). bf16/fp16 parameters: p.data
    is a view of a flat bf16/fp16 buffer (the engine's working copy, written in the update's
    pass), the fp32 master weights are the engine's (DRAM or NVMe), and the gradients stay
    torch's own tensors, converted into the engine's fp32 gradient buffer when final.

    Copy path (CUDA parameters; CPU parameters with _copy_path=True, which is how it is tested
    here): the parameters stay where they are; the flat buffers are host copies (pinned for
    CUDA). Gradients are copied into the host buffer (on a side stream, then synchronised),
    and after the step the updated working copy is copied back to the parameters with
    non-blocking copies on the side stream, which the compute stream then waits for (the
    ZeRO-Offload data path); the host buffer is not touched again before that copy is done."""

    def __init__(self, opt, gi, group):
        self.gi = gi  # no reference to opt: the gradient hooks hold groups, and must not hold the optimizer
        self.params = [p for p in group["params"] if p.requires_grad]
        if not self.params:
            raise ValueError(f"memwall.torch.AdamW: param group {gi} has no parameter that requires grad")
        dev = self.params[0].device
        for k, p in enumerate(self.params):
            where = f"parameter {k} of param group {gi} (shape {tuple(p.shape)})"
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
        self.stream = torch.cuda.Stream(device=dev) if self.cuda else None
        self.wb_event = None     # CUDA: the write-back copies of the last step
        self.numel = [p.numel() for p in self.params]
        self.first = []
        off = 0
        for n in self.numel:
            self.first.append(off)
            off += n
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
            for k, (p, a, n) in enumerate(zip(self.params, self.first, self.numel)):
                self.w[a:a + n].copy_(p.detach().reshape(-1))
                if not self.copy:
                    p.data = self.w[a:a + n].view(p.shape)
                gv = self.g[a:a + n].view(p.shape)
                if p.grad is not None:
                    self._check_grad(p, p.grad, k)
                    gv.copy_(p.grad)
                if not self.own_grads:
                    p.grad = gv
                self.gviews.append(gv)
        self.ptrs = [p.data_ptr() for p in self.params]
        self.pversions = [p._version for p in self.params]
        L = _lib.lib()
        self._numel_arr = (_lib.ctypes.c_uint64 * len(self.numel))(*self.numel)
        # Each engine names its NVMe objects the same way: one private directory per engine
        # under each NVMe directory (removed by free()).
        self.dirs = []
        nvme = None
        if opt._nvme_dirs:
            try:
                for d in opt._nvme_dirs:
                    self.dirs.append(tempfile.mkdtemp(prefix=f"memwall-g{gi}-", dir=d))
            except OSError as e:
                self.remove_dirs()
                raise OSError(e.errno, f"memwall.torch.AdamW: cannot create the state directory of param group "
                                       f"{gi} in {e.filename}: {e.strerror}") from e
            self.nvme_b = ":".join(self.dirs).encode()  # must outlive the engine
            nvme = self.nvme_b
        self.handle = _lib.ctypes.c_void_p()
        rc = L.mw_pyapi_create(_lib.ctypes.byref(self.handle), len(self.numel), self._numel_arr, None,
                               _STATES[opt._state].encode(), _MOMENTS[opt._moments][0].encode(),
                               _WFMT[self.dtype].encode(), nvme, opt._subgroup_size, opt._buffer_count,
                               opt._threads, opt._dram_budget, opt._nvme_budget, self.w.data_ptr(),
                               self.g.data_ptr(), opt._trace_handle)
        if rc < 0:
            self.remove_dirs()
        _lib.check(rc, f"creating the offload engine of param group {gi} ({self.total} parameters)")
        # release_grads: the engine gives each subgroup's gradient pages back once its update has
        # read them (only our own mapping: never pinned memory)
        self.release = bool(opt._release_grads) and self.gmap is not None
        if self.release:  # and the staging buffers between steps (NVMe state; a no-op in DRAM)
            _lib.check(L.mw_offload_set_release(self.handle, 1, 1),
                       f"releasing the gradients of param group {gi}")
        if self.lowp:  # the fp32 master starts from the parameters' values
            self.push_all()
        self.begun = False       # backward_begin called for the coming step
        self.armed_hp = None     # hyper-parameters the step was armed with
        self.hooks = [0] * len(self.params)      # hook calls since the last step, per parameter
        self.reported = [False] * len(self.params)
        self.gversion = None     # fp32: self.g._version after the last hook
        self.gver = [None] * len(self.params)   # low precision: (grad object id, version) at its hook
        self.probe_hp = None     # hyper-parameters at the first hook of the probing step

    # ------------------------------------------------------------------ helpers
    def hp(self, group):
        b1, b2 = group["betas"]
        return (float(group["lr"]), float(b1), float(b2), float(group["eps"]), float(group["weight_decay"]))

    def _check_grad(self, p, grad, k):
        where = f"parameter {k} of param group {self.gi} (shape {tuple(p.shape)})"
        if grad.is_sparse:
            raise RuntimeError(f"memwall.torch.AdamW does not support sparse gradients ({where}); "
                               f"use dense gradients (e.g. nn.Embedding(..., sparse=False))")
        if grad.device != p.device or grad.dtype != self.dtype:
            raise RuntimeError(f"memwall.torch.AdamW: the gradient of {where} is {grad.dtype} on {grad.device}; "
                               f"expected {self.dtype} on {p.device}")
        if not grad.is_contiguous():
            raise RuntimeError(f"memwall.torch.AdamW does not support non-contiguous gradients ({where}, strides "
                               f"{grad.stride()}); assign p.grad = p.grad.contiguous() before step()")

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
            return
        self._check_grad(p, grad, k)
        gv.copy_(grad)  # CUDA: a synchronous copy into pinned memory (the hook reports it next)
        if not self.own_grads:
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

    def sync_params(self):
        """Parameters changed outside the optimizer (model.load_state_dict, p.copy_) since the
        last step: push them into the engine's master weights (a no-op when the master is the
        parameter itself: all-DRAM fp32)."""
        L = _lib.lib()
        for k, p in enumerate(self.params):
            if p.data_ptr() != self.ptrs[k]:
                raise RuntimeError(f"memwall.torch.AdamW: the storage of parameter {k} of param group {self.gi} was "
                                   f"replaced after the optimizer was created (p.data = ..., module.to(...)); "
                                   f"create the optimizer after moving the model")
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
        self.begun, self.armed_hp = False, None
        self.hooks = [0] * len(self.params)
        self.reported = [False] * len(self.params)
        self.gversion = None
        self.gver = [None] * len(self.params)
        self.probe_hp = None

    def step(self, hp):
        """Runs (or finishes) the update of this group; on failure recovers and raises."""
        L = _lib.lib()
        if not self.begun:
            self.begin(False, hp)
        # a reported range may be being updated right now: only the others
        self.fetch_grads([k for k in range(len(self.params)) if not self.reported[k]])
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
        self.write_back()

    def zero_grad(self, set_to_none):
        if self.own_grads:
            for p in self.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        else:
            self.clear_grads()
            for k, p in enumerate(self.params):
                if p.grad is not self.gviews[k]:
                    p.grad = self.gviews[k]
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

    def remove_dirs(self):
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.dirs = []

    def free(self):
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
        self._hook_handles = []
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
        if self._overlap:
            me = weakref.ref(self)  # a hook must not keep the optimizer (its engines, NVMe files) alive

            def make_hook(k):
                def hook(p):
                    opt = me()
                    if opt is not None:
                        opt._on_grad(g, k)
                return hook
            for k, p in enumerate(g.params):
                self._hook_handles.append(p.register_post_accumulate_grad_hook(make_hook(k)))

    # ------------------------------------------------------------------ overlap
    def _on_grad(self, g, k):
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
            if not g.begun:
                g.begin(True, g.hp(self.param_groups[g.gi]))
            g.report(k)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hps = [g.hp(self.param_groups[g.gi]) for g in self._groups]
        late = None
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
                    late = ("the gradients were modified after backward (e.g. clip_grad_norm_)"
                            if g.grads_modified() else
                            "lr/betas/eps/weight_decay changed between backward() and step()")
                elif not g.begun:
                    g.begin(True, hp)
        for g, hp in zip(self._groups, hps):
            g.step(hp)
        if late:
            self._mode = "off"
            raise RuntimeError(f"memwall.torch.AdamW(overlap=True): {late}, but the update had already started "
                               f"during backward with the values of that time, and this step used them. Use "
                               f"overlap=False for this training loop (overlap is now off)")
        return loss

    def zero_grad(self, set_to_none=True):
        """fp32 parameters: zeroes the flat gradient buffers, and p.grad stays a view of them
        whatever set_to_none says (autograd accumulates in place; the engine reads them without
        a copy). bf16/fp16 parameters: torch's behaviour."""
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW: zero_grad() between backward() and step() with overlap=True: "
                               "the update has already started with these gradients; call step() first or use "
                               "overlap=False")
        for g in self._groups:
            g.zero_grad(set_to_none)

    # ------------------------------------------------------------------ state
    def _read(self, g, region, first, n, nbytes, dtype):
        out = torch.empty(nbytes, dtype=torch.uint8)
        _lib.check(_lib.lib().mw_offload_read_raw(g.handle, region, first, n, out.data_ptr()),
                   f"reading the state of param group {g.gi}")
        return out.view(dtype) if dtype is not None else out

    def _write(self, g, region, first, n, t, nbytes, what):
        g.wait_write_back()  # a master write refreshes the host working copy
        t = t.detach().contiguous().cpu()
        if t.numel() * t.element_size() != nbytes:
            raise ValueError(f"memwall.torch.AdamW.load_state_dict: {what} has {t.numel() * t.element_size()} "
                             f"bytes, expected {nbytes}")
        _lib.check(_lib.lib().mw_offload_write_raw(g.handle, region, first, n, t.data_ptr()),
                   f"restoring {what}")

    def state_dict(self):
        """torch.optim.AdamW's layout ({'state': {i: {'step', 'exp_avg', 'exp_avg_sq'}},
        'param_groups': [...]}) with fp32 or bf16 moments exactly as stored; 8-bit moments are
        kept per group under 'memwall' (their block scales span parameters)."""
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.state_dict() between backward() and step() with overlap=True")
        L = _lib.lib()
        state, groups, extra = {}, [], []
        idx = 0
        for g, group in zip(self._groups, self.param_groups):
            steps = int(L.mw_offload_committed_steps(g.handle))
            ids = {id(p): i for i, p in enumerate(group["params"])}
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = list(range(idx, idx + len(group["params"])))
            groups.append(packed)
            mom = self._moments
            q8 = {}
            if mom == "8bit" and steps > 0:
                nsc = -(-g.total // _lib.Q8_BLOCK)
                q8 = {"exp_avg": self._read(g, _lib.R_EXP_AVG, 0, g.total, g.total, None),
                      "exp_avg_scale": self._read(g, _lib.R_EXP_AVG_SCALE, 0, g.total, 4 * nsc, torch.float32),
                      "exp_avg_sq": self._read(g, _lib.R_EXP_AVG_SQ, 0, g.total, g.total, None),
                      "exp_avg_sq_scale": self._read(g, _lib.R_EXP_AVG_SQ_SCALE, 0, g.total, 4 * nsc, torch.float32)}
            extra.append(q8)
            if steps > 0 or g.lowp:
                for k, p in enumerate(g.params):
                    s = {"step": torch.tensor(float(steps))}
                    if g.lowp:  # the fp32 master is not the parameter: it is part of the state
                        s["master"] = self._read(g, _lib.R_MASTER, g.first[k], g.numel[k], 4 * g.numel[k],
                                                 torch.float32).view(p.shape)
                    if mom != "8bit" and steps > 0:
                        a, n = g.first[k], g.numel[k]
                        dt = _MOMENTS[mom][1]
                        s["exp_avg"] = self._read(g, _lib.R_EXP_AVG, a, n, _nbytes_region(mom, n), dt).view(p.shape)
                        s["exp_avg_sq"] = self._read(g, _lib.R_EXP_AVG_SQ, a, n, _nbytes_region(mom, n), dt).view(p.shape)
                    state[idx + ids[id(p)]] = s
            idx += len(group["params"])
        return {"state": state, "param_groups": groups,
                "memwall": {"format": 1, "moment_dtype": self._moments, "groups": extra}}

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this class (or of torch.optim.AdamW, for fp32 moments).
        The parameters themselves come from the model's own state dict, loaded before or after."""
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
        L = _lib.lib()
        for gi, (g, group, saved) in enumerate(zip(self._groups, self.param_groups, groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"memwall.torch.AdamW.load_state_dict: param group {gi} has {len(saved['params'])} "
                                 f"parameters in the state dict, {len(group['params'])} in the optimizer")
            ids = {id(p): i for i, p in enumerate(group["params"])}
            steps = set()
            for k, p in enumerate(g.params):
                s = state_dict["state"].get(saved["params"][ids[id(p)]])
                steps.add(int(s["step"]) if s is not None else 0)
            if len(steps) != 1:
                raise ValueError(f"memwall.torch.AdamW.load_state_dict: the parameters of param group {gi} have "
                                 f"different step counts {sorted(steps)}; memwall steps a group as one")
            step = steps.pop()
            saved_states = [state_dict["state"].get(saved["params"][ids[id(p)]]) for p in g.params]
            if g.lowp and all(s is not None and "master" in s for s in saved_states):
                for k, s in enumerate(saved_states):
                    a, n = g.first[k], g.numel[k]
                    self._write(g, _lib.R_MASTER, a, n, s["master"].float(), 4 * n,
                                f"master of parameter {k} of param group {gi}")
                g.write_back()  # the parameters now round the master (copy path: copied to them)
            else:
                g.push_all()
            if step > 0:
                if self._moments == "8bit":
                    q8 = mw["groups"][gi]
                    nsc = -(-g.total // _lib.Q8_BLOCK)
                    self._write(g, _lib.R_EXP_AVG, 0, g.total, q8["exp_avg"], g.total, "exp_avg")
                    self._write(g, _lib.R_EXP_AVG_SCALE, 0, g.total, q8["exp_avg_scale"], 4 * nsc, "exp_avg_scale")
                    self._write(g, _lib.R_EXP_AVG_SQ, 0, g.total, q8["exp_avg_sq"], g.total, "exp_avg_sq")
                    self._write(g, _lib.R_EXP_AVG_SQ_SCALE, 0, g.total, q8["exp_avg_sq_scale"], 4 * nsc,
                                "exp_avg_sq_scale")
                else:
                    dt = _MOMENTS[self._moments][1]
                    for k, p in enumerate(g.params):
                        s = state_dict["state"][saved["params"][ids[id(p)]]]
                        a, n = g.first[k], g.numel[k]
                        for key, region in (("exp_avg", _lib.R_EXP_AVG), ("exp_avg_sq", _lib.R_EXP_AVG_SQ)):
                            t = s[key]
                            if t.dtype != dt:
                                raise ValueError(f"memwall.torch.AdamW.load_state_dict: {key} of parameter {k} of "
                                                 f"param group {gi} is {t.dtype}, expected {dt}")
                            self._write(g, region, a, n, t, _nbytes_region(self._moments, n),
                                        f"{key} of parameter {k} of param group {gi}")
            else:
                nb = _nbytes_region(self._moments, g.total)
                zero = torch.zeros(nb, dtype=torch.uint8)
                self._write(g, _lib.R_EXP_AVG, 0, g.total, zero, nb, "exp_avg")
                self._write(g, _lib.R_EXP_AVG_SQ, 0, g.total, zero, nb, "exp_avg_sq")
                if self._moments == "8bit":
                    nsc = 4 * -(-g.total // _lib.Q8_BLOCK)
                    z = torch.zeros(nsc, dtype=torch.uint8)
                    self._write(g, _lib.R_EXP_AVG_SCALE, 0, g.total, z, nsc, "exp_avg_scale")
                    self._write(g, _lib.R_EXP_AVG_SQ_SCALE, 0, g.total, z, nsc, "exp_avg_sq_scale")
            _lib.check(L.mw_offload_set_committed_steps(g.handle, step), f"restoring the step of param group {gi}")
            for key, v in saved.items():
                if key != "params":
                    group[key] = tuple(v) if key == "betas" else v
        self._mode = "probe" if self._overlap else "off"

    # ------------------------------------------------------------------ streamed state files
    _MAGIC = b"MWTORCH1"

    def _regions(self, g):
        """(region, bytes per element or None for 8-bit scales, name) of one group's state."""
        mom = self._moments
        per = {"fp32": 4, "bf16": 2, "8bit": 1}[mom]
        out = [(_lib.R_MASTER, 4, "master")] if g.lowp else []
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

    def save_state(self, path, chunk_elems=1 << 24):
        """Writes the optimizer state to `path` one chunk at a time (at most chunk_elems
        elements of one region in memory), unlike state_dict(), which materialises all of it.
        Layout: b"MWTORCH1", a little-endian u64 header length, a JSON header (groups'
        hyper-parameters, sizes, steps, formats), then each group's regions in order (master for
        bf16/fp16 parameters, exp_avg, its 8-bit scales, exp_avg_sq, its scales) as stored.
        Written to path + ".tmp" and renamed, so a crash leaves the previous file intact."""
        import json
        import struct
        if any(g.begun for g in self._groups):
            raise RuntimeError("memwall.torch.AdamW.save_state() between backward() and step() with overlap=True")
        chunk = max(_lib.Q8_BLOCK, chunk_elems // _lib.Q8_BLOCK * _lib.Q8_BLOCK)
        L = _lib.lib()
        groups = []
        for g, group in zip(self._groups, self.param_groups):
            hp = {k: v for k, v in group.items() if k != "params" and isinstance(v, (int, float, str, bool, tuple,
                                                                                     list, type(None)))}
            groups.append({"hparams": hp, "numel": g.numel, "dtype": _WFMT[g.dtype],
                           "step": int(L.mw_offload_committed_steps(g.handle))})
        header = json.dumps({"format": 1, "moment_dtype": self._moments, "groups": groups}).encode()
        tmp = str(path) + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self._MAGIC + struct.pack("<Q", len(header)) + header)
            for g in self._groups:
                for region, per, name in self._regions(g):
                    for a in range(0, g.total, chunk):
                        n = min(chunk, g.total - a)
                        nb = self._region_bytes(per, a, n)
                        t = self._read(g, region, a, n, nb, None)  # held: string_at reads its memory
                        f.write(_lib.ctypes.string_at(t.data_ptr(), nb))
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
        chunk = max(_lib.Q8_BLOCK, chunk_elems // _lib.Q8_BLOCK * _lib.Q8_BLOCK)
        L = _lib.lib()
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
            for gi, (g, m) in enumerate(zip(self._groups, gs)):
                if m["numel"] != g.numel or m["dtype"] != _WFMT[g.dtype]:
                    raise ValueError(f"memwall.torch.AdamW.load_state: param group {gi} of {path} has other "
                                     f"parameters (sizes or dtype) than the optimizer's")
            for gi, (g, m, group) in enumerate(zip(self._groups, gs, self.param_groups)):
                if not g.lowp:
                    g.push_all()
                for region, per, name in self._regions(g):
                    for a in range(0, g.total, chunk):
                        n = min(chunk, g.total - a)
                        nb = self._region_bytes(per, a, n)
                        data = f.read(nb)
                        if len(data) != nb:
                            raise ValueError(f"memwall.torch.AdamW.load_state: {path} ends inside {name} of param "
                                             f"group {gi} (truncated file)")
                        buf = bytearray(data)  # held while the tensor over it is in use
                        self._write(g, region, a, n, torch.frombuffer(buf, dtype=torch.uint8), nb,
                                    f"{name} of param group {gi}")
                if g.lowp:
                    g.write_back()  # the parameters now round the master (copy path: copied to them)
                _lib.check(L.mw_offload_set_committed_steps(g.handle, int(m["step"])),
                           f"restoring the step of param group {gi}")
                for k, v in m["hparams"].items():
                    group[k] = tuple(v) if k == "betas" else v
            if f.read(1):
                raise ValueError(f"memwall.torch.AdamW.load_state: {path} has bytes past the state (another file?)")
        self._mode = "probe" if self._overlap else "off"

    # ------------------------------------------------------------------ reporting and teardown
    def stats(self):
        """The engines' counters and plan, summed over param groups (docs/python.md)."""
        out = dict.fromkeys(_lib.STATS_FIELDS, 0.0)
        buf = (_lib.ctypes.c_double * len(_lib.STATS_FIELDS))()
        for g in self._groups:
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
        for h in getattr(self, "_hook_handles", []):
            h.remove()
        self._hook_handles = []
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
