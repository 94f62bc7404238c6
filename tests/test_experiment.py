"""The experiment runner: config validation, dry runs, a real run on the lab micro (run directory,
resume after a kill, analyses consistent with direct ``calibrate`` calls)."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibdcd.calibration import calibrate
from calibdcd.experiment import (
    ConfigError,
    RunContext,
    ablation_configs,
    dry_run,
    fixed_config,
    grid,
    load_config,
    parse_config,
    prepare_setting,
    resolve,
    run_experiment,
    threshold_at_fpr,
)
from calibdcd.metrics import auc, tpr_at_fpr
from calibdcd.paths import default_shared
from experiment_support import REPO, lab_micro, micro_config_text, micro_run

SHARED = Path(default_shared() or "shared-data-not-found")


def _base(**over):
    cfg = {
        "name": "t",
        "benchmarks": [{"name": "wikimia", "path": str(SHARED / "data" / "WikiMIA"), "split": 64}],
        "targets": [{"name": "m", "backend": "hf", "model": "/nonexistent/model"}],
        "detectors": ["overlap"],
    }
    cfg.update(over)
    return cfg


# --------------------------------------------------------------------------------------------
# Config validation (no model)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        ({"targets": None}, "targets", "non-empty list"),
        ({"seeds": [0, "a"]}, "seeds[1]", "integer"),
        ({"seeds": [1, 1]}, "seeds", "repeats"),
        ({"protocol": "loose"}, "protocol", "one of"),
        ({"calibration": {"strengths": [0.5, 1.5]}}, "calibration.strengths", "[0, 1]"),
        ({"calibration": {"rnaks": [3]}}, "calibration.rnaks", "unknown key"),
        ({"evaluation": {"fpr": 2}}, "evaluation.fpr", "[1e-06, 1.0]"),
        ({"split": {"n_supervised_per_class": 0}}, "split.n_supervised_per_class", ">= 1"),
        ({"detectors": [{"name": "overlap", "opts": {}}]}, "detectors[0].opts", "unknown key"),
        (
            {"targets": [{"name": "m", "backend": "hf"}]},
            "targets[0].model",
            "required",
        ),
        (
            {"targets": [{"name": "a b", "backend": "hf", "model": "x"}]},
            "targets[0].name",
            "usable label",
        ),
        (
            {"targets": [{"name": "m", "backend": "hf", "model": "x", "base": "zz"}]},
            "targets[0].base",
            "no target named 'zz'",
        ),
        (
            {"detectors": ["overlap", {"name": "overlap"}]},
            "detectors[1].label",
            "already used",
        ),
        ({"benchmarks": [{"name": "lab", "lab": "micro"}]}, "benchmarks[0].path", "required"),
    ],
)
def test_config_errors_name_the_key_path(change, path, words):
    data = _base()
    for k, v in change.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    with pytest.raises(ConfigError) as exc:
        parse_config(data, source="exp.yaml")
    assert exc.value.path == path
    assert words in exc.value.problem
    assert str(exc.value).startswith(f"exp.yaml: {path}: ")


def test_config_file_problems(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbenchmarks: [\n  - a\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: <root>: line \d+, column \d+: invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    monkeypatch.delenv("CALIBDCD_NOPE", raising=False)
    env = _base(cache_dir="${CALIBDCD_NOPE}/c")
    with pytest.raises(ConfigError, match="cache_dir: environment variable CALIBDCD_NOPE"):
        parse_config(env)
    monkeypatch.setenv("CALIBDCD_NOPE", str(tmp_path))
    assert parse_config(env).cache_dir == str(tmp_path / "c")
    # defaults and relative paths resolved against the config file's directory
    good = tmp_path / "sub" / "good.yaml"
    good.parent.mkdir()
    good.write_text(
        "benchmarks: [{name: x, path: data.jsonl}]\n"
        "targets: [{name: m, backend: hf, model: ./m}]\n"
        "detectors: [overlap]\n"
    )
    (good.parent / "data.jsonl").write_text("")  # a file that is not there is a problem
    cfg = load_config(good)
    assert cfg.name == "good" and cfg.seeds == (0,) and cfg.calibration.ranks == (3, 4, 5, 6)
    assert cfg.benchmarks[0].path == str(good.parent / "data.jsonl")
    assert cfg.targets[0].model == str(good.parent / "m")
    assert cfg.grid_size == 1


def test_dry_run_reports_every_problem_without_loading_models():
    data = _base(
        detectors=["nosuchdetector", "overlap"],
        targets=[
            {"name": "m", "backend": "hf", "model": "/nonexistent/model"},
            {"name": "r", "backend": "carrier-pigeon", "model": "x"},
        ],
        benchmarks=[{"name": "wikimia", "path": "/nonexistent/WikiMIA"}],
    )
    # the dry run's own checks (a file read with read_config reports these with the config)
    lines, problems = dry_run(parse_config(data, check_options=False))
    text = "\n".join(problems)
    assert "benchmarks[0] (wikimia-" in text or "benchmarks[0] (wikimia)" in text
    assert "no such file or directory" in text
    assert "targets[0] (m).model: no such local checkpoint" in text
    assert "targets[1] (r).backend: 'carrier-pigeon' is not available" in text
    assert "detectors[0] (nosuchdetector).name: unknown detector" in text
    assert any(
        "grid: 1 benchmarks x 2 targets x 2 detectors x 1 seeds = 4 settings" in x for x in lines
    )


def test_dry_run_names_a_missing_checkpoint_once(tmp_path, monkeypatch):
    """A target's local checkpoint that is not there is one problem, with its line in the
    config, and not again in the list of models that cannot be used here (which still names a
    missing hub model of a detector)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty hub cache
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"text": "t {i}", "label": {i % 2}}}\n' for i in range(8)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"benchmarks: [{{name: own, path: {data}}}]\n"
        "targets: [{name: m, backend: hf, model: /nonexistent/model}]\n"
        "detectors: [{name: dpdllm, options: {reference: {model_path: no-org/no-model}}}]\n"
    )
    _, problems = dry_run(load_config(cfg))
    text = "\n".join(problems)
    assert text.count("/nonexistent/model") == 1, text
    assert "targets[0] (m).model: no such local checkpoint" in text
    assert "no-org/no-model: not in the local hub cache" in text, text


