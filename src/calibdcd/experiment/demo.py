"""``calibdcd demo``: the lab experiment end to end in one call.

:func:`demo_config` is a lighter programmatic twin of ``configs/lab-small.yaml`` (so the demo also
works from an installed package without the repository's ``configs/``): the lab's three
post-trained chat models and its base model x VeilProbe and DPDLLM x one seed, the paper's
protocol on the lab's ground truth. To fit a cold first run into 20 minutes on 2 CPU cores it
draws 300 of the lab's 500 texts (balanced), VeilProbe's suffixes have 48 new tokens instead of
the ``cpu`` preset's 96 and the overlap baseline is left out; ``configs/lab-small.yaml`` is the
full experiment.

:func:`run_demo` builds the lab if needed (``calibdcd.lab.ensure_lab``), runs the grid
(resumable; a re-run is served from the caches), writes the report and returns the comparison
tables as Markdown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import ExperimentConfig, parse_config

__all__ = ["DEMO_DETECTORS", "demo_config", "run_demo"]

#: the detectors of the demo, in table order (``overlap``, a cheap extra baseline, on request)
DEMO_DETECTORS = ("veilprobe", "dpdllm")

_CHAT = ("chat-qwen", "chat-llama", "chat-reasoning")

#: texts the demo draws from the lab (balanced): 150 members + 150 non-members keeps a cold first
#: run of ``make demo`` within 20 minutes on 2 CPU cores (the lab small has 250 + 250; ``"all"``
#: or ``configs/lab-small.yaml`` runs them all)
DEMO_SUBSAMPLE = 300


def demo_config(
    preset: str = "small",
    *,
    detectors: Sequence[str] = DEMO_DETECTORS,
    cache_dir: str | Path | None = None,
    output: str | Path | None = None,
    n_boot: int = 1000,
    subsample: int | str = DEMO_SUBSAMPLE,
) -> ExperimentConfig:
    """The lab experiment for ``preset``. With ``subsample="all"`` and all three detectors it is
    ``configs/lab-small.yaml`` up to VeilProbe's 48-token suffixes (a test checks this)."""
    hf = {"device": "auto", "batch_size": 64}
    targets: list[dict[str, Any]] = [
        {"name": m, "backend": "hf", "lab": preset, "model": m, "base": "base", "options": hf}
        for m in _CHAT
    ]
    targets.append(
        {
            "name": "base",
            "backend": "hf",
            "lab": preset,
            "model": "base",
            "post_trained": False,
            "options": hf,
        }
    )
    known: dict[str, dict[str, Any]] = {
        # as configs/lab-small.yaml (the cpu preset, the query = the first half of each text: the
        # lab's texts are whole paragraphs a chat model would simply end) with 48-token suffixes
        "veilprobe": {
            "name": "veilprobe",
            "label": "VeilProbe",
            "preset": "cpu",
            "options": {"sampling": {"prompt_fraction": 0.5, "max_new_tokens": 48}},
        },
        "dpdllm": {
            "name": "dpdllm",
            "label": "DPDLLM",
            "options": {
                "length": 64,
                "reference": {
                    "model_path": f"lab-clean-reference:{preset}",
                    "learning_rate": 0.001,
                },
            },
        },
        "overlap": {"name": "overlap", "label": "Overlap"},
    }
    unknown = [d for d in detectors if d not in known]
    if unknown:
        raise ValueError(
            f"detectors: unknown demo detector(s) {unknown}; choose from {list(known)}"
        )
    data: dict[str, Any] = {
        "name": f"lab-{preset}",
        "seeds": [0],
        "protocol": "paper",
        "split": {
            "subsample": subsample,
            "n_supervised_per_class": 50,
            "calibration_fraction": 0.5,
        },
        "benchmarks": [
            {"name": "lab", "lab": preset, "path": "ground_truth.jsonl", "label": "lab"}
        ],
        "targets": targets,
        "detectors": [known[d] for d in detectors],
        "evaluation": {"fpr": 0.05, "n_boot": n_boot, "level": 0.95},
    }
    if cache_dir is not None:  # else the user cache, where `calibdcd lab build` puts labs too
        data["cache_dir"] = str(cache_dir)
    if output is not None:
        data["output"] = str(output)
    return parse_config(data, base_dir=Path.cwd())


def run_demo(
    out_dir: str | Path | None = None,
    *,
    preset: str = "small",
    detectors: Sequence[str] = DEMO_DETECTORS,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, str]:
    """Build the lab (once), run the demo grid, write the report.

    Returns (path of the HTML report, the comparison tables as Markdown).
    """
    from calibdcd.experiment.components import resolve_lab
    from calibdcd.experiment.runner import run_experiment
    from calibdcd.report import write_report
    from calibdcd.report.aggregate import load_results
    from calibdcd.report.tables import build_tables

    say = log or (lambda s: None)
    out = Path(out_dir) if out_dir is not None else Path("runs") / f"lab-{preset}"
    say(f"lab {preset}: {resolve_lab(preset, root=cache_dir)}")
    cfg = demo_config(preset, detectors=detectors, cache_dir=cache_dir, output=out)
    run_dir = run_experiment(cfg, out, progress=progress, log=say)
    html = write_report(run_dir)
    keys = ("auc_main", "tpr_main", "paired", "base_vs_post", "ablation", "fp_recovery", "space")
    tables = {t.key: t for t in build_tables(load_results(run_dir))}
    text = "\n".join(tables[k].markdown() for k in keys if k in tables)
    return html, text
