"""``calibdcd demo``: the lab experiment end to end in one call.

:func:`demo_config` is the programmatic twin of ``configs/lab-micro.yaml`` (so the demo also works
from an installed package without the repository's ``configs/``; a test checks they are equal):
the ``micro`` lab, seeds 0-2 (``detector_seed: fixed``), its post-trained ``chat-qwen`` and its
base model x VeilProbe (``cpu`` preset, first-half queries), DPDLLM and the overlap baseline, with
and without CalibDCD, the controls and the blind baseline, the paper's protocol on the lab's ground
truth. A cold first run (lab build included) fits in about 10 minutes on 2 CPU cores. It is a
reduced, illustrative version of the lab study (one chat model of three, a 300-text lab):
``chat_models`` adds the others; the full study is ``configs/lab-v2.yaml`` (the ``v2`` lab, all
three chat models and the base, ablations).

:func:`run_demo` builds the lab if needed (``calibdcd.lab.ensure_lab``), runs the grid
(resumable; a re-run is served from the caches), writes the report and returns the comparison
tables as Markdown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import ExperimentConfig, parse_config

__all__ = ["DEMO_CHAT_MODELS", "DEMO_DETECTORS", "DEMO_PRESET", "demo_config", "run_demo"]

#: the detectors of the demo, in table order
DEMO_DETECTORS = ("veilprobe", "dpdllm", "overlap")
#: the lab of the demo (``configs/lab-micro.yaml``'s)
DEMO_PRESET = "micro"
#: the post-trained models of the demo (every lab has these three)
ALL_CHAT_MODELS = ("chat-qwen", "chat-llama", "chat-reasoning")
DEMO_CHAT_MODELS = ("chat-qwen",)

#: what the demo prints after its tables
FULL_STUDY = (
    "This is the demo: a reduced, illustrative version of the lab study (the micro lab, one "
    "post-trained model of three, 3 seeds). The full study is `calibdcd run "
    "configs/lab-v2.yaml` (the v2 lab's 1,000-text pool, all three chat models and the base, "
    "ablations); its numbers, and from which run, are under 'Measured results' in README.md."
)


def demo_config(
    preset: str = DEMO_PRESET,
    *,
    chat_models: Sequence[str] = DEMO_CHAT_MODELS,
    detectors: Sequence[str] = DEMO_DETECTORS,
    seeds: Sequence[int] = (0, 1, 2),
    cache_dir: str | Path | None = None,
    output: str | Path | None = None,
    n_boot: int = 1000,
) -> ExperimentConfig:
    """The demo grid on lab ``preset``; the defaults are ``configs/lab-micro.yaml``."""
    hf = {"device": "cpu", "dtype": "float32", "batch_size": 64}
    unknown_chat = [m for m in chat_models if m not in ALL_CHAT_MODELS]
    if unknown_chat:
        raise ValueError(
            f"chat_models: unknown lab model(s) {unknown_chat}; choose from {list(ALL_CHAT_MODELS)}"
        )
    targets: list[dict[str, Any]] = [
        {"name": m, "backend": "hf", "lab": preset, "model": m, "base": "base", "options": hf}
        for m in chat_models
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
        # the cpu preset with the query = the first half of each text (the lab's texts are whole
        # paragraphs a chat model would simply end)
        "veilprobe": {
            "name": "veilprobe",
            "label": "VeilProbe",
            "preset": "cpu",
            "options": {"sampling": {"prompt_fraction": 0.5}},
        },
        "dpdllm": {
            "name": "dpdllm",
            "label": "DPDLLM",
            "options": {
                "length": 64,
                # the lab's clean reference LM (never the lab's base: it memorised the members)
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
        "seeds": list(seeds),
        "detector_seed": "fixed",
        "protocol": "paper",
        "split": {
            "subsample": "all",
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
    preset: str = DEMO_PRESET,
    chat_models: Sequence[str] = DEMO_CHAT_MODELS,
    detectors: Sequence[str] = DEMO_DETECTORS,
    seeds: Sequence[int] = (0, 1, 2),
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
    cfg = demo_config(
        preset,
        chat_models=chat_models,
        detectors=detectors,
        seeds=seeds,
        cache_dir=cache_dir,
        output=out,
    )
    run_dir = run_experiment(cfg, out, progress=progress, log=say)
    html = write_report(run_dir)
    keys = ("auc_main", "paired", "base_vs_post")
    tables = {t.key: t for t in build_tables(load_results(run_dir))}
    text = "\n".join(tables[k].markdown() for k in keys if k in tables)
    return html, f"{text}\n{FULL_STUDY}"
