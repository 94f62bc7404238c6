"""The fitted detector on the micro lab: CLI fit/score round trip against the experiment run,
save/load, target identity, no pickle, and the statistics of the threshold and the set test.

The experiment run is the session's micro run (the overlap detector on the lab's chat-qwen,
``experiment_support.micro_run``); the fit reuses its generation cache and its split, so the
same texts get the same target outputs and the comparison checks everything after them.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import subprocess
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from calibdcd.fitted import FittedDetector, TargetMismatchError, target_record
from calibdcd.fitted.audit import (
    distribution_check,
    empirical_p_values,
    set_level_test,
    threshold_at,
)
from experiment_support import calibdcd_cli as _cli
from experiment_support import lab_micro, micro_run

SETTING = "lab__chat-qwen__Overlap__s0"


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """(run's cache dir, split.json, scores.csv rows, id -> text, id -> label)."""
    cfg_path, run_dir = micro_run(tmp_path_factory)
    setting = run_dir / "settings" / SETTING
    split = json.loads((setting / "split.json").read_text())
    with (setting / "scores.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    gt = [json.loads(x) for x in (lab_micro() / "ground_truth.jsonl").read_text().splitlines()]
    text = {g["id"]: g["text"] for g in gt}
    label = {g["id"]: int(g["label"]) for g in gt}
    return cfg_path.parent / "cache", split, rows, text, label


@pytest.fixture(scope="module")
def bundle(experiment, tmp_path_factory):
    """``calibdcd fit`` with the experiment's parts: its supervised split (same order), its
    calibration non-members, the pool's other non-members held out, its members as pool."""
    cache, split, _rows, text, label = experiment
    d = tmp_path_factory.mktemp("fit")
    cal = set(split["calibration"])  # the paper protocol draws them from the pool
    ev_nm = [i for i in split["evaluation"] if label[i] == 0 and i not in cal]
    ev_m = [i for i in split["evaluation"] if label[i] == 1]
    _jsonl(
        d / "supervised.jsonl", [{"text": text[i], "label": label[i]} for i in split["supervised"]]
    )
    _jsonl(d / "calibration.jsonl", [{"text": text[i]} for i in split["calibration"]])
    _jsonl(d / "heldout.jsonl", [{"text": text[i]} for i in ev_nm])
    _jsonl(d / "pool.jsonl", [{"text": text[i]} for i in ev_m])
    lab = lab_micro()
    (d / "fit.yaml").write_text(
        "target: {name: chat-qwen, backend: hf, model: " + str(lab / "chat-qwen") + ", "
        "options: {device: cpu, batch_size: 64}}\n"
        "detector: {name: overlap, options: {max_new_tokens: 16, positions: 8}}\n"
        "data: {supervised: supervised.jsonl, calibration: calibration.jsonl, "
        "heldout: heldout.jsonl, pool: pool.jsonl}\n"
        "calibdcd: true\nfpr: 0.05\nseed: 0\n"
        f"cache_dir: {cache}\n"
    )
    res = _cli("fit", str(d / "fit.yaml"), "--out", str(d / "bundle"), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    return d / "bundle"


@pytest.mark.slow
def test_cli_fit_score_round_trip_gives_the_experiment_scores(experiment, bundle, tmp_path):
    cache, _split, rows, text, _label = experiment
    ev = [r for r in rows if r["part"] == "evaluation"]
    _jsonl(tmp_path / "suspect.jsonl", [{"id": r["id"], "text": text[r["id"]]} for r in ev])
    out = tmp_path / "scores.jsonl"
    res = _cli(
        "score", str(bundle), str(tmp_path / "suspect.jsonl"), "--out", str(out),
        "--model", str(lab_micro() / "chat-qwen"), "--cache-dir", str(cache), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    summary, recs = lines[0], lines[1:]
    assert summary["kind"] == "summary" and len(recs) == len(ev)
    got = np.array([r["score"] for r in recs])
    want = np.array([float(r["score_after"]) for r in ev])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert [r["id"] for r in recs] == [r["id"] for r in ev]
    # p-values and decisions follow the bundle's held-out null
    fitted = FittedDetector.load(bundle)
    np.testing.assert_allclose([r["p_value"] for r in recs], empirical_p_values(got, fitted.null))
    assert [r["member"] for r in recs] == list(got > fitted.threshold)
    # the pool has members: the set is more member-like than the held-out non-members
    assert summary["set_test"]["reject"] is True
    assert summary["distribution_check"]["folds"] >= 2


def _files(root: Path) -> dict[str, object]:
    """Every file of a bundle: bytes, or for ``.npz`` its arrays (zip entries carry times)."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as f:
                out[str(p.relative_to(root))] = {k: f[k].tobytes() for k in f.files}
        else:
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.mark.slow
def test_save_load_round_trip_keeps_every_part(bundle, experiment, tmp_path):
    _cache, _split, _rows, _text, _label = experiment
    fitted = FittedDetector.load(bundle)
    fitted.save(tmp_path / "again")
    assert _files(tmp_path / "again") == _files(bundle)
    again = FittedDetector.load(tmp_path / "again")
    z = np.random.default_rng(0).normal(
        size=(20, sum(s.stop - s.start for s in fitted.blocks.values()))
    )
    np.testing.assert_array_equal(again.score_features(z), fitted.score_features(z))
    np.testing.assert_array_equal(again.null, fitted.null)
    assert again.threshold == fitted.threshold
    a, b = again.scorer.calibration, fitted.scorer.calibration
    assert a is not None and b is not None
    np.testing.assert_array_equal(a.basis, b.basis)
    assert a.summary() == b.summary()
    head = json.loads((bundle / "bundle.json").read_text())
    assert head["format_version"] == 1 and head["views"] and head["feature_blocks"]
    # the decoding of the detector's queries (Overlap names it, its features do not carry it)
    rec = head["generation"]["continuation"]
    assert rec["requested"]["temperature"] == 0.0 and rec["used"]["max_new_tokens"] == 16
    assert not any(os.path.isabs(str(v)) for v in _strings(head)), "absolute path in bundle.json"


def _strings(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


@pytest.mark.slow
def test_no_pickle_anywhere_in_a_bundle(bundle):
    for path in bundle.rglob("*"):
        if not path.is_file():
            continue
        assert path.suffix in {".json", ".npz", ".safetensors", ".txt", ".jinja"}, path
        raw = path.read_bytes()
        assert not raw.startswith(b"\x80"), f"{path} looks like a pickle"
        if path.suffix == ".npz":
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    with zf.open(name) as member:
                        assert b"\x80" not in member.read(12)[:1], f"{path}:{name}"
            with np.load(path, allow_pickle=False) as f:
                for k in f.files:
                    assert f[k].dtype != object, f"{path}:{k}"


@pytest.mark.slow
def test_load_checks_the_target_identity(bundle):
    lab = lab_micro()
    head = json.loads((bundle / "bundle.json").read_text())
    same = target_record("hf", str(lab / "chat-qwen"), options={"device": "cpu"})
    FittedDetector.load(bundle, target=same)  # same checkpoint: fine
    other = target_record("hf", str(lab / "chat-llama"), options={"device": "cpu"})
    with pytest.raises(TargetMismatchError, match="content"):
        FittedDetector.load(bundle, target=other)
    with pytest.warns(RuntimeWarning, match="dtype"):
        FittedDetector.load(bundle, target={**same, "options": {"dtype": "bfloat16"}})
    # other package versions (a bundle written elsewhere, its digest its own): a warning
    from calibdcd.fitted.detector import _header_digest

    head2 = dict(head, versions={**head["versions"], "numpy": "0.0.1"})
    head2["header_sha256"] = _header_digest(head2)
    tmp = bundle.parent / "versions"
    import shutil

    shutil.copytree(bundle, tmp, dirs_exist_ok=True)
    (tmp / "bundle.json").write_text(json.dumps(head2))
    with pytest.warns(RuntimeWarning, match="numpy 0.0.1"):
        FittedDetector.load(tmp)


# --------------------------------------------------------------------------------------------
# Statistics (on the experiment run's stored scores: no target queries)
# --------------------------------------------------------------------------------------------


def _nonmember_scores(experiment) -> np.ndarray:
    """Original-detector scores of every non-member outside the supervised split: the
    classifier never saw them, so they are exchangeable."""
    _, _, rows, _, _ = experiment
    return np.array(
        [float(r["score_before"]) for r in rows if r["label"] == "0" and r["part"] != "supervised"]
    )


def test_p_values_and_threshold_are_the_conformal_ones():
    null = np.array([0.1, 0.4, 0.4, 0.9, 1.5])
    p = empirical_p_values(np.array([2.0, 0.4, 0.0, np.nan]), null)
    np.testing.assert_allclose(p[:3], [1 / 6, 5 / 6, 1.0])
    assert np.isnan(p[3])
    assert threshold_at(null, 0.05) == math.inf  # 5 null scores cannot resolve 5 %
    assert threshold_at(null, 1 / 3) == 0.9  # floor(6 / 3) = 2 -> the 2nd largest
    s = np.linspace(-1, 3, 50)
    assert np.array_equal(s > threshold_at(null, 1 / 3), empirical_p_values(s, null) <= 1 / 3)


@pytest.mark.slow
def test_set_level_test_rejects_at_most_alpha_of_random_nonmember_subsets(experiment):
    scores = _nonmember_scores(experiment)
    assert scores.size >= 60
    rng = np.random.default_rng(14)
    alpha, k, rejections = 0.05, 20, 0
    for _ in range(100):
        perm = rng.permutation(scores.size)
        suspect, null = scores[perm[:k]], scores[perm[k:]]
        rejections += set_level_test(suspect, null, alpha=alpha).reject
    # Binomial(100, 0.05): P(X > 10) < 1.2 %
    assert rejections <= 10, rejections


@pytest.mark.slow
def test_fpr_at_the_threshold_on_fresh_nonmembers(experiment):
    """Random held-out / fresh partitions of the non-members: the FPR at the threshold averages
    to floor(fpr (n + 1)) / (n + 1) ≤ fpr (here ~4 %)."""
    scores = _nonmember_scores(experiment)
    rng = np.random.default_rng(3)
    fpr, fprs = 0.05, []
    n_null = scores.size // 2
    for _ in range(300):
        perm = rng.permutation(scores.size)
        null, fresh = scores[perm[:n_null]], scores[perm[n_null:]]
        fprs.append(float(np.mean(fresh > threshold_at(null, fpr))))
    mean = float(np.mean(fprs))
    expected = math.floor(fpr * (n_null + 1)) / (n_null + 1)
    assert mean <= fpr + 0.01
    assert abs(mean - expected) < 0.02, (mean, expected)


def test_distribution_check_flags_different_texts_and_not_same_ones():
    rng = np.random.default_rng(0)
    words_a = "the model was trained on this corpus of python documentation pages".split()
    words_b = "a recipe for bread needs flour water salt yeast and patience".split()

    def texts(words, n):
        return [" ".join(rng.choice(words, 12)) for _ in range(n)]

    far = distribution_check(texts(words_a, 30), texts(words_b, 30), n_boot=200)
    assert far.differ and far.auc > 0.95 and "differ as texts" in (far.warning or "")
    near = distribution_check(texts(words_a, 30), texts(words_a, 30), n_boot=200)
    assert not near.differ and near.warning is None


def test_fit_reads_a_file_of_texts_as_score_and_a_run_do(tmp_path):
    """fit's data files took only a `text` column while `score` and a run's benchmark try
    `text`, `input`, `snippet` (a WikiMIA-style `input` file failed fit only): one default."""
    from calibdcd.data import load_texts
    from calibdcd.experiment.fit_config import load_fit_config
    from calibdcd.fitted_cli import _fit_texts

    for name, label in (("m.jsonl", 1), ("n.jsonl", 0)):
        rows = [{"input": f"{name} text {i}", "label": label} for i in range(30)]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = tmp_path / "fit.yaml"
    p.write_text(
        "target: {backend: hf, model: x}\ndetector: {name: overlap}\n"
        "data: {members: m.jsonl, nonmembers: n.jsonl}\n"
    )
    texts = _fit_texts(load_fit_config(p), tmp_path)
    assert len(texts.supervised) + len(texts.calibration) + len(texts.heldout) == 60
    assert set(texts.supervised) <= set(load_texts(tmp_path / "m.jsonl").texts) | set(
        load_texts(tmp_path / "n.jsonl").texts
    )
    (tmp_path / "both.jsonl").write_text(
        (tmp_path / "m.jsonl").read_text() + (tmp_path / "n.jsonl").read_text()
    )
    p.write_text(
        p.read_text().replace("{members: m.jsonl, nonmembers: n.jsonl}", "{path: both.jsonl}")
    )
    assert len(_fit_texts(load_fit_config(p), tmp_path).labels) > 0


def test_max_members_draws_with_the_one_splitting_primitive():
    """fit's max_members / max_nonmembers draw (it was hand-rolled beside the protocol's
    stratified_draw): a seeded draw of each, order kept, a short list kept whole, and the
    members' draw unchanged by the non-members' cap (members are drawn first)."""
    from calibdcd.fitted_cli import _at_most

    members = [f"m{i}" for i in range(50)]
    nonmembers = [f"n{i}" for i in range(40)]
    m, n = _at_most(members, nonmembers, 10, 100, seed=3)
    assert len(m) == 10 and n == nonmembers and m == sorted(m, key=members.index)
    assert _at_most(members, nonmembers, 10, 100, seed=3) == (m, n)
    assert _at_most(members, nonmembers, 10, 5, seed=3)[0] == m
    assert _at_most(members, nonmembers, 10, 100, seed=4)[0] != m
    assert _at_most(members, nonmembers, None, None, seed=3) == (members, nonmembers)


def test_a_fit_configs_local_model_is_read_against_its_directory(tmp_path, monkeypatch):
    """A fit config's data files were read against its directory but its local model and
    tokenizer against the working directory: both now as a run config's targets are."""
    from calibdcd.experiment.fit_config import load_fit_config

    (tmp_path / "configs").mkdir()
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "configs" / "fit.yaml"
    p.write_text(
        "target: {backend: hf, model: ./ckpt, tokenizer: ../tok}\ndetector: {name: overlap}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    cfg = load_fit_config(p)
    assert cfg.target.model == str(tmp_path / "configs" / "ckpt")
    assert cfg.target.tokenizer == str(tmp_path / "tok")
    assert cfg.resolve(cfg.data.members) == tmp_path / "configs" / "m.txt"
    p.write_text(p.read_text().replace("./ckpt, tokenizer: ../tok", "Qwen/Qwen2.5-0.5B"))
    assert load_fit_config(p).target.model == "Qwen/Qwen2.5-0.5B"  # a hub id as written


def test_fit_dry_run_checks_the_targets_model_as_the_runs_dry_run_does(tmp_path):
    """fit --dry-run said OK for a lab model the lab does not have (the fit then failed after
    building the lab and reading the texts): it checks the target where the run's dry run
    does (target_where), and its models with the run's check (dry_run_models)."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    (tmp_path / "m.txt").write_text("".join(f"member text {i}\n" for i in range(30)))
    (tmp_path / "n.txt").write_text("".join(f"other text {i}\n" for i in range(30)))
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(
        "target: {backend: hf, lab: micro, model: chat-qwne}\ndetector: {name: overlap}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    res = CliRunner().invoke(app, ["fit", str(cfg), "--dry-run", "-o", str(tmp_path / "b")])
    assert res.exit_code == 1, res.output
    assert "target.model: " in res.output and "chat-qwne" in res.output, res.output
    assert "dry run: OK" not in res.output


def test_fit_config_reports_every_problem_with_its_line(tmp_path):
    from calibdcd.experiment.fit_config import load_fit_config

    p = tmp_path / "fit.yaml"
    p.write_text(
        "target: {backend: hf}\n"
        "detector: {name: overlap, typo: 1}\n"
        "data: {lab: micro, members: m.txt}\n"
        "fpr: 2\n"
        "mode: sometimes\n"
    )
    with pytest.raises(ValueError) as err:
        load_fit_config(p)
    msg = str(err.value)
    assert "5 problems" in msg
    for key, line in (("target.model", 1), ("detector.typo", 2), ("data", 3), ("fpr", 4),
                      ("mode", 5)):  # fmt: skip
        assert f"fit.yaml:{line}: {key}" in msg, msg


def test_a_fit_config_checks_calibdcd_and_its_labs_as_a_run_config_does(tmp_path):
    """A mistyped CalibDCD setting was a TypeError once the fit had built its lab and target,
    and an unknown lab passed the dry run as "not built yet": both are config problems now,
    with their lines, in the run config's words."""
    from calibdcd.experiment.fit_config import load_fit_config

    p = tmp_path / "fit.yaml"
    p.write_text(
        "target: {backend: hf, lab: mikro, model: chat-qwen}\n"
        "detector: {name: overlap}\n"
        "data: {lab: mikro@1}\n"
        "calibdcd: {rankz: [3], tau: 2}\n"
    )
    with pytest.raises(ValueError) as err:
        load_fit_config(p)
    msg = str(err.value)
    assert "fit.yaml:1: target.lab: unknown lab preset 'mikro'" in msg, msg
    assert "fit.yaml:3: data.lab: unknown lab preset 'mikro'" in msg, msg
    assert "fit.yaml:4: calibdcd.rankz: unknown key (did you mean 'ranks'?)" in msg, msg
    assert "fit.yaml:4: calibdcd.tau:" in msg, msg


def test_fit_config_reads_like_a_run_config_every_problem_at_once(tmp_path, monkeypatch):
    """${VAR} expansion (unset ones reported), the target's backend options and the detector's
    options are checked with the run configs' reader: all problems at once, each with its
    line; a good file with ${VAR} loads with the variables expanded."""
    from calibdcd.experiment.config import ConfigError
    from calibdcd.experiment.fit_config import load_fit_config

    monkeypatch.delenv("CALIBDCD_UNSET_URL", raising=False)
    p = tmp_path / "fit.yaml"
    p.write_text(
        "target:\n"
        "  backend: openai\n"
        "  model: m\n"
        "  options: {base_url: '${CALIBDCD_UNSET_URL}', concurrencyy: 4}\n"
        "detector: {name: overlap, options: {max_new_tokenz: 4}}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_fit_config(p)
    msg = str(err.value)
    assert "3 problems" in msg, msg
    assert "fit.yaml:4: target.options.base_url: environment variable CALIBDCD_UNSET_URL" in msg
    assert "fit.yaml:4: target.options.concurrencyy" in msg
    assert "fit.yaml:5: detector.options.max_new_tokenz: unknown field" in msg
    monkeypatch.setenv("CALIBDCD_UNSET_URL", "http://127.0.0.1:9/v1")
    p.write_text(p.read_text().replace("concurrencyy", "concurrency").replace("tokenz", "tokens"))
    cfg = load_fit_config(p)
    assert cfg.target.options["base_url"] == "http://127.0.0.1:9/v1"


def test_fit_texts_keep_the_held_out_part_disjoint():
    from calibdcd.fitted import FitTexts

    members = [f"member text {i}" for i in range(30)]
    nonmembers = [f"other text {i}" for i in range(50)]
    t = FitTexts.split(members, nonmembers, heldout_fraction=0.3, calibration_fraction=0.3)
    assert len(t.heldout) == 15 and len(t.calibration) == 15
    assert not set(t.heldout) & (set(t.supervised) | set(t.calibration))
    assert set(t.heldout).isdisjoint(t.fit_pool("inductive"))
    assert set(t.heldout) <= set(t.fit_pool("transductive"))
    with pytest.raises(ValueError, match="disjoint"):
        FitTexts(t.supervised, t.labels, t.calibration, (*t.heldout, t.calibration[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FitTexts.split(members, nonmembers, seed=1)


# --------------------------------------------------------------------------------------------
# Learnt parts travel in the bundle
# --------------------------------------------------------------------------------------------


def _learnt_detector(name: str, cache: Path):
    from calibdcd.experiment.labs import resolve_lab_refs

    if name == "veilprobe":
        from calibdcd.detectors.veilprobe import VeilProbe
        from veilprobe_support import fast_config

        return VeilProbe(fast_config(cache / "veilprobe")), None
    from calibdcd.detectors.registry import create_detector

    options = {
        "length": 32,
        "progress": False,
        "reference": {"model_path": "lab-clean-reference:micro", "epochs": 1,
                      "learning_rate": 0.001, "cache_dir": str(cache / "reference")},
    }  # fmt: skip
    spec = {"name": "dpdllm", "preset": None, "options": options, "benchmark": "lab"}
    return create_detector("dpdllm", options=resolve_lab_refs(options)), spec


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dpdllm", "veilprobe"])
def test_inductive_bundle_scores_with_its_saved_learnt_parts(name, tmp_path):
    """Fit (no CalibDCD: the learnt parts are the point), save, load and score new texts with a
    detector whose own cache is empty: the scores equal the in-process ones and nothing is
    trained again (the bundle's mapping model / reference LM is used)."""
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import build_target
    from calibdcd.fitted import FitTexts, fit_detector

    lab = lab_micro()
    gt = [json.loads(x) for x in (lab / "ground_truth.jsonl").read_text().splitlines()]
    mem = [g["text"] for g in gt if g["label"] == 1][:50]
    non = [g["text"] for g in gt if g["label"] == 0][:50]
    texts = FitTexts(  # 20 per class: VeilProbe's ProtoNet episodes need them
        supervised=tuple(mem[:20] + non[:20]),
        labels=(1,) * 20 + (0,) * 20,
        heldout=tuple(non[20:40]),
    )
    new = mem[40:46] + non[44:50]
    entry = TargetEntry(name="chat-qwen", backend="hf", model=str(lab / "chat-qwen"),
                        options={"device": "cpu", "batch_size": 64})  # fmt: skip
    target = build_target(entry, tmp_path / "generations.sqlite")
    det, spec = _learnt_detector(name, tmp_path / "fit-cache")
    fitted = fit_detector(det, target, texts, mode="inductive", detector_spec=spec)
    # VeilProbe's cpu preset trains its proxy and masked LM on the pool too: they travel
    want = {"reference"} if name == "dpdllm" else {"mapping", "proxy", "masked_lm"}
    assert set(fitted.learnt) == want
    direct = fitted.score(new, target, det, check_distribution=False).scores
    fitted.save(tmp_path / "bundle")
    loaded = FittedDetector.load(tmp_path / "bundle")
    fresh_cache = tmp_path / "fresh-cache"
    det2, _ = _learnt_detector(name, fresh_cache)
    res = loaded.score(new, target, det2, check_distribution=False)
    np.testing.assert_allclose(res.scores, direct, rtol=1e-6, atol=1e-9)
    for kind in ("mapping", "proxy", "mlm"):  # no mapping model, proxy or masked LM trained
        assert not (fresh_cache / "veilprobe" / kind).exists(), kind
    assert not (fresh_cache / "reference").exists()  # no reference LM fine-tuned


def test_register_detector_makes_a_detector_buildable_by_name(request, tmp_path):
    from calibdcd.detectors import registry
    from calibdcd.detectors.base import (
        NormalizedClassifier,
        PersistableClassifier,
        PoolTrained,
        ReferenceTrained,
        Timed,
    )
    from calibdcd.detectors.overlap import ContinuationOverlap, OverlapConfig
    from calibdcd.detectors.registry import (
        create_detector,
        register_detector,
        registered_detectors,
    )
    from calibdcd.experiment.config import DetectorEntry
    from calibdcd.experiment.detector_entries import DETECTORS, detector_available, plan_detector

    built = []

    def factory(preset, options, benchmark, cache_dir):
        built.append((preset, dict(options), benchmark))
        return ContinuationOverlap(OverlapConfig(positions=int(options.get("positions", 4))))

    register_detector("overlap-test", factory, description="a test detector", replace=True)
    request.addfinalizer(lambda: registry._FACTORIES.pop("overlap-test", None))
    assert "overlap-test" in registered_detectors() and "overlap-test" in DETECTORS
    assert detector_available("overlap-test")
    det = plan_detector(
        DetectorEntry(name="overlap-test", options={"positions": 3}), "lab", 0, "."
    ).build()
    assert det.config.positions == 3 and built[-1] == (None, {"positions": 3}, "lab")
    assert create_detector("overlap-test").config.positions == 4
    with pytest.raises(ValueError, match="already registered"):
        register_detector("overlap-test", factory)
    # parameters apart from construction: params gives the config, nothing is built for it
    from calibdcd.detectors.registry import create_detector_config

    assert create_detector_config("overlap-test", options={"positions": 5}).positions == 5
    n_built = len(built)
    register_detector(
        "overlap-test",
        params=lambda p, o, b, c: OverlapConfig(positions=int(o.get("positions", 4))),
        build=ContinuationOverlap,
        replace=True,
    )
    assert create_detector_config("overlap-test", options={"positions": 6}).positions == 6
    assert create_detector("overlap-test", options={"positions": 2}).config.positions == 2
    assert len(built) == n_built  # the factory registered before is gone
    # fit and score plan it as a run does: a detector registered without bars is given no
    # `progress` option (fit wrote one into every detector's options, which a strict config
    # refused: the built-ins each dropped it by hand)
    from calibdcd.fitted_cli import _planned_detector
    from calibdcd.options import replace_nested

    register_detector(
        "overlap-test",
        params=lambda p, o, b, c: replace_nested(OverlapConfig(), dict(o)),
        build=ContinuationOverlap,
        replace=True,
    )
    spec = {"name": "overlap-test", "options": {"positions": 5}}
    for progress in (True, False, None):
        det = _planned_detector(spec, tmp_path, progress).build(progress=progress)
        assert det.config.positions == 5
    with pytest.raises(ValueError, match="give a factory, or both params and build"):
        register_detector("overlap-test", params=lambda *a: None, replace=True)
    with pytest.raises(ValueError, match="not both"):
        register_detector("overlap-test", factory, params=lambda *a: None, replace=True)
    # a build that needs a package not installed: the config check leaves it to the dry run
    from calibdcd.experiment.detector_entries import detector_entry_problems

    def missing(config):
        raise ModuleNotFoundError("No module named 'some_extra'")

    register_detector(
        "overlap-test",
        params=lambda p, o, b, c: OverlapConfig(positions=int(o.get("positions", 4))),
        build=missing,
        replace=True,
    )
    entry = DetectorEntry(name="overlap-test", options={"positions": 3})
    assert detector_entry_problems(entry, {}) == []
    with pytest.raises(ValueError, match="unknown detector 'nope'; known: dpdllm"):
        create_detector("nope")
    # the built-ins declare their capabilities (no signature probing)
    vp = create_detector("veilprobe", preset="cpu", cache_dir=".")
    dp = create_detector("dpdllm", benchmark="lab")
    ov = create_detector("overlap")
    assert (
        isinstance(vp, PoolTrained)
        and isinstance(vp, Timed)
        and not isinstance(vp, ReferenceTrained)
    )
    assert isinstance(dp, ReferenceTrained) and not isinstance(dp, PoolTrained)
    assert not isinstance(ov, (PoolTrained, ReferenceTrained, Timed))
    for clf in (vp.new_classifier(), ov.new_classifier()):
        assert isinstance(clf, NormalizedClassifier) and isinstance(clf, PersistableClassifier)
    assert isinstance(dp.new_classifier(), PersistableClassifier)
    assert not isinstance(dp.new_classifier(), NormalizedClassifier)


def test_a_held_out_count_that_wastes_the_fpr_budget_is_named():
    """⌊fpr·(n+1)⌋/(n+1) is what a conformal threshold spends: 37 held-out scores at 5 % spend
    2.6 % (measured on DPDLLM, where missing features left 33-39 of 40 held-out texts), and the
    warning names the count that spends all of it."""
    from calibdcd.fitted.detector import _warn_fpr_budget, achievable_fpr

    assert achievable_fpr(39, 0.05) == pytest.approx(0.05)
    assert achievable_fpr(37, 0.05) == pytest.approx(1 / 38)
    assert achievable_fpr(198, 0.01) == pytest.approx(1 / 199)
    with pytest.warns(RuntimeWarning, match=r"37 held-out non-members \(3 had no finite"
                      r" features\).*2\.6%.*39 held-out"):  # fmt: skip
        _warn_fpr_budget(37, 40, 0.05)
    with pytest.warns(RuntimeWarning, match="199 held-out"):
        _warn_fpr_budget(150, 150, 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_fpr_budget(39, 40, 0.05)  # the whole budget: silent
        _warn_fpr_budget(40, 40, 0.05)  # 4.9 %: close enough, silent


def test_bundle_digests_refuse_an_edited_header_or_file(tmp_path):
    """Every file and setting of a bundle is covered by a digest: an edited ``fpr`` or a
    replaced ``null.npz`` is refused, naming the file (here on a hand-made bundle directory;
    the slow test below does it on a real fitted bundle)."""
    from calibdcd.fitted.detector import (
        BUNDLE,
        BundleIntegrityError,
        _check_integrity,
        _file_digests,
        _header_digest,
        read_bundle_header,
    )

    d = tmp_path / "b"
    d.mkdir()
    np.savez(d / "null.npz", scores=np.arange(5.0))
    (d / "learnt").mkdir()
    (d / "learnt" / "part.json").write_text("{}")
    header = {"format_version": 1, "fpr": 0.05, "files_sha256": _file_digests(d)}
    header["header_sha256"] = _header_digest(header)
    (d / BUNDLE).write_text(json.dumps(header))
    assert set(header["files_sha256"]) == {"null.npz", "learnt/part.json"}
    _check_integrity(d, read_bundle_header(d))  # untouched: fine
    np.savez(d / "null.npz", scores=np.arange(5.0) + 1)  # other valid values
    with pytest.raises(BundleIntegrityError, match=r"null\.npz: changed after the fit"):
        _check_integrity(d, read_bundle_header(d))
    np.savez(d / "null.npz", scores=np.arange(5.0))
    (d / BUNDLE).write_text(json.dumps({**header, "fpr": 2.0}))
    with pytest.raises(BundleIntegrityError, match=r"bundle\.json: changed after the fit"):
        read_bundle_header(d)
    (d / BUNDLE).write_text(json.dumps(header)[:-20])  # truncated
    with pytest.raises(BundleIntegrityError, match=r"bundle\.json: not valid JSON \(line 1"):
        read_bundle_header(d)
    (d / BUNDLE).write_text(json.dumps(header))
    (d / "learnt" / "part.json").unlink()
    with pytest.raises(BundleIntegrityError, match=r"part\.json: missing from the bundle"):
        _check_integrity(d, read_bundle_header(d))
    # a bundle with its digests removed cannot be told from an old one: refused unless asked
    bare = {k: v for k, v in header.items() if k not in ("files_sha256", "header_sha256")}
    (d / BUNDLE).write_text(json.dumps({**bare, "fpr": 2.0}))
    with pytest.raises(BundleIntegrityError, match=r"bundle\.json: carries no digests"):
        _check_integrity(d, read_bundle_header(d))
    with pytest.warns(RuntimeWarning, match="loaded unchecked"):
        _check_integrity(d, read_bundle_header(d), allow_unverified=True)


def test_suspect_files_fail_in_one_line_naming_file_and_line(tmp_path):
    from calibdcd.data import load_texts

    bad = tmp_path / "s.txt"
    bad.write_bytes(b"a fine line\nbad \xff\xfe bytes\n")
    with pytest.raises(ValueError, match=r"s\.txt, line 2: not valid UTF-8 \(byte 0xff at col"):
        load_texts(bad)
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match=r"e\.jsonl, line 1: no texts \(empty file"):
        load_texts(empty)
    with pytest.raises(FileNotFoundError, match=r"nope\.txt: no such file"):
        load_texts(tmp_path / "nope.txt")


def test_fit_texts_say_which_part_holds_a_text():
    from calibdcd.fitted import FitTexts

    ft = FitTexts(
        supervised=("s1", "s2"), labels=(1, 0), calibration=("c1",), heldout=("h1",),
        pool=("p1",),
    )  # fmt: skip
    # the unlabelled pool is not a labelled part: its texts count as new
    assert ft.part_of(["s2", "x", "h1", "c1", "p1"]) == [
        "supervised", None, "heldout", "calibration", None,
    ]  # fmt: skip


@pytest.mark.slow
def test_score_refuses_edited_bundles_and_counts_each_suspect_text_once(
    experiment, bundle, tmp_path
):
    """On a real fitted bundle: an edited fpr or a replaced null.npz is refused in one line;
    --alpha outside (0, 1) is refused; a suspect file holding each text twice gives the same
    set-level verdict and p-value as the single file, and texts of the fit's labelled parts are
    flagged and left out of the set test."""
    import shutil

    cache, split, rows, text, label = experiment
    model = str(lab_micro() / "chat-qwen")
    # the pool's members: the bundle's unlabelled pool, not one of its labelled parts
    ev = [r["id"] for r in rows if r["part"] == "evaluation" and label[r["id"]] == 1][:30]
    fit_ids = split["supervised"][:5]

    def score(b: Path, items: list[str], name: str, *extra: str) -> subprocess.CompletedProcess:
        _jsonl(tmp_path / f"{name}.jsonl", [{"text": text[i]} for i in items])
        return _cli(
            "score", str(b), str(tmp_path / f"{name}.jsonl"), "--out",
            str(tmp_path / f"{name}.out.jsonl"), "--model", model, "--cache-dir", str(cache),
            "--no-progress", *extra,
        )  # fmt: skip

    def summary(name: str) -> dict:
        return json.loads((tmp_path / f"{name}.out.jsonl").read_text().splitlines()[0])

    one = score(bundle, ev, "one")
    assert one.returncode == 0, one.stderr[-2000:]
    two = score(bundle, ev + ev, "two")
    assert two.returncode == 0, two.stderr[-2000:]
    s1, s2 = summary("one"), summary("two")
    assert s2["set_test"] == s1["set_test"]  # duplicates counted once
    assert any("30 repeated text(s)" in w for w in s2["warnings"])
    mixed = score(bundle, ev + fit_ids, "mixed")
    assert mixed.returncode == 0, mixed.stderr[-2000:]
    sm = summary("mixed")
    assert sm["set_test"] == s1["set_test"]
    assert any("5 text(s) were part of the fit (supervised)" in w for w in sm["warnings"])
    recs = [json.loads(x) for x in (tmp_path / "mixed.out.jsonl").read_text().splitlines()[1:]]
    assert [r["in_fit"] for r in recs] == [None] * 30 + ["supervised"] * 5
    bad_alpha = score(bundle, ev, "alpha", "--alpha", "2")
    assert bad_alpha.returncode == 2 and "--alpha must lie in (0, 1), got 2" in bad_alpha.stderr
    edited = tmp_path / "edited"
    shutil.copytree(bundle, edited)
    header = json.loads((edited / "bundle.json").read_text())
    (edited / "bundle.json").write_text(json.dumps({**header, "fpr": 2.0}))
    r = score(edited, ev, "edited")
    assert r.returncode == 2 and "bundle.json: changed after the fit" in r.stderr
    assert "Traceback" not in r.stderr
    shutil.rmtree(edited)
    shutil.copytree(bundle, edited)
    with np.load(edited / "null.npz") as f:
        null = f["scores"]
    np.savez(edited / "null.npz", scores=null - 100.0)  # valid values that declare everyone
    r = score(edited, ev, "replaced")
    assert r.returncode == 2 and "null.npz: changed after the fit" in r.stderr


def test_fit_and_score_share_the_cache_root_rule_of_every_command(tmp_path, monkeypatch):
    """No cache_dir: $CALIBDCD_CACHE, else the user cache, as `run` (and `score` without
    --cache-dir) use, so a `score` run from another directory finds `fit`'s generations; a
    cache_dir in the file is read against the file's directory."""
    from calibdcd.experiment.fit_config import load_fit_config
    from calibdcd.paths import cache_root

    monkeypatch.setenv("CALIBDCD_CACHE", str(tmp_path / "shared-cache"))
    p = tmp_path / "cfgs" / "fit.yaml"
    p.parent.mkdir()
    body = (
        "target: {backend: openai, model: m, options: {base_url: 'http://127.0.0.1:9/v1'}}\n"
        "detector: {name: overlap}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    p.write_text(body)
    assert load_fit_config(p).cache_root() == cache_root(None) == tmp_path / "shared-cache"
    p.write_text(body + "cache_dir: here\n")
    assert load_fit_config(p).cache_root() == tmp_path / "cfgs" / "here"


def _fit_without_its_models(tmp_path: Path, monkeypatch) -> Path:
    """A fit config (DPDLLM on a hub target) whose two models, the target and DPDLLM's default
    reference, are not in the (empty, offline) hub cache; its texts beside it; cwd there."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.txt").write_text("".join(f"member text {i}\n" for i in range(30)))
    (tmp_path / "n.txt").write_text("".join(f"other text {i}\n" for i in range(30)))
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(
        "target: {backend: hf, model: org/served-name}\n"
        "detector: {name: dpdllm}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
        "split: {n_supervised_per_class: 10}\n"
    )
    return cfg


def test_fit_dry_run_names_texts_target_and_every_missing_model(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    cfg = _fit_without_its_models(tmp_path, monkeypatch)
    res = CliRunner().invoke(app, ["fit", str(cfg), "--dry-run", "-o", str(tmp_path / "b")])
    assert res.exit_code == 1, res.output
    assert f"bundle: {tmp_path / 'b'}" in res.output
    assert "texts: supervised 20 (10 members)" in res.output
    assert "org/served-name: not in the local hub cache; used by target.model" in res.output
    assert "detector.options.reference.model_path (default)" in res.output
    assert f"calibdcd models fetch {cfg}" in res.output
    assert not (tmp_path / "b").exists()  # nothing written


def test_fit_names_every_missing_model_before_any_work_as_run_does(tmp_path, monkeypatch):
    """`calibdcd fit` (not a dry run) checks every model it needs first and prints the one list
    `calibdcd run` prints (exit 1, no traceback hint); it had found the target's model missing
    only on loading it, one model, in one collapsed line, exit 2, and DPDLLM's default reference
    not at all. From flags (no config file to name) the list gives each one's download."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    cfg = _fit_without_its_models(tmp_path, monkeypatch)
    res = CliRunner().invoke(app, ["fit", str(cfg), "-o", "b"])
    lines = res.output.splitlines()
    assert res.exit_code == 1, res.output
    assert lines[0] == f"error: 2 model(s) named by {cfg} cannot be used here:", lines
    assert "  - org/served-name: not in the local hub cache; used by target.model" in lines
    assert any("detector.options.reference.model_path (default)" in x for x in lines), lines
    assert f"fetch them all with: calibdcd models fetch {cfg}" in res.output
    assert "CALIBDCD_DEBUG" not in res.output and not (tmp_path / "b").exists()
    flags = ["--members", "m.txt", "--nonmembers", "n.txt", "-o", "b"]
    res = CliRunner().invoke(app, ["fit", "--target", "hf:model=org/served-name", *flags])
    assert res.exit_code == 1, res.output
    assert "named by the command line cannot be used here" in res.output
    assert "  hf download org/served-name" in res.output.splitlines(), res.output


def test_fit_dry_run_reports_an_unset_variable_a_typo_a_bad_url_and_a_family_at_once(
    tmp_path, monkeypatch
):
    """The issue's check: a fit config with an unset ${VAR}, a misspelt option, a base URL that is
    not one and an unknown chat family gives all four under ``fit --dry-run``, each with its
    line, as a run config's dry run would (the same target checks)."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    monkeypatch.delenv("CALIBDCD_UNSET_MODEL", raising=False)
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(
        "target:\n"
        "  backend: openai\n"
        "  model: ${CALIBDCD_UNSET_MODEL}\n"
        "  family: qwen9\n"
        "  options:\n"
        "    base_url: not a url\n"
        "detector: {name: overlap, options: {max_new_tokenz: 4}}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    res = CliRunner().invoke(app, ["fit", str(cfg), "--dry-run", "-o", str(tmp_path / "b")])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "4 problems" in out, out
    assert "fit.yaml:3: target.model: environment variable CALIBDCD_UNSET_MODEL" in out, out
    assert "fit.yaml:4: target.family: unknown chat family 'qwen9'" in out, out
    assert "fit.yaml:6: target.options.base_url:" in out and "not a url" in out, out
    assert "fit.yaml:7: detector.options.max_new_tokenz: unknown field" in out, out
    assert not (tmp_path / "b").exists()


def test_a_served_template_that_cannot_be_had_is_one_line_in_fit_and_its_dry_run(tmp_path):
    """A served model with no family and no tokenizer takes CalibDCD's views from its server's
    chat template; a server without ``/tokenize`` (here a real loopback server answering only
    ``/v1/models``) is found by ``fit --dry-run`` and by ``fit`` as one line, not a traceback."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from typer.testing import CliRunner

    from calibdcd.cli import app

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self, code: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path.endswith("/v1/models"):
                self._answer(200, {"object": "list", "data": [{"id": "my-finetune"}]})
            else:
                self._answer(404, {"detail": "Not Found"})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(404, {"detail": "Not Found"})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        (tmp_path / "m.txt").write_text("".join(f"member text {i}\n" for i in range(30)))
        (tmp_path / "n.txt").write_text("".join(f"other text {i}\n" for i in range(30)))
        cfg = tmp_path / "fit.yaml"
        cfg.write_text(
            "target:\n  backend: openai\n  model: my-finetune\n"
            f"  options: {{base_url: '{url}', dialect: vllm}}\n"
            "detector: {name: overlap}\n"
            "data: {members: m.txt, nonmembers: n.txt}\n"
            "split: {n_supervised_per_class: 10}\n"
        )
        out = tmp_path / "bundle"
        dry = CliRunner().invoke(app, ["fit", str(cfg), "--dry-run", "-o", str(out)])
        assert dry.exit_code == 1, dry.output
        assert "target: " in dry.output and "serves 'my-finetune'" in dry.output, dry.output
        assert "fit.yaml:1: target views: " in dry.output, dry.output
        assert "/tokenize answers HTTP 404" in dry.output, dry.output
        res = CliRunner().invoke(app, ["fit", str(cfg), "-o", str(out), "--no-progress"])
        assert res.exit_code == 2, res.output
        errors = [x for x in res.output.splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and "target views: " in errors[0], res.output
        assert "/tokenize answers HTTP 404" in errors[0], res.output
        assert "Traceback" not in res.output and not out.exists()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_target_spec_reads_like_lm_eval_model_args():
    from calibdcd.fitted.config import parse_target_spec

    got = parse_target_spec(
        "openai:base_url=http://127.0.0.1:8000/v1,model=org/m,family=qwen2.5,concurrency=32,"
        "dialect=vllm"
    )
    assert got == {
        "backend": "openai", "model": "org/m", "family": "qwen2.5",
        "options": {"base_url": "http://127.0.0.1:8000/v1", "concurrency": 32, "dialect": "vllm"},
    }  # fmt: skip
    for bad in ("openai", "base_url=x", "openai:model"):
        with pytest.raises(ValueError, match="--target"):
            parse_target_spec(bad)


def test_fit_from_flags_without_a_config(tmp_path, monkeypatch):
    """`calibdcd fit --target ... --members ... --nonmembers ...`: the same checks as a config
    file (here: the dry run, a mistyped option, a missing flag, flags beside a config)."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.txt").write_text("".join(f"member text {i}\n" for i in range(30)))
    (tmp_path / "n.txt").write_text("".join(f"other text {i}\n" for i in range(30)))
    base = ["fit", "--members", "m.txt", "--nonmembers", "n.txt", "-o", "b"]
    runner = CliRunner()
    res = runner.invoke(app, [*base, "--target", "hf:model=./nowhere", "--dry-run"])
    # a local model path is read against the working directory (the command line's), as a
    # config's is against its directory: the dry run names where it looked
    where = tmp_path.resolve() / "nowhere"
    assert "texts: supervised" in res.output and f"target: hf {where}" in res.output, res.output
    res = runner.invoke(app, [*base, "--target", "openai:base_url=http://127.0.0.1:9/v1,model=m,"
                                                 "concurrencyy=4", "--dry-run"])  # fmt: skip
    assert res.exit_code == 2 and "target.options.concurrencyy" in res.output
    res = runner.invoke(app, ["fit", "--members", "m.txt", "-o", "b"])
    assert res.exit_code == 2 and "without a config, fit needs --target, --nonmembers" in res.output
    (tmp_path / "fit.yaml").write_text("target: {model: m}\n")
    res = runner.invoke(app, ["fit", "fit.yaml", "--members", "m.txt", "-o", "b"])
    assert res.exit_code == 2 and "give a config or --target" in res.output


@pytest.mark.parametrize("name", ["fit-micro", "audit-vllm"])
def test_shipped_fit_configs_load(name):
    from calibdcd.experiment.fit_config import load_fit_config

    cfg = load_fit_config(Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml")
    if name == "audit-vllm":
        assert cfg.target.options["dialect"] == "vllm" and cfg.target.family == "qwen2.5"
        assert cfg.target.options["base_url"].startswith("http")


def test_a_served_fit_keeps_no_credential_in_its_bundle_and_scores_through_base_url(
    tmp_path, monkeypatch
):
    """fit and score through a real loopback server, the overlap detector (no torch model):
    the URL's password is not written into the bundle meant to be shared; score of that bundle
    asks for the server (--base-url) instead of failing on a masked URL, and with it gives the
    verdicts; a doubled suspect file gives the single file's set-level verdict."""
    import random

    from typer.testing import CliRunner

    from calibdcd.cli import app
    from test_openai_target import FaultServer, _memorising_answer

    rng = random.Random(1)
    words = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(320)]
    labels = [i % 2 for i in range(320)]
    monkeypatch.chdir(tmp_path)
    m = [t for t, y in zip(texts, labels, strict=True) if y]
    n = [t for t, y in zip(texts, labels, strict=True) if not y]
    (tmp_path / "m.txt").write_text("".join(t + "\n" for t in m[:120]))
    (tmp_path / "n.txt").write_text("".join(t + "\n" for t in n[:140]))
    (tmp_path / "suspect.txt").write_text("".join(t + "\n" for t in m[120:150]))
    # the same 30 texts again, each a near-copy (other whitespace): still 30 distinct texts
    (tmp_path / "twice.txt").write_text(
        "".join(t + "\n" for t in m[120:150])
        + "".join(t.replace(" ", "  ", 1) + " \n" for t in m[120:150])
    )
    # the suspect file in every format the one reader reads: the same texts, the same verdict
    rows = [{"id": f"s{i}", "text": t} for i, t in enumerate(m[120:150])]
    (tmp_path / "suspect.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "suspect.json").write_text(json.dumps(rows, indent=1))
    (tmp_path / "suspect.csv").write_text(
        "id,text\n" + "".join(f'{r["id"]},"{r["text"]}"\n' for r in rows)
    )
    (tmp_path / "suspect.dat").write_text("".join(t + "\n" for t in m[120:150]))
    with FaultServer(
        lambda p, a: "ok", answer=_memorising_answer(texts, labels), served_model="tiny"
    ) as srv:
        host = srv.url.removeprefix("http://")
        url = f"http://auditor:s3cret-pw@{host}/v1"
        runner = CliRunner()
        spec = f"openai:base_url={url},model=tiny,family=qwen2.5,dialect=vllm"
        res = runner.invoke(
            app,
            ["fit", "--target", spec, "--members", "m.txt", "--nonmembers", "n.txt",
             "--detector", "overlap", "-o", "bundle", "--cache-dir", "cache", "--no-progress"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        saved = (tmp_path / "bundle" / "bundle.json").read_text()
        assert "s3cret-pw" not in saved and "auditor:" not in saved
        assert f"http://***@{host}/v1" in saved
        score = ["score", "bundle", "suspect.txt", "--cache-dir", "cache", "--no-progress"]
        res = runner.invoke(app, [*score, "-o", "s.jsonl"])
        assert res.exit_code == 2 and "pass the server with --base-url" in res.output
        verdicts = []
        for name in ("suspect.txt", "twice.txt", "suspect.jsonl", "suspect.json", "suspect.csv"):
            res = runner.invoke(
                app,
                ["score", "bundle", name, "--cache-dir", "cache", "--no-progress",
                 "--base-url", url, "-o", f"{name}.jsonl"],
            )  # fmt: skip
            assert res.exit_code == 0, res.output
            verdicts.append(re.search(r"the set is .*\)", res.output)[0])
        assert "MORE member-like" in verdicts[0] and len(set(verdicts)) == 1, verdicts
        res = runner.invoke(
            app,
            ["score", "bundle", "twice.txt", "--cache-dir", "cache", "--no-progress",
             "--base-url", url, "-o", "twice.jsonl"],
        )  # fmt: skip
        assert re.search(r"30 repeated text\(s\) .*each distinct text counts once", res.output)
        # an unknown suffix: one line naming the supported ones, nothing scored
        res = runner.invoke(
            app,
            ["score", "bundle", "suspect.dat", "--cache-dir", "cache", "--no-progress",
             "--base-url", url, "-o", "x.jsonl"],
        )  # fmt: skip
        assert res.exit_code == 2, res.output
        assert "suspect.dat: unsupported file type; expected one of .jsonl" in res.output
        assert "Traceback" not in res.output and not Path("x.jsonl").exists()
        # score from another directory with no --cache-dir: the cache-root rule of every
        # command ($CALIBDCD_CACHE here) finds fit's and score's cache, so nothing is asked again
        monkeypatch.setenv("CALIBDCD_CACHE", str(tmp_path / "cache"))
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        asked = sum(srv.successes.values())
        res = runner.invoke(
            app,
            ["score", str(tmp_path / "bundle"), str(tmp_path / "suspect.txt"), "--no-progress",
             "--base-url", url, "-o", "again.jsonl"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        assert sum(srv.successes.values()) == asked  # every completion came from the cache
        assert re.search(r"the set is .*\)", res.output)[0] == verdicts[0]
        # score --dry-run: the bundle's digests and target, the texts; nothing asked or written
        res = runner.invoke(
            app,
            ["score", str(tmp_path / "bundle"), str(tmp_path / "twice.txt"), "--dry-run",
             "--base-url", url, "-o", "dry.jsonl"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        assert "dry run: OK" in res.output and "texts: 60 from" in res.output, res.output
        assert "(30 distinct)" in res.output and "scores: dry.jsonl" in res.output, res.output
        assert not Path("dry.jsonl").exists() and sum(srv.successes.values()) == asked


def test_a_fit_config_secrets_list_masks_its_variables(tmp_path, monkeypatch):
    """``secrets: [VAR]`` in a fit config works as in a run config: the variable's value is
    secret whatever its name (here one without KEY/TOKEN/SECRET/PASSWORD, put into a URL's
    path where no credential rule would catch it), so :func:`calibdcd.redact.redact`, which
    every message and the bundle's target record go through, masks it; a variable not listed
    is not; a value that is not a list of names is a config error with its line."""
    from calibdcd.experiment.fit_config import load_fit_config
    from calibdcd.redact import redact

    monkeypatch.setenv("AUDIT_ROUTE", "route-8f3a9c-private")
    monkeypatch.setenv("AUDIT_MODEL", "model-77b1-public")
    (tmp_path / "m.txt").write_text("a member\n")
    (tmp_path / "n.txt").write_text("a non-member\n")
    text = (
        "secrets: AUDIT_ROUTE\n"
        "target:\n"
        "  model: ${AUDIT_MODEL}\n"
        "  backend: openai\n"
        "  family: qwen2.5\n"
        "  options: {base_url: 'http://127.0.0.1:9/${AUDIT_ROUTE}/v1'}\n"
        "detector: {name: overlap}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    (tmp_path / "fit.yaml").write_text(text)
    cfg = load_fit_config(tmp_path / "fit.yaml")
    assert cfg.secrets == ["AUDIT_ROUTE"]
    assert "route-8f3a9c-private" in cfg.target.options["base_url"]  # used as it is
    assert redact(cfg.target.options["base_url"]) == "http://127.0.0.1:9/***/v1"
    assert redact(cfg.target.model) == "model-77b1-public"
    (tmp_path / "fit.yaml").write_text(text.replace("secrets: AUDIT_ROUTE", "secrets: [3]"))
    with pytest.raises(Exception, match=r"fit.yaml:1: secrets\[0\]: Input should be a valid"):
        load_fit_config(tmp_path / "fit.yaml")
    (tmp_path / "fit.yaml").write_text(text.replace("secrets: AUDIT_ROUTE", "secrets: 3"))
    with pytest.raises(Exception, match=r"fit.yaml:1: secrets: Input should be a valid list"):
        load_fit_config(tmp_path / "fit.yaml")


@pytest.mark.slow
def test_fit_resolves_lab_references_under_its_own_cache_root(tmp_path, monkeypatch):
    """A fit config's ``cache_dir`` is where its detector's lab references resolve and build, as
    for its target and texts: with the micro lab built under the suite's cache root and
    ``$CALIBDCD_CACHE`` pointing at an empty directory, a DPDLLM fit whose reference is
    ``lab-clean-reference:micro`` and whose ``cache_dir`` is the suite's root builds nothing
    under ``$CALIBDCD_CACHE`` (the detector's references used to resolve there: a second micro
    lab built, and its clean reference trained, beside the config's cache)."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    suite_root = Path(os.environ["CALIBDCD_CACHE"])  # the suite's own root (conftest)
    lab = lab_micro()  # built under it
    gt = [json.loads(x) for x in (lab / "ground_truth.jsonl").read_text().splitlines()]
    _jsonl(tmp_path / "m.jsonl", [{"text": g["text"]} for g in gt if g["label"] == 1][:24])
    _jsonl(tmp_path / "n.jsonl", [{"text": g["text"]} for g in gt if g["label"] == 0][:40])
    (tmp_path / "fit.yaml").write_text(
        "target: {name: chat-qwen, backend: hf, lab: micro, model: chat-qwen,\n"
        "         options: {device: cpu, batch_size: 64}}\n"
        "detector: {name: dpdllm, options: {length: 32, reference: {model_path: "
        "'lab-clean-reference:micro', epochs: 1, learning_rate: 0.001}}}\n"
        "data: {members: m.jsonl, nonmembers: n.jsonl}\n"
        "calibdcd: false\n"
        f"cache_dir: {suite_root}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("CALIBDCD_CACHE", str(elsewhere))
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    res = CliRunner().invoke(
        app, ["fit", str(tmp_path / "fit.yaml"), "-o", str(tmp_path / "bundle"), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    built_elsewhere = sorted(p.name for p in elsewhere.iterdir()) if elsewhere.exists() else []
    assert built_elsewhere == [], built_elsewhere
    assert "reference" in json.loads((tmp_path / "bundle" / "bundle.json").read_text())["learnt"]


def test_score_dry_run_identifies_a_lab_target_without_building_its_lab(tmp_path, monkeypatch):
    """score --dry-run ("nothing built") trained the bundle's lab when the cache lacked it:
    the target's record is now made without building it, the model known by its name (as
    check_target compares a record without content); the real score still builds it."""
    from calibdcd.fitted.config import TargetSection
    from calibdcd.fitted_cli import _target_record

    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    section = TargetSection(backend="hf", lab="micro", model="chat-qwen")
    record = _target_record(section, tmp_path / "cache", build_lab=False)
    assert (record["model"], record["lab"], record["content"]) == ("chat-qwen", "micro", None)
    assert not (tmp_path / "cache" / "lab").exists()
