"""The experiment config (pydantic schema): every problem of a file at once with its key path and
line, unknown keys with a suggestion, component options checked, the file format round trip,
lab references resolved at load without building; the dry run's problem kinds together."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from calibdcd.experiment import ConfigError, load_config, parse_config
from calibdcd.experiment.config import read_config
from calibdcd.integrity import safetensors_problem

REPO = Path(__file__).resolve().parents[1]

FOUR = """\
name: four
benchmarks:
  - {name: x, path: data.jsonl}
targets:
  - name: m
    backend: hf
    model: ./m
    options: {device: cpu, batchsize: 8}
detectors:
  - overlap
  - {name: veilprobe, preset: cpu, options: {sampling: {prompt_fractoin: 0.5}}}
evaluation: {fpr: 2}
analysis: {blind: false}
"""


def test_four_mistakes_report_four_with_paths_and_lines(tmp_path):
    p = tmp_path / "four.yaml"
    p.write_text(FOUR)
    (tmp_path / "data.jsonl").write_text("")  # exists: a missing file would be a fifth problem
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    got = [(q.path, q.line) for q in exc.value.problems]
    assert got == [
        ("targets[0].options.batchsize", 8),
        ("detectors[1].options.sampling.prompt_fractoin", 11),
        ("evaluation.fpr", 12),
        ("analysis", 13),
    ]
    text = str(exc.value)
    assert text.startswith(f"{p}: 4 problems:")
    assert f"{p}:13: analysis: unknown key (did you mean 'analyses'?)" in text
    assert "(did you mean 'batch_size'?)" in text
    assert "(did you mean 'prompt_fraction'?)" in text
    assert "must lie in [1e-06, 1.0], got 2.0" in text


def test_wrong_option_types_and_structure_are_collected(tmp_path):
    data = {
        "benchmarks": [{"name": "x", "path": "d.jsonl", "dedupe": "yes"}],
        "targets": [
            {"name": "r", "backend": "openai", "model": "m",
             "options": {"base_url": "http://127.0.0.1:9/v1", "timeout": "soon"}},
            {"name": "r", "backend": "hf", "model": "x"},
        ],
        "detectors": [{"name": "overlap", "options": {"max_new_tokens": "many"}}],
        "seeds": [0, True],
    }  # fmt: skip
    with pytest.raises(ConfigError) as exc:
        parse_config(data, source="exp.yaml")
    problems = {q.path: q.problem for q in exc.value.problems}
    assert set(problems) == {
        "benchmarks[0].dedupe",
        "targets[0].options.timeout",
        "targets[1].name",
        "detectors[0].options.max_new_tokens",
        "seeds[1]",
    }, problems
    assert "must be float, got 'soon'" in problems["targets[0].options.timeout"]
    assert "already used by targets[0]" in problems["targets[1].name"]
    assert "got 'many'" in problems["detectors[0].options.max_new_tokens"]


@pytest.mark.parametrize(
    "name",
    [
        "demo",
        "lab-micro",
        "lab-small",
        "lab-v2",
        "paper",
        "paper-vllm",
        "real-lab",
        "real-regime",
        "real-wikimia24",
    ],
)
def test_shipped_configs_round_trip_through_the_schema(name, tmp_path, request):
    import yaml

    if name.startswith(("paper", "real")):
        request.getfixturevalue("shared_data_dir")  # its benchmarks are the shared copies

    from calibdcd.experiment.plan import setting_hash
    from calibdcd.experiment.runner import portable_config

    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    d = portable_config(cfg, tmp_path)
    again_path = tmp_path / "config.yaml"
    again_path.write_text(yaml.safe_dump(d, sort_keys=False))
    again = load_config(again_path)
    assert portable_config(again, tmp_path) == d
    assert [setting_hash(s, again) for s in _grid(again)] == [
        setting_hash(s, cfg) for s in _grid(cfg)
    ]


def test_lab_bands_reseeds_every_lab_and_bands_only_keeps_what_the_bands_read(tmp_path):
    """benchmarks/lab_bands.py's per-lab-seed config: every lab reference (targets, benchmark,
    DPDLLM's clean reference) at the new seed, and ``--bands-only`` down to the two paper
    detectors with every analysis off; the result still passes the schema."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_bands", REPO / "benchmarks" / "lab_bands.py")
    lab_bands = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab_bands)
    src = REPO / "configs" / "lab-v2.yaml"
    full = load_config(lab_bands.seeded_config(src, 1, tmp_path / "full"))
    cfg = load_config(lab_bands.seeded_config(src, 1, tmp_path / "bands", bands_only=True))
    for c in (full, cfg):
        assert {t.lab for t in c.targets} == {"v2@1"}
        assert [b.lab for b in c.benchmarks] == ["v2@1"]
    assert [d.name for d in full.detectors] == [
        "veilprobe", "dpdllm", "overlap",
        "loss", "zlib", "mink", "mink++", "recall", "logprofile",  # the gray-box ones (issue 49)
        "samia",  # the black-box attack (issue 49), resumed into lab seed 0's run last
    ]  # fmt: skip
    assert full.analyses.controls and full.analyses.blind
    assert [d.name for d in cfg.detectors] == ["veilprobe", "dpdllm"]
    dpdllm = cfg.detectors[1].options["reference"]["model_path"]
    assert dpdllm == "lab-clean-reference:v2@1"
    a = cfg.analyses
    assert not any(
        (a.ablations, a.adaptive_vs_fixed, a.fp_recovery, a.space_comparison, a.controls, a.blind)
    )
    assert cfg.name == "lab-v2-lab1" and cfg.seeds == full.seeds
    one = load_config(lab_bands.seeded_config(src, 2, tmp_path / "one", split_seeds=[0]))
    assert list(one.seeds) == [0] and {t.lab for t in one.targets} == {"v2@2"}