def test_dry_run_estimates_the_targets_requests_from_the_split_and_the_detectors():
    """The dry run's estimate: per detector, (subsample + calibration non-members x views) x
    the completions a text costs it, summed over the settings (two seeds here)."""
    if not (SHARED / "data" / "WikiMIA").is_dir():
        pytest.skip(f"benchmark copies not found at {SHARED / 'data'}")
    cfg = parse_config(
        _base(
            detectors=["overlap", {"name": "veilprobe", "preset": "cpu"}],
            seeds=[0, 1],
            calibration={"n_views": 2},
        ),
        check_options=False,
    )
    lines, _ = dry_run(cfg)
    bench = next(x for x in lines if x.startswith("  benchmarks[0]"))
    subsample = int(re.search(r"subsample (\d+)", bench).group(1))
    calibration = int(re.search(r"calibration (\d+)", bench).group(1))
    texts = subsample + calibration * 2
    head = next(x for x in lines if x.startswith("requests: at most"))
    overlap = next(x for x in lines if x.startswith("  overlap: "))
    veilprobe = next(x for x in lines if x.startswith("  veilprobe: "))
    # overlap: one greedy completion per text; VeilProbe (cpu): 3 samples x 2 queries
    assert overlap.startswith(f"  overlap: {2 * texts:,} (1 per text")
    assert veilprobe.startswith(f"  veilprobe: {2 * texts * 6:,} (6 per text")
    assert f"at most {2 * texts * 7:,} completions" in head


def test_dry_run_checks_the_group_aware_split():
    if not (SHARED / "data" / "BookTection").is_dir():
        pytest.skip(f"benchmark copies not found at {SHARED / 'data'}")
    bench = [{"name": "booktection", "path": str(SHARED / "data" / "BookTection")}]
    cfg = parse_config(_base(benchmarks=bench, split={"group_by": "group"}))
    assert cfg.group_by == "group" and load_config_roundtrip(cfg).group_by == "group"
    lines, problems = dry_run(cfg)
    assert not [p for p in problems if "benchmarks" in p]
    line = next(x for x in lines if "booktection" in x and "left out by group" in x)
    assert "supervised 100" in line
    _, problems = dry_run(parse_config(_base(benchmarks=bench, split={"group_by": "author"})))
    assert any("benchmarks[0]" in p and "group_by='author' but 5484 of 5484 texts have no "
               "meta 'author'" in p for p in problems)  # fmt: skip


def test_a_fixed_subsample_is_a_setting_of_the_split():
    from calibdcd.experiment.plan import setting_hash

    plain = parse_config(_base(seeds=[0, 1]))
    fixed = parse_config(_base(seeds=[0, 1], split={"subsample_seed": 0}))
    assert plain.subsample_seed is None and fixed.subsample_seed == 0
    assert load_config_roundtrip(fixed).subsample_seed == 0
    assert "subsample_seed" not in plain.as_dict().get("split", {})  # old configs unchanged
    # it changes what a setting is (and so its hash), and only when it is set
    a, b = grid(plain)[0], grid(fixed)[0]
    assert setting_hash(a, plain) != setting_hash(b, fixed)
    assert setting_hash(a, plain) == setting_hash(a, parse_config(_base(seeds=[0, 1])))
    with pytest.raises(ConfigError, match="subsample_seed"):
        parse_config(_base(split={"subsample_seed": "zero"}))


