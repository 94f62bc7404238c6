"""calibdcd.device: the one device picker and bf16 switch (targets, lab, VeilProbe, DPDLLM)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibdcd.device import (  # noqa: E402
    autocast,
    native_bf16,
    resolve_device,
    resolve_dtype,
    torch_device,
)


def test_auto_picks_cuda_then_mps_then_cpu():
    want = "cuda" if torch.cuda.is_available() else None
    if want is None and torch.backends.mps.is_available():
        want = "mps"
    assert resolve_device("auto") == resolve_device(None) == (want or "cpu")
    assert torch_device("cpu") == torch.device("cpu")
    assert resolve_device("cpu") == "cpu"


def test_unknown_or_unavailable_devices_are_errors():
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")
    with pytest.raises(ValueError, match="not a valid torch device"):
        resolve_device("cpu:x")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_bf16_is_opt_in_on_cpu():
    x = torch.ones(2, 2)
    with autocast("cpu"):  # the default: CUDA only
        assert (x @ x).dtype == torch.float32
    with autocast(torch.device("cpu"), True, cpu=True):
        assert (x @ x).dtype == torch.bfloat16
    with autocast("cpu", False, cpu=True):
        assert (x @ x).dtype == torch.float32
    with pytest.raises(ValueError, match="cuda or cpu"):
        autocast("mps", True, cpu=True)


def test_dtype_names():
    assert resolve_dtype("bf16", "cpu") is torch.bfloat16
    assert resolve_dtype("auto", "cpu") is torch.float32
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("int8", "cpu")


def test_native_bf16_is_a_cuda_property():
    assert native_bf16("cpu") is False and native_bf16(torch.device("cpu")) is False
    if not torch.cuda.is_available():
        assert native_bf16("cuda") is False
        assert resolve_dtype("auto", "cuda") is torch.float32  # no bf16 without a capable GPU
    else:
        capable = torch.cuda.get_device_capability(0) >= (8, 0)
        assert native_bf16("cuda:0") is capable
        assert resolve_dtype("auto", "cuda:0") is (torch.bfloat16 if capable else torch.float32)