def _grid(cfg):
    from calibdcd.experiment.runner import grid

    return grid(cfg)


def test_setting_hashes_of_lab_micro_are_unchanged(tmp_path):
    """The paper's method as the default changed what a setting computes, so lab-micro's hashes
    changed with it (every stored result of the earlier default is recomputed, never reused);
    a config that spells out the earlier default (as every stored run's config.yaml does:
    ``guard: true``, ``calibration_space: auto``) keeps the hashes the hand-written reader gave
    before the pydantic schema (runs/lab-micro/grid.json), so an old run stays complete."""
    import yaml

    from calibdcd.experiment.plan import setting_hash

    cfg = load_config(REPO / "configs" / "lab-micro.yaml")
    hashes = {s.id: setting_hash(s, cfg) for s in _grid(cfg)}
    assert hashes["lab__chat-qwen__VeilProbe__s0"] == "c487a14b2fdcc879"
    assert hashes["lab__chat-qwen__VeilProbe__s1"] == "80eb6d2c671c5b60"
    old = yaml.safe_load((REPO / "configs" / "lab-micro.yaml").read_text())
    old["calibration"] = {"guard": True}
    old["calibration_space"] = "auto"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    cfg = load_config(tmp_path / "old.yaml")
    hashes = {s.id: setting_hash(s, cfg) for s in _grid(cfg)}
    assert hashes["lab__chat-qwen__VeilProbe__s0"] == "eaf634e9f6b7e826"
    assert hashes["lab__chat-qwen__VeilProbe__s1"] == "3a2c8f4097361ced"