def load_config_roundtrip(cfg):
    import yaml

    return parse_config(yaml.safe_load(yaml.safe_dump(cfg.as_dict())))


def test_paper_config_dry_run_passes_but_for_its_hub_models(tmp_path, monkeypatch, shared_data_dir):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # no model fetched
    res = CliRunner().invoke(app, ["run", str(REPO / "configs" / "paper.yaml"), "--dry-run"])
    assert res.exit_code == 1, res.output
    assert "= 24 settings" in res.output
    assert "pool 1900 (950 m / 950 nm)" in res.output  # BookTection, the paper's data table
    assert "pool 442 (234 m / 208 nm)" in res.output  # WikiMIA
    assert "dry run: 1 problem(s)" in res.output  # the missing hub models (tests/test_models.py)
    assert "model(s) or dataset(s) named by" in res.output
    assert "Qwen/Qwen2.5-7B-Instruct" in res.output
    # BookMIA is the hub benchmark (not the 200-text local subset): named, with the command
    assert "(BookMIA): hub dataset swj0419/BookMIA not fetched yet" in res.output
    assert "  - swj0419/BookMIA: not in the local hub cache; used by benchmarks[1]" in res.output
    assert "calibdcd models fetch" in res.output
    cfg = load_config(REPO / "configs" / "paper.yaml")
    assert {t.family for t in cfg.targets} == {"qwen2.5", "llama3.1", "deepseek-r1-distill-qwen"}
    assert len(grid(cfg)) == 24
    # the paper's CalibDCD and the official DPDLLM arrangement
    assert cfg.calibration.guard is False and cfg.calibration_space == "raw"
    dpd = next(d for d in cfg.detectors if d.name == "dpdllm")
    assert dpd.options["reference"]["arrangement"] == "per_split"


def test_lab_small_config_dry_run_passes():
    lines, problems = dry_run(load_config(REPO / "configs" / "lab-small.yaml"))
    assert problems == []
    assert any("= 12 settings" in x for x in lines)


# --------------------------------------------------------------------------------------------
# A real run on the lab micro
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return micro_run(tmp_path_factory)


