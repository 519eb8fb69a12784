"""Initial weights for memwall.torch.offload(model, weights_from=...), read a tensor at a time from a
Hugging Face safetensors checkpoint, so that a model too big for DRAM is never whole there
(docs/python.md, "Whole-state offload: a model larger than DRAM").

Why this shape:
- The session asks for each unit's initial weights through its init_unit callback (streamed: one
  unit, or rather one optimizer subgroup, resident at a time, written straight into the NVMe master).
  This file fills that unit's slice of the flat fp32 array from the checkpoint: each tensor is read
  with the `safetensors` package's safe_open in row chunks of at most CHUNK_BYTES and converted to
  fp32 in place (fp32, bf16, fp16 and fp64 files; the same conversion as from_pretrained(dtype=float32)).
- safe_open maps the file, and the pages it touched count in the resident set until the mapping goes
  (measured: a 200 MB tensor read through one open file adds 200 MB of RssFile, read through one open
  per chunk adds nothing lasting). So each chunk opens the file again: the header is parsed again
  (microseconds), and no more than CHUNK_BYTES of the file is ever mapped and touched at once.
- Every parameter is matched to its key, with its shape and type checked, before anything is written:
  a missing or mismatched tensor is refused up front, naming it.
- Buffers that are not parameters (rotary inv_freq, ...) are small; a model built on the meta device
  gets them on the CPU: persistent ones from the checkpoint, the others (never saved) computed by the
  model's own _init_weights, as transformers' from_pretrained does. A buffer nothing computes is refused.
"""
import json
import math
import os
import warnings

import torch

__all__ = ["SafetensorsWeights", "materialise_buffers", "meta_placeholders"]

CHUNK_BYTES = 64 << 20
_FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def _safe_open():
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise ImportError("memwall.torch.offload(weights_from=...) reads safetensors checkpoints with the "
                          "`safetensors` package: pip install safetensors") from e
    return safe_open


