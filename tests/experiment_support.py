"""Shared pieces of the experiment and report tests: the lab micro and a small real run on it.

The run uses the real components end to end: the lab's micro checkpoints (a tiny pre-trained
Llama with known members and its chat-tuned copy) through ``HFTarget`` and the SQLite generation
cache, the ten views, the continuation-overlap detector, CalibDCD, the analyses. It is stored
in the session's temporary directory; a second module asking for it resumes it (every setting is
complete, nothing is recomputed).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def require_components() -> None:
    for mod in ("calibdcd.views", "calibdcd.targets.hf", "calibdcd.targets.cache"):
        pytest.importorskip(mod, reason=f"{mod} is not merged into this checkout yet")


def lab_micro() -> Path:
    """The prebuilt lab micro (``$CALIBDCD_LAB_ROOT/lab-micro``), else built by calibdcd.lab."""
    root = Path(os.environ.get("CALIBDCD_LAB_ROOT", "/work/cache"))
    if (root / "lab-micro" / "ground_truth.jsonl").is_file():
        return root / "lab-micro"
    lab = pytest.importorskip("calibdcd.lab", reason="no prebuilt lab micro and no calibdcd.lab")
    return Path(lab.ensure_lab("micro", progress=False))


def micro_config_text(cache_dir: Path, *, targets: tuple[str, ...] = ("chat-qwen", "base")) -> str:
    lab = lab_micro()
    lines = [
        "name: micro-test",
        "seeds: [0]",
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
    require_components()
    from calibdcd.experiment import load_config, run_experiment

    base = tmp_path_factory.getbasetemp() / "micro-run"
    base.mkdir(exist_ok=True)
    cfg_path = base / "micro.yaml"
    if not cfg_path.exists():
        cfg_path.write_text(micro_config_text(base / "cache"))
    run_dir = base / "run"
    run_experiment(load_config(cfg_path), run_dir, progress=False)
    return cfg_path, run_dir
