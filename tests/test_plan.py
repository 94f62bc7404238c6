"""resolve → materialize → execute: a run's plan is resolved once and builds nothing; only
materialize builds what the plan's settings need."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from calibdcd.experiment import load_config
from calibdcd.experiment.plan import grid, materialize, resolve, setting_hash

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


def test_a_resumed_run_s_plan_counts_its_complete_settings(tmp_path, monkeypatch):
    """A stored run (lab seed 2 of the lab-v2 study, 24 settings) with a detector added to its
    config: the plan says how many settings are complete and how many it will compute; a
    result.json of another setting hash is not counted."""
    import tarfile

    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    tar = REPO / "benchmarks" / "results" / "runs" / "lab-v2-paper-lab2.tar.xz"
    with tarfile.open(tar) as fh:
        fh.extractall(tmp_path / "runs", filter="data")
    run = next((tmp_path / "runs").rglob("grid.json")).parent
    text = (run / "config.yaml").read_text()
    cfg = load_config(run / "config.yaml")
    assert f"plan: 24 of 24 setting(s) into {run}: 24 complete" in resolve(cfg, run).describe()[0]
    added = text.replace("\ndetectors:\n", "\ndetectors:\n- {name: loss, label: LOSS}\n", 1)
    assert added != text
    (tmp_path / "added.yaml").write_text(added)
    one = run / "settings" / "lab__base__DPDLLM__s0" / "result.json"
    one.write_text(one.read_text().replace('"setting_hash": "', '"setting_hash": "x', 1))
    plan = resolve(load_config(tmp_path / "added.yaml"), run)
    assert plan.describe()[0] == (
        f"plan: 36 of 36 setting(s) into {run}: 23 complete (kept unless their inputs "
        "changed), 13 to compute"
    )


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
    cfg = cfg.model_copy(
        update={"detectors": tuple(d for d in cfg.detectors if d.name != "dpdllm")}
    )
    plan = resolve(cfg, tmp_path / "run")
    assert [a.kind for a in plan.artefacts] == ["lab"] and plan.artefacts[0].built
    assert materialize(plan) is plan


def test_the_plan_holds_every_benchmark_target_and_detector_as_resolved(tmp_path, monkeypatch):
    """The plan carries each benchmark's loaded name, each target's model and the detector of
    every (detector, benchmark, seed) with its seed's options merged, nothing built; a run's
    context builds exactly those detectors (the seed offsets are decided in one place)."""
    from calibdcd.experiment.resources import RunContext

    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    cache = tmp_path / "empty-cache"
    cfg = load_config(_micro(tmp_path, cache))
    cfg = cfg.model_copy(update={"detector_seed": "offset"})
    plan = resolve(cfg, tmp_path / "run")
    assert not cache.exists()
    assert [(b.entry.label, b.name) for b in plan.benchmarks] == [("lab", "lab")]
    assert [(t.entry.name, t.built) for t in plan.targets] == [
        ("chat-qwen", False),
        ("base", False),
    ]
    keys = set(plan.detectors)
    assert keys == {(d.label, "lab", s) for d in cfg.detectors for s in cfg.seeds}
    base = plan.detectors[("Overlap", "lab", 0)]
    assert base.entry == next(d for d in cfg.detectors if d.label == "Overlap")
    assert base.offsets == {} and base.problem is None
    for s in (1, 2):
        shifted = plan.detectors[("Overlap", "lab", s)]
        assert shifted.offsets == {"seed": base.config.seed + s}
        assert shifted.config.seed == base.config.seed + s
        vp0, vp = (plan.detectors[("VeilProbe", "lab", k)].config for k in (0, s))
        assert vp.sampling.seed == vp0.sampling.seed + s
    for p in plan.settings:
        assert plan.detector(p).key == (p.setting.detector.label, "lab", p.setting.seed)
    lines = "\n".join(plan.describe())
    assert "benchmark lab: lab from lab micro/ground_truth.jsonl" in lines
    assert (
        "target chat-qwen: hf lab micro/chat-qwen (its lab is built first); views: its lab "
        "checkpoint's chat template"
    ) in lines
    assert "detector Overlap for lab, seed 2: options seed=" in lines
    assert "detector VeilProbe for lab, seed 0: as configured" in lines
    # the run's context builds the plan's detectors (the overlap detector builds nothing)
    ctx = RunContext(plan, progress=False)
    for s in cfg.seeds:
        built = ctx.detector(plan.detectors[("Overlap", "lab", s)])
        assert built.config == plan.detectors[("Overlap", "lab", s)].config
    assert not cache.exists()
    # under detector_seed: fixed every seed is the configured detector
    fixed = resolve(cfg.model_copy(update={"detector_seed": "fixed"}), tmp_path / "run")
    assert set(fixed.detectors) == {(d.label, "lab", 0) for d in cfg.detectors}


def test_a_benchmark_is_planned_under_the_name_it_loads_with(tmp_path, shared_data_dir):
    """A detector is configured for the loaded benchmark's name (DPDLLM's per-benchmark
    settings), so the plan must know that name without reading: a known benchmark's canonical
    name (whatever alias the config uses), a named file, a bare file path's stem."""
    from calibdcd.experiment.benchmark_entries import entry_benchmark_name, load_benchmark_entry
    from calibdcd.experiment.config import BenchmarkEntry

    rows = tmp_path / "my.data.jsonl"
    rows.write_text('{"text": "a b c", "label": 1}\n{"text": "d e f", "label": 0}\n')
    entries = [
        BenchmarkEntry(name="WikiMIA", path=str(shared_data_dir / "WikiMIA"), split="64"),
        BenchmarkEntry(name="wikimia_24", path=str(shared_data_dir / "WikiMIA-24"), split="64"),
        BenchmarkEntry(name="mine", path=str(rows)),
        BenchmarkEntry(name=str(rows)),
    ]
    names = [entry_benchmark_name(e) for e in entries]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # WikiMIA-24's duplicate texts
        assert names == [load_benchmark_entry(e).name for e in entries]
    assert names == ["wikimia", "wikimia-24", "mine", "my"]
    assert entry_benchmark_name(BenchmarkEntry(name="mimir", hub="owner/some-set")) == "mimir"


