"""Activations on NVMe for memwall.torch.offload(activations="nvme") (docs/python.md, "Activations on NVMe";
issue 25 item 3).

The tensors autograd saves during the model's forward (its activations) are what is left in DRAM once
weights, gradients and optimizer state stream from NVMe. torch.autograd.graph.saved_tensors_hooks lets
a pack hook replace each saved tensor by a handle and an unpack hook give it back in backward: here
the pack hook writes a large one to NVMe as forward makes it and returns a handle (the tensor itself
can then go as soon as forward is done with it), and the unpack hook reads it back, a few tensors
ahead of backward, which unpacks them in about the reverse order.

Why this shape:
- The I/O is the C spill store's (memwall/pyapi.h, mw_pyacts_*; src/pyapi/pyacts.c): one NVMe object
  per saved tensor, crc32c, O_DIRECT, io_uring, writes through a fixed staging pool with
  back-pressure. This file only decides what to spill, keeps the order and the read-ahead window, and
  rebuilds the tensors.
- What stays in DRAM: tensors under min_bytes (int64 indices, norms' statistics, rotary tables), the
  session's weights (views of its params mapping: the unit machinery fetches them again for
  backward), views of the model's buffers (a causal mask) and every other leaf that requires grad
  (all of them live anyway), tensors that are not plain strided CPU tensors (sparse, conjugate or
  negative views, subclasses, other devices).
- Exactly the same tensor back: the bytes of the tensor's extent in its storage (from a 64-byte
  boundary, so that the data keeps its alignment and the kernels take the same path), then
  as_strided with the saved size, stride and dtype: bitwise the same results as keeping it.
- A storage saved twice (one normed input saved by the q, k and v projections; q, k and v views of
  one qkv product) is written once while a tensor over it is still alive and unchanged (same storage,
  same version counter); its later packs share the object. Whole storages are saved when the view
  covers at least half of it, so that sibling views share them.
- Lifetimes follow autograd's: a handle lives as long as the graph node that saved it; the NVMe object
  goes when its last handle goes (a micro-batch's set is freed after its backward, retain_graph can
  unpack again), the bytes read back when every handle of it has been unpacked once.
- Read-ahead: at the end of forward and at each unpack, reads start for the next `prefetch` tensors
  still waiting, from the latest packed down, at most prefetch_bytes of them at once (at least one).
- The hooks are active only inside the offloaded model's forward, in training (under no_grad nothing
  is saved); an exception in forward leaves them through an always-called forward hook, and the
  graph it dropped frees its objects; close() removes the files.
"""
import ctypes
import weakref

import torch

from . import _lib

__all__ = ["NvmeActivations"]

_ALIGN = 4096
_KEEP_ALIGN = 64  # torch's CPU allocator aligns storages to 64 bytes: the copy keeps the data's offset from it


class NvmeActivations:
    """Options of activations on NVMe: offload(model, ..., activations=NvmeActivations(...)) ("nvme" is
    NvmeActivations()).

    min_bytes:      saved tensors smaller than this stay in DRAM (default 64 KiB)
    prefetch:       tensors read ahead of backward (default 4; 0: each read when backward needs it)
    prefetch_bytes: at most these bytes read ahead at once (default 256 MiB; one tensor always)
    staging_bytes:  the write staging pool (default 32 MiB, in chunks of chunk_bytes, default 8 MiB): a
                    forward that makes activations faster than the disk takes them waits for it
    directory:      where the files go (default: nvme_dir/activations; removed at close)
    """

    def __init__(self, min_bytes=64 << 10, prefetch=4, prefetch_bytes=256 << 20, staging_bytes=0, chunk_bytes=0,
                 directory=None):
        for k, v in (("min_bytes", min_bytes), ("prefetch", prefetch), ("prefetch_bytes", prefetch_bytes),
                     ("staging_bytes", staging_bytes), ("chunk_bytes", chunk_bytes)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"memwall.torch.offload: activations: {k}={v!r}: a non-negative int")
        if not 1 <= min_bytes <= 1 << 40:
            raise ValueError(f"memwall.torch.offload: activations: min_bytes={min_bytes}: 1 byte to 1 TiB")
        if prefetch > 64:
            raise ValueError(f"memwall.torch.offload: activations: prefetch={prefetch}: 0..64 tensors ahead")
        self.min_bytes, self.prefetch, self.prefetch_bytes = min_bytes, prefetch, prefetch_bytes
        self.staging_bytes, self.chunk_bytes, self.directory = staging_bytes, chunk_bytes, directory

    def __repr__(self):
        return (f"NvmeActivations(min_bytes={self.min_bytes}, prefetch={self.prefetch}, "
                f"prefetch_bytes={self.prefetch_bytes}, staging_bytes={self.staging_bytes}, "
                f"chunk_bytes={self.chunk_bytes}, directory={self.directory!r})")


