"""``calibdcd demo``: the lab experiment end to end in one call.

:func:`demo_config` is the programmatic twin of ``configs/demo.yaml`` (so the demo also works
from an installed package without the repository's ``configs/``; a test checks they are equal):
the ``demo`` lab (micro's base and its post-trained ``chat-qwen``, without micro's two other chat
models), seed 0, both models x VeilProbe (``cpu`` preset, first-half queries), DPDLLM and the
overlap baseline, with and without CalibDCD, the controls and the blind baseline, the paper's
protocol on the lab's ground truth. It is a reduced, illustrative version of the lab study (one
chat model of three, a 300-text lab, one seed): its intervals are over texts only.
``configs/lab-micro.yaml`` is the same grid on the micro lab with seeds 0-2
(``demo_config("micro", seeds=(0, 1, 2))``, also checked by a test); ``chat_models`` adds the
other chat models (on the micro lab, which has them); the full study is ``configs/lab-v2.yaml``
(the ``v2`` lab, all three chat models and the base, ablations).

:func:`run_demo` builds the lab if needed (``calibdcd.lab.ensure_lab``), runs the grid
(resumable; a re-run is served from the caches), writes the report and returns the comparison
tables as Markdown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import ExperimentConfig, parse_config

__all__ = [
    "DEMO_CHAT_MODELS",
    "DEMO_DETECTORS",
    "DEMO_PRESET",
    "DEMO_SEEDS",
    "demo_config",
    "demo_preset",
    "full_study_note",
    "run_demo",
]

#: the detectors of the demo, in table order
DEMO_DETECTORS = ("veilprobe", "dpdllm", "overlap")
#: the lab of the demo (``configs/demo.yaml``'s): micro with only its chat-qwen
DEMO_PRESET = "demo"
#: the lab of the demo when it is asked for other chat models than the demo lab's
FULL_PRESET = "micro"
#: the post-trained models of the micro lab (and of every synthetic lab but ``demo``)
ALL_CHAT_MODELS = ("chat-qwen", "chat-llama", "chat-reasoning")
DEMO_CHAT_MODELS = ("chat-qwen",)
#: the demo's seed: one, so a cold demo fits in 15 minutes on 2 CPU cores (README); the
#: reproducibility config ``configs/lab-micro.yaml`` runs seeds 0-2
DEMO_SEEDS = (0,)


def full_study_note(n_seeds: int, n_chat: int, preset: str = DEMO_PRESET) -> str:
    """What the demo prints after its tables: that it is reduced, and where the study is."""
    seeds = (
        "one seed, so its intervals are over texts only and say nothing about another split"
        if n_seeds == 1
        else f"{n_seeds} seeds"
    )
    return (
        f"This is the demo: a reduced, illustrative version of the lab study (the {preset} lab, "
        f"{'one post-trained model' if n_chat == 1 else f'{n_chat} post-trained models'} of "
        f"three, {seeds}). The full study is `calibdcd run "
        "configs/lab-v2.yaml` (the v2 lab's 1,000-text pool, all three chat models and the "
        "base, 3 seeds, ablations); its numbers, and from which run, are in docs/results.md "
        "(the README's verdict table sums them up)."
    )


def demo_preset(chat_models: Sequence[str]) -> str:
    """The lab the demo runs on for ``chat_models``: the demo lab when it has them all (it has
    chat-qwen only), else micro (all three chat models; the same base)."""
    from calibdcd.lab.config import preset_models

    has = preset_models(DEMO_PRESET) or ()
    return DEMO_PRESET if all(m in has for m in chat_models) else FULL_PRESET


def demo_config(
    preset: str | None = None,
    *,
    chat_models: Sequence[str] = DEMO_CHAT_MODELS,
    detectors: Sequence[str] = DEMO_DETECTORS,
    seeds: Sequence[int] = DEMO_SEEDS,
    cache_dir: str | Path | None = None,
    output: str | Path | None = None,
    n_boot: int = 1000,
) -> ExperimentConfig:
    """The demo grid on lab ``preset`` (None: :func:`demo_preset`); the defaults are
    ``configs/demo.yaml``, ``("micro", seeds=(0, 1, 2))`` is ``configs/lab-micro.yaml``."""
    hf = {"device": "cpu", "dtype": "float32", "batch_size": 64}
    unknown_chat = [m for m in chat_models if m not in ALL_CHAT_MODELS]
    if unknown_chat:
        raise ValueError(
            f"chat_models: unknown lab model(s) {unknown_chat}; choose from {list(ALL_CHAT_MODELS)}"
        )
    from calibdcd.lab.config import preset_models

    preset = preset or demo_preset(chat_models)
    has = preset_models(preset)
    if has is not None and any(m not in has for m in chat_models):
        raise ValueError(
            f"chat_models: the {preset} lab has only {list(has)}; the {FULL_PRESET} lab (the "
            f"default for other chat models) has {list(ALL_CHAT_MODELS)}"
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
    preset: str | None = None,
    chat_models: Sequence[str] = DEMO_CHAT_MODELS,
    detectors: Sequence[str] = DEMO_DETECTORS,
    seeds: Sequence[int] = DEMO_SEEDS,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, str]:
    """Build the lab (once), run the demo grid, write the report.

    Returns (path of the HTML report, the comparison tables as Markdown).
    """
    from calibdcd.experiment.labs import resolve_lab
    from calibdcd.experiment.runner import run_experiment
    from calibdcd.report import write_report
    from calibdcd.report.aggregate import load_results
    from calibdcd.report.tables import build_tables

    say = log or (lambda s: None)
    preset = preset or demo_preset(chat_models)
    out = Path(out_dir) if out_dir is not None else Path("runs") / f"lab-{preset}"
    cfg = demo_config(  # first: a bad argument fails before the lab is built
        preset,
        chat_models=chat_models,
        detectors=detectors,
        seeds=seeds,
        cache_dir=cache_dir,
        output=out,
    )
    say(f"lab {preset}: {resolve_lab(preset, root=cache_dir)}")
    run_dir = run_experiment(cfg, out, progress=progress, log=say)
    html = write_report(run_dir)
    keys = ("auc_main", "paired", "base_vs_post", "selection_why")
    tables = {t.key: t for t in build_tables(load_results(run_dir))}
    text = "\n".join(tables[k].markdown() for k in keys if k in tables)
    return html, f"{text}\n{full_study_note(len(seeds), len(chat_models), preset)}"
