"""Device selection, autocast and seeding shared by VeilProbe's torch modules."""

from __future__ import annotations

import contextlib
import random

__all__ = ["autocast", "cpu_threads", "pick_device", "seed_everything"]


def pick_device(device: str | None = None):
    """``device`` if given, else cuda, then mps, then cpu."""
    import torch

    if device:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast(device, enabled: bool = True):
    """bf16 autocast on CUDA (when ``enabled``); a no-op elsewhere (CPU bf16 is slow for these
    tiny widths and changes numerics of the tests)."""
    import torch

    if enabled and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 - third-party code may use the global RNG
    torch.manual_seed(seed)


@contextlib.contextmanager
def cpu_threads(n: int):
    """Temporarily limit torch's CPU intra-op threads (tiny models run faster single-threaded,
    and on a shared machine extra threads mostly spin)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, min(n, old)))
    try:
        yield
    finally:
        torch.set_num_threads(old)