def options(activations):
    """NvmeActivations for activations="nvme" or an NvmeActivations; None for "dram"; else an error."""
    if isinstance(activations, NvmeActivations):
        return activations
    if activations == "nvme":
        return NvmeActivations()
    if activations == "dram":
        return None
    raise ValueError(f"memwall.torch.offload: activations={activations!r}: use 'dram', 'nvme' or "
                     "memwall.torch.NvmeActivations(...)")


class _Entry:
    """One NVMe object: the bytes [lo, hi) of a storage."""
    __slots__ = ("handle", "nbytes", "room", "pos", "refs", "waiting", "buf", "reading", "key", "alive", "version",
                 "lo", "hi", "__weakref__")


class _Packed:
    """What autograd holds instead of a saved tensor: its entry and how to rebuild it from the bytes."""
    __slots__ = ("spill", "entry", "dtype", "size", "stride", "boff", "ext", "done")

    def __del__(self):
        s = self.spill
        if s is not None:
            try:
                s._release(self)
            except Exception:  # noqa: BLE001 - at interpreter exit (the library may be gone); close() frees all
                pass


class Spill:
    """The hooks of one offload (Offload._acts): the C spill store, the order and the read-ahead."""

    def __init__(self, opts, nvme_dir, skip_ranges, on_error):
        self.opts = opts
        self.dir = str(opts.directory or (str(nvme_dir).split(":")[0].rstrip("/") + "/activations"))
        self._skip = list(skip_ranges)      # [(first byte, end)] of memory never spilled (the session's arrays)
        self._model = None
        self._buffers = set()               # data_ptr of the model's buffers' storages: they live anyway
        self._on_error = on_error
        self._order = []                    # entries in pack order (since none was live)
        self._top = -1                      # the highest position that may still wait for an unpack
        self._live = 0
        self._storages = {}                 # storage data_ptr -> entry (deduplication)
        self._ctx = None
        self.front = None                   # sees each saved tensor first (_device.DeviceUnits: a model on a device)
        self._deferred = None               # a failure found where it could not be raised (a handle's __del__)
        self.kept = 0                       # saved tensors left in DRAM, bytes (figures)
        self.shared = 0                     # packs that found their bytes written already
        L = _lib.acts_lib()
        h = ctypes.c_void_p()
        _lib.check(L.mw_pyacts_open(ctypes.byref(h), self.dir.encode(), opts.staging_bytes, opts.chunk_bytes, 0),
                   f"memwall.torch.offload: opening the activations' store in '{self.dir}'")
        self._h = h

    # ------------------------------------------------------------------ the model's forward

    def enter(self, module=None, args=None):
        self.exit()  # an earlier forward that ended without the post hook
        if not torch.is_grad_enabled() or self._h is None:
            return
        if self._deferred is not None:
            e, self._deferred = self._deferred, None
            raise self._on_error(e)
        m = self._model() if self._model is not None else None
        if m is not None:
            self._buffers = {b.untyped_storage().data_ptr() for b in m.buffers() if b.device.type == "cpu"}
        pack, unpack = (self._pack, self._unpack) if self.front is None else self.front.chain(self._pack, self._unpack)
        self._ctx = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        self._ctx.__enter__()

    def exit(self, module=None, args=None, output=None):
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)
            if output is not None:  # a forward that finished: backward's first reads can start
                self._prefetch()

    def attach(self, model):
        """The hooks that bracket the model's forward (their handles)."""
        self._model = weakref.ref(model)
        return [model.register_forward_pre_hook(self.enter),
                model.register_forward_hook(self.exit, always_call=True)]

    # ------------------------------------------------------------------ pack

    def _keep(self, t):
        if type(t) is not torch.Tensor or t.layout != torch.strided or t.device.type != "cpu" or t.is_conj() \
                or t.is_neg() or (t.requires_grad and t.is_leaf) or t.numel() == 0:
            return True
        if any(s < 0 for s in t.stride()):
            return True
        return False

    @staticmethod
    def _as_is(t):
        """A tensor kept in DRAM: detached (an op's output saved as it is would hold its own node: a
        reference cycle through C++ that a forward without backward never frees)."""
        return t if t.grad_fn is None else t.detach()

    def _pack(self, t):
        if self._h is None or self._keep(t):
            return self._as_is(t)
        try:
            st = t.untyped_storage()
            base = st.data_ptr()
        except Exception:  # noqa: BLE001 - no storage (a wrapper tensor): kept as it is
            return self._as_is(t)
        if base in self._buffers or any(a <= base < b for a, b in self._skip):
            return self._as_is(t)  # a buffer (a causal mask), or the session's weights (fetched again for backward)
        isz = t.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        first = t.storage_offset() * isz
        ext = span * isz
        if ext < self.opts.min_bytes:
            self.kept += ext
            return self._as_is(t)
        e = self._shared(t, base, first, ext, isz)
        if e is not None:
            self.shared += 1
        else:
            total = st.nbytes()
            lo, hi = (0, total) if 2 * ext >= total else (first - first % _KEEP_ALIGN, first + ext)
            e = self._put(t, base, lo, hi)
        p = _Packed()
        p.spill, p.entry, p.dtype, p.size, p.stride = self, e, t.dtype, tuple(t.shape), tuple(t.stride())
        p.boff, p.ext, p.done = first - e.lo, ext, False
        e.refs += 1
        e.waiting += 1
        return p

    def _shared(self, t, base, first, ext, isz):
        """The live entry holding these bytes unchanged, or None."""
        e = self._storages.get(base)
        if e is None or e.handle is None:
            return None
        other = e.alive()
        if other is None or other._version != e.version or t._version != e.version or \
                other.untyped_storage().data_ptr() != base:
            return None
        if first < e.lo or first + ext > e.hi or (first - e.lo) % isz:
            return None
        return e

    def _put(self, t, base, lo, hi):
        L = _lib.acts_lib()
        h = ctypes.c_uint64()
        try:
            _lib.check(L.mw_pyacts_put(self._h, base + lo, hi - lo, ctypes.byref(h)),
                       f"memwall.torch.offload: writing a saved tensor ({t.dtype}, {tuple(t.shape)}, "
                       f"{hi - lo} bytes) to NVMe")
        except Exception as e:
            raise self._on_error(e)
        e = _Entry()
        e.handle, e.nbytes, e.room = h.value, hi - lo, L.mw_pyacts_room(hi - lo)
        e.refs = e.waiting = 0
        e.buf, e.reading, e.key = None, False, base
        e.alive, e.version, e.lo, e.hi = weakref.ref(t), t._version, lo, hi
        e.pos = len(self._order)
        self._order.append(e)
        self._top = e.pos
        self._live += 1
        self._storages[base] = e
        return e

    # ------------------------------------------------------------------ unpack

    def _unpack(self, p):
        if not isinstance(p, _Packed):
            return p
        e = p.entry
        try:
            if e.handle is None:
                raise RuntimeError("memwall.torch.offload: a saved tensor was unpacked after its activations' store "
                                   "was closed")
            if e.buf is None:
                self._start(e)
            self._prefetch()
            if e.reading:
                e.reading = False
                _lib.check(_lib.acts_lib().mw_pyacts_read_wait(self._h, e.handle),
                           f"memwall.torch.offload: reading a saved tensor ({p.dtype}, {p.size}) back from NVMe")
        except Exception as err:
            raise self._on_error(err)
        base = e.buf[p.boff:p.boff + p.ext].view(p.dtype)
        out = torch.as_strided(base, p.size, p.stride, base.storage_offset())
        if not p.done:
            p.done = True
            e.waiting -= 1
            if e.waiting == 0:
                e.buf = None  # `out` holds the bytes while autograd needs them
        return out

    def _start(self, e):
        raw = torch.empty(e.room + _ALIGN, dtype=torch.uint8)
        a = (-raw.data_ptr()) % _ALIGN
        buf = raw[a:a + e.room]
        _lib.check(_lib.acts_lib().mw_pyacts_read_start(self._h, e.handle, buf.data_ptr(), e.room),
                   f"memwall.torch.offload: reading a saved tensor ({e.nbytes} bytes) back from NVMe")
        e.buf, e.reading = buf, True

    def _prefetch(self):
        """Reads for the next `prefetch` tensors still waiting, from the latest packed down."""
        order = self._order
        while self._top >= 0 and (order[self._top].handle is None or order[self._top].waiting == 0):
            self._top -= 1
        ahead, held, i = 0, 0, self._top
        while i >= 0 and ahead < self.opts.prefetch:
            f = order[i]
            i -= 1
            if f.handle is None or f.waiting == 0:
                continue
            ahead += 1
            if f.buf is None:
                if held and held + f.room > self.opts.prefetch_bytes:
                    break
                self._start(f)
            held += f.room

    # ------------------------------------------------------------------ lifetimes

    def _release(self, p):
        """A handle goes (autograd freed the saved variable)."""
        e = p.entry
        p.spill = None
        if not p.done:
            e.waiting -= 1
        e.refs -= 1
        if e.refs == 0:
            self._drop(e)
        elif e.waiting == 0 and not e.reading:
            e.buf = None

    def _drop(self, e):
        h, e.handle = e.handle, None
        if h is None:
            return
        if self._storages.get(e.key) is e:
            del self._storages[e.key]
        self._live -= 1
        if self._h is not None:
            rc = _lib.acts_lib().mw_pyacts_drop(self._h, h)  # waits for its read: the buffer goes after
            if rc < 0 and self._deferred is None:
                try:
                    _lib.check(rc, "memwall.torch.offload: dropping a saved tensor from NVMe")
                except Exception as err:  # noqa: BLE001 - raised by the next forward (enter)
                    self._deferred = err
        e.buf, e.reading = None, False
        if self._live == 0:  # the micro-batch's set is gone: the next one starts a new order
            self._order = []
            self._top = -1
            self._storages.clear()

    def stats(self):
        """The spill store's figures (mw_pyacts_stats) and the bytes kept in DRAM."""
        if self._h is None:
            return {}
        out = (ctypes.c_double * len(_lib.ACTS_STATS_FIELDS))()
        k = _lib.check(_lib.acts_lib().mw_pyacts_stats(self._h, out, len(out)), "activations' stats")
        d = {f: out[i] for i, f in enumerate(_lib.ACTS_STATS_FIELDS[:k])}
        d["kept_bytes"], d["shared_packs"] = self.kept, self.shared
        return d

    def close(self):
        """Removes the files; saved tensors still held by a graph can no longer be unpacked."""
        self.exit()
        h, self._h = self._h, None
        if h is None:
            return
        _lib.acts_lib().mw_pyacts_close(h)  # waits for every read in flight: the buffers may go after it
        for e in self._order:
            e.handle, e.buf, e.reading = None, None, False
        self._order = []
        self._storages.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit there is no caller to tell
            pass
