"""Progress: a run's inner bars (generation, detectors' training and features) follow the run's
``progress`` setting unless a config sets them; they show counts and an ETA, and go when done."""

from __future__ import annotations

import pytest

from calibdcd.progress import inner_bar
from calibdcd.targets.base import GenerationParams


@pytest.mark.parametrize("run_progress", [True, False])
def test_a_run_passes_its_progress_to_detectors_and_targets(tmp_path, run_progress):
    from calibdcd.experiment import RunContext, resolve
    from calibdcd.experiment.config import load_config
    from experiment_support import micro_config_text

    text = micro_config_text(tmp_path / "cache", targets=("chat-qwen",), seeds=(0, 1))
    head, tail = text.split("detectors:\n", 1)
    tail = tail.split("\n", 1)[1]  # drop the default overlap line
    text = (
        head
        + (
            "detectors:\n"
            "  - {name: veilprobe, label: VP, preset: cpu}\n"
            "  - {name: veilprobe, label: VP-quiet, preset: cpu, options: {progress: false}}\n"
            "  - {name: overlap, label: Overlap}\n"
        )
        + tail
    )
    (tmp_path / "c.yaml").write_text(text)
    cfg = load_config(tmp_path / "c.yaml")
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=run_progress)
    by = {(p.setting.detector.label, p.seed): p.detector for p in plan.settings}
    assert ctx.detector(by["VP", 0]).config.progress is run_progress
    assert ctx.detector(by["VP", 1]).config.progress is run_progress
    assert ctx.detector(by["VP-quiet", 0]).config.progress is False  # the config decides
    ctx.detector(by["Overlap", 0])  # no progress option: built without one
    target = ctx.target(plan.targets[0])
    assert target.target.progress is run_progress
    ctx.release_target()


def test_inner_bar_shows_counts_and_eta_and_is_erased(capfd, target):
    prompts = [f"The number {i} is" for i in range(6)]
    target.progress = True
    target.batch_size = 2
    try:
        target.generate(prompts, GenerationParams(max_new_tokens=2, temperature=0.0))
    finally:
        target.progress = False
    err = capfd.readouterr().err
    # desc, count of total and elapsed<ETA from the first frame (later frames are rate-limited)
    assert "generate:" in err and "0/3 [" in err and "<" in err
    # erased when done: the bar's last write clears its line (tqdm leave=False) instead of
    # leaving the final "3/3" frame as the last thing on the terminal
    assert err.endswith("\r") and err.split("\r")[-2].strip() == ""
    with inner_bar(range(3), desc="x", enabled=False) as bar:
        assert list(bar) == [0, 1, 2]
    assert capfd.readouterr().err == ""


def test_a_cached_target_shows_one_bar_over_all_its_chunks(capfd, target, tmp_path):
    """The cache asks its target chunk by chunk; the user sees one bar over every missing
    completion (its ETA is the whole call's), not a bar restarting with each chunk."""
    from calibdcd.targets.cache import CachedTarget

    prompts = [f"The number {i} is" for i in range(6)]
    target.progress = True
    try:
        with CachedTarget(target, tmp_path / "gen.sqlite", chunk_size=2) as cached:
            cached.generate(prompts, GenerationParams(max_new_tokens=2, temperature=0.0))
            assert target.progress is True  # handed back after the call
    finally:
        target.progress = False
    err = capfd.readouterr().err
    assert "generate:" in err and "0/6 [" in err
    assert "batch" not in err  # the target's own per-chunk bars stayed off
