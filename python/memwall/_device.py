"""The weights of an offloaded model on a compute device (memwall.torch.offload of a CUDA model; docs/python.md,
"Whole-state offload on a GPU"; issue 25 item 5).

The session (C, src/pyapi/pysession.c) keeps its flat fp32 params and grads arrays in host memory and streams
the units' weights into them from NVMe. When the model's parameters are on a device D (a GPU), this file moves
each unit between those host arrays and D: NVMe -> the session's pages -> pinned staging -> D for the weights,
D -> pinned staging -> the session's gradient array for the gradients.

Why this shape:
- A parameter has device memory only while its unit is acquired: at acquire (after the session's acquire
  returned, so the host pages are filled) the unit's range is copied into one new device buffer and every
  p.data becomes a view of it; at release p.data becomes a placeholder of the parameter's shape over one
  shared zero element (no memory; reads zeros, as a released streamed unit's pages do on the CPU). Device
  memory then holds the units in use, not the model: a release records an event on the compute stream, and
  an acquire waits for the one `prefetch` releases back, so that however far the host runs ahead of the
  GPU's queue at most prefetch + 2 units' weights are on the device (the buffers of released units stay
  allocated until their kernels ran: record_stream).
- Autograd keeps what forward saved for backward, and what it saves of a weight is often a view of it (F.linear
  saves weight.t() for the product's backward), which would hold every unit's buffer from forward to backward:
  the whole model on D again. So a saved_tensors_hooks pack hook, active inside the model's forward, replaces
  every saved tensor whose storage is a unit's device buffer by a handle (unit, offset, size, stride); the
  unpack hook rebuilds it over the buffer that the unit's backward acquire made (the same values: the weights
  change only at step()). A weight unpacked while its unit is not acquired is an error naming the unit, never
  a read of the placeholder's zeros. With activations on NVMe this hook sees each saved tensor first and hands
  the others to the spill store's (_activations.Spill.front).
- Pinned staging, not the session's pages pinned in place: a released streamed unit's pages are dropped with
  madvise(MADV_DONTNEED) (src/train/stream.c) and refilled by the next fetch; pages registered with the CUDA
  driver (cudaHostRegister) stay pinned to the old physical pages, so the device would read stale weights.
  The host copies each unit into two pinned buffers in turn, in pieces of at most CHUNK elements (a memcpy;
  pinned memory stays 4 x 64 MiB for any model), a side stream copies each piece to D (non_blocking) while
  the next is filled, and the compute stream waits on the last piece's event before the unit's first kernel;
  a staging buffer is reused only after the copy that read it finished (its event).
- Gradients: autograd accumulates them on D in p.grad (fresh at each micro-batch's backward). When the unit's
  gradients are complete (where the CPU path reports grad_ready), a second side stream waits for the compute
  stream and copies them into pinned staging (a second one: the next unit's weights must not queue behind that
  wait). That copy is waited for before the host adds them into the session's
  gradient views and the session is told grad_ready (it may write them to NVMe at once), but one unit late:
  the wait for unit v's copy happens when unit v-1's copy has been queued (or at the end of the backward
  pass), so the GPU runs unit v-1's backward while the host waits, adds and calls the session. Two pinned
  buffers for that; the session's calls keep their order (grad_ready in decreasing unit order, all before
  backward_end; its acquires never wait for a gradient write). A unit larger than a buffer goes piece by
  piece through both, each added as it lands, and is told at once. Adding into the host array, micro-batch
  after micro-batch, is what autograd does in place on the CPU path (0 + g1, then + g2, ...): the same sums
  in the same order.
- A simulation of the device for machines without a GPU (MEMWALL_OFFLOAD_DEVICE_SIM=1 with a CPU model): D is
  the CPU, the device buffers are separate CPU tensors and every copy is made the same way, without streams
  or pinning. Everything above except the CUDA calls runs, so python/tests/test_offload_device.py checks the
  copy path bitwise against the plain CPU path on any machine (with tiny staging buffers too, so that the
  pieces are exercised); the CUDA calls (_record, _wait, _compute, _on_side and the non_blocking flags) are
  the only code that runs on a GPU alone, in scripts/gpu_check.sh.

Threads: the hooks run on the thread that runs the model's forward and on autograd's thread for backward,
never at once (the session's calls are serial too); the side stream is the only asynchronous actor.
"""
import collections
import contextlib

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["DeviceUnits", "SIM_ENV"]

SIM_ENV = "MEMWALL_OFFLOAD_DEVICE_SIM"


