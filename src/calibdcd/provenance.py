"""What a result or a cached artefact depends on beyond its inputs: library versions, device, dtype.

Two uses, one place:

* :func:`build_environment` is salted into the cache key of every *trained* artefact (lab
  checkpoints, DPDLLM's reference LMs, VeilProbe's tokenizers, mapping models and proxies, cached
  classifiers): a different torch/transformers/tokenizers version, device or CPU thread count
  can change their bytes, so such a change builds a new artefact instead of reusing one made
  under other conditions (measurements: docs/reproducibility.md).
* :func:`run_environment` is what a run directory records (``environment.json``): the same plus
  Python, platform, CPU, thread counts and the git commit (never an absolute path).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from calibdcd.device import default_device_type

__all__ = [
    "build_environment",
    "git_commit",
    "hardware_info",
    "library_versions",
    "run_environment",
]

#: the packages whose versions a run records
RECORDED_PACKAGES = (
    "calibdcd",
    "numpy",
    "scipy",
    "scikit-learn",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "huggingface_hub",
    "pyyaml",
    "matplotlib",
)


def library_versions(packages: tuple[str, ...] = RECORDED_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def build_environment(device: str | None = "auto", threads: int | None = None) -> dict[str, Any]:
    """The part of the environment that can change a trained artefact's bytes (for cache keys).

    ``device`` is the artefact's configured device (``"auto"`` is resolved; only its type
    counts). ``threads``: torch's intra-op thread count during training (None = the current
    one). It is part of the key because it can change the bytes: measured on this project's
    CPU (torch 2.13), 1, 2 and 4 threads give bitwise identical weights and logits, 3 threads
    different ones (docs/reproducibility.md).
    """
    if device is None or device == "auto":
        dev = default_device_type()
    else:
        dev = str(device).split(":", 1)[0]
    versions = library_versions(("torch", "transformers", "tokenizers"))
    out: dict[str, Any] = {"device": dev, **versions}
    if dev == "cpu":
        if threads is None or threads <= 0:
            try:
                import torch

                threads = torch.get_num_threads()
            except ImportError:
                threads = None
        out["threads"] = threads
    return out


def git_commit() -> dict[str, Any]:
    """HEAD of the repository holding the code (else of the working directory) + dirty flag."""
    for repo in (Path(__file__).resolve().parents[2], Path.cwd()):
        try:
            head = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if head.returncode != 0:
                continue
            dirty = subprocess.run(
                ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    return {"commit": None, "dirty": None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_capability() -> str | None:
    """The SIMD level torch's CPU kernels dispatch to (``"AVX2"``, ``"AVX512"``, ...): two CPUs
    with different levels can train different bytes from the same inputs."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError, RuntimeError):
        return None


def hardware_info(*, torch: bool = True) -> dict[str, Any]:
    """The machine an artefact was made on: CPU model, core count and torch's CPU kernel level.
    Recorded beside trained artefacts (``lab.json``) but kept out of their cache keys, so a cache
    copied between machines stays usable; comparing it is how a difference between two builds
    of one lab is traced to the hardware. ``torch=False``: the kernel level is None unless torch
    is already imported (reading it imports torch: 250 MB for a run that loads no torch model)."""
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": _cpu_capability() if torch or "torch" in sys.modules else None,
    }


def _torch_info(load: bool = True) -> dict[str, Any]:
    if not load and "torch" not in sys.modules:
        return {"loaded": False}
    try:
        import torch
    except ImportError:
        return {}
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "default_device": default_device_type(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


def run_environment(*, torch: bool = True) -> dict[str, Any]:
    """Everything a run directory records about where it ran (no absolute paths). ``torch``:
    the run uses torch (False: torch is not imported to describe it; ``"torch": {"loaded":
    false}`` unless something imported it already)."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        **hardware_info(torch=torch),
        "versions": library_versions(),
        "torch": _torch_info(torch),
        "env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")
            if k in os.environ
        },
        "git": git_commit(),
        "argv": [portable_arg(a) for a in sys.argv],
    }


def portable_arg(arg: str) -> str:
    """A command-line argument without the machine's directories: an absolute path becomes
    relative to the working directory when under it, else its last two components."""
    if not os.path.isabs(arg):
        return arg
    p = Path(arg)
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(*p.parts[-2:])) if len(p.parts) > 2 else p.name