class SafetensorsWeights:
    """A checkpoint's tensors by key: a directory (model.safetensors or model.safetensors.index.json),
    a .safetensors file, or a .safetensors.index.json file."""

    def __init__(self, path):
        self.path = str(path)
        p = self.path
        files = None
        if os.path.isdir(p):
            index = os.path.join(p, "model.safetensors.index.json")
            single = os.path.join(p, "model.safetensors")
            if os.path.isfile(index):
                files = self._from_index(index)
            elif os.path.isfile(single):
                files = [single]
            else:
                there = sorted(os.listdir(p))
                other = [f for f in there if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
                raise FileNotFoundError(
                    f"memwall.torch.offload: weights_from='{p}' has neither model.safetensors nor "
                    f"model.safetensors.index.json"
                    + (f" (it has {', '.join(other[:3])}: weights_from reads safetensors only; convert with "
                       "model.save_pretrained(dir, safe_serialization=True) on a machine that can load it)"
                       if other else f" (it holds {', '.join(there[:6]) or 'nothing'})"))
        elif os.path.isfile(p) and p.endswith(".index.json"):
            files = self._from_index(p)
        elif os.path.isfile(p) and p.endswith(".safetensors"):
            files = [p]
        elif os.path.exists(p):
            raise ValueError(f"memwall.torch.offload: weights_from='{p}': give a Hugging Face model directory, a "
                             ".safetensors file or a .safetensors.index.json file")
        else:
            raise FileNotFoundError(f"memwall.torch.offload: weights_from='{p}' does not exist")
        safe_open = _safe_open()
        self.where = {}   # key -> file
        self.info = {}    # key -> (shape, dtype string)
        for f in files:
            with safe_open(f, framework="pt") as h:
                for k in h.keys():
                    if k in self.where:
                        raise ValueError(f"memwall.torch.offload: tensor '{k}' is in two files of '{p}' "
                                         f"({os.path.basename(self.where[k])}, {os.path.basename(f)})")
                    s = h.get_slice(k)
                    self.where[k] = f
                    self.info[k] = (tuple(s.get_shape()), s.get_dtype())
        self.files = files

    def _from_index(self, index):
        with open(index, encoding="utf-8") as f:
            try:
                wm = json.load(f)["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"memwall.torch.offload: {index} is not a safetensors index (no weight_map)") from e
        base = os.path.dirname(index)
        files = sorted({os.path.join(base, v) for v in wm.values()})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"memwall.torch.offload: {index} names {len(missing)} files that are not there "
                                    f"({', '.join(os.path.basename(m) for m in missing[:3])})")
        return files

    def key_for(self, names, prefix):
        """The checkpoint's key for a tensor of these names (aliases: a tied parameter has several), the
        model's base_model_prefix ('model', 'transformer') added or removed as a published checkpoint
        of the base model has it; None when none is there."""
        for n in names:
            cands = [n]
            if prefix:
                if n.startswith(prefix + "."):
                    cands.append(n[len(prefix) + 1:])
                else:
                    cands.append(f"{prefix}.{n}")
            for c in cands:
                if c in self.where:
                    return c
        return None

    def check(self, key, shape, name):
        shp, dt = self.info[key]
        if tuple(shp) != tuple(shape):
            raise ValueError(f"memwall.torch.offload: '{name}' is {list(shape)} in the model but '{key}' is "
                             f"{list(shp)} in {self.where[key]}: the checkpoint is not of this configuration")
        if dt not in _FLOAT_DTYPES:
            raise ValueError(f"memwall.torch.offload: '{key}' in {self.where[key]} is {dt}; weights_from reads "
                             f"floating-point tensors ({', '.join(_FLOAT_DTYPES)}), converted to fp32")

    def read_into(self, key, dst):
        """dst (an fp32 CPU tensor of the key's shape, written in place) := the tensor, converted to fp32,
        read in row chunks of at most CHUNK_BYTES, the file opened per chunk."""
        safe_open = _safe_open()
        shape, dt = self.info[key]
        f = self.where[key]
        if len(shape) == 0 or dst.numel() == 0:
            with safe_open(f, framework="pt") as h:
                dst.copy_(h.get_tensor(key))
            return
        row = _FLOAT_DTYPES[dt] * math.prod(shape[1:])
        step = max(1, CHUNK_BYTES // max(1, row))
        for a in range(0, shape[0], step):
            b = min(shape[0], a + step)
            with safe_open(f, framework="pt") as h:
                dst[a:b].copy_(h.get_slice(key)[a:b])


def meta_placeholders(model):
    """Each parameter on the meta device becomes a CPU Parameter of its shape over one element
    (zero strides: no memory), the same new object for every module that shares it (tied weights);
    offload() then makes it a view of the session's array. Returns [(module, name, old)] to undo."""
    made, slots = {}, []
    for m in model.modules():
        for n, p in list(m._parameters.items()):
            if p is None or not p.is_meta:
                continue
            q = made.get(id(p))
            if q is None:
                q = torch.nn.Parameter(torch.empty((), dtype=p.dtype).expand(p.shape), requires_grad=p.requires_grad)
                made[id(p)] = q
            m._parameters[n] = q
            slots.append((m, n, p))
    return slots


def undo_placeholders(slots):
    for m, n, p in slots:
        m._parameters[n] = p


def _init_owner(model, mname):
    """The innermost transformers PreTrainedModel (an _init_weights) containing module `mname`."""
    owner = model if hasattr(model, "_init_weights") else None
    parts = mname.split(".") if mname else []
    cur = model
    for part in parts:
        cur = cur._modules.get(part)
        if cur is None:
            break
        if hasattr(cur, "_init_weights") and hasattr(cur, "config"):
            owner = cur
    return owner


def materialise_buffers(model, source=None):
    """The model's buffers on the meta device get CPU tensors with their values: a persistent buffer from
    the checkpoint when it has it, else computed by the model's own _init_weights(module) (transformers:
    the rotary inv_freq and original_inv_freq, as from_pretrained computes them). A buffer still unset
    after that is refused, naming it. Returns the names of the buffers made."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    todo = {}   # module name -> (module, [(buffer name, full name, sentinel)])
    made = []
    for mname, m in model.named_modules():
        for bname, b in list(m._buffers.items()):
            if b is None or not b.is_meta:
                continue
            full = f"{mname}.{bname}" if mname else bname
            persistent = bname not in m._non_persistent_buffers_set
            key = source.key_for([full], prefix) if (source is not None and persistent) else None
            new = torch.empty(b.shape, dtype=b.dtype, device="cpu")
            if key is not None:
                shp, dt = source.info[key]
                if tuple(shp) != tuple(b.shape):
                    raise ValueError(f"memwall.torch.offload: buffer '{full}' is {list(b.shape)} in the model but "
                                     f"'{key}' is {list(shp)} in {source.where[key]}")
                with _safe_open()(source.where[key], framework="pt") as h:
                    new.copy_(h.get_tensor(key))
                m._buffers[bname] = new
                made.append(full)
                continue
            if b.dtype == torch.bool:
                raise ValueError(f"memwall.torch.offload: buffer '{full}' (bool) is on the meta device and not in "
                                 "the checkpoint; give it its values before offload()")
            if b.is_floating_point() or b.is_complex():
                sentinel = float("nan")
            else:
                sentinel = torch.iinfo(b.dtype).min
            new.fill_(sentinel)
            m._buffers[bname] = new
            todo.setdefault(mname, (m, []))[1].append((bname, full, sentinel))
            made.append(full)
    for mname, (m, bufs) in todo.items():
        owner = _init_owner(model, mname)
        if owner is None:
            raise ValueError(f"memwall.torch.offload: buffer '{bufs[0][1]}' is on the meta device, not in the "
                             "checkpoint, and the model has no _init_weights to compute it; give the buffers their "
                             "values before offload()")
        with torch.no_grad():
            owner._init_weights(m)
        for bname, full, sentinel in bufs:
            v = m._buffers.get(bname)
            unset = v is None or v.is_meta or (bool(torch.isnan(v).any()) if isinstance(sentinel, float)
                                               else bool((v == sentinel).any()))
            if unset:
                raise ValueError(f"memwall.torch.offload: buffer '{full}' is on the meta device and not in the "
                                 f"checkpoint, and {type(owner).__name__}._init_weights({type(m).__name__}) did not "
                                 "compute it; give it its values before offload()")
    stray = [f"{mname}.{k}" for mname, m in model.named_modules() for k, v in vars(m).items()
             if isinstance(v, torch.Tensor) and v.is_meta]
    if stray:
        raise ValueError(f"memwall.torch.offload: module attributes on the meta device that are neither parameters "
                         f"nor buffers ({', '.join(stray[:3])}): give them their values before offload()")
    return made


def unexpected_keys(source, used):
    """The checkpoint's keys no parameter or buffer took (warned about, as transformers does)."""
    left = sorted(set(source.where) - set(used))
    if left:
        warnings.warn(f"memwall.torch.offload: {len(left)} tensors of {source.path} match no parameter or buffer of "
                      f"the model and were not read ({', '.join(left[:4])}{', ...' if len(left) > 4 else ''})",
                      RuntimeWarning, stacklevel=4)
    return left
