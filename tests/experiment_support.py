"""Shared pieces of the experiment and report tests: the lab micro and a small real run on it.

The run uses the real components end to end: the lab's micro checkpoints (a tiny pre-trained
Llama with known members and its chat-tuned copy) through ``HFTarget`` and the SQLite generation
cache, the ten views, the continuation-overlap detector, CalibDCD, the analyses. It is stored
in the session's temporary directory; a second module asking for it resumes it (every setting is
complete, nothing is recomputed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def calibdcd_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    timeout: float | None = 300,
) -> subprocess.CompletedProcess:
    """``python -m calibdcd ARGS`` in a fresh process on this checkout's ``src``: the command's
    own exit code and output, and a fresh import (huggingface_hub reads its endpoint and offline
    switch at import). The hub is off unless ``env`` says otherwise; ``env`` goes over this
    process's environment."""
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "calibdcd", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd,
        timeout=timeout,
    )


def lab_micro() -> Path:
    """The lab micro as experiments resolve it (``calibdcd.experiment.labs.resolve_lab``:
    a prebuilt ``$CALIBDCD_LAB_ROOT/lab-micro`` when that variable is set, else the cached
    build, built once)."""
    from calibdcd.experiment.labs import resolve_lab

    lab = resolve_lab("micro")
    assert lab is not None
    return lab


def micro_config_text(
    cache_dir: Path,
    *,
    targets: tuple[str, ...] = ("chat-qwen", "base"),
    seeds: tuple[int, ...] = (0,),
    detector_seed: str = "offset",
) -> str:
    lab = lab_micro()
    lines = [
        "name: micro-test",
        f"seeds: [{', '.join(map(str, seeds))}]",
        f"detector_seed: {detector_seed}",
        "protocol: paper",
        "benchmarks:",
        f"  - {{name: lab, path: {lab / 'ground_truth.jsonl'}, label: lab}}",
        "targets:",
    ]
    for t in targets:
        if t == "base":
            extra = "post_trained: false"
        else:
            extra = "base: base" if "base" in targets else "post_trained: true"
        lines.append(
            f"  - {{name: {t}, backend: hf, model: {lab / t}, {extra}, "
            "options: {device: cpu, batch_size: 64}}"
        )
    lines += [
        "detectors:",
        "  - {name: overlap, label: Overlap, options: {max_new_tokens: 16, positions: 8}}",
        "evaluation: {n_boot: 50}",
        f"cache_dir: {cache_dir}",
    ]
    return "\n".join(lines) + "\n"


def micro_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config path, run dir) of the session's micro run, computed on first use."""
    from calibdcd.experiment import load_config, run_experiment

    base = tmp_path_factory.getbasetemp() / "micro-run"
    base.mkdir(exist_ok=True)
    cfg_path = base / "micro.yaml"
    if not cfg_path.exists():
        cfg_path.write_text(micro_config_text(base / "cache"))
    run_dir = base / "run"
    run_experiment(load_config(cfg_path), run_dir, progress=False)
    return cfg_path, run_dir


def micro_seeds_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config path, run dir) of a two-seed run (chat-qwen only) sharing the micro run's cache.

    ``detector_seed: fixed`` keeps the overlap detector's generation parameters, so seed 1 is
    served from the generation cache of seed 0 (same texts, new split): cheap, and the seeds
    still differ in their split and classifier."""
    from calibdcd.experiment import load_config, run_experiment

    micro_run(tmp_path_factory)  # fills the shared generation cache
    base = tmp_path_factory.getbasetemp() / "micro-run"
    cfg_path = base / "micro-seeds.yaml"
    if not cfg_path.exists():
        text = micro_config_text(
            base / "cache", targets=("chat-qwen",), seeds=(0, 1), detector_seed="fixed"
        )
        cfg_path.write_text(text)
    run_dir = base / "run-seeds"
    run_experiment(load_config(cfg_path), run_dir, progress=False)
    return cfg_path, run_dir


def verdict_module():
    """``benchmarks/verdict.py`` as a module (its ``RUNS`` and ``unpacked`` read the stored run
    archives)."""
    spec = importlib.util.spec_from_file_location("verdict", REPO / "benchmarks" / "verdict.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["verdict"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("verdict", None)
    return module
