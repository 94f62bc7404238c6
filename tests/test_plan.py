"""resolve → materialize → execute: a run's plan is resolved once and builds nothing; only
materialize builds what the plan's settings need."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from calibdcd.experiment import load_config
from calibdcd.experiment.plan import grid, materialize, resolve
from calibdcd.experiment.setting import setting_hash

REPO = Path(__file__).resolve().parents[1]


def _micro(tmp_path: Path, cache: Path, extra_target: str = "") -> Path:
    text = (REPO / "configs" / "lab-micro.yaml").read_text()
    p = tmp_path / "micro.yaml"
    p.write_text(text + extra_target + f"\ncache_dir: {cache}\n")
    return p


def test_resolve_builds_nothing_and_names_what_a_run_would_build(tmp_path, monkeypatch):
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    cache = tmp_path / "empty-cache"
    cfg = load_config(_micro(tmp_path, cache))
    plan = resolve(cfg, tmp_path / "run")
    assert not cache.exists() and not (tmp_path / "run").exists()  # nothing built or written
    assert [p.id for p in plan.grid] == [s.id for s in grid(cfg)]
    assert all(p.setting_hash == setting_hash(p.setting, cfg) for p in plan.grid)
    assert plan.settings == plan.grid and plan.shard is None
    kinds = {(a.kind, a.spec, a.built) for a in plan.artefacts}
    assert kinds == {("lab", "micro", False), ("clean reference", "micro", False)}
    lab = next(a for a in plan.artefacts if a.kind == "lab")
    assert lab.directory.startswith(str(cache)) and "targets[0]" in lab.used_by
    lines = "\n".join(plan.describe())
    assert f"plan: 18 of 18 setting(s) into {tmp_path / 'run'}" in lines
    assert "lab micro (micro-s0-" in lines and ": to build at " in lines
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.run_dir = tmp_path  # type: ignore[misc]


def test_a_shard_plans_only_its_settings_and_their_artefacts(tmp_path, monkeypatch):
    """A shard builds no lab that only another shard's targets use."""
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    other = (
        "\n  - {name: other, backend: hf, lab: micro@1, model: base, post_trained: false,"
        " options: {device: cpu}}"
    )
    path = _micro(tmp_path, tmp_path / "cache")
    text = path.read_text().replace("\ndetectors:", other + "\ndetectors:", 1)
    path.write_text(text)
    cfg = load_config(path)
    whole = resolve(cfg)
    assert {a.spec for a in whole.artefacts} == {"micro", "micro@1"}
    first = resolve(cfg, shard=(0, 2))
    assert [p.id for p in first.settings] == [p.id for p in whole.grid[: len(whole.grid) // 2]]
    assert all(p.setting.target.name != "other" for p in first.settings)
    assert {a.spec for a in first.artefacts} == {"micro"}
    last = resolve(cfg, shard=(1, 2))
    assert "micro@1" in {a.spec for a in last.artefacts}


def test_materialize_leaves_a_built_plan_as_it_is(tmp_path, lab_micro):
    """With the lab and reference built (the suite's cache root), nothing is left to build and
    materialize returns the plan itself: execution then runs its settings."""
    cfg = load_config(REPO / "configs" / "lab-micro.yaml")
    cfg = dataclasses.replace(cfg, detectors=tuple(d for d in cfg.detectors if d.name != "dpdllm"))
    plan = resolve(cfg, tmp_path / "run")
    assert [a.kind for a in plan.artefacts] == ["lab"] and plan.artefacts[0].built
    assert materialize(plan) is plan
