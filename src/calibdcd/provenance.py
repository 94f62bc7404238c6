"""What a result or a cached artefact depends on beyond its inputs: library versions, device, dtype.

Two uses, one place:

* :func:`build_environment` is salted into the cache key of every *trained* artefact (lab
  checkpoints, DPDLLM's reference LMs, VeilProbe's tokenizers, mapping models and proxies, cached
  classifiers): a different torch/transformers/tokenizers version, device or CPU thread count
  can change their bytes, so such a change builds a new artefact instead of reusing one made
  under other conditions (measurements: docs/reproducibility.md).
* :func:`run_environment` is what a run directory records (``environment.json``): the same plus
  Python, platform, CPU, thread counts, the host name and the git commit (never an absolute
  path).

A run directory can be resumed, at another commit or on another machine. Its history is kept:

* :func:`record_start` adds each start to ``environment.json``'s ``starts`` list (commit, dirty
  flag, host, start time; the top-level keys stay those of the latest start);
* :func:`setting_provenance` is what each setting's ``result.json`` records as ``provenance``:
  the commit, dirty flag and host of the start that computed it (never part of a hash);
* :func:`commit_history` and :func:`resumed_phrase` read both back for the report ("resumed
  across 2 commits: 6e9143f (9 settings), d5cd4ee (9 settings)").
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from calibdcd.device import default_device_type

__all__ = [
    "build_environment",
    "commit_history",
    "commit_label",
    "git_commit",
    "hardware_info",
    "hostname",
    "library_versions",
    "measured_on",
    "record_start",
    "resumed_phrase",
    "run_environment",
    "save_measurement",
    "setting_provenance",
    "start_record",
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


def commit_label(git: Mapping[str, Any] | None) -> str:
    """A recorded commit as reports name it: its first 12 hex digits, "(uncommitted changes)"
    after it when the tree was dirty, "unknown" when none was recorded (:func:`git_commit`)."""
    git = git or {}
    label = (git.get("commit") or "unknown")[:12]
    return label + (" (uncommitted changes)" if git.get("dirty") else "")


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


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def measured_on(*, torch: bool = False) -> dict[str, Any]:
    """What a benchmark's record names its numbers by (the one description every script in
    ``benchmarks/`` writes): ``machine``, one line (CPU model, cores, kernel level); the CPU
    fields of :func:`hardware_info` (``arch`` for its ``machine``), the kernel, memory, Python,
    torch's version when loaded, and the commit of the code measured (:func:`git_commit`).
    ``torch``: read torch's CPU kernel level even when torch is not imported yet."""
    hw = hardware_info(torch=torch)
    kernel = platform.release()
    return {
        "machine": f"{hw['cpu']}, {hw['cpu_count']} cores, kernel {kernel}",
        "cpu": hw["cpu"],
        "cores": hw["cpu_count"],
        "arch": hw["machine"],
        "cpu_capability": hw["cpu_capability"],
        "kernel": kernel,
        "memory_gb": _memory_gb(),
        "python": platform.python_version(),
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "git": git_commit(),
    }


def save_measurement(path: str | Path | None, record: Any) -> Path | None:
    """Write a benchmark's record (:func:`measured_on` and its numbers) to ``path`` as indented
    JSON, atomically (a crash leaves the previous file or none), creating its folder; the one
    way every script in ``benchmarks/`` stores what it measured. ``None``: nothing written."""
    if path is None:
        return None
    from calibdcd.atomic import write_json

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)
    return out


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
        "host": hostname(),
        "argv": [portable_arg(a) for a in sys.argv],
    }


def build_record(device: str | None, threads: int | None) -> dict[str, Any]:
    """What a built artefact (a lab's ``lab.json``) records of how and where it was built, the
    same for every kind of lab: the library versions, the environment that can change its
    bytes (:func:`build_environment`), the hardware, the platform, the commit of the code and
    the command line (no absolute paths, as :func:`run_environment`'s)."""
    versions = {k: v for k, v in library_versions().items() if v is not None}
    return {
        "versions": {"python": platform.python_version(), **versions},
        "build_environment": build_environment(device, threads),
        "hardware": hardware_info(),
        "platform": platform.platform(),
        "git": git_commit(),
        "argv": [portable_arg(a) for a in sys.argv],
    }


def hostname() -> str | None:
    """The machine's host name (what the run directory's ``.lock`` names too), None unknown."""
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def start_record(env: Mapping[str, Any]) -> dict[str, Any]:
    """One start of a run, from the ``environment.json`` it wrote: commit, dirty flag, host and
    start time (None where that environment did not record it: ``host`` before it was)."""
    git = env.get("git") or {}
    return {
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "host": env.get("host"),
        "started": env.get("started"),
    }


