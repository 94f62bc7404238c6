"""The one device picker and bf16 switch for everything that runs torch (targets, the lab,
VeilProbe's models, DPDLLM's reference LM). torch is imported only when a function is called.

``"auto"`` (or None / empty) means cuda if available, then mps, then cpu; any other value must
be ``cpu``, ``cuda[:i]`` or ``mps`` and available here. bfloat16 autocast is opt-in per caller
(:func:`autocast`): on CUDA it runs when the device supports it; on CPU only when asked
(``cpu=True``: it pays off only with native bf16 instructions), never on MPS.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = [
    "autocast", "default_device_type", "native_bf16", "resolve_device", "resolve_dtype",
    "torch_device",
]  # fmt: skip


def resolve_device(device: Any = "auto") -> str:
    """The device string ``device`` names here (``"auto"``/None: cuda, then mps, then cpu);
    ValueError for an unknown kind or a CUDA device on a machine without CUDA."""
    import torch

    if device is None or device == "" or device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    device = str(device)
    kind = device.split(":")[0]
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda[:i]' or 'mps', got {device!r}")
    try:
        torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a valid torch device") from exc
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available")
    return device


def torch_device(device: Any = "auto") -> Any:
    """:func:`resolve_device` as a ``torch.device``."""
    import torch

    return torch.device(resolve_device(device))


def default_device_type() -> str:
    """What ``device: auto`` resolves to here (``"cpu"`` when torch is not installed)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "cpu"
    return resolve_device("auto")


def native_bf16(device: Any) -> bool:
    """Whether the CUDA device ``device`` (``cuda``, ``cuda:i`` or a ``torch.device``) computes
    in bfloat16 natively (compute capability 8.0 or later: A100, H100, ...). torch's
    ``is_bf16_supported()`` also says yes for emulated bf16 (T4, V100), which is slower than
    fp32 there, and it reads the current device, not the one asked for."""
    import torch

    if not torch.cuda.is_available():
        return False
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return False
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index) >= (8, 0)


def autocast(device: Any, bf16: bool = True, *, cpu: bool = False) -> Any:
    """A bfloat16 autocast context on ``device`` when ``bf16`` and the device takes it (CUDA
    with native bf16, :func:`native_bf16`; CPU only with ``cpu=True``); a no-op context
    otherwise. With ``cpu=True`` (bf16 explicitly asked for on whatever device) an MPS device is
    a ValueError rather than a silent fp32 run."""
    if not bf16:
        return contextlib.nullcontext()
    import torch

    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind == "cuda":
        if native_bf16(device):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()
    if kind == "cpu":
        return torch.autocast("cpu", dtype=torch.bfloat16) if cpu else contextlib.nullcontext()
    if cpu:
        raise ValueError(f"bf16 needs a cuda or cpu device, got {str(device)!r}")
    return contextlib.nullcontext()


def resolve_dtype(dtype: Any, device: str) -> Any:
    """The torch dtype to load weights in: ``"auto"`` → bfloat16 on a CUDA device with native
    bf16 (:func:`native_bf16`), else float32 (older GPUs, CPU, MPS); else a dtype or one of its
    names (``bf16``, ``float32``, ...)."""
    import torch

    if dtype == "auto":
        if str(device).startswith("cuda") and native_bf16(device):
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip
    if dtype not in names:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]
