"""memwall.torch.offload: the whole training state of a PyTorch model (weights, gradients, the AdamW
state) in memwall's residency machine, streamed from NVMe unit by unit (docs/python.md, "Whole-state
offload"; issue 25).

Why this shape:
- The C side already is the trainer's step taken apart into flat calls (memwall/pyapi.h,
  mw_pysession_*: units, prefetch, gradients written as they finish, the update behind the next
  forward, the plan against a DRAM budget, the order check). This file only maps a torch model
  onto it: it cuts the model into units, makes every parameter's .data a view of the session's
  flat params array and every .grad a view of its flat grads array (autograd accumulates in place
  there, as DDP's gradient_as_bucket_view does), and calls the session from module hooks.
- Hooks per unit, not per parameter, for the weights: a forward pre-hook acquires a unit, a
  forward post-hook releases it and hangs a hook on the unit's output tensors; when the gradient
  of those outputs arrives in backward the unit's backward is about to start, so the unit held
  before (whose backward is done: its input gradient is this output gradient) is released and
  this one acquired. Gradients: one post-accumulate-grad hook per parameter counts the unit's
  parameters; when all are accumulated the unit is reported (grad_ready, decreasing unit order,
  after its weights are released, as the C trainer does).
- A tied parameter (embedding and head) is one unit's; its later use (the head) runs through an alias
  leaf over the same weights, so that autograd does not hold the head's vocabulary-sized gradient
  through the whole backward pass and sum it out of place with the embedding's (_plan): the alias's
  gradient is added into the session's array once the head's weights are released.
- The vocabulary-sized tensors, on the host (lean, the default; MEMWALL_OFFLOAD_LEAN=0 turns it off): the
  head (a bias-free nn.Linear: over the embedding's weight when tied, else in the last run) runs through
  _Head, whose backward goes over the vocabulary in chunks: each chunk's weight gradient is added into the
  session's array in place (no vocabulary x width gradient of its own; the parameter's own hooks do not
  fire) and, streamed, the weights that chunk read go at once (mw_pysession_unit_trim), so the head's
  backward holds one array of its size, not three. Streamed without accumulation a quarter of the head's
  weights goes at the end of its forward too, over the loss, and its backward reads it again. The embedding
  lookups take sparse gradients (nn.Embedding.sparse), which autograd adds into the session's dense
  array in place: torch's dense embedding backward builds a vocabulary x width array of zeros for the
  few rows a batch touches. Both change the rounding of the head's input gradient (summed by chunk) and of
  rows a batch repeats, so the device path (_device.py, which keeps the alias) is bitwise the host path
  with lean off.
- weights_from: a model built on the meta device gets placeholders for its parameters (no memory) and
  its initial weights from a safetensors checkpoint, a tensor at a time in the session's init_unit
  callback (_weights.py), so that it is never whole in DRAM.
- Resume: with the optimizer on NVMe the session commits every step as `memwall train` does (a record
  the engine replaces atomically once a step's writes landed); offload(resume=True) reopens that state
  for the same model description, so this file keeps no state of its own beyond the step count.
- A model on a device (CUDA): the session's arrays stay on the host and are the staging of the copies;
  a unit's weights go to the device at its acquire and its gradients come back at its grad_ready
  (_device.py, which says why: pinned staging, the saved-tensor hook for the weights' views).
- The schedule is static, from the module structure (forward: unit 0, the blocks, the last unit,
  and unit 0 again for a tied head; backward: the reverse, without the embedding lookups, which
  need no weights) and every use is checked against it: a module that runs out of that order is
  an error naming it, never a silently wrong result.
"""
import atexit
import ctypes
import os
import weakref
import warnings

import torch

from . import _activations
from . import _device
from . import _lib
from . import _weights

__all__ = ["offload", "Offload", "OffloadAdamW", "clip_grad_norm_"]

_WEIGHTS = ("dram", "nvme")
_LEAN_ENV = "MEMWALL_OFFLOAD_LEAN"
_HEAD_CHUNK_BYTES = 32 << 20  # a head's backward goes over the vocabulary in chunks of this much weight
_TRIM_NOW = 1  # MW_PYSESSION_TRIM_NOW
_HEAD_OVER_LOSS = 0.25  # the part of a streamed head's weights dropped over the loss (_head_forward_done)
_OPTIMIZERS = (None, "dram", "nvme")
_NAME_MAX = 95  # MW_FOREIGN_NAME_MAX - 1


def _short(name, limit=_NAME_MAX):
    """A name for the C side's messages (at most `limit` bytes): the tail, where module names differ."""
    b = name.encode()
    return name if len(b) <= limit else "..." + b[-(limit - 3):].decode(errors="ignore")


def _plain(method):
    """A function calling a bound method (torch marks some hooks with attributes, which methods refuse)."""
    def hook(*args):
        return method(*args)
    return hook


def _tensors_in(obj, out):
    """Every tensor in a module's output (tensors, tuples, lists, dicts, ModelOutput)."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors_in(x, out)
    return out


def _block_list(model):
    """The model's repeated block list: the largest nn.ModuleList whose children share one class."""
    best, best_name = None, None
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 0 and len({type(c) for c in m}) == 1:
            if any(True for _ in m.parameters()) and (best is None or len(m) > len(best)):
                best, best_name = m, name
    return best, best_name


def _default_units(model):
    """[[modules before the block list], block 0, ..., block L-1, [modules after it]], the modules
    in registration order (the forward order of transformers' models; checked at every pass)."""
    blocks, bname = _block_list(model)
    if blocks is None:
        raise ValueError("memwall.torch.offload: the model has no repeated block list (an nn.ModuleList whose "
                         "children share one class); name the units with units=[module, ...] in forward order")
    names = {id(m): n for n, m in model.named_modules()}
    before, after = [], []

    def contains(m):
        return any(x is blocks for x in m.modules())

    def walk(m):
        direct = [n for n, p in m.named_parameters(recurse=False)]
        if direct:
            raise ValueError(f"memwall.torch.offload: module '{names[id(m)] or '(the model)'}' holds parameters "
                             f"({', '.join(direct[:3])}) itself and contains the block list '{bname}': the default "
                             "units cannot tell when they are used; name the units with units=[module, ...]")
        seen = False
        for c in m.children():
            if c is blocks:
                seen = True
            elif contains(c):
                walk(c)
                seen = True
            elif any(True for _ in c.parameters()):
                (after if seen else before).append(c)

    walk(model)
    if not before or not after:
        raise ValueError(f"memwall.torch.offload: the block list '{bname}' has no modules with parameters "
                         f"{'before' if not before else 'after'} it (embeddings, final norm or head): the default "
                         "units need both; name the units with units=[module, ...]")
    return [before] + list(blocks) + [after]


def _close_at_exit(ref):
    """Interpreter exit: an offload still open is closed; a committed state stays for resume= (a
    script that stopped without close() is one that did not finish), the trace is written."""
    off = ref()
    if off is not None:
        try:
            off.close(restore=False, keep=True)
        except Exception:  # noqa: BLE001 - at exit there is no caller to tell
            pass


_libc = None


def _trim_heap():
    """The C heap's free memory back to the OS (glibc's malloc_trim; elsewhere nothing). A forward pass
    frees many tensors of a few MiB, below glibc's mmap threshold (which rises to 32 MiB as large ones
    are freed), in the middle of the heap: 0.2 GiB at Qwen2.5-0.5B, batch 1 x 256, activations on NVMe,
    kept from the OS through the loss and the backward pass."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None).malloc_trim
            _libc.argtypes, _libc.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc(0)


class _Head(torch.autograd.Function):
    """logits = x @ W^T for a head whose W is the session's (see the design note: "lean"); the backward is
    Offload._head_backward. W is no input of the graph: autograd neither saves it (the activations' hooks
    never see it) nor makes a gradient of its size."""

    @staticmethod
    def forward(ctx, x, off, unit, q):
        ctx.save_for_backward(x)
        ctx.off, ctx.unit, ctx.q = off, unit, q
        out = torch.nn.functional.linear(x, off._wview[id(q)])
        off._head_forward_done(unit, q)
        return out

    @staticmethod
    def backward(ctx, dout):
        (x,) = ctx.saved_tensors
        return ctx.off._head_backward(x, dout, ctx.unit, ctx.q), None, None, None


class _Session:
    """Owns the C session. The flat tensors over its arrays keep it alive (the ctypes arrays they
    are made from hold a reference to it), so the mappings outlive every view of them."""

    def __init__(self):
        self.handle = None
        self.trace = None  # the recorder the session writes into (trace=): freed after it

    def close(self):
        if self.handle:
            _lib.lib().mw_pysession_close(self.handle)
            self.handle = None
        if self.trace:
            _lib.lib().mw_trace_free(self.trace)
            self.trace = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit there is no caller to tell
            pass


class _Run:
    """One contiguous use of a unit in the forward pass: the modules (sites) that use it."""

    def __init__(self, index, unit, sites):
        self.index, self.unit, self.sites = index, unit, sites
        self.backward = True  # acquired again in backward


class _Token:
    """A forward run's backward event, hung on its output tensors (fires once)."""
    __slots__ = ("run", "gen", "fired")

    def __init__(self, run, gen):
        self.run, self.gen, self.fired = run, gen, False