def test_hashing_a_lab_config_builds_no_lab(tmp_path, monkeypatch):
    from calibdcd.experiment import RunContext, resolve
    from calibdcd.experiment.resources import inputs_hash

    monkeypatch.setenv("CALIBDCD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    text = (REPO / "configs" / "lab-micro.yaml").read_text()
    p = tmp_path / "lab.yaml"
    p.write_text(text + f"\ncache_dir: {tmp_path / 'c'}\n")
    cfg = load_config(p)
    ref = cfg.labs["micro"]
    assert ref.key.startswith("micro-s0-") and not ref.built and "/" not in ref.key
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    for p in plan.grid[:4]:
        assert inputs_hash(p, ctx) == f"lab-not-built:{ref.key}"
    assert not (tmp_path / "cache" / "lab").exists() and not (tmp_path / "c" / "lab").exists()


def test_a_lab_reference_names_its_build_seed(tmp_path, monkeypatch):
    from calibdcd.experiment.config import lab_spec

    assert lab_spec("micro") == ("micro", 0) and lab_spec("micro@2") == ("micro", 2)
    with pytest.raises(ValueError, match="expected <preset> or <preset>@<seed>"):
        lab_spec("micro@x")
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    refs = {}
    for spec in ("micro", "micro@0", "micro@2"):
        cfg = parse_config(
            {
                "benchmarks": [{"name": "lab", "lab": spec, "path": "ground_truth.jsonl"}],
                "targets": [{"name": "chat", "backend": "hf", "lab": spec, "model": "chat-qwen"}],
                "detectors": [
                    {
                        "name": "dpdllm",
                        "options": {"reference": {"model_path": f"lab-clean-reference:{spec}"}},
                    }
                ],
                "cache_dir": str(tmp_path / "cache"),
            }
        )
        assert list(cfg.labs) == [spec]
        refs[spec] = cfg.labs[spec]
    assert refs["micro"].key == refs["micro@0"].key
    assert refs["micro@2"].key.startswith("micro-s2-") and refs["micro@2"].seed == 2
    assert refs["micro@2"].key.split("-")[-1] != refs["micro"].key.split("-")[-1]
    assert not (tmp_path / "cache" / "lab").exists()
    with pytest.raises(ValueError, match="unknown lab preset 'nope'"):
        parse_config(
            {
                "benchmarks": [{"name": "lab", "lab": "nope@1", "path": "ground_truth.jsonl"}],
                "targets": [{"name": "chat", "backend": "hf", "lab": "nope@1", "model": "x"}],
                "detectors": ["overlap"],
            }
        )


def test_a_lab_spec_resolves_in_one_place_for_the_config_and_the_run(tmp_path, monkeypatch):
    """The config's LabRef and the run's resolve_lab are one resolver (they were two): they
    name the same directory, a prebuilt copy is looked for at every call (the cached
    resolution of the lab's key does not hide a copy that appears later), and a spec neither
    can resolve is the same message from both."""
    from calibdcd.experiment.config import resolve_lab_ref
    from calibdcd.experiment.labs import resolve_lab
    from experiment_support import lab_micro

    monkeypatch.setenv("CALIBDCD_LAB_ROOT", str(tmp_path / "labs"))
    cache = tmp_path / "c"
    ref = resolve_lab_ref("micro", cache_dir=cache)
    assert not ref.prebuilt and not ref.built and ref.directory.startswith(str(cache / "lab"))
    assert resolve_lab("micro", build=False, root=cache) is None
    (tmp_path / "labs").mkdir()
    (tmp_path / "labs" / "lab-micro").symlink_to(lab_micro(), target_is_directory=True)
    ref = resolve_lab_ref("micro", cache_dir=cache)
    assert ref.prebuilt and ref.built and ref.key.startswith("micro-prebuilt-")
    for build in (False, True):  # used as it is, never built
        assert resolve_lab("micro", build=build, root=cache) == tmp_path / "labs" / "lab-micro"
    assert not (cache / "lab").exists()
    assert resolve_lab_ref("nope@1", cache_dir=cache).startswith("unknown lab preset 'nope'")
    assert resolve_lab("nope@1", build=False, root=cache) is None
    with pytest.raises(ValueError, match="unknown lab preset 'nope'"):
        resolve_lab("nope@1", root=cache)


def test_hashing_with_the_lab_built_trains_no_clean_reference(tmp_path, monkeypatch):
    """The lab is built, DPDLLM's clean reference LM is not: checking a stored result's inputs
    names the missing reference instead of training it (minutes of CPU on the micro lab)."""
    from calibdcd.experiment import RunContext, resolve
    from calibdcd.experiment.resources import inputs_hash
    from experiment_support import lab_micro

    labs = tmp_path / "labs"
    labs.mkdir()
    (labs / "lab-micro").symlink_to(lab_micro(), target_is_directory=True)
    monkeypatch.setenv("CALIBDCD_LAB_ROOT", str(labs))
    p = tmp_path / "lab.yaml"
    p.write_text((REPO / "configs" / "lab-micro.yaml").read_text() + "\ncache_dir: c\n")
    cfg = load_config(p)
    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    hashes = {p.setting.detector.label: inputs_hash(p, ctx) for p in plan.grid if p.seed == 0}
    assert hashes["DPDLLM"].startswith("reference-not-built:lab-clean-reference:micro=")
    assert len(hashes["Overlap"]) == 16 and ":" not in hashes["Overlap"]  # a real hash
    assert not (tmp_path / "c" / "dpdllm-lab-reference").exists()


def test_safetensors_integrity_from_the_header(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    f = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((4, 8), dtype=np.float32), "b": np.ones(3, dtype=np.float32)}, f)
    assert safetensors_problem(f) is None
    os.truncate(f, f.stat().st_size - 5)
    assert "truncated safetensors file" in safetensors_problem(f)
    (tmp_path / "x.safetensors").write_bytes(b"\x10\x00")
    assert "no header" in safetensors_problem(tmp_path / "x.safetensors")


