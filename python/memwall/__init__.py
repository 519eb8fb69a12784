"""memwall for Python: the offload engine of memwall (optimizer state in host DRAM or on NVMe,
updated by a C pipeline) behind a torch.optim.Optimizer. See docs/python.md.

    import memwall.torch
    opt = memwall.torch.AdamW(model.parameters(), lr=3e-4, state="nvme", nvme_dir="/mnt/nvme/run")

    off = memwall.torch.offload(model, nvme_dir="/mnt/nvme/run")   # weights and gradients too
    opt = off.optimizer(lr=3e-4)
"""
from ._lib import MemwallError  # noqa: F401

__version__ = "0.1.0"