class Offload:
    """The handle memwall.torch.offload returns (see offload())."""

    def __init__(self, model, *, weights="nvme", optimizer=None, nvme_dir=None, dram_budget=None, prefetch=2,
                 units=None, activations="dram", grad_accum=1, no_decay=None, subgroup_size=None,
                 buffer_count=None, threads=None, weights_from=None, resume=False, trace=None):
        if resume not in (False, True, "auto"):
            raise ValueError(f"memwall.torch.offload: resume={resume!r}: use False (a fresh session), True (continue "
                             "the committed state in nvme_dir) or 'auto' (continue it if there is one)")
        self._resume = resume
        self._trace_path = None if trace is None else str(trace)
        acts = _activations.options(activations)  # None: in DRAM; else saved tensors on NVMe (_activations.py)
        if weights not in _WEIGHTS:
            raise ValueError(f"memwall.torch.offload: weights={weights!r}: use 'nvme' (streamed) or 'dram' (resident)")
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"memwall.torch.offload: optimizer={optimizer!r}: use 'nvme', 'dram' or None (nvme when "
                             "the weights stream)")
        if not isinstance(model, torch.nn.Module):
            raise TypeError("memwall.torch.offload: model must be a torch.nn.Module")
        if getattr(model, "_memwall_offload", None) is not None:
            raise ValueError("memwall.torch.offload: this model is offloaded already (close() that offload first)")
        for k, v in (("grad_accum", grad_accum), ("prefetch", prefetch)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"memwall.torch.offload: {k} must be an int, got {v!r}")
        if not 1 <= grad_accum <= 65536:
            raise ValueError(f"memwall.torch.offload: grad_accum={grad_accum}: 1..65536 backward passes per step")
        if not 0 <= prefetch <= 8:
            raise ValueError(f"memwall.torch.offload: prefetch={prefetch}: 0..8 units fetched ahead")
        if nvme_dir is None and (weights == "nvme" or optimizer == "nvme" or acts is not None):
            raise ValueError("memwall.torch.offload: nvme_dir= is needed with weights, optimizer state or activations "
                             "on NVMe: the "
                             "directory of the state (created if missing; files removed at close)")
        on_meta = [n for n, p in model.named_parameters() if p.is_meta]
        if on_meta and weights_from is None:
            raise ValueError(f"memwall.torch.offload: {len(on_meta)} parameters are on the meta device "
                             f"({', '.join(on_meta[:3])}{', ...' if len(on_meta) > 3 else ''}): they have no values to "
                             "start from; give weights_from=DIR (a Hugging Face directory: its safetensors are read "
                             "into the session unit by unit, the model never whole in DRAM), or build the model on "
                             "the CPU")
        self.model = model
        self.weights = weights
        self.grad_accum = grad_accum
        self._prefetch = prefetch
        self.nvme_dir = None if nvme_dir is None else str(nvme_dir)
        self._source = None if weights_from is None else _weights.SafetensorsWeights(weights_from)
        self._keys = {}
        if self._source is not None or any(b.is_meta for b in model.buffers()):
            # Before the parameters get their placeholders: the model's _init_weights may touch them (a no-op
            # on the meta device). Small: rotary frequencies and the like.
            self._made_buffers = _weights.materialise_buffers(model, self._source)
        slots = _weights.meta_placeholders(model)
        try:
            self._plan(model, units, no_decay)
            if self._source is not None:
                self._bind()
            self._open(weights, optimizer, dram_budget, prefetch, subgroup_size, buffer_count, threads)
            self._acts = None if acts is None else _activations.Spill(acts, self.nvme_dir, [
                (t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in (self._flat_params, self._flat_grads)], self._fail)
        except BaseException:
            _weights.undo_placeholders(slots)  # the model as it was given (its buffers on the CPU now)
            raise
        self._attach()
        if self._acts is not None:  # the saved-tensor hooks around the model's forward
            self._hooks += self._acts.attach(model)
            if self._dev is not None:
                self._acts.front = self._dev  # the weights' saved views first (_device.py), the rest spilled
                if self._dev.cuda:
                    warnings.warn("memwall.torch.offload: activations='nvme' spills CPU tensors; the activations of "
                                  f"a model on {self._device} stay on the device (only its weights and gradients "
                                  "go through the session)", RuntimeWarning, stacklevel=3)
        elif self._dev is not None:
            self._hooks += self._dev.attach(model)

    # ------------------------------------------------------------------ the units and the schedule

    def _plan(self, model, units, no_decay):
        names, aliases = {}, {}
        for n, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), n)
            aliases.setdefault(id(p), []).append(n)
        mod_names = {id(m): (n or "(the model)") for n, m in model.named_modules()}
        groups = _default_units(model) if units is None else list(units)
        if not groups:
            raise ValueError("memwall.torch.offload: units=[] names no module")
        owner = {}            # id(param) -> unit
        unit_params = []      # unit -> [params] in flat order
        unit_names = []
        sites = []            # (module, unit) in forward order
        for gi, g in enumerate(groups):
            mods = list(g) if isinstance(g, (list, tuple)) else [g]
            for m in mods:
                if not isinstance(m, torch.nn.Module):
                    raise TypeError(f"memwall.torch.offload: units[{gi}] holds {type(m).__name__}, not a module")
                if id(m) not in mod_names:
                    raise ValueError(f"memwall.torch.offload: units[{gi}] is a module that is not part of the model")
            own, unit_sites = [], []
            for m in mods:
                ps = list(m.parameters())
                if not ps:
                    continue
                mine = [p for p in ps if id(p) not in owner]
                theirs = {owner[id(p)] for p in ps if id(p) in owner}
                if mine and theirs:
                    shared = next(p for p in ps if id(p) in owner)
                    raise ValueError(f"memwall.torch.offload: module '{mod_names[id(m)]}' has parameters of its "
                                     f"own and shares '{names[id(shared)]}' with unit "
                                     f"'{unit_names[owner[id(shared)]]}': a module "
                                     "uses one unit; name the units so that tied parameters are a module of their own")
                if len(theirs) > 1:
                    raise ValueError(f"memwall.torch.offload: module '{mod_names[id(m)]}' uses parameters of several "
                                     "units; name the units so that each module uses one")
                if theirs:
                    unit_sites.append((m, theirs.pop()))
                    continue
                own.extend(p for p in mine if all(p is not q for q in own))
                unit_sites.append((m, None))
            u = len(unit_params) if own else None
            if own:
                for p in own:
                    owner[id(p)] = u
                unit_params.append(own)
                unit_names.append(_short("+".join(mod_names[id(m)] for m, x in unit_sites if x is None)))
            for m, x in unit_sites:
                sites.append((m, u if x is None else x))
        missing = [n for n, p in model.named_parameters() if id(p) not in owner]
        if missing:
            raise ValueError(f"memwall.torch.offload: {len(missing)} parameters are in no unit "
                             f"({', '.join(missing[:4])}"
                             f"{', ...' if len(missing) > 4 else ''}): units= must cover every parameter of the model")
        if len(sites) != len({id(m) for m, _ in sites}):
            raise ValueError("memwall.torch.offload: a module is named in two units")
        for u, ps in enumerate(unit_params):
            for p in ps:
                n = names[id(p)]
                if p.dtype != torch.float32:
                    raise ValueError(f"memwall.torch.offload: parameter '{n}' is {p.dtype}; offload trains fp32 "
                                     "parameters (model.float() first)")
                if p.device.type not in ("cpu", "cuda"):
                    raise NotImplementedError(f"memwall.torch.offload: parameter '{n}' is on {p.device}; offload runs "
                                              "CPU and CUDA models (model.to('cpu') or model.to('cuda') first)")
                if p.is_sparse or not p.requires_grad:
                    raise ValueError(f"memwall.torch.offload: parameter '{n}' is "
                                     f"{'sparse' if p.is_sparse else 'frozen (requires_grad=False)'}; offload trains "
                                     "every parameter of the model, dense")
        devices = {p.device for p in self._all_params(unit_params)}
        if len(devices) > 1:
            where = {}
            for p in self._all_params(unit_params):
                where.setdefault(p.device, names[id(p)])
            raise ValueError("memwall.torch.offload: the parameters are on several devices (" +
                             ", ".join(f"'{n}' on {d}" for d, n in where.items()) + "); offload trains a model whose "
                             "parameters are all on one device: model.to(device) first")
        dev = devices.pop() if devices else torch.device("cpu")
        if dev.type == "cpu" and os.environ.get(_device.SIM_ENV, "0") not in ("", "0"):
            self._device = dev  # the device path simulated on the CPU (tests; _device.py)
        else:
            self._device = None if dev.type == "cpu" else dev
        # Forward runs: consecutive sites of one unit.
        runs = []
        for m, u in sites:
            if runs and runs[-1].unit == u:
                runs[-1].sites.append(m)
            else:
                runs.append(_Run(len(runs), u, [m]))
        # Backward: the runs in reverse, without the first run when it is embedding lookups only
        # (their backward needs no weights; a tied embedding is acquired for its head's backward).
        first = runs[0]
        if all(isinstance(m, torch.nn.Embedding) for m in first.sites):
            first.backward = False
        self._runs = runs
        self._bwd_runs = [r for r in reversed(runs) if r.backward]
        # A unit used again later in forward (a tied head): its parameters are used there through aliases
        # (_attach), so that autograd does not sum the two uses' gradients itself. It would hold the
        # head's gradient (vocabulary x width) in the AccumulateGrad node's input buffer from the head's
        # backward to the embedding's, the whole backward pass, and add the embedding's to it out of place
        # at the end: three arrays of the unit's size at once with the session's, the peak of the step for
        # a large vocabulary. The alias's gradient is added into the session's array once the head's
        # weights are released (_fold_alias); the embedding's is then accumulated in place: two at most.
        seen_units = set()
        for r in runs:
            r.alias_slots = []
            if r.unit in seen_units:
                for s in r.sites:
                    for sub in s.modules():
                        for pname, q in sub._parameters.items():
                            if q is not None and owner.get(id(q)) == r.unit:
                                r.alias_slots.append((sub, pname, q))
            seen_units.add(r.unit)
        self._site_run = {id(m): r for r in runs for m in r.sites}
        self._site_name = {id(m): mod_names[id(m)] for m, _ in sites}
        self._unit_params = unit_params
        self._unit_names = unit_names
        self._param_names = names
        self._aliases = aliases
        self._params = [p for ps in unit_params for p in ps]
        self._param_unit = {id(p): u for u, ps in enumerate(unit_params) for p in ps}
        if no_decay is None:
            self._no_decay = set()
        elif callable(no_decay):
            self._no_decay = {id(p) for p in self._params if no_decay(names[id(p)], p)}
        else:
            want = set(no_decay)
            unknown = want - set(names.values())
            if unknown:
                raise ValueError(f"memwall.torch.offload: no_decay names unknown parameters: {sorted(unknown)[:4]}")
            self._no_decay = {id(p) for p in self._params if names[id(p)] in want}

    @staticmethod
    def _all_params(unit_params):
        return [p for ps in unit_params for p in ps]

    def _bind(self):
        """Every parameter's tensor in the checkpoint (a tied one under any of its names), its shape and
        type checked before anything is written."""
        src = self._source
        prefix = getattr(self.model, "base_model_prefix", "") or ""
        missing = []
        for p in self._params:
            names = self._aliases[id(p)]
            k = src.key_for(names, prefix)
            if k is None:
                missing.append(names[0])
                continue
            src.check(k, p.shape, names[0])
            self._keys[id(p)] = k
        if missing:
            have = sorted(src.where)
            raise ValueError(f"memwall.torch.offload: {len(missing)} parameters are not in weights_from='{src.path}' "
                             f"({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); its "
                             f"{len(have)} tensors are named like {', '.join(have[:3])}: the checkpoint is not of "
                             "this model")
        used = set(self._keys.values())
        for n, _ in self.model.named_buffers(remove_duplicate=False):
            k = src.key_for([n], prefix)
            if k is not None:
                used.add(k)
        _weights.unexpected_keys(src, used)

    def _run_modules(self, run):
        return "+".join(self._site_name[id(m)] for m in run.sites)

    # ------------------------------------------------------------------ the session

    def _open(self, weights, optimizer, dram_budget, prefetch, subgroup_size, buffer_count, threads):
        L = _lib.lib()
        nu = len(self._unit_params)
        u64s = lambda xs: (ctypes.c_uint64 * len(xs))(*xs)  # noqa: E731
        i32s = lambda xs: (ctypes.c_int * len(xs))(*xs)  # noqa: E731
        strs = lambda xs: (ctypes.c_char_p * len(xs))(*[x.encode() for x in xs])  # noqa: E731
        unit_numel = u64s([sum(p.numel() for p in ps) for ps in self._unit_params])
        fwd = i32s([r.unit for r in self._runs])
        bwd = i32s([r.unit for r in self._bwd_runs])
        tnames, seen = [], set()
        for i, p in enumerate(self._params):
            n = _short(self._param_names[id(p)])
            if n in seen:
                n = _short(f"{i}:{self._param_names[id(p)]}")
            seen.add(n)
            tnames.append(n)
        tnumel = u64s([p.numel() for p in self._params])
        tflags = (ctypes.c_uint * len(self._params))(*[_lib.NO_DECAY if id(p) in self._no_decay else 0
                                                       for p in self._params])
        failure = []

        src = self._source

        def init_unit(user, unit, dst, n):
            try:
                flat = torch.frombuffer((ctypes.c_float * n).from_address(dst), dtype=torch.float32)
                off = 0
                with torch.no_grad():
                    for p in self._unit_params[unit]:
                        k = p.numel()
                        if src is not None:  # a tensor at a time from the checkpoint, converted to fp32
                            src.read_into(self._keys[id(p)], flat[off:off + k].view(p.shape))
                        else:
                            flat[off:off + k].copy_(p.detach().reshape(-1))
                        off += k
                return 0
            except Exception as e:  # noqa: BLE001 - told after the C call returns
                failure.append(e)
                return -5

        cb = self._init_cb = _lib.INIT_UNIT_FN(init_unit)  # kept: the net holds the pointer
        sess = _Session()
        h = ctypes.c_void_p()
        if self._trace_path:  # the recorder lives as long as the session (freed after it)
            th = ctypes.c_void_p()
            _lib.check(L.mw_trace_init(ctypes.byref(th), 0), "creating the trace recorder")
            sess.trace = th
            L.mw_trace_meta(th, b"source", b"memwall.torch.offload")
        resume = {False: 0, True: 1, "auto": 2}[self._resume]
        rc = L.mw_pysession_open2(ctypes.byref(h), nu, unit_numel, strs(self._unit_names), len(fwd), fwd, len(bwd),
                                  bwd, len(self._params), tnumel, strs(tnames), tflags, cb, None, weights.encode(),
                                  optimizer.encode() if optimizer else None,
                                  self.nvme_dir.encode() if self.nvme_dir else None, int(dram_budget or 0),
                                  self.grad_accum, prefetch, int(subgroup_size or 0), int(buffer_count or 0),
                                  int(threads or 0), resume, sess.trace)
        if failure:
            if h.value:
                L.mw_pysession_close(h)
            what = "copying the model's weights into the session" if src is None else \
                f"reading the initial weights from '{src.path}'"
            raise RuntimeError(f"memwall.torch.offload: {what} failed: {failure[0]!r}") from failure[0]
        if rc < 0:
            sess.close()  # the recorder
        _lib.check(rc, "memwall.torch.offload: opening the session")
        sess.handle = h
        self._sess = sess
        self._h = h
        n = L.mw_pysession_n_params(h)
        flat = []
        for ptr in (L.mw_pysession_params(h), L.mw_pysession_grads(h)):
            arr = (ctypes.c_float * n).from_address(ptr)
            arr._memwall_session = sess  # a view of the mapping keeps the session alive
            flat.append(torch.frombuffer(arr, dtype=torch.float32))
        self._flat_params, self._flat_grads = flat
        self._ranges = []
        for u in range(nu):
            a, c = ctypes.c_uint64(), ctypes.c_uint64()
            _lib.check(L.mw_pysession_unit_range(h, u, ctypes.byref(a), ctypes.byref(c)), "unit range")
            self._ranges.append((a.value, c.value))

    def _call(self, what, rc):
        return _lib.check(rc, f"memwall.torch.offload: {what}")

    # ------------------------------------------------------------------ the model's tensors and hooks

    def _attach(self):
        """p.data and p.grad become views of the session's arrays (the model's own storage goes), then the hooks.
        On a device (_device.py) p.data is a placeholder on it between the unit's uses and p.grad is None
        between backward passes; the views of the session's arrays are the host side of the copies."""
        self._views = []
        self._gview = {}
        self._wview = {}
        dev = self._device is not None
        for u, ps in enumerate(self._unit_params):
            off = self._ranges[u][0]
            for p in ps:
                k = p.numel()
                w = self._flat_params[off:off + k].view(p.shape)
                g = self._flat_grads[off:off + k].view(p.shape)
                if not dev:
                    p.data = w
                    p.grad = g
                self._views.append((p, w.data_ptr(), g))
                self._gview[id(p)] = g
                self._wview[id(p)] = w
                off += k
        # The aliases of the later uses of a unit (see _plan): leaves over the same weights, their
        # gradient taken by _on_alias_grad.
        self._swapped = []          # (module, name, param) slots holding an alias now
        self._alias_pending = []    # (unit, param, gradient) not yet added into the session's array
        alias_hooks = []
        for r in self._runs:
            r.aliases = []
            made = {}
            for sub, pname, q in r.alias_slots:
                a = made.get(id(q))
                if a is None:
                    a = made[id(q)] = torch.nn.Parameter(self._wview[id(q)], requires_grad=True)
                    a._memwall_alias_of = (r.unit, q)
                    alias_hooks.append(a.register_post_accumulate_grad_hook(self._on_alias_grad))
                r.aliases.append((sub, pname, q, a))
        self._dev = None
        self._lean = not dev and os.environ.get(_LEAN_ENV, "1") not in ("", "0")
        self._heads = {}    # id(module) -> (module, unit, param, alias or None): heads run by _Head
        self._sparse = []   # embeddings made sparse here (restored at close)
        if self._lean:
            def plain_linear(sub):
                return (type(sub).forward is torch.nn.Linear.forward and sub.bias is None
                        and "forward" not in sub.__dict__ and id(sub) not in self._heads)

            for r in self._runs:  # tied heads: a later use of a unit, through its alias
                for sub, pname, q, a in r.aliases:
                    if pname == "weight" and plain_linear(sub):
                        self._heads[id(sub)] = (sub, r.unit, q, a)
            last = self._runs[-1]  # an untied head: a bias-free Linear of the last run, its weight the run's unit's
            for site in last.sites:
                for sub in site.modules():
                    q = sub._parameters.get("weight") if isinstance(sub, torch.nn.Linear) else None
                    if q is not None and plain_linear(sub) and self._param_unit.get(id(q)) == last.unit:
                        self._heads[id(sub)] = (sub, last.unit, q, None)
            for sub, _, _, _ in self._heads.values():
                sub.forward = (lambda x, sub=sub: self._head_forward(sub, x))
            for m in self.model.modules():
                w = m._parameters.get("weight") if isinstance(m, torch.nn.Embedding) else None
                if w is not None and id(w) in self._param_unit and not m.sparse:
                    m.sparse = True
                    self._sparse.append(m)
        self._heads_untied = {id(q): True for _, _, q, a in self._heads.values() if a is None}
        if dev:
            by_unit = {}
            for r in self._runs:
                for _, _, q, a in r.aliases:
                    row = by_unit.setdefault(r.unit, [])
                    if all(a is not b for _, b in row):
                        row.append((q, a))
            self._dev = _device.DeviceUnits(self._device, self._unit_params, self._ranges, self._flat_params,
                                            self._flat_grads, by_unit, self._unit_names, depth=self._prefetch)
            self._dev.park()  # the model's own device storage goes here
            for p in self._params:
                p.grad = None
        self._closed = False
        self._broken = None
        self._gen = 0               # training forward passes
        self._pass = False          # inside a forward of the model
        self._fpos = 0              # the next forward run
        self._open_run = None       # (run, done sites, outputs)
        self._in_bwd = False
        self._micro = 0             # backward passes since the last step
        self._clip = None
        self._grad_version = 0
        self._opt = None
        self._steps = 0
        self._version = 0           # the weights changed (a step, a write): gathered copies are stale
        self._cache = None          # (version, unit, tensor) of the last unit gathered
        self._pending = {}          # id(param) -> values loaded by load_state_dict, not yet written
        hooks = []
        m = self.model
        hooks.append(m.register_forward_pre_hook(self._root_pre))
        hooks.append(m.register_forward_hook(self._root_post))
        for r in self._runs:
            for s in r.sites:
                hooks.append(s.register_forward_pre_hook(self._site_pre))
                hooks.append(s.register_forward_hook(self._site_post))
        for p in self._params:
            hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        hooks.append(m.register_state_dict_pre_hook(_plain(self._sd_pre)))
        hooks.append(m.register_state_dict_post_hook(_plain(self._sd_root_post)))
        with_params = [x for x in m.modules() if any(True for _ in x.parameters(recurse=False))]
        if self.weights == "nvme" or self._dev is not None:  # the parameters hold no values between uses
            for x in with_params:
                hooks.append(x.register_state_dict_post_hook(_plain(self._sd_post)))
        for x in with_params:
            hooks.append(x.register_load_state_dict_pre_hook(_plain(self._load_pre)))
        hooks.append(m.register_load_state_dict_post_hook(_plain(self._load_post)))
        self._hooks = hooks + alias_hooks
        for p in self._params:
            p._memwall_offload = weakref.ref(self)
        m._memwall_offload = self
        self._steps = int(self.stats()["steps"])  # a resumed session's committed steps
        atexit.register(_close_at_exit, weakref.ref(self))

    def _guard(self, reading=False):
        """Refuses a closed offload, and one an earlier error left mid-pass (reading its weights is still fine)."""
        if self._closed:
            raise RuntimeError("memwall.torch.offload: this offload is closed")
        if self._broken and not reading:
            raise RuntimeError(f"memwall.torch.offload: unusable after an earlier error ({self._broken}); close() it "
                               "and call offload() again")

    def _fail(self, e):
        self._broken = str(e).splitlines()[0] if str(e) else type(e).__name__
        return e

    def _order_error(self, msg):
        return RuntimeError(f"memwall.torch.offload: {msg}. The module order offload() planned is "
                            f"{self._plan_text()}; a model whose module order changes is not supported (a changed "
                            "order is refused, never run with the wrong weights): build the offload again for the "
                            "new order, or name the units with units=[...]")

    def _plan_text(self):
        names = [self._run_modules(r) for r in self._runs]
        return " -> ".join(names if len(names) <= 6 else names[:3] + ["..."] + names[-2:])

    def _unit(self, event, unit, backward, who):
        if event == _lib.UNIT_RELEASE and self._dev is not None:
            self._dev.release(unit)  # the parameters' device views go first
        rc = _lib.lib().mw_pysession_unit(self._h, event, unit, backward)
        if rc < 0:
            msg = _lib.lib().mw_error_msg()
            msg = msg.decode(errors="replace") if msg else ""
            if "schedule expected" in msg:
                raise self._order_error(f"module '{who}' ran out of order ({msg})")
            _lib.check(rc, f"{'acquiring' if event == _lib.UNIT_ACQUIRE else 'releasing'} unit '{who}'")
        if event == _lib.UNIT_ACQUIRE and self._dev is not None:
            self._dev.acquire(unit)  # the host pages hold the unit now: to the device

    # forward ------------------------------------------------------------

    def _root_pre(self, module, args):
        self._guard()
        try:
            if self._in_bwd:
                raise RuntimeError("memwall.torch.offload: a forward pass of the model inside its backward pass "
                                   "(activation checkpointing, a closure in a hook) is not supported yet")
            self._unswap()
            self._alias_pending = []  # a forward whose backward never ran: its aliases' gradients go
            if self._open_run is not None:  # an earlier forward raised halfway: its unit is let go
                r = self._open_run[0]
                self._open_run = None
                self._unit(_lib.UNIT_RELEASE, r.unit, 0, self._run_modules(r))
            if self._pending:
                self._flush_pending()
            for p, wptr, g in self._views:
                if (p.data_ptr() != wptr) if self._dev is None else not self._dev.is_placeholder(p.data):
                    raise RuntimeError(f"memwall.torch.offload: parameter '{self._param_names[id(p)]}' is not the "
                                       "session's any more (p.data or the module was replaced, or the model moved with "
                                       ".to()); close() the offload first, then change the model")
                if self._dev is not None:
                    p.grad = None  # a device gradient lives from its backward to its unit's grad_ready only
                elif p.grad is None or p.grad.data_ptr() != g.data_ptr():  # zero_grad(set_to_none=True) / p.grad = x
                    p.grad = g
            training = torch.is_grad_enabled()
            if training:
                self._gen += 1
            self._call("pass_begin", _lib.lib().mw_pysession_pass_begin(self._h, int(training)))
            self._pass = True
            self._fpos = 0
        except Exception as e:
            raise self._fail(e)

    def _root_post(self, module, args, output):
        try:
            self._pass = False
            if self._lean and torch.is_grad_enabled():
                _trim_heap()
            if self._fpos != len(self._runs) or self._open_run is not None:
                r = self._runs[self._fpos] if self._open_run is None else self._open_run[0]
                raise self._order_error(f"the forward pass ended before module '{self._run_modules(r)}' "
                                        f"{'ran' if self._open_run is None else 'finished'}")
        except Exception as e:
            raise self._fail(e)

    def _site_pre(self, module, args):
        try:
            self._guard()
            name = self._site_name[id(module)]
            if self._in_bwd:
                raise NotImplementedError(f"memwall.torch.offload: module '{name}' ran inside the backward pass "
                                          "(activation checkpointing runs a block's forward again there): not "
                                          "supported by offload yet; turn it off (model.gradient_checkpointing_"
                                          "disable())")
            if not self._pass:
                raise RuntimeError(f"memwall.torch.offload: module '{name}' ran outside a forward of the offloaded "
                                   "model; call the model offload() was given, not its parts")
            r = self._site_run[id(module)]
            if self._open_run is not None:
                if self._open_run[0] is r:
                    return
                o = self._open_run[0]
                left = [self._site_name[id(s)] for s in o.sites if id(s) not in self._open_run[1]]
                raise self._order_error(f"module '{name}' ran before '{', '.join(left)}' (of the same unit as "
                                        f"'{self._run_modules(o)}')")
            if self._fpos >= len(self._runs) or self._runs[self._fpos] is not r:
                want = self._run_modules(self._runs[self._fpos]) if self._fpos < len(self._runs) else \
                    "the end of the forward pass"
                raise self._order_error(f"module '{name}' ran where the schedule expected '{want}' (forward "
                                        f"position {self._fpos})")
            self._unit(_lib.UNIT_ACQUIRE, r.unit, 0, name)
            self._open_run = (r, set(), [])
            if r.aliases and torch.is_grad_enabled():
                for sub, pname, q, a in r.aliases:
                    sub._parameters[pname] = a
                    self._swapped.append((sub, pname, q))
        except Exception as e:
            raise self._fail(e)

    def _unswap(self):
        """The modules of a later use of a unit get their parameters back (see _plan)."""
        sw, self._swapped = self._swapped, []
        for sub, pname, q in sw:
            sub._parameters[pname] = q

    def _site_post(self, module, args, output):
        try:
            if self._open_run is None:
                return
            r, done, outs = self._open_run
            if self._site_run.get(id(module)) is not r:
                return
            done.add(id(module))
            if torch.is_grad_enabled():
                _tensors_in(output, outs)
            if len(done) < len(r.sites):
                return
            self._open_run = None
            self._fpos += 1
            self._unswap()
            self._unit(_lib.UNIT_RELEASE, r.unit, 0, self._run_modules(r))
            tok = _Token(r, self._gen)
            for t in outs:
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(lambda g, tok=tok: self._bwd_event(tok))
        except Exception as e:
            raise self._fail(e)

    # backward -----------------------------------------------------------

    def _begin_backward(self):
        if self._in_bwd:
            return
        self._guard()
        if self._micro >= self.grad_accum:
            raise RuntimeError(f"memwall.torch.offload: backward pass {self._micro + 1} before step(); the offload was "
                               f"made with grad_accum={self.grad_accum} backward passes per step (opt.step() after "
                               "each grad_accum of them)")
        last = self._micro == self.grad_accum - 1
        self._call("backward_begin", _lib.lib().mw_pysession_backward_begin(self._h, self._micro, int(last)))
        self._in_bwd = True
        nu = len(self._unit_params)
        self._held = None
        self._bpos = 0
        self._count = [0] * nu
        self._done = [False] * nu
        self._mark = nu  # units from here up are reported
        torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _bwd_event(self, tok):
        try:
            if tok.fired:
                return
            tok.fired = True
            if tok.gen != self._gen:
                raise RuntimeError("memwall.torch.offload: a backward pass through an earlier forward pass than the "
                                   "latest; one backward per forward, in order")
            self._begin_backward()
            self._release_held()
            r = tok.run
            if not r.backward:
                return
            if self._bpos >= len(self._bwd_runs) or self._bwd_runs[self._bpos] is not r:
                want = self._run_modules(self._bwd_runs[self._bpos]) if self._bpos < len(self._bwd_runs) else \
                    "the end of the backward pass"
                raise self._order_error(f"the backward pass reached module '{self._run_modules(r)}' where the "
                                        f"schedule expected '{want}' (backward position {self._bpos})")
            self._bpos += 1
            self._unit(_lib.UNIT_ACQUIRE, r.unit, 1, self._run_modules(r))
            self._held = r
        except Exception as e:
            raise self._fail(e)

    def _head_forward(self, sub, x):
        """A head's forward (its module's forward while offloaded): through _Head in a training pass (tied:
        its alias swapped in by _site_pre), the plain linear otherwise."""
        _, unit, q, a = self._heads[id(sub)]
        training = sub._parameters.get("weight") is a if a is not None else self._pass and torch.is_grad_enabled()
        # (an input without a gradient would leave the weight without one: autograd's own path then)
        return _Head.apply(x, self, unit, q) if training and x.requires_grad else torch.nn.Linear.forward(sub, x)

    def _head_forward_done(self, u, q):
        """Streamed without accumulation, the first _HEAD_OVER_LOSS of the head's weights go at the end of its
        forward though its backward reads them next (fetched again then: a wait of their read). Over the loss
        the head's weights and the loss's logits-sized arrays made the step's peak, just above the blocks'
        backward (which holds the tied embedding's gradient); a quarter of them brings the loss below it
        (Qwen2.5-0.5B, 1 x 256: all of them cost 0.3-0.45 s a step of 8.4-9.2 s for no lower peak). With
        accumulation the whole gradient array stays in DRAM through the step (the plan), far more than
        the head's weights: they stay."""
        if self.weights == "nvme" and self.grad_accum == 1:
            rows = int(q.shape[0] * _HEAD_OVER_LOSS)
            self._call("dropping the head's weights", _lib.lib().mw_pysession_unit_trim(
                self._h, u, self._grad_off(q), rows * (q.numel() // q.shape[0]), _TRIM_NOW))

    def _head_backward(self, x, dout, u, q):
        """The head's backward over the vocabulary in chunks of _HEAD_CHUNK_BYTES of weight: the input's
        gradient summed chunk by chunk, each chunk's weight gradient added into the session's array, and,
        streamed, the weights read so far dropped (mw_pysession_unit_trim, whole subgroups)."""
        try:
            self._begin_backward()
            if u >= self._mark:
                self._report(u)  # raises: its unit was reported already
            w, g = self._wview[id(q)], self._gview[id(q)]
            V, D = w.shape
            x2, d2 = x.reshape(-1, D), dout.reshape(-1, V)
            rows = max(1, _HEAD_CHUNK_BYTES // (4 * D))
            first = self._grad_off(q)
            dx = None
            with torch.no_grad():
                for r0 in range(0, V, rows):
                    r1 = min(V, r0 + rows)
                    dc = d2[:, r0:r1]
                    t = dc @ w[r0:r1]
                    dx = t if dx is None else dx.add_(t)
                    g[r0:r1].addmm_(dc.t(), x2)
                    if self.weights == "nvme":
                        self._call("dropping the head's weights", _lib.lib().mw_pysession_unit_trim(
                            self._h, u, first, r1 * D, 0))
            if self._heads_untied.get(id(q)):
                self._grad_arrived(u)  # autograd does not see this weight: its gradient is complete here
            return dx.view(x.shape)
        except Exception as e:
            raise self._fail(e)

    def _release_held(self):
        r = self._held
        if r is None:
            return
        self._held = None
        self._unit(_lib.UNIT_RELEASE, r.unit, 1, self._run_modules(r))
        self._fold(r.unit)
        if self._done[r.unit] and r.unit < self._mark:
            self._report(r.unit)

    def _on_alias_grad(self, a):
        """The gradient of a later use of a unit's parameter (a tied head), through its alias: kept until
        the unit's weights are released, then added into the session's array (_fold)."""
        try:
            if self._broken:
                return
            self._begin_backward()
            u, q = a._memwall_alias_of
            g, a.grad = a.grad, None
            if g is None:
                return
            if u >= self._mark:
                self._report(u)  # raises: its unit was reported already
            self._alias_pending.append((u, q, g))
            if self._held is None or self._held.unit != u:
                self._fold(u)
        except Exception as e:
            raise self._fail(e)

    def _fold(self, u):
        """Adds the aliases' gradients of unit u into the session's array (in place: the array holds the
        micro-batches before, and zeros at the first)."""
        if not self._alias_pending:
            return
        keep = []
        for v, q, g in self._alias_pending:
            if v == u:
                with torch.no_grad():
                    self._gview[id(q)].add_(g if self._dev is None else self._dev.to_host(g))
            else:
                keep.append((v, q, g))
        self._alias_pending = keep

    def _report(self, u):
        """grad_ready(u), after the units above it (in decreasing order; a unit whose parameters had no
        gradient in this pass is reported then: its gradients stay zero). On a device the gradients are
        copied back first and the session is told once they are in its array, one unit late (the last at
        _end_backward: _device.DeviceUnits.grads_start, flush)."""
        if u >= self._mark:
            raise RuntimeError(f"memwall.torch.offload: a gradient of unit '{self._unit_names[u]}' arrived after those "
                               f"of unit '{self._unit_names[self._mark]}' were reported: the backward pass does not "
                               "run the units in reverse forward order (name the units so that it does)")
        L = _lib.lib()
        for v in range(self._mark - 1, u - 1, -1):
            self._fold(v)
            ready = (lambda v=v: self._call(f"grad_ready({self._unit_names[v]})",
                                            L.mw_pysession_grad_ready(self._h, v)))
            if self._dev is None:
                ready()
            else:  # the device's gradients copied back and added into the session's, then ready() (_device.py)
                with torch.no_grad():
                    self._dev.grads_start(v, self._gview, ready)
        self._mark = u

    def _on_grad(self, p):
        try:
            if self._broken:
                return
            self._begin_backward()
            g = p.grad
            u = self._param_unit[id(p)]
            if self._dev is not None:
                if g is None or g.device != self._device:
                    raise RuntimeError(f"memwall.torch.offload: the gradient of '{self._param_names[id(p)]}' is "
                                       f"{'None' if g is None else 'on ' + str(g.device)} after its accumulation, not "
                                       f"on {self._device}; do not assign p.grad")
            elif g is None or g.data_ptr() != self._flat_grads.data_ptr() + 4 * self._grad_off(p):
                raise RuntimeError(f"memwall.torch.offload: autograd replaced the gradient of "
                                   f"'{self._param_names[id(p)]}' (p.grad is not the session's view); do not assign "
                                   "p.grad, and do not use create_graph=True")
            self._grad_arrived(u)
        except Exception as e:
            raise self._fail(e)

    def _grad_arrived(self, u):
        """One more parameter of unit u has its gradient of this pass (counted; the unit is reported once all
        have, unless its weights are still held: then at their release)."""
        if u >= self._mark:
            self._report(u)  # raises: its unit was reported already
        self._count[u] += 1
        if self._count[u] == len(self._unit_params[u]):
            self._done[u] = True
            if self._held is None or self._held.unit != u:
                self._report(u)  # else when its weights are released

    def _grad_off(self, p):
        off = getattr(self, "_goff", None)
        if off is None:
            off = self._goff = {}
            for u, ps in enumerate(self._unit_params):
                a = self._ranges[u][0]
                for q in ps:
                    off[id(q)] = a
                    a += q.numel()
        return off[id(p)]

    def _end_backward(self):
        try:
            if not self._in_bwd:
                return
            self._release_held()
            if self._mark > 0:
                self._report(0)
            if self._dev is not None:
                with torch.no_grad():
                    self._dev.flush()  # the last unit's gradients in the session's array, grad_ready told
            self._in_bwd = False
            self._micro += 1
            self._call("backward_end", _lib.lib().mw_pysession_backward_end(self._h))
            # Every gradient view shares the flat array's version counter: a write after this is seen at step().
            self._grad_version = self._flat_grads._version
        except Exception as e:
            raise self._fail(e)

    # ------------------------------------------------------------------ step, norm

    def _grad_norm(self):
        self._guard()
        if self._micro != self.grad_accum:
            raise RuntimeError(f"memwall.torch.offload: the gradient norm after {self._micro} of the step's "
                               f"{self.grad_accum} backward passes (grad_accum); clip after the last one")
        v = ctypes.c_double()
        rc = _lib.lib().mw_pysession_grad_norm(self._h, ctypes.byref(v))
        if rc == _lib.E_OVERFLOW:
            return v.value  # inf or NaN: step() will skip
        self._call("the gradient norm", rc)
        return v.value

    def _step(self, lr, betas, eps, weight_decay, max_grad_norm=None):
        self._guard()
        if self._in_bwd:
            raise RuntimeError("memwall.torch.offload: step() inside a backward pass")
        if self._micro != self.grad_accum:
            raise RuntimeError(f"memwall.torch.offload: step() after {self._micro} backward passes; the offload was "
                               f"made with grad_accum={self.grad_accum}, and each step takes exactly that many")
        if self._pending:
            raise RuntimeError("memwall.torch.offload: load_state_dict() during a step (between the first backward "
                               "and step()); load between steps")
        if self.weights == "nvme" and self._flat_grads._version != self._grad_version:
            raise self._fail(RuntimeError(
                "memwall.torch.offload: the gradients were written after the last backward pass (torch.nn.utils."
                "clip_grad_norm_, a GradScaler, p.grad.mul_()?); with weights='nvme' they are on NVMe by then and "
                "p.grad reads zeros, so that change is lost: clip with memwall.torch.clip_grad_norm_(model."
                "parameters(), max_norm), which the session applies inside the step"))
        clip = self._clip or max_grad_norm or 0.0
        try:
            rc = _lib.lib().mw_pysession_step(self._h, float(lr), float(betas[0]), float(betas[1]), float(eps),
                                              float(weight_decay), float(clip))
            self._call("step", rc)
        except Exception as e:
            raise self._fail(e)
        self._clip = None
        self._micro = 0
        self._steps += 1
        self._version += 1
        if rc == 1:
            warnings.warn("memwall.torch.offload: the gradients hold inf or NaN: the step was skipped (the weights "
                          "stay; the step counts for the bias correction)", RuntimeWarning, stacklevel=3)
        return rc

    def finish(self):
        """Waits for the update in flight (the optimizer on NVMe runs it behind the next forward) and
        commits it."""
        self._guard(reading=True)
        self._call("finish", _lib.lib().mw_pysession_finish(self._h))

    # ------------------------------------------------------------------ the weights in and out

    def _between_steps(self, what):
        if self._in_bwd or 0 < self._micro:
            raise RuntimeError(f"memwall.torch.offload: {what} during a step (between the first backward and step()); "
                               "do it between steps")

    def unit_values(self, u):
        """Unit u's current weights (a new flat fp32 tensor; streamed: read from the NVMe master)."""
        self._guard(reading=True)
        c = self._cache
        if c is not None and c[0] == self._version and c[1] == u:
            return c[2]
        a, n = self._ranges[u]
        out = torch.empty(n, dtype=torch.float32)
        self._call(f"reading unit '{self._unit_names[u]}'", _lib.lib().mw_pysession_unit_read(self._h, u,
                                                                                               out.data_ptr()))
        self._cache = (self._version, u, out)
        return out

    def _value_of(self, p):
        u = self._param_unit[id(p)]
        off = self._grad_off(p) - self._ranges[u][0]
        return self.unit_values(u)[off:off + p.numel()].view(p.shape)

    def _write_unit(self, u, flat):
        self._between_steps("writing weights (load_state_dict)")
        self._call(f"writing unit '{self._unit_names[u]}'",
                   _lib.lib().mw_pysession_unit_write(self._h, u, flat.data_ptr()))
        self._version += 1

    def _flush_pending(self):
        """Writes the values load_state_dict() left, unit by unit (a unit loaded in part keeps the rest)."""
        pend, self._pending = self._pending, {}
        for u, ps in enumerate(self._unit_params):
            if not any(id(p) in pend for p in ps):
                continue
            if all(id(p) in pend for p in ps):
                flat = torch.cat([pend[id(p)].reshape(-1) for p in ps])
            else:
                flat = self.unit_values(u).clone()
                a = self._ranges[u][0]
                for p in ps:
                    if id(p) in pend:
                        o = self._grad_off(p) - a
                        flat[o:o + p.numel()].copy_(pend[id(p)].reshape(-1))
            self._write_unit(u, flat)

    def _sd_pre(self, module, prefix, keep_vars):
        self._guard(reading=True)
        if self._pending:
            self._flush_pending()
        self.finish()  # an overlapped update writes the resident weights: done first

    def _sd_post(self, module, state_dict, prefix, local_metadata):
        """Streamed weights read zeros outside their unit's use: the state dict gets the NVMe master's."""
        for name, p in module._parameters.items():
            key = prefix + name
            if p is None or id(p) not in self._param_unit or key not in state_dict or state_dict[key] is p:
                continue  # keep_vars=True: the Parameter objects themselves, as torch gives them
            state_dict[key] = self._value_of(p)

    def _sd_root_post(self, module, state_dict, prefix, local_metadata):
        self._cache = None  # the state dict holds the gathered units; no copy of them stays here

    def _load_pre(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                  error_msgs):
        for name, p in module._parameters.items():
            key = prefix + name
            if p is None or id(p) not in self._param_unit or key not in state_dict:
                continue
            v = state_dict[key]
            if not isinstance(v, torch.Tensor) or v.shape != p.shape:
                continue  # torch reports it
            self._between_steps("load_state_dict()")
            self._pending[id(p)] = v.detach().to(torch.float32).clone()
            state_dict[key] = p  # torch's copy into the parameter is then a no-op: the session takes the values

    def _load_post(self, module, incompatible_keys):
        if self._pending:
            self._flush_pending()

    def state_dict(self):
        """model.state_dict(), the weights gathered from the session (as the model's own state_dict() does
        while offloaded)."""
        return self.model.state_dict()

    def load_state_dict(self, state_dict, strict=True):
        """model.load_state_dict(state_dict): the weights go into the session unit by unit."""
        return self.model.load_state_dict(state_dict, strict=strict)

    # ------------------------------------------------------------------ the optimizer

    def optimizer(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=None):
        """The session's AdamW as a torch.optim.Optimizer (OffloadAdamW); one per offload.
        max_grad_norm: clip every step by the global L2 norm of its gradients, inside the update (the
        session computes the norm as the gradients are written), as memwall.torch.clip_grad_norm_ does
        for one step; for loops that cannot call it (transformers' Trainer: give it max_grad_norm=0 and
        this one instead). A clip_grad_norm_ call in a step takes precedence."""
        self._guard()
        if self._opt is not None and self._opt() is not None:
            raise RuntimeError("memwall.torch.offload: this offload has its optimizer already (one per offload)")
        opt = OffloadAdamW(self, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        self._opt = weakref.ref(opt)
        return opt

    def parameters(self):
        return list(self._params)

    def stats(self):
        """The session's figures (steps, planned DRAM peak, bytes fetched and written, ...)."""
        self._guard()
        out = (ctypes.c_double * len(_lib.SESSION_STATS_FIELDS))()
        k = _lib.check(_lib.lib().mw_pysession_stats(self._h, out, len(out)), "stats")
        return {f: out[i] for i, f in enumerate(_lib.SESSION_STATS_FIELDS[:k])}

    @property
    def units(self):
        """[(unit name, number of parameters)] in flat order."""
        return [(n, self._ranges[u][1]) for u, n in enumerate(self._unit_names)]

    @property
    def schedule(self):
        """The forward and backward unit orders the session checks every pass against."""
        return [r.unit for r in self._runs], [r.unit for r in self._bwd_runs]

    @property
    def steps(self):
        """Optimizer steps taken (committed ones, after a resume: where the caller's data continues)."""
        return self._steps

    @property
    def resumable(self):
        """True when every step is committed to nvme_dir (the optimizer state on NVMe): a process killed
        at any instant continues with offload(..., resume=True)."""
        self._guard(reading=True)
        return bool(_lib.lib().mw_pysession_resumable(self._h))

    def write_trace(self):
        """Writes the trace collected so far (trace=...) for `memwall report` (close() writes it too)."""
        if not self._trace_path or self._sess is None or not self._sess.trace:
            raise RuntimeError("memwall.torch.offload: no trace requested (offload(..., trace='run/trace.json'))")
        d = os.path.dirname(os.path.abspath(self._trace_path))
        os.makedirs(d, exist_ok=True)
        _lib.check(_lib.lib().mw_trace_write(self._sess.trace, self._trace_path.encode()),
                   f"memwall.torch.offload: writing the trace {self._trace_path}")

    def close(self, restore=True, keep=False):
        """Ends the offload: with restore=True the parameters get their current values back as ordinary
        tensors (the model trains on without memwall); with restore=False they become empty tensors
        (nothing is read: for a model larger than memory). The hooks go; the session is freed when no
        view of its arrays is left. The trace (trace=) is written.

        A resumable session (the optimizer state on NVMe) has finished: its committed state in nvme_dir
        is removed, unless keep=True (a later offload(..., resume=True) continues it) or an earlier
        error left the session unusable (the state of the last committed step stays, for a resume); at
        interpreter exit without close() it stays too."""
        if self._closed:
            return
        if self._trace_path and self._sess is not None and self._sess.trace:
            try:
                self.finish()  # the engine quiet while the recorder is read
            except Exception:  # noqa: BLE001 - the trace of a failed run is still written; the error was told
                pass
            self.write_trace()
        if not keep and not self._broken:
            self._call("ending the session", _lib.lib().mw_pysession_end(self._h))
        values = None
        if restore:
            try:
                if self._pending:
                    self._flush_pending()
                self.finish()
                values = {}
                for u, ps in enumerate(self._unit_params):
                    flat = self.unit_values(u).clone()
                    a = 0
                    for p in ps:
                        values[id(p)] = flat[a:a + p.numel()].view(p.shape)
                        a += p.numel()
            except Exception as e:
                raise RuntimeError(f"memwall.torch.offload: close(): reading the weights back failed ({e}); "
                                   "close(restore=False) ends the offload without them") from e
        self._unswap()
        self._alias_pending = []
        for r in self._runs:
            r.aliases = []  # they view the session's array
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for sub, _, _, _ in self._heads.values():
            del sub.forward  # the class's again
        self._heads = {}
        for m in self._sparse:
            m.sparse = False
        self._sparse = []
        if getattr(self, "_acts", None) is not None:
            self._acts.close()  # the activations' files
        where = self._device or torch.device("cpu")  # the parameters go back where the model had them
        if self._dev is not None:
            self._dev.close()
            self._dev = None
        for p in self._params:
            p.data = values[id(p)].to(where) if values is not None else torch.empty(0, device=where)
            p.grad = None
            try:
                del p._memwall_offload
            except AttributeError:
                pass
        if getattr(self.model, "_memwall_offload", None) is self:
            del self.model._memwall_offload
        self._closed = True
        self._views = []
        self._gview, self._wview = {}, {}  # views of the session's arrays: it is freed once none is left
        self._cache = None
        self._flat_params = self._flat_grads = None
        self._sess = None  # the session is freed here, unless a tensor still views its arrays


class OffloadAdamW(torch.optim.Optimizer):
    """The offload session's AdamW behind torch's Optimizer interface (Offload.optimizer()).

    One param group with every parameter of the offloaded model; lr, betas, eps and weight_decay are
    read from it at every step (LR schedulers work). step() runs the session's update (with the
    optimizer on NVMe it runs behind the next forward pass); zero_grad() keeps the gradients as the
    session's views (the session zeroes them when the next step's first backward begins)."""

    def __init__(self, off, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, max_grad_norm=None):
        if not 0.0 <= lr or not 0.0 <= eps or not 0.0 <= weight_decay or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"memwall.torch.offload: bad AdamW hyper-parameters (lr {lr}, betas {betas}, eps {eps}, "
                             f"weight decay {weight_decay})")
        if max_grad_norm is not None and not float(max_grad_norm) > 0:
            raise ValueError(f"memwall.torch.offload: max_grad_norm={max_grad_norm}: a positive number, or None (no "
                             "clipping)")
        self._off = off
        super().__init__(off.parameters(), dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                                max_grad_norm=None if max_grad_norm is None else float(max_grad_norm)))

    def add_param_group(self, param_group):
        if self.param_groups:
            raise ValueError("memwall.torch.offload: the offloaded optimizer has one param group (all the model's "
                             "parameters); per-tensor weight decay is offload(no_decay=...)")
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        g = self.param_groups[0]
        self._off._step(g["lr"], g["betas"], g["eps"], g["weight_decay"], g.get("max_grad_norm"))
        return loss

    def zero_grad(self, set_to_none=True):
        """Nothing to free: the gradients are the session's arrays, zeroed when the next step's first
        backward begins (streamed, their pages are given back after each step)."""
        return None

    _KEY = "memwall_offload"

    def state_dict(self):
        """The session's optimizer state by content, for a framework's checkpoint (transformers' Trainer
        saves it beside the model's weights): the param group's hyper-parameters as torch's AdamW keeps
        them, and under "memwall_offload" the step count, the units (names and sizes: a load checks them)
        and the AdamW moments as two flat fp32 tensors (exp_avg, exp_avg_sq), read from the committed
        state a subgroup at a time. The weights are the model's (model.state_dict())."""
        off = self._off
        off._guard(reading=True)
        off._between_steps("OffloadAdamW.state_dict()")
        n = int(_lib.lib().mw_pysession_n_params(off._h))
        m, v = torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=torch.float32)
        off._call("reading the optimizer state", _lib.lib().mw_pysession_state_read(off._h, 0, n, m.data_ptr(),
                                                                                    v.data_ptr()))
        groups = [{k: (list(x) if k == "betas" else x) for k, x in g.items() if k != "params"}
                  for g in self.param_groups]
        for g in groups:
            g["params"] = list(range(len(off._params)))
        return {"state": {}, "param_groups": groups,
                self._KEY: {"version": 1, "steps": off.steps, "units": [list(u) for u in off.units],
                            "exp_avg": m, "exp_avg_sq": v}}

    def load_state_dict(self, state_dict):
        """The inverse of state_dict(): the hyper-parameters into the param group, the moments and the
        step count into the session (its committed state and record: a resume of the session after this
        continues from it). Between steps; the units must be this offload's (names and sizes)."""
        off = self._off
        off._guard()
        off._between_steps("OffloadAdamW.load_state_dict()")
        st = state_dict.get(self._KEY) if isinstance(state_dict, dict) else None
        if not isinstance(st, dict) or st.get("version") != 1:
            raise ValueError("memwall.torch.offload: OffloadAdamW.load_state_dict() takes what "
                             "OffloadAdamW.state_dict() returned (a 'memwall_offload' entry of version 1); this state dict is not one "
                             "(torch.optim.AdamW's?)")
        units = [tuple(u) for u in st.get("units", [])]
        if units != list(off.units):
            diff = next((i for i, (a, b) in enumerate(zip(units, off.units)) if a != b), min(len(units),
                                                                                             len(off.units)))
            raise ValueError(f"memwall.torch.offload: the optimizer state was saved for other units ({len(units)} "
                             f"units; unit {diff}: {units[diff] if diff < len(units) else None}, this offload's: "
                             f"{off.units[diff] if diff < len(off.units) else None}): load it into an offload of the "
                             "same model and units")
        n = int(_lib.lib().mw_pysession_n_params(off._h))
        m, v, steps = st.get("exp_avg"), st.get("exp_avg_sq"), st.get("steps")
        for name, t in (("exp_avg", m), ("exp_avg_sq", v)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != n:
                raise ValueError(f"memwall.torch.offload: the optimizer state's {name} is not {n} fp32 values")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"memwall.torch.offload: the optimizer state's step count {steps!r} is not a count")
        groups = state_dict.get("param_groups") or []
        if len(groups) != 1:
            raise ValueError(f"memwall.torch.offload: the optimizer state has {len(groups)} param groups; OffloadAdamW "
                             "has one")
        m, v = m.detach().contiguous(), v.detach().contiguous()
        off._call("writing the optimizer state", _lib.lib().mw_pysession_state_write(off._h, 0, n, m.data_ptr(),
                                                                                     v.data_ptr(), steps))
        for k, x in groups[0].items():
            if k != "params":
                self.param_groups[0][k] = tuple(x) if k == "betas" else x
        off._steps = steps
        off._version += 1


def offload(model, nvme_dir=None, dram_budget=None, prefetch=2, units=None, activations="dram", *, weights="nvme",
            optimizer=None, grad_accum=1, no_decay=None, subgroup_size=None, buffer_count=None, threads=None,
            weights_from=None, resume=False, trace=None):
    """Moves the whole training state of `model` (fp32 parameters on the CPU, on one CUDA device, or on
    the meta device with weights_from) into a memwall session and returns the handle (Offload):
    off.optimizer(lr=...) is its AdamW.

    A model on a CUDA device keeps the session on the host: each unit's weights are copied to the
    device for its use (pinned staging, a side stream) and freed after it, its gradients copied back
    and added into the session's when the unit's are complete (p.grad is None between backward
    passes); docs/python.md, "Whole-state offload on a GPU" (_device.py).

    weights_from: None (the model's own values are the initial weights), or a Hugging Face checkpoint (a
                  directory with model.safetensors or model.safetensors.index.json, a .safetensors file or
                  an index file): each unit's initial weights are read from it a tensor at a time (fp32,
                  bf16, fp16 files, converted to fp32) when the session asks for them, so that a model built
                  on the meta device (`with torch.device("meta"): AutoModelForCausalLM.from_config(cfg)`)
                  is never whole in DRAM; its buffers (rotary inv_freq, ...) are made on the CPU
                  (persistent ones from the checkpoint, the others by the model's _init_weights)

    weights:      "nvme" (streamed: a unit is fetched `prefetch` units ahead of its use and dropped after
                  it; gradients are written to NVMe as they finish) or "dram" (resident)
    optimizer:    where the AdamW state lives: "nvme", "dram", or None (nvme when the weights stream)
    nvme_dir:     the directory of the NVMe state (created if missing; default ./run/nvme)
    dram_budget:  bytes; with streamed weights, subgroup_size and buffer_count left None are chosen so that the
                  planned DRAM peak (this process's resident set at open plus the session's arrays and staging,
                  not the model's activations) fits it, the largest that do (as `memwall train --dram-budget`),
                  and with room left (grad_accum 1) each step's gradients stay in DRAM for the update instead of
                  a round trip through NVMe (stats()["grads_kept_in_dram"]) and a tied embedding stays resident
                  from its lookup to the head; a run whose plan is above it even so is refused up front, the
                  parts named with their bytes
    units:        None (the model's repeated block list, one unit per block, plus one unit for the
                  modules before it and one for those after), or [module or [modules], ...] in forward order
    grad_accum:   backward passes per step (micro-batches; each step() takes exactly that many)
    no_decay:     parameters without weight decay: a callable (name, param) -> bool or names
    activations:  "dram", or "nvme" (the large tensors autograd saves in the model's forward are written to
                  nvme_dir/activations as forward makes them and read back ahead of backward, bitwise the same;
                  memwall.torch.NvmeActivations(min_bytes=..., prefetch=...) sets the details)
    resume:       False (a fresh session; a committed state left in nvme_dir is refused), True (continue the
                  committed state in nvme_dir: weights, moments and step count as the last committed step left
                  them; off.steps says where the data continues; another model or units are refused), or
                  "auto" (continue it if there is one). With the optimizer on NVMe every step is committed, so
                  a process killed at any instant loses at most the step in flight (docs/python.md, "Resume")
    trace:        a path: the run's events (I/O, updates, the units' fetches, waits and gradient writes) are
                  written there at close() as a Chrome/Perfetto JSON that `memwall report` reads, with the
                  units as lanes, as for `memwall train --trace`
    """
    return Offload(model, weights=weights, optimizer=optimizer, nvme_dir=nvme_dir, dram_budget=dram_budget,
                   prefetch=prefetch, units=units, activations=activations, grad_accum=grad_accum, no_decay=no_decay,
                   subgroup_size=subgroup_size, buffer_count=buffer_count, threads=threads, weights_from=weights_from,
                   resume=resume, trace=trace)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """torch.nn.utils.clip_grad_norm_ for offloaded parameters: returns the total L2 norm of the step's
    gradients (the session computes it as they are written) and clips inside the next step() (the
    gradients are scaled by max_norm / norm in the update when the norm exceeds max_norm; p.grad is
    not changed). The parameters must be all of one offloaded model's. Parameters that are not
    offloaded are torch.nn.utils.clip_grad_norm_'s."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = list(parameters)
    offs = {}
    plain = 0
    for p in params:
        ref = getattr(p, "_memwall_offload", None)
        off = ref() if ref is not None else None
        if off is None:
            plain += 1
        else:
            offs[id(off)] = off
    if not offs:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    if plain or len(offs) > 1:
        raise ValueError("memwall.torch.clip_grad_norm_: offloaded parameters mixed with others (or of two offloads); "
                         "clip each offloaded model's parameters on their own")
    off = next(iter(offs.values()))
    if len({id(p) for p in params}) != len(off._params):
        raise ValueError(f"memwall.torch.clip_grad_norm_: {len({id(p) for p in params})} of the offloaded model's "
                         f"{len(off._params)} parameters; the session's norm is over all of them: pass "
                         "model.parameters()")
    if float(norm_type) != 2.0:
        raise ValueError(f"memwall.torch.clip_grad_norm_: norm_type={norm_type}; the session computes the L2 norm (2)")
    max_norm = float(max_norm)
    if not max_norm > 0:
        raise ValueError(f"memwall.torch.clip_grad_norm_: max_norm={max_norm}: use a positive number")
    norm = off._grad_norm()
    if error_if_nonfinite and not (norm < float("inf")):
        raise RuntimeError(f"The total norm of order 2.0 for gradients from `parameters` is non-finite ({norm}), so "
                           "it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           "norm anyway, set `error_if_nonfinite=False`")
    off._clip = max_norm
    return torch.tensor(norm, dtype=torch.float32)