def test_dry_run_reports_config_options_split_and_damaged_weights_together(tmp_path):
    """Several kinds at once: a config error with its line, an unknown target option, a split
    too small for the protocol, and a truncated local model.safetensors."""
    from experiment_support import lab_micro

    lab = lab_micro()
    ckpt = tmp_path / "base"
    ckpt.mkdir()
    for f in (lab / "base").iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    w = ckpt / "model.safetensors"
    os.truncate(w, w.stat().st_size - 100)
    rows = (lab / "ground_truth.jsonl").read_text().splitlines()
    members = [r for r in rows if json.loads(r)["label"] == 1][:52]
    non_members = [r for r in rows if json.loads(r)["label"] == 0][:52]
    (tmp_path / "small.jsonl").write_text("\n".join(members + non_members) + "\n")
    p = tmp_path / "c.yaml"
    p.write_text(
        "benchmarks: [{name: lab, path: small.jsonl}]\n"
        "targets:\n"
        "  - {name: m, backend: hf, model: ./base, options: {device: cpu}}\n"
        "  - {name: r, backend: openai, model: m, family: qwen2.5,\n"
        "     options: {base_url: 'http://127.0.0.1:9/v1', concurrancy: 4}}\n"
        "detectors: [overlap]\n"
        f"cache_dir: {tmp_path / 'cache'}\n"
    )
    cfg, problems = read_config(p)
    assert cfg is not None  # an option problem does not stop the other checks
    assert [(q.path, q.line) for q in problems] == [("targets[1].options.concurrancy", 5)]

    # through the CLI: every kind in one report
    from experiment_support import calibdcd_cli

    out = calibdcd_cli("run", str(p), "--dry-run")
    assert out.returncode == 1, out.stderr
    err = out.stderr
    assert f"{p}:5: targets[1].options.concurrancy" in err and "did you mean 'concurrency'" in err
    assert "calibration non-member(s); CalibDCD needs at least 2" in err
    assert "targets[0] (m).model:" in err and "truncated safetensors file" in err
    # target r is not asked for its models until its options are right
    assert "cannot reach" not in err
    assert "dry run: 3 problem(s)" in err


def _result(**over):
    est = {"estimate": 0.6, "low": 0.5, "high": 0.7, "level": 0.95, "n_boot": 50}
    r = {
        "id": "b__t__d__s0", "setting_hash": "h", "inputs_hash": "i", "benchmark": "b",
        "target": "t", "detector": "d", "seed": 0,
        "sizes": {"supervised": [100, 50], "calibration": [50, 0], "evaluation": [200, 100]},
        "before": {"auc": est, "tpr": est}, "after": {"auc": est, "tpr": est},
        "calibration": {"rank": 3}, "future_field": [1, 2],
    }  # fmt: skip
    r.update(over)
    return r