def test_a_detector_unresolvable_before_its_build_still_gets_its_seed(request):
    """A factory-only registration that refuses an unresolved lab reference cannot be resolved
    by the plan; the plan says why and its build raises that. Resolved again once its reference
    resolves (materialize does so after building), it gets the seed's offsets, read from the
    configured detector's parameters, and is built once."""
    from calibdcd.detectors import registry
    from calibdcd.detectors.overlap import ContinuationOverlap, OverlapConfig
    from calibdcd.detectors.registry import register_detector
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import plan_detector

    seen = []

    def factory(preset, options, benchmark, cache_dir):
        seen.append(dict(options))
        if str(options.get("ref", "")).startswith("lab:"):
            raise ValueError("ref: an unresolved lab reference")
        return ContinuationOverlap(OverlapConfig(seed=int(options.get("seed", 3))))

    register_detector("picky-test", factory, uses_torch=False, replace=True)
    request.addfinalizer(lambda: registry._FACTORIES.pop("picky-test", None))
    ok = plan_detector(DetectorEntry(name="picky-test", options={"ref": "/a/b"}), "x", 2, None)
    assert ok.problem is None and ok.offsets == {"seed": 5} and ok.config.seed == 5
    assert ok.entry.options == {"ref": "/a/b", "seed": 5}
    picky = DetectorEntry(name="picky-test", options={"ref": "lab:micro@97/base"})  # never built
    planned = plan_detector(picky, "x", 2, None)
    assert planned.problem == "ref: an unresolved lab reference" and planned.config is None
    assert planned.entry == picky and planned.offsets == {}
    assert "seed 2: not resolved here (ref: an unresolved lab reference)" in planned.describe()
    with pytest.raises(ValueError, match="an unresolved lab reference"):
        planned.build()
    # resolved once its reference resolves: seed 3 + 2, from the configured detector's config
    later = plan_detector(dataclasses.replace(picky, options={"ref": "/c"}), "x", 2, None)
    assert later.offsets == {"seed": 5}
    del seen[:]
    assert later.build().config.seed == 5
    assert seen == [{"ref": "/c", "seed": 5}]  # built once


def test_a_targets_view_source_is_decided_by_one_rule_without_loading_anything(tmp_path):
    """The plan says where each target's views come from with the rule target_views follows
    (view_rule): nothing loaded, built or asked of a server."""
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import describe_views, view_rule

    url = {"base_url": "http://127.0.0.1:9/v1"}  # nothing listens: nothing may be asked
    cases = [
        (TargetEntry(name="a", backend="openai", model="m", tokenizer="server", options=url),
         "server"),
        (TargetEntry(name="b", backend="hf", model="m", tokenizer="org/tok"), "tokenizer"),
        (TargetEntry(name="c", backend="hf", model="chat-qwen", lab="micro@7"), "lab checkpoint"),
        (TargetEntry(name="d", backend="hf", model="packaged:smollm2-135m-instruct"),
         "checkpoint"),
        (TargetEntry(name="e", backend="hf", model=str(tmp_path)), "checkpoint"),
        (TargetEntry(name="f", backend="hf", model="org/unfetched"), "hub model"),
        (TargetEntry(name="g", backend="openai", model="served", options=url), "remote"),
        (TargetEntry(name="h", backend="openai", model="served", family="qwen2.5", options=url),
         "family"),
    ]  # fmt: skip
    root = tmp_path / "cache"
    assert [view_rule(t, root) for t, _ in cases] == [rule for _, rule in cases]
    assert not root.exists()
    assert describe_views(cases[1][0], root) == "the chat template of tokenizer org/tok"
    assert describe_views(cases[-1][0], root) == "the built-in views of family qwen2.5"