def record_start(env: dict[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env`` (this start's environment) with ``starts``: every earlier start of the run
    directory (from ``previous``, the ``environment.json`` found there; one written before
    calibdcd kept the list counts as its one start), then this one. The other keys are this
    start's, as before, so a reader of the latest commit or start time reads the same keys."""
    starts: list[dict[str, Any]] = []
    if previous:
        old = previous.get("starts")
        if isinstance(old, list):
            starts = [dict(s) for s in old if isinstance(s, Mapping)]
        elif previous.get("git") or previous.get("started"):
            starts = [start_record(previous)]
    return {**env, "starts": [*starts, start_record(env)]}


def setting_provenance(env: Mapping[str, Any]) -> dict[str, Any]:
    """What a setting's ``result.json`` records as ``provenance``: the commit, dirty flag, host
    and start time of the run start that computed it (:func:`start_record`). Not part of any
    hash: a result computed at another commit is reused as long as its hashes match."""
    return start_record(env)


def _commit_key(rec: Mapping[str, Any] | None) -> tuple[str | None, bool]:
    rec = rec or {}
    return rec.get("commit"), bool(rec.get("dirty"))


def _commit_name(key: tuple[str | None, bool]) -> str:
    commit, dirty = key
    name = commit[:7] if commit else "unknown commit"
    return name + (" (uncommitted changes)" if dirty else "")


def commit_history(
    env: Mapping[str, Any] | None, provenances: Iterable[Mapping[str, Any] | None]
) -> dict[str, Any]:
    """Which code computed a run directory's settings.

    ``provenances``: each setting's ``result.json`` ``provenance`` (None for a result written
    before calibdcd recorded it). Returns ``{"commits": [{"commit", "dirty", "settings",
    "started"}...], "unrecorded": n, "source": "results" | "starts" | None}``: from the
    results' own records when any has one (``settings`` counted, first start time of that
    commit from ``env["starts"]``); else from ``environment.json``'s list of starts
    (``settings`` None: the run did not say which start computed which setting). A commit of
    a start that computed none of the results is listed only while some results are
    unrecorded (it may have computed them)."""
    starts = [s for s in ((env or {}).get("starts") or []) if isinstance(s, Mapping)]
    provs = list(provenances)
    recorded = [p for p in provs if p]
    unrecorded = len(provs) - len(recorded)
    entries: dict[tuple[str | None, bool], dict[str, Any]] = {}
    for s in starts:
        key = _commit_key(s)
        if key not in entries:
            entries[key] = {
                "commit": key[0],
                "dirty": key[1],
                "settings": None,
                "started": s.get("started"),
            }
    for p in recorded:
        key = _commit_key(p)
        e = entries.setdefault(
            key, {"commit": key[0], "dirty": key[1], "settings": None, "started": p.get("started")}
        )
        e["settings"] = (e["settings"] or 0) + 1
    if recorded:
        if not unrecorded:  # a start that computed none of these settings is not their code
            entries = {k: e for k, e in entries.items() if e["settings"]}
        source = "results"
    else:
        source = "starts" if entries else None
    return {"commits": list(entries.values()), "unrecorded": unrecorded, "source": source}


def resumed_phrase(
    env: Mapping[str, Any] | None, provenances: Iterable[Mapping[str, Any] | None]
) -> str | None:
    """One clause for a report's provenance line when the settings were not all computed at
    the latest start's commit: "resumed across 2 commits: 6e9143f (9 settings), d5cd4ee (9
    settings)" (from the results' records, else the starts' list), or "every setting computed
    at 6e9143f" when one other commit computed them all; None when the latest commit computed
    everything (or nothing says otherwise)."""
    hist = commit_history(env, provenances)
    commits = hist["commits"]
    if not commits:
        return None

    def name(e: Mapping[str, Any]) -> str:
        out = _commit_name((e["commit"], e["dirty"]))
        if hist["source"] == "results":
            n = e["settings"]
            if n is None:  # a start whose settings (if any) predate the record
                return out + " (no setting with a recorded commit)"
            return out + f" ({n} setting{'s' if n != 1 else ''})"
        return out + (f" (started {e['started']})" if e.get("started") else "")

    if len(commits) > 1:
        text = f"resumed across {len(commits)} commits: " + ", ".join(name(e) for e in commits)
        if hist["source"] == "results" and hist["unrecorded"]:
            n = hist["unrecorded"]
            text += (
                f"; {n} setting{'s' if n != 1 else ''} without a recorded commit "
                "(written before calibdcd recorded it)"
            )
        if hist["source"] == "starts":
            text += " (which start computed which setting is not recorded)"
        return text
    latest = _commit_key((env or {}).get("git"))
    only = commits[0]
    if hist["source"] == "results" and not hist["unrecorded"]:
        if (only["commit"], only["dirty"]) != latest:
            return "every setting computed at " + name(only)
    return None


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