def test_result_json_is_typed_versioned_and_reads_version_0(tmp_path):
    from calibdcd.results import (
        RESULT_SCHEMA_VERSION,
        ResultError,
        parse_result,
        read_result,
        write_result,
    )

    p = tmp_path / "result.json"
    write_result(p, parse_result(_result(schema_version=RESULT_SCHEMA_VERSION)))
    stored = json.loads(p.read_text())
    assert stored["schema_version"] == RESULT_SCHEMA_VERSION and stored["future_field"] == [1, 2]
    r = read_result(p)
    assert r.before.auc.estimate == 0.6 and r.sizes.evaluation == [200, 100] and not r.skipped
    assert r["after"]["tpr"]["low"] == 0.5  # still reads like the dict it replaces
    p.write_text(json.dumps(_result()))  # written before the version existed
    assert read_result(p).schema_version == 0
    p.write_text(json.dumps(_result(schema_version=RESULT_SCHEMA_VERSION + 1)))
    with pytest.raises(ResultError, match=rf"{p}: result schema version"):
        read_result(p)
    p.write_text(json.dumps(_result(before={"auc": {"estimate": "high"}})))
    with pytest.raises(ResultError, match=rf"{p}: not a valid result \(before.auc"):
        read_result(p)


def test_result_sections_are_typed_and_the_shipped_schema_is_current(tmp_path):
    """analyses/controls/paired are typed: a result whose section does not fit is refused when
    written (naming the field), and docs/result.schema.json is the schema the code exports."""
    from calibdcd.results import ResultError, parse_result, result_json_schema, write_result

    good = {
        "controls": {"placebo": {"auc": 0.61, "tpr": 0.1, "corrected": True, "rank": 3}},
        "paired": {
            "calibdcd_vs_original": {
                "auc": {"metric": "auc", "estimate": 0.01, "low": -0.02, "high": 0.04},
                "tpr": {"metric": "tpr", "estimate": 0.0, "low": -0.05, "high": 0.05},
            }
        },
        "analyses": {"fixed": {"auc": 0.6, "config": {"rank": 3, "strength": 0.9}}},
    }
    write_result(tmp_path / "ok.json", parse_result(_result(**good)))
    bad = {**good, "paired": {"x": {"auc": {"metric": "auc", "low": "wide"}}}}
    with pytest.raises(ResultError, match=r"does not fit its schema \(paired\.x\.auc\.low"):
        write_result(tmp_path / "bad.json", parse_result(_result(**bad)))
    shipped = json.loads((REPO / "docs" / "result.schema.json").read_text())
    assert shipped == result_json_schema(), "regenerate: calibdcd schema result > docs/..."
    props = shipped["properties"]
    assert {"analyses", "controls", "paired"} <= set(props)
    assert "PairedEstimate" in shipped["$defs"] and "MethodOutcome" in shipped["$defs"]


