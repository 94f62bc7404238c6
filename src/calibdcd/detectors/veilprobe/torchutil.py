"""Seeding and CPU threads shared by VeilProbe's torch modules (devices and bf16:
:mod:`calibdcd.device`)."""

from __future__ import annotations

import contextlib
import random

__all__ = ["cpu_threads", "seed_everything"]


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