def test_run_directory_contents(run):
    _, run_dir = run
    for name in ("config.yaml", "environment.json", "grid.json", "results.csv", "results.jsonl"):
        assert (run_dir / name).is_file(), name
    # which data the run read: where from (no machine path) and a digest of its content
    (bench,) = json.loads((run_dir / "benchmarks.json").read_text())
    assert bench["source"] == "ground_truth.jsonl" and bench["n_texts"] == 300
    assert len(bench["content_digest"]) >= 16
    env = json.loads((run_dir / "environment.json").read_text())
    assert len(env["git"]["commit"]) == 40
    assert env["versions"]["numpy"] == np.__version__
    import torch

    # the machine, as lab.json records it too: the CPU's torch kernel level can change bytes
    assert env["cpu"] and env["cpu_count"] >= 1
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    resolved = load_config(run_dir / "config.yaml")  # the resolved config loads back
    assert resolved.grid_size == 2
    ids = [g["id"] for g in json.loads((run_dir / "grid.json").read_text())]
    assert ids == ["lab__chat-qwen__Overlap__s0", "lab__base__Overlap__s0"]
    for sid in ids:
        d = run_dir / "settings" / sid
        res = json.loads((d / "result.json").read_text())
        split = json.loads((d / "split.json").read_text())
        assert res["sizes"]["supervised"] == [100, 50]
        assert res["sizes"]["evaluation"][0] == len(split["evaluation"])
        assert set(split["calibration"]) <= set(split["evaluation"])  # protocol "paper"
        assert sorted(res["views"]) == sorted(
            ["U1", "U2", "U3", "U4", "U5", "U6", "U7", "U8", "T1", "T2"]
        )
        # what the target decoded the detector's queries with (Overlap: greedy continuations)
        gen = res["generation"]["continuation"]
        assert gen["backend"] == "hf" and gen["source"] == "generation_config.json"
        assert gen["requested"]["temperature"] == gen["used"]["temperature"] == 0.0
        with (d / "scores.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == len(split["subsample"])
        pool = [r for r in rows if r["in_pool"] == "1"]
        y = np.array([int(r["label"]) for r in pool])
        for stage in ("before", "after"):
            s = np.array([float(r[f"score_{stage}"]) for r in pool])
            assert auc(y, s) == pytest.approx(res[stage]["auc"]["estimate"], abs=1e-9)
            assert tpr_at_fpr(y, s) == pytest.approx(res[stage]["tpr"]["estimate"], abs=1e-9)
            iv = res[stage]["auc"]
            assert iv["low"] <= iv["estimate"] <= iv["high"] and iv["n_boot"] == 50
        # the controls and the blind baseline: per-text scores and their pool metrics
        pool_scores = {"original": np.array([float(r["score_before"]) for r in pool])}
        for name in ("placebo", "centred", "blind"):  # (the noise floor: test_noise_floor.py)
            s = np.array([float(r[f"score_{name}"]) for r in pool])
            pool_scores[name] = s
            assert auc(y, s) == pytest.approx(res["controls"][name]["auc"], abs=1e-9), name
            assert tpr_at_fpr(y, s) == pytest.approx(res["controls"][name]["tpr"], abs=1e-9)
        assert res["controls"]["centred"]["beyond_paper"] is True
        for key, (a, b) in {"placebo_vs_original": ("placebo", "original"),
                            "original_vs_blind": ("original", "blind")}.items():  # fmt: skip
            d = res["paired"][key]["auc"]
            want = auc(y, pool_scores[a]) - auc(y, pool_scores[b])
            assert d["estimate"] == pytest.approx(want, abs=1e-12)
            assert d["low"] <= d["estimate"] <= d["high"] and 0 <= d["p_value"] <= 1
            assert d["half_width"] == pytest.approx((d["high"] - d["low"]) / 2)
            assert d["n_boot"] == 1000  # at least MIN_PAIRED_BOOT, whatever evaluation.n_boot
        assert {r["id"] for r in rows if r["calibration"] == "1"} == set(split["calibration"])
    # the detector finds the lab's repeated members on the chat model
    first = json.loads((run_dir / "settings" / ids[0] / "result.json").read_text())
    assert first["before"]["auc"]["estimate"] > 0.6


def test_analyses_match_direct_calibrate_calls(run):
    """Recompute each setting from the cached features (no target is loaded) and check the
    stored CalibDCD selection, ablations and fixed configuration against direct calls."""
    cfg_path, run_dir = run
    cfg = load_config(cfg_path)
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    for s in grid(cfg):
        prep = prepare_setting(plan.setting(s.id), ctx.inputs(plan.setting(s.id)))
        res = json.loads((run_dir / "settings" / s.id / "result.json").read_text())
        p = prep.problem
        # the paper: the extractor's output, scored by the whole fitted detector (its z-score
        # included), the classifier family refitted on the corrected raw features
        assert p.space == res["space"] == "raw"

        def direct(config, p=p):
            cal = calibrate(p.z_cal, p.views, p.original.score, block=p.block, **config.kwargs())
            if not cal.corrected:
                return cal, np.asarray(p.original.score(p.z_eval))
            clf = p.new_classifier().fit(cal.transform(p.z_sup), p.y_sup)
            return cal, clf.score(cal.transform(p.z_eval))

        cal, scores = direct(cfg.calibration)
        stored = res["calibration"]
        assert list(cal.selected_views) == stored["selected_views"]
        assert cal.rank == stored["rank"] and cal.strength == stored["strength"]
        assert cal.fpp == pytest.approx(stored["fpp"])
        assert auc(p.y_eval, scores) == pytest.approx(res["after"]["auc"]["estimate"], abs=1e-12)
        for name, variant in ablation_configs(cfg.calibration, s.seed).items():
            vcal, vs = direct(variant)
            got = res["analyses"]["ablations"][name]
            assert got["selected_views"] == list(vcal.selected_views), name
            assert got["auc"] == pytest.approx(auc(p.y_eval, vs), abs=1e-12), name
            assert got["tpr"] == pytest.approx(tpr_at_fpr(p.y_eval, vs), abs=1e-12), name
        assert len(res["analyses"]["ablations"]["top1"]["selected_views"]) == 1
        fcal, fs = direct(fixed_config(cfg.calibration, 3, 0.9))
        assert res["analyses"]["fixed"]["auc"] == pytest.approx(auc(p.y_eval, fs), abs=1e-12)
        assert fcal.rank == (3 if fcal.basis.shape[1] else None)
        full = res["analyses"]["ablations"]["fixed_full"]
        if cal.corrected and cal.strength < 1:
            assert full is not None and full["strength"] == 1.0 and full["rank"] == cal.rank
        else:
            assert full is None
        # the normalised-space variant: calibrate after the classifier's own normalisation
        fwd = p.original.transform
        z0, views = fwd(p.z_cal), {k: fwd(v) for k, v in p.views.items()}
        rcal = calibrate(z0, views, p.original.score_transformed, block=p.block)
        if rcal.corrected:
            clf = p.new_classifier().fit(rcal.transform(fwd(p.z_sup)), p.y_sup)
            rs = clf.score(rcal.transform(fwd(p.z_eval)))
        else:
            rs = p.original.score(p.z_eval)
        alt = res["analyses"]["space"]
        assert alt["space"] == "normalized"
        variant = res["controls"]["normalized"]
        assert variant["space"] == "normalized" and variant["beyond_paper"] is True
        assert variant["auc"] == pytest.approx(auc(p.y_eval, rs), abs=1e-12)
        assert alt["rank"] == rcal.rank and alt["selected_views"] == list(rcal.selected_views)
        assert alt["auc"] == pytest.approx(auc(p.y_eval, rs), abs=1e-12)
    assert ctx.target_loads == 0  # everything came from the feature cache


def test_controls_match_direct_recomputation(run):
    """Placebo, noise floor, centred variant and blind baseline recomputed from the cached
    features and the split's texts agree with the stored results."""
    from calibdcd.blind import blind_scores
    from calibdcd.calibration import Calibration
    from calibdcd.experiment.analyses import controls

    cfg_path, run_dir = run
    cfg = load_config(cfg_path)
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    for s in grid(cfg):
        prep = prepare_setting(plan.setting(s.id), ctx.inputs(plan.setting(s.id)))
        p = prep.problem
        res = json.loads((run_dir / "settings" / s.id / "result.json").read_text())
        main = p.run(cfg.calibration)
        out = controls(p, main, cfg.calibration, seed=s.seed)
        placebo = out["placebo"].outcome.calibration
        assert isinstance(placebo, Calibration) and placebo.corrected
        b = placebo.basis
        np.testing.assert_allclose(b.T @ b, np.eye(b.shape[1]), atol=1e-12)  # orthonormal
        block = np.arange(b.shape[0]) if p.block is None else p.block
        assert not b[np.setdiff1d(np.arange(b.shape[0]), block)].any()  # inside the block
        if main.calibration.corrected:
            assert b.shape[1] == main.calibration.basis.shape[1]
            assert placebo.strength == main.calibration.strength
            assert out["placebo"].extra["size_from"] == "calibdcd"
        else:
            assert placebo.strength == cfg.analyses.fixed_strength
            assert out["placebo"].extra["size_from"] == "fixed"
        # the random directions are not CalibDCD's
        if main.calibration.corrected:
            assert np.abs(main.calibration.basis.T @ b).max() < 0.99
        for name in ("placebo", "noise_floor", "centred", "abstain", "normalized"):
            got = out[name].outcome.auc
            assert got == pytest.approx(res["controls"][name]["auc"], abs=1e-12), name
        # the (half-sample) noise floor is an interval around the original (test_noise_floor.py)
        nf = out["noise_floor"].extra
        assert nf["auc_low"] < p.auc_before < nf["auc_high"]
        assert res["controls"]["centred"]["strength"] == out["centred"].outcome.calibration.strength
        # abstaining differs from the paper's method only where the best J <= 0
        abst = out["abstain"].outcome
        if main.calibration.best_objective > 1e-9:
            assert abst.auc == pytest.approx(main.auc, abs=1e-12)
        else:
            assert not abst.calibration.corrected
            assert abst.auc == pytest.approx(p.auc_before, abs=1e-12)
            assert res["controls"]["abstain"]["reason"].startswith("abstained")
        texts, labels = prep.benchmark.texts, np.asarray(prep.benchmark.labels)
        sb = blind_scores([texts[i] for i in prep.sup_used], labels[prep.sup_used],
                          [texts[i] for i in prep.eval_used], seed=s.seed)  # fmt: skip
        assert auc(p.y_eval, sb) == pytest.approx(res["controls"]["blind"]["auc"], abs=1e-12)
    assert ctx.target_loads == 0


def test_seeds_vary_the_split_the_classifier_and_the_detector_state():
    """`seeds` is an axis: each seed has its own split, classifier seed and (with the default
    ``detector_seed: offset``) every seed field of the detector config shifted; seed 0 is the
    configured detector; ``detector_seed: fixed`` keeps the detector."""
    from calibdcd.detectors.dpdllm.detector import DPDLLMConfig
    from calibdcd.detectors.veilprobe.config import VeilProbeConfig
    from calibdcd.experiment.detector_entries import seed_offsets
    from calibdcd.experiment.plan import split_config

    def seeds_of(cfg, path=""):
        import dataclasses

        out = {}
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            if f.name == "seed":
                out[path + "seed"] = v
            elif dataclasses.is_dataclass(v):
                out.update(seeds_of(v, f"{path}{f.name}."))
        return out

    from calibdcd.options import replace_nested

    for base in (DPDLLMConfig(), VeilProbeConfig()):
        before = seeds_of(base)
        assert before  # every detector has random state
        after = seeds_of(replace_nested(base, seed_offsets(base, 2)))
        assert after == {k: v + 2 for k, v in before.items()}

    cfg = parse_config(
        {**_base(), "seeds": [0, 1, 2], "detectors": [{"name": "overlap", "options": {"seed": 5}}]}
    )
    assert cfg.detector_seed == "offset"
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    settings = grid(cfg)
    assert [s.seed for s in settings] == [0, 1, 2]
    dets = [ctx.detector(plan.setting(s.id).detector) for s in settings]
    assert [d.config.seed for d in dets] == [5, 6, 7]
    fixed_plan = resolve(parse_config({**_base(), "seeds": [0, 1], "detector_seed": "fixed"}))
    fixed = RunContext(fixed_plan, progress=False)
    one, zero = (fixed.detector(p.detector) for p in reversed(fixed_plan.settings))
    assert one is zero
    from calibdcd.data import make_split

    labels = np.array([1] * 150 + [0] * 150)
    sups = [tuple(make_split(labels, split_config(s.benchmark, cfg), seed=s.seed).supervised)
            for s in settings]  # fmt: skip
    assert len(set(sups)) == 3


def test_fp_recovery_counts_are_consistent(run):
    _, run_dir = run
    for d in (run_dir / "settings").iterdir():
        res = json.loads((d / "result.json").read_text())
        fr = res["analyses"]["fp_recovery"]
        pool = fr["pool"]
        assert pool["fp_before"] - pool["recovered"] + pool["new_fp"] == pool["fp_after"]
        assert pool["tp_before"] - pool["members_lost"] + pool["members_gained"] == pool["tp_after"]
        n_m = res["sizes"]["evaluation"][1]
        n_nm = res["sizes"]["evaluation"][0] - n_m
        assert pool["tp_before"] / n_m == pytest.approx(res["before"]["tpr"]["estimate"])
        assert pool["tp_after"] / n_m == pytest.approx(res["after"]["tpr"]["estimate"])
        assert pool["fp_before"] <= 0.05 * n_nm and pool["fp_after"] <= 0.05 * n_nm
        aff = fr["affected"]
        assert 0 <= aff["recovered"] <= aff["cases"] <= res["sizes"]["calibration"][0]
        assert aff["view"] == max(
            res["calibration"]["selected_views"], key=res["calibration"]["fpp"].get
        )
        with (d / "scores.csv").open() as fh:
            rows = [r for r in csv.DictReader(fh) if r["in_pool"] == "1"]
        y = np.array([int(r["label"]) for r in rows])
        s0 = np.array([float(r["score_before"]) for r in rows])
        assert threshold_at_fpr(y, s0, 0.05) == pytest.approx(pool["threshold_before"])
        assert int(((s0 >= pool["threshold_before"]) & (y == 0)).sum()) == pool["fp_before"]


def test_resume_after_kill_recomputes_only_missing_settings(tmp_path, tmp_path_factory, capsys):
    """Kill a real `calibdcd run` subprocess after its first setting; the restart skips it and
    its settings bar counts only the settings it computes, naming the complete one.
    The generations come from the session's micro run where it has them (chat-qwen, base): what
    is tested is the run directory, not the target."""
    micro_cfg, _ = micro_run(tmp_path_factory)
    cfg_path = tmp_path / "resume.yaml"
    cfg_path.write_text(
        micro_config_text(micro_cfg.parent / "cache", targets=("chat-qwen", "chat-llama", "base"))
    )
    run_dir = tmp_path / "run"
    import calibdcd

    src = str(Path(calibdcd.__file__).resolve().parents[1])  # the code under test
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=src)
    # a real process, SIGKILLed by itself the moment its first setting is reported done: the
    # kill lands at a known point without the test polling the run directory for minutes
    script = (
        "import os, signal, sys\n"
        "from calibdcd.experiment import load_config, run_experiment\n"
        "def log(line):\n"
        "    if line.startswith('done '):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "run_experiment(load_config(sys.argv[1]), sys.argv[2], progress=False, log=log)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(cfg_path), str(run_dir)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    first = run_dir / "settings" / "lab__chat-qwen__Overlap__s0" / "result.json"
    done = sorted(p.parent.name for p in (run_dir / "settings").glob("*/result.json"))
    assert done == ["lab__chat-qwen__Overlap__s0"], done
    stamp = first.stat().st_mtime_ns
    before = first.read_bytes()

    log: list[str] = []
    capsys.readouterr()
    run_experiment(load_config(cfg_path), run_dir, progress=True, log=log.append)
    assert "skip lab__chat-qwen__Overlap__s0 (complete)" in log
    assert sum(x.startswith("done ") for x in log) == 3 - len(done)
    last = capsys.readouterr().err.replace("\r", "\n").splitlines()
    bar = [x for x in last if x.startswith("settings")][-1]
    assert bar.startswith("settings (1 complete): 100%") and "| 2/2 [" in bar, bar
    assert first.stat().st_mtime_ns == stamp and first.read_bytes() == before
    assert len(list((run_dir / "settings").glob("*/result.json"))) == 3
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == [
        "lab__chat-qwen__Overlap__s0",
        "lab__chat-llama__Overlap__s0",
        "lab__base__Overlap__s0",
    ]


def test_demo_config_is_configs_demo_and_on_three_seeds_configs_lab_micro():

    from calibdcd.experiment.demo import demo_config

    # the demo (embedded, so an installed package has it) is configs/demo.yaml: the demo lab,
    # one seed
    demo = demo_config(cache_dir="/c", output="/o")
    yaml_cfg = load_config(REPO / "configs" / "demo.yaml")
    assert demo == yaml_cfg.model_copy(update={"source": None, "cache_dir": "/c", "output": "/o"})
    assert demo.seeds == (0,) and {t.lab for t in demo.targets} == {"demo"}
    assert [t.name for t in demo.targets] == ["chat-qwen", "base"]
    assert [d.name for d in demo.detectors] == ["veilprobe", "dpdllm", "overlap"]
    # the same grid on the micro lab with seeds 0-2 is the reproducibility config
    micro = demo_config("micro", seeds=(0, 1, 2), cache_dir="/c", output="/o")
    yaml_micro = load_config(REPO / "configs" / "lab-micro.yaml")
    assert micro == yaml_micro.model_copy(
        update={"source": None, "cache_dir": "/c", "output": "/o"}
    )
    # other chat models than the demo lab's: the micro lab, which has them
    every = demo_config(chat_models=("chat-qwen", "chat-llama", "chat-reasoning"))
    assert [t.name for t in every.targets] == ["chat-qwen", "chat-llama", "chat-reasoning", "base"]
    assert {t.lab for t in every.targets} == {"micro"}
    assert {t.base for t in every.targets if t.post_trained} == {"base"}
    with pytest.raises(ValueError, match="unknown demo detector"):
        demo_config(detectors=("nope",))
    with pytest.raises(ValueError, match="unknown lab model"):
        demo_config(chat_models=("chat-nope",))
    with pytest.raises(ValueError, match="the demo lab has only"):
        demo_config("demo", chat_models=("chat-llama",))


def test_the_demo_lab_is_micro_with_one_chat_model():
    """The demo lab shares micro's pre-training (so one base serves both) and gives chat-qwen
    micro's SFT: the same config, seed and position among the styles."""
    from calibdcd.lab.config import PRESETS, lab_models, pretrain_hash, resolve_config

    demo, micro = resolve_config("demo"), resolve_config("micro")
    assert pretrain_hash(demo, 0, "p") == pretrain_hash(micro, 0, "p")
    assert demo.sft == micro.sft and demo.styles == micro.styles[:1]
    assert lab_models(PRESETS["demo"]) == ("base", "chat-qwen")
    assert lab_models(PRESETS["micro"]) == ("base", "chat-qwen", "chat-llama", "chat-reasoning")


def test_loading_a_model_the_built_lab_lacks_names_what_it_has(tmp_path, monkeypatch):
    """A lab whose directory has base and chat-qwen only (the demo lab's models, here micro's
    own files): asking it for chat-llama fails before any load, naming the lab's models."""
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import build_target

    micro = lab_micro()
    lab = tmp_path / "labs" / "lab-demo"
    lab.mkdir(parents=True)
    for name in ("lab.json", "ground_truth.jsonl", "base", "chat-qwen"):
        (lab / name).symlink_to(micro / name)
    monkeypatch.setenv("CALIBDCD_LAB_ROOT", str(tmp_path / "labs"))
    entry = TargetEntry(name="t", backend="hf", model="chat-llama", lab="demo")
    with pytest.raises(ValueError, match=r"has no model 'chat-llama'; it has base, chat-qwen"):
        build_target(entry, tmp_path / "g.sqlite", tmp_path / "cache")
    # the dry run says the same of the built lab, before any run
    from calibdcd.experiment.runner import dry_run

    p = tmp_path / "demo.yaml"
    text = (REPO / "configs" / "demo.yaml").read_text()
    p.write_text(text.replace("model: chat-qwen,", "model: chat-llama,"))
    _, problems = dry_run(load_config(p))
    assert problems == [
        f"targets[0] (chat-qwen).model: lab {lab} has no model 'chat-llama'; it has base, chat-qwen"
    ], problems


def test_a_dry_run_names_a_model_the_unbuilt_lab_will_not_have(tmp_path):
    from calibdcd.experiment.runner import dry_run

    text = (REPO / "configs" / "demo.yaml").read_text()
    p = tmp_path / "demo.yaml"
    p.write_text(
        text.replace("model: chat-qwen,", "model: chat-llama,") + f"cache_dir: {tmp_path}/c\n"
    )
    _, problems = dry_run(load_config(p))
    assert (
        "targets[0] (chat-qwen).model: lab preset 'demo' has no model 'chat-llama'; it has "
        "base, chat-qwen" in problems
    ), problems


@pytest.mark.slow
def test_demo_on_the_lab_micro_strict_protocol(tmp_path, monkeypatch):
    """The demo path on the micro lab (4 targets, overlap detector), then the same grid under
    protocol strict: no calibration text is ever in the reporting pool."""
    labs = tmp_path / "labs"  # the run's cache root would hold its own lab: share the built one
    labs.mkdir()
    (labs / "lab-micro").symlink_to(lab_micro(), target_is_directory=True)
    monkeypatch.setenv("CALIBDCD_LAB_ROOT", str(labs))
    from calibdcd.experiment.demo import demo_config, run_demo

    monkeypatch.chdir(tmp_path)
    every = ("chat-qwen", "chat-llama", "chat-reasoning")
    html, text = run_demo(tmp_path / "run", preset="micro", chat_models=every, seeds=(0,),
                          detectors=("overlap",), cache_dir=tmp_path / "cache",
                          progress=False)  # fmt: skip
    assert html.is_file()
    assert "Overlap + CalibDCD" in text and "Base vs post-trained" in text
    rows = [r for r in text.splitlines() if r.startswith("| lab | Overlap | base |")]
    assert [r.split(" | ")[3] for r in rows] == ["chat-qwen", "chat-llama", "chat-reasoning"]

    cfg = demo_config(
        "micro",
        chat_models=every,
        seeds=(0,),
        detectors=("overlap",),
        cache_dir=tmp_path / "cache",
    ).model_copy(update={"protocol": "strict"})
    log: list[str] = []
    run_experiment(cfg, tmp_path / "strict", progress=False, log=log.append)
    assert sum(x.startswith("done ") for x in log) == 4
    for d in (tmp_path / "strict" / "settings").iterdir():
        split = json.loads((d / "split.json").read_text())
        assert not set(split["calibration"]) & set(split["evaluation"])
        res = json.loads((d / "result.json").read_text())
        assert res["protocol"] == "strict"
        assert res["sizes"]["evaluation"][0] == len(split["evaluation"])


def test_stored_results_are_reused_only_for_the_same_inputs(tmp_path):
    """A result is keyed on the config *and* on what the config leaves open: a benchmark file
    edited in place gets a new inputs hash (so the setting is recomputed), the config hash
    stays."""
    from calibdcd.experiment.plan import setting_hash
    from calibdcd.experiment.resources import inputs_hash

    def inputs(cfg):
        plan = resolve(cfg)
        return inputs_hash(plan.grid[0], RunContext(plan, progress=False))

    lab = lab_micro()
    data = tmp_path / "gt.jsonl"
    data.write_text((lab / "ground_truth.jsonl").read_text())
    text = micro_config_text(tmp_path / "cache").replace(str(lab / "ground_truth.jsonl"), str(data))
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(text)
    cfg = load_config(cfg_path)
    s = grid(cfg)[0]
    before = (setting_hash(s, cfg), inputs(cfg))
    assert before[1] == inputs(cfg)  # stable
    rows = [json.loads(x) for x in data.read_text().splitlines() if x]
    rows[0]["text"] = rows[0]["text"] + " Edited."
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = (setting_hash(s, cfg), inputs(cfg))
    assert after[0] == before[0] and after[1] != before[1]
    # a renamed text id (same text, same label) is part of the identity too: the stored result
    # (whose scores.csv names the old id) is not reused
    rows[1]["id"] = str(rows[1]["id"]) + "-renamed"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    renamed = inputs(cfg)
    assert renamed not in (before[1], after[1])