def test_dry_run_names_a_truncated_lab_checkpoint(tmp_path, monkeypatch):
    """A prebuilt lab whose base model.safetensors lost its tail: the dry run names the file
    (the run would fail only when loading it, after the other targets' work)."""
    from calibdcd.experiment import dry_run
    from experiment_support import lab_micro

    lab = lab_micro()
    copy = tmp_path / "lab-micro"
    for f in lab.rglob("*"):
        if f.is_file():
            dst = copy / f.relative_to(lab)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if f.relative_to(lab) == Path("base/model.safetensors"):
                dst.write_bytes(f.read_bytes()[:-64])
            else:
                dst.symlink_to(f)
    monkeypatch.setenv("CALIBDCD_LAB_ROOT", str(tmp_path))
    cfg = parse_config(
        {
            "benchmarks": [{"name": "lab", "lab": "micro", "path": "ground_truth.jsonl"}],
            "targets": [
                {"name": "chat", "backend": "hf", "lab": "micro", "model": "chat-qwen"},
                {"name": "base", "backend": "hf", "lab": "micro", "model": "base"},
            ],
            "detectors": ["overlap"],
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    assert cfg.labs["micro"].key.startswith("micro-prebuilt-")
    _, problems = dry_run(cfg)
    assert len(problems) == 1, problems
    assert problems[0].startswith("targets[1] (base).model: ")
    assert "base/model.safetensors: truncated safetensors file" in problems[0]


ONE_OF_EACH = """\
name: one-of-each
seeds: [0, -1]
calibration: {ranks: [0], strengths: [1.5], tau: 1.5}
split: {calibration_fraction: 1.5}
benchmarks:
  - {name: wiki, path: missing.jsonl}
  - {name: wikimai}
targets:
  - {name: served, backend: openaii, model: m, options: {base_url: "http://127.0.0.1:9/v1"}}
  - {name: qwen, backend: hf, model: Qwen/Qwen2.5-0.5B, family: qwen9}
  - {name: api, backend: openai, model: m, family: qwen2.5, options: {base_url: "not a url"}}
  - {name: typo, backend: openai, model: m, family: qwen2.5, options: {base_ur: "http://x/v1"}}
detectors:
  - {name: overlapp}
  - {name: veilprobe, preset: offical}
evaluation: {fpr: 2.0}
analyses: {blindd: true}
"""


def test_one_mistake_of_each_kind_is_reported_at_once_with_lines(tmp_path):
    """Schema, value, path, URL, option and name problems in one pass, each with its line and
    key path (an unknown family and a missing file included): before, a file like this reported
    six of them, and the rest only once those were fixed."""
    p = tmp_path / "bad.yaml"
    p.write_text(ONE_OF_EACH)
    cfg, problems = read_config(p)
    assert cfg is None
    got = {q.path: (q.line, q.problem) for q in problems}
    expected_lines = {
        "seeds[1]": 2,
        "calibration.ranks": 3,
        "calibration.strengths": 3,
        "calibration.tau": 3,
        "split.calibration_fraction": 4,
        "benchmarks[0].path": 6,
        "benchmarks[1].name": 7,
        "targets[0].backend": 9,
        "targets[1].family": 10,
        "targets[2].options.base_url": 11,
        "targets[3].options.base_ur": 12,
        "detectors[0].name": 14,
        "detectors[1].preset": 15,
        "evaluation.fpr": 16,
        "analyses.blindd": 17,
    }
    assert {k: v[0] for k, v in got.items()} == expected_lines, got
    assert (
        got["benchmarks[0].path"][1] == f"no such file or directory: {tmp_path / 'missing.jsonl'}"
    )
    assert "(did you mean 'wikimia'?)" in got["benchmarks[1].name"][1]
    assert "(did you mean 'openai'?)" in got["targets[0].backend"][1]
    assert "unknown chat family 'qwen9' (did you mean 'qwen2.5'?)" in got["targets[1].family"][1]
    assert "http(s) URL" in got["targets[2].options.base_url"][1]
    assert "(did you mean 'base_url'?)" in got["targets[3].options.base_ur"][1]
    assert "(did you mean 'overlap'?)" in got["detectors[0].name"][1]
    assert "must lie in (0, 1], got 1.5" in got["calibration.tau"][1]
    # the command line prints them all, each as file:line: key: problem
    from typer.testing import CliRunner

    from calibdcd.cli import app

    res = CliRunner().invoke(app, ["run", str(p), "--dry-run"])
    assert res.exit_code == 2
    assert f"dry run: {len(expected_lines)} problem(s)" in res.output
    assert f"{p}:10: targets[1].family: unknown chat family 'qwen9'" in res.output


@pytest.mark.parametrize(
    "name, n_settings",
    [
        ("lab-v2-lab2", 24),  # VeilProbe and DPDLLM on four targets, three seeds
        ("lab-v2-paper-lab2", 24),  # the same, re-run with the paper's CalibDCD (2026-11-27)
        # the full study on lab seed 0: three detectors, controls (2026-11-27), then six
        # gray-box ones and SaMIA resumed into the same run directory (2026-11-28)
        ("lab-v2-paper-lab0", 120),
        ("real-regime", 60),  # ten detectors on the real LM's base and chat, three seeds
        # WikiMIA-24 on SmolLM2 and Gemma-3, the paper's CalibDCD: three detectors (2026-11-27),
        # then five gray-box ones, ReCaLL and SaMIA resumed into the same run directory
        # (2026-11-28 and 29)
        ("real-wikimia24-paper", 60),
        # lab seed 1: DPDLLM with every control, six gray-box detectors, four targets (2026-11-28)
        ("lab-v2-lab1-dpdllm-controls", 84),
    ],
)
def test_a_stored_run_resolves_to_its_own_setting_hashes(tmp_path, name, n_settings, request):
    """The committed run directories (the lab-v2 study's lab seeds 0-2, the real-model regime
    study and WikiMIA-24 on two real LMs, written by earlier calibdcd commits): their
    config.yaml, read by today's code, gives the setting hashes their grid.json recorded, so a
    stored run stays complete and is never recomputed by a refactoring. No lab is built; a run
    that reads the shared benchmark copies skips without them."""
    import tarfile

    from calibdcd.experiment.plan import setting_hash

    tar = REPO / "benchmarks" / "results" / "runs" / f"{name}.tar.xz"
    with tarfile.open(tar) as fh:
        fh.extractall(tmp_path / "runs", filter="data")
    run = next(tmp_path.rglob("grid.json")).parent
    text = (run / "config.yaml").read_text()
    # the shared copies: a benchmark path, or the real-model lab's recipe (built from WikiMIA-24)
    if "../shared/" in text or "${CALIBDCD_SHARED}" in text or "lab: real-" in text:
        shared = request.getfixturevalue("shared_data_dir").parent  # skips when absent
        # a run names them relative to its own directory (runs/<run>/ -> ../../shared): put
        # them there, as on the machine it ran on
        (tmp_path / "shared").symlink_to(shared)
    stored = {r["id"]: r["setting_hash"] for r in json.loads((run / "grid.json").read_text())}
    cfg = load_config(run / "config.yaml")
    assert {s.id: setting_hash(s, cfg) for s in _grid(cfg)} == stored
    assert len(stored) == n_settings


def test_one_schema_is_the_file_as_validated_and_what_the_code_reads(tmp_path):
    """:class:`ExperimentConfig` is the YAML as validated: the split's sizes read as properties,
    relative paths made absolute, ``split.subsample`` in every benchmark, the name the file's
    stem; ``source`` and ``labs`` are set when loaded and are no keys of a file; ``as_dict``
    validates back into the same config."""
    from calibdcd.experiment.config import ExperimentConfig
    from calibdcd.options import suggestion

    known = sorted(k for k in ExperimentConfig.model_fields if k not in ("source", "labs"))
    (tmp_path / "d.jsonl").write_text("")
    p = tmp_path / "exp-1.yaml"
    p.write_text(
        "split: {subsample: all, n_calibration: 7, group_by: group, subsample_seed: 3}\n"
        "benchmarks: [{name: x, path: d.jsonl, subsample: 9}]\n"
        "targets: [{name: m, backend: hf, model: ./m, tokenizer: ./tok}]\n"
        "detectors: [overlap]\n"
        "cache_dir: c\n"
    )
    cfg = load_config(p)
    assert cfg.name == "exp-1" and cfg.source == str(p) and cfg.labs == {}
    assert (cfg.n_calibration, cfg.group_by, cfg.subsample_seed) == (7, "group", 3)
    assert (cfg.n_supervised_per_class, cfg.calibration_fraction, cfg.balance) == (50, 0.5, "equal")
    assert cfg.benchmarks[0].subsample is None and cfg.benchmarks[0].path == str(
        tmp_path / "d.jsonl"
    )
    assert cfg.targets[0].model == str(tmp_path / "m")
    assert cfg.targets[0].tokenizer == str(tmp_path / "tok")
    assert cfg.cache_dir == str(tmp_path / "c") and cfg.seeds == (0,)
    again = ExperimentConfig.model_validate(cfg.as_dict())  # split.subsample: in each benchmark
    assert again.as_dict() == cfg.as_dict() and again.benchmarks == cfg.benchmarks
    assert cfg.model_copy(update={"detector_seed": "fixed"}).detector_seed == "fixed"
    with pytest.raises(ValueError, match="frozen"):
        cfg.name = "other"  # type: ignore[misc]
    # set when loaded, never read from a file; a split's subsample is checked as a benchmark's
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "source: x.yaml\n"
        "split: {subsample: 1}\n"
        "benchmarks: [{name: x, path: d.jsonl}]\n"
        "targets: [{name: m, backend: hf, model: ./m}]\n"
        "detectors: [overlap]\n"
        "labs: {}\n"
    )
    cfg, problems = read_config(bad)
    assert cfg is None
    assert [(q.path, q.line, q.problem) for q in problems] == [
        ("source", 1, f"unknown key{suggestion('source', known)}"),
        ("split.subsample", 2, "must be 'paper', 'all' or an integer >= 2, got 1"),
        ("labs", 6, f"unknown key{suggestion('labs', known)}"),
    ]
    assert "source" not in known and "labs" not in known and "split" in known