class _WeightRef:
    """What autograd holds instead of a saved view of a unit's device buffer."""
    __slots__ = ("unit", "offset", "size", "stride")

    def __init__(self, unit, offset, size, stride):
        self.unit, self.offset, self.size, self.stride = unit, offset, size, stride


class DeviceUnits:
    """The device copies of one offload's units (Offload._dev).

    device:       the torch.device the model's parameters are on (cuda:k, or cpu for the simulation)
    unit_params:  unit -> [parameters] in the session's flat order
    ranges:       unit -> (first element, count) in the session's arrays
    flat_params, flat_grads: the session's host arrays (flat fp32 CPU tensors)
    aliases:      unit -> [(param, alias leaf)] of its later uses (a tied head, Offload._attach)
    names:        unit -> its name (for errors)
    depth:        released units whose kernels may still be queued on the device (Offload passes its
                  prefetch; at least 1); an acquire beyond that waits for the oldest, so that at most
                  depth + 1 units' weights are on the device however far the host runs ahead of the GPU
    chunk:        elements per staging buffer (default CHUNK; the pinned memory is 4 of them at most)
    """

    CHUNK = 16 << 20  # 64 MiB a staging buffer: a vocabulary-sized unit goes through in pieces

    def __init__(self, device, unit_params, ranges, flat_params, flat_grads, aliases, names, depth=2, chunk=None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._unit_params = unit_params
        self._ranges = ranges
        self._flat_params, self._flat_grads = flat_params, flat_grads
        self._aliases = aliases
        self._names = names
        self._offs = []  # unit -> [(param, offset in the unit)]
        for u, ps in enumerate(unit_params):
            o, row = 0, []
            for p in ps:
                row.append((p, o))
                o += p.numel()
            self._offs.append(row)
        self._zero = torch.zeros(1, dtype=torch.float32, device=self.device)  # every placeholder's element
        self._bufs = {}              # unit -> its flat device buffer while acquired
        self._keys = {}              # the buffer's storage data_ptr -> unit (the pack hook's lookup)
        self._live = []              # weak references to the storages of the buffers made (figures, tests)
        self.peak_units = 0          # the most unit buffers alive at once
        self.bytes_in = 0            # weights copied to the device
        self.bytes_out = 0           # gradients copied back
        self.units_in = 0            # unit copies to the device
        self._ctx = None
        self._side = {}  # "in" (weights to the device) and "out" (gradients back): CUDA streams
        self._depth = max(1, int(depth))
        self._inuse = collections.deque()  # events on the compute stream after the released units' kernels
        if self.cuda:
            with torch.cuda.device(self.device):
                # Two side streams: a gradient copy waits for its unit's backward kernels, and the next unit's
                # weights must not queue behind that wait (they are what the next kernels wait for).
                self._side = {"in": torch.cuda.Stream(self.device), "out": torch.cuda.Stream(self.device)}
        # Staging, pinned on CUDA (plain CPU tensors in the simulation, which runs the same code): two buffers
        # for the weights (a piece being copied to the device while the next is filled) and two for the
        # gradients (a unit's copy in flight while the one before is added on the host), each the largest
        # unit or `chunk` elements, whichever is smaller.
        n = max(1, min(int(chunk or self.CHUNK), max([c for _, c in ranges] or [1])))
        self._chunk = n
        self._stage = [torch.empty(n, dtype=torch.float32, pin_memory=self.cuda) for _ in range(2)]
        self._stage_done = [None, None]  # the event of the last copy out of each weights buffer
        self._next = 0
        self._gstage = [torch.empty(n, dtype=torch.float32, pin_memory=self.cuda) for _ in range(2)]
        self._gnext = 0
        self._gpending = None        # (unit, rows, event, slot, first offset, host views, ready): not yet told

    # ------------------------------------------------------------------ the CUDA calls (none in the simulation)

    def _record(self, stream):
        if not self.cuda:
            return None
        e = torch.cuda.Event()
        e.record(stream)
        return e

    @staticmethod
    def _wait(event):
        if event is not None:
            event.synchronize()

    def _compute(self):
        return torch.cuda.current_stream(self.device) if self.cuda else None

    def _on_side(self, way):
        return torch.cuda.stream(self._side[way]) if self.cuda else contextlib.nullcontext()

    # ------------------------------------------------------------------ placeholders

    def placeholder(self, p):
        """A tensor of p's shape on the device over one shared zero element (no memory)."""
        return self._zero.expand(p.shape)

    def is_placeholder(self, t):
        """Whether t is one of placeholder()'s (a parameter not replaced by the user since)."""
        return t.device == self.device and t.data_ptr() == self._zero.data_ptr()  # a view of the private zero

    def park(self):
        """Every parameter and alias gets its placeholder (at attach; no unit acquired)."""
        for ps in self._unit_params:
            for p in ps:
                p.data = self.placeholder(p)
        for row in self._aliases.values():
            for q, a in row:
                a.data = self.placeholder(q)

    # ------------------------------------------------------------------ weights in, out

    def acquire(self, u):
        """Unit u's weights from the session's host range to a new device buffer; p.data views it. Called
        after the session's acquire returned (the host pages hold the unit)."""
        a, n = self._ranges[u]
        host = self._flat_params[a:a + n]
        while len(self._inuse) > self._depth:  # back-pressure: the host may run far ahead of the GPU's queue
            self._wait(self._inuse.popleft())
        with self._on_side("in"):
            buf = torch.empty(n, dtype=torch.float32, device=self.device)  # on CUDA: the side stream's
        done = None
        for c0 in range(0, n, self._chunk):
            c = min(self._chunk, n - c0)
            i = self._next
            self._next ^= 1
            self._wait(self._stage_done[i])  # the copy that read this staging buffer has finished
            st = self._stage[i][:c]
            st.copy_(host[c0:c0 + c])  # a memcpy from the session's pages (pageable: never DMA'd from directly)
            with self._on_side("in"):
                buf[c0:c0 + c].copy_(st, non_blocking=self.cuda)
                done = self._stage_done[i] = self._record(self._side.get("in"))
        if self.cuda and done is not None:
            cur = self._compute()
            cur.wait_event(done)      # the unit's kernels start after its weights arrived
            buf.record_stream(cur)    # freed at release: not reused before the compute stream is done with it
        self._bufs[u] = buf
        self._keys[buf.untyped_storage().data_ptr()] = u
        self._live.append(StorageWeakRef(buf.untyped_storage()))
        self.peak_units = max(self.peak_units, self.live_units())
        self.bytes_in += 4 * n
        self.units_in += 1
        for p, o in self._offs[u]:
            p.data = buf[o:o + p.numel()].view(p.shape)
        for q, al in self._aliases.get(u, ()):
            o = self._offset(u, q)
            al.data = buf[o:o + q.numel()].view(q.shape)

    def release(self, u):
        """Unit u's parameters (and aliases) get their placeholders; its device buffer goes (on CUDA once the
        compute stream is done with it, record_stream)."""
        buf = self._bufs.pop(u, None)
        if buf is None:
            return
        self._keys.pop(buf.untyped_storage().data_ptr(), None)
        ev = self._record(self._compute())  # after the unit's kernels queued so far
        if ev is not None:
            self._inuse.append(ev)
        for p, _ in self._offs[u]:
            p.data = self.placeholder(p)
        for q, al in self._aliases.get(u, ()):
            al.data = self.placeholder(q)

    def _offset(self, u, q):
        for p, o in self._offs[u]:
            if p is q:
                return o
        raise KeyError(q)

    def live_units(self):
        """Unit buffers whose storage is alive now: acquired, or held elsewhere (a view autograd saved)."""
        self._live = [r for r in self._live if not r.expired()]
        return len(self._live)

    # ------------------------------------------------------------------ gradients back

    def grads_start(self, u, host_views, ready):
        """Starts copying unit u's device gradients (p.grad) back; they are added into the session's host views
        (host_views: id(p) -> view) and ready() is called (the session told grad_ready) once the copy finished,
        which is waited for at the next grads_start or at flush(): at most one unit waits. A unit larger than a
        staging buffer is copied in pieces through both buffers and told at once (the unit before it first).
        p.grad is None from here. Parameters without a gradient add nothing (their host gradients stay)."""
        rows = []
        for p, o in self._offs[u]:
            g = p.grad
            if g is None:
                continue
            if g.device != self.device:
                raise RuntimeError(f"memwall.torch.offload: the gradient of a parameter of unit '{self._names[u]}' "
                                   f"is on {g.device}, not on {self.device} with the parameter; do not assign p.grad")
            rows.append((p, o, g))
            p.grad = None
        base = min([o for _, o, _ in rows] or [0])
        if max([o + p.numel() for p, o, _ in rows] or [0]) - base > self._chunk:
            self.flush()
            self._pieces_back(rows, host_views)
            ready()
            return
        slot = self._gnext
        self._gnext ^= 1  # the slot's last copy was waited for one start ago (_finish below)
        queued = self._record(self._compute())  # after the unit's backward kernels
        with self._on_side("out"):
            if queued is not None:
                self._side["out"].wait_event(queued)
            for p, o, g in rows:
                self._gstage[slot][o - base:o - base + p.numel()].copy_(g.reshape(-1), non_blocking=self.cuda)
            done = self._record(self._side.get("out"))
        prev, self._gpending = self._gpending, (u, rows, done, slot, base, host_views, ready)
        if prev is not None:
            self._finish(prev)

    def _pieces_back(self, rows, host_views):
        """Gradients larger than a staging buffer: piece by piece through both, each piece added on the host
        once its copy finished (the next piece's copy in flight meanwhile)."""
        flat = [(p, g.reshape(-1), host_views[id(p)].view(-1)) for p, _, g in rows]  # on the compute stream
        queued = self._record(self._compute())  # after the unit's backward kernels and those reshapes
        if queued is not None:
            self._side["out"].wait_event(queued)
        inflight = [None, None]  # (event, host piece, staging piece) per buffer
        i = 0
        for p, src, dst in flat:
            for a in range(0, p.numel(), self._chunk):
                k = min(self._chunk, p.numel() - a)
                if inflight[i] is not None:
                    ev, h, st = inflight[i]
                    self._wait(ev)
                    h.add_(st)
                st = self._gstage[i][:k]
                with self._on_side("out"):
                    st.copy_(src[a:a + k], non_blocking=self.cuda)
                    inflight[i] = (self._record(self._side.get("out")), dst[a:a + k], st)
                i ^= 1
            self.bytes_out += 4 * p.numel()
        for j in (i, i ^ 1):  # the older piece first
            if inflight[j] is not None:
                ev, h, st = inflight[j]
                self._wait(ev)
                h.add_(st)

    def flush(self):
        """The unit still waiting: its copy waited for, its gradients added, the session told."""
        prev, self._gpending = self._gpending, None
        if prev is not None:
            self._finish(prev)

    def _finish(self, pending):
        u, rows, done, slot, base, host_views, ready = pending
        self._wait(done)  # the session may write the host gradients to NVMe as soon as it is told
        for p, o, _ in rows:
            host_views[id(p)].add_(self._gstage[slot][o - base:o - base + p.numel()].view(p.shape))
            self.bytes_out += 4 * p.numel()
        ready()

    def to_host(self, g):
        """A device tensor's values on the host (a tied head's alias gradient, Offload._fold)."""
        return g if g.device.type == "cpu" else g.to("cpu")

    # ------------------------------------------------------------------ saved tensors

    def pack(self, t, nxt=None):
        """The pack hook: a saved view of a unit's device buffer becomes a handle; anything else goes to nxt
        (the spill store's pack) or is kept as it is."""
        if self._keys:
            try:
                ptr = t.untyped_storage().data_ptr()
            except Exception:  # noqa: BLE001 - no storage (a wrapper tensor)
                ptr = None
            u = self._keys.get(ptr) if ptr is not None else None
            if u is not None and t.device == self.device:
                return _WeightRef(u, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if nxt is not None:
            return nxt(t)
        return t if t.grad_fn is None else t.detach()  # no reference cycle through an op's own output

    def unpack(self, x, nxt=None):
        if not isinstance(x, _WeightRef):
            return nxt(x) if nxt is not None else x
        buf = self._bufs.get(x.unit)
        if buf is None:
            raise RuntimeError(f"memwall.torch.offload: backward needs the weights of unit '{self._names[x.unit]}' "
                               "while that unit is not acquired (its modules' backward ran outside the schedule "
                               "offload() planned); name the units with units=[...] so that each module's backward "
                               "runs inside its own unit")
        return torch.as_strided(buf, x.size, x.stride, x.offset)

    def chain(self, pack, unpack):
        """The (pack, unpack) pair that sees each saved tensor first and passes the others on."""
        return (lambda t: self.pack(t, pack)), (lambda x: self.unpack(x, unpack))

    def enter(self, module=None, args=None):
        """The model's forward pre-hook (no spill store): the saved-tensor hooks on, in training."""
        self.exit()
        if torch.is_grad_enabled():
            self._ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            self._ctx.__enter__()

    def exit(self, module=None, args=None, output=None):
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def attach(self, model):
        """Its own hooks around the model's forward (used when activations stay in DRAM)."""
        return [model.register_forward_pre_hook(self.enter),
                model.register_forward_hook(self.exit, always_call=True)]

    def close(self):
        self.exit()
        self._gpending = None
        self._inuse.clear()
        self._bufs.clear()
        self._keys.clear()
        if self.cuda:
            for st in self._side.values():
                st.synchronize()  # no copy reads the staging any more
        self._stage = self._stage_done = self._gstage = None
