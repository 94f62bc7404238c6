"""One cache root per run: the config's ``cache_dir``, else ``$CALIBDCD_CACHE``, else the user
cache; the run's labs, DPDLLM's reference LMs and a local target's conversions live under it."""

from __future__ import annotations

from pathlib import Path

from calibdcd.paths import cache_root, user_cache_root


def test_cache_root_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CALIBDCD_CACHE", raising=False)
    assert user_cache_root() == tmp_path / "home" / ".cache" / "calibdcd"
    assert cache_root(None) == user_cache_root()
    monkeypatch.setenv("CALIBDCD_CACHE", str(tmp_path / "env"))
    assert cache_root(None) == cache_root("") == tmp_path / "env"
    assert cache_root(tmp_path / "run") == tmp_path / "run"


def test_fit_and_score_take_their_cache_root_by_the_one_rule(tmp_path, monkeypatch):
    """fit's --cache-dir and a fit config's cache_dir skipped the rule's check (a file given
    as the cache root failed later, with a traceback); fit and score now say it in one line."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.txt").write_text("a member text\n")
    (tmp_path / "n.txt").write_text("a non-member text\n")
    (tmp_path / "afile").write_text("x")
    fit = ["fit", "--target", "hf:model=x", "--members", "m.txt", "--nonmembers", "n.txt",
           "--detector", "overlap", "-o", "b", "--dry-run"]  # fmt: skip
    for extra in (["--cache-dir", "afile"], []):
        if not extra:
            (tmp_path / "fit.yaml").write_text(
                "target: {backend: hf, model: x}\ndetector: {name: overlap}\n"
                "data: {members: m.txt, nonmembers: n.txt}\ncache_dir: afile\n"
            )
            args = ["fit", "fit.yaml", "-o", "b", "--dry-run"]
        else:
            args = fit + extra
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, res.output
        assert res.output.startswith("error: ") and "is a file, not a directory" in res.output
        assert res.output.count("\n") == 1 and "Traceback" not in res.output


def _config(tmp_path: Path, cache_line: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(
        "name: root-test\n"
        "benchmarks:\n"
        "  - {name: lab, lab: micro, path: ground_truth.jsonl, label: lab}\n"
        "targets:\n"
        "  - {name: chat-qwen, backend: hf, lab: micro, model: chat-qwen, post_trained: true,"
        " options: {device: cpu}}\n"
        "detectors:\n"
        "  - {name: dpdllm, options: {length: 16, reference: {model_path: 'lab:micro/base',"
        " epochs: 1, device: cpu}}}\n" + cache_line
    )
    return p


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def test_a_run_with_cache_dir_keeps_its_lab_and_reference_there(tmp_path, monkeypatch, lab_micro):
    """The config's ``cache_dir`` is where the run finds (or builds) its lab and fine-tunes
    DPDLLM's reference LM; ``$CALIBDCD_CACHE`` (here an empty directory) is never touched."""
    from calibdcd.experiment import load_config
    from calibdcd.experiment.labs import resolve_lab
    from calibdcd.experiment.plan import resolve
    from calibdcd.experiment.resources import RunContext
    from calibdcd.experiment.runner import dry_run

    env_cache = tmp_path / "env-cache"
    env_cache.mkdir()
    monkeypatch.setenv("CALIBDCD_CACHE", str(env_cache))
    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    run_root = tmp_path / "run-cache"
    cfg = load_config(_config(tmp_path, f"cache_dir: {run_root}\n"))
    assert cache_root(cfg.cache_dir) == run_root

    # no lab under the run's root yet: the dry run says it will be built there on first run
    lines, problems = dry_run(cfg)
    assert not problems, problems
    assert any("lab 'micro' not built yet" in line for line in lines), lines
    assert any(line.startswith(f"cache: {run_root}; output: ") for line in lines), lines

    # the lab the run would build: <run root>/lab/<the micro lab's key>; put the shared build
    # there (what ensure_lab would build, without the minutes of training)
    (run_root / "lab").mkdir(parents=True)
    (run_root / "lab" / lab_micro.name).symlink_to(lab_micro, target_is_directory=True)
    assert resolve_lab("micro", build=False, root=run_root) == run_root / "lab" / lab_micro.name
    assert resolve_lab("micro", build=False) is None  # $CALIBDCD_CACHE has no lab

    plan = resolve(cfg)
    ctx = RunContext(plan, progress=False)
    bench = ctx.benchmark(plan.benchmarks[0])
    assert len(bench.texts) > 0
    det = ctx.detector(plan.settings[0].detector)
    ref = det.config.reference
    assert Path(ref.model_path) == run_root / "lab" / lab_micro.name / "base"
    assert Path(ref.cache_dir) == run_root

    # one real component: the reference LM is fine-tuned into the run's root
    from calibdcd.detectors.dpdllm.reference import ReferenceLM

    lm = ReferenceLM.fine_tuned(ref, 16, list(bench.texts[:4]), progress=False)
    assert lm.path.parent == run_root / "dpdllm-reference"
    assert (lm.path / "meta.json").is_file()
    assert _files(env_cache) == []


def test_a_run_without_cache_dir_uses_the_shared_root(tmp_path, monkeypatch, lab_micro):
    """No ``cache_dir``: the run's root is ``$CALIBDCD_CACHE``, where the shared lab is."""
    from calibdcd.experiment import load_config
    from calibdcd.experiment.labs import resolve_lab

    monkeypatch.delenv("CALIBDCD_LAB_ROOT", raising=False)
    monkeypatch.setenv("CALIBDCD_CACHE", str(lab_micro.parent.parent))
    cfg = load_config(_config(tmp_path, ""))
    assert cfg.cache_dir is None
    assert cache_root(cfg.cache_dir) == lab_micro.parent.parent
    assert resolve_lab("micro", build=False, root=cache_root(cfg.cache_dir)) == lab_micro


def test_a_second_process_waits_for_the_lab_build_and_says_so(tmp_path, capfd):
    """The lab lock: while another process holds it, ``ensure_lab`` says it waits (the lab is
    shared, not built twice)."""
    import fcntl
    import threading

    from calibdcd.atomic import file_lock

    lock = tmp_path / ".lab.lock"
    lock.touch()
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        got: list[bool] = []

        def other() -> None:
            with file_lock(lock, "lab micro: another process is building it; waiting"):
                got.append(True)

        t = threading.Thread(target=other)
        t.start()
        t.join(0.5)
        assert not got  # still waiting
        fcntl.flock(held, fcntl.LOCK_UN)
        t.join(10)
    assert got == [True]
    assert "another process is building it; waiting" in capfd.readouterr().err


def test_a_second_process_waits_for_the_clean_reference_and_trains_nothing(tmp_path, capfd):
    """DPDLLM's lab clean reference is trained once per cache root: a process that finds another
    one training it says it waits, and uses that process's reference when it is done."""
    import fcntl
    import threading

    from calibdcd.lab.clean_reference import clean_reference_dir, ensure_clean_reference
    from experiment_support import lab_micro

    lab = lab_micro()
    out = clean_reference_dir(lab, cache_dir=tmp_path)
    lock = out.parent / f".{out.name}.lock"
    lock.parent.mkdir(parents=True)
    got: list[Path] = []
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # "another process" is training it

        t = threading.Thread(
            target=lambda: got.append(ensure_clean_reference(lab, cache_dir=tmp_path))
        )
        t.start()
        t.join(1.0)
        assert not got  # waiting, not training
        out.mkdir()
        (out / "reference.json").write_text("{}")  # the other process finished
        fcntl.flock(held, fcntl.LOCK_UN)
        t.join(30)
    assert got == [out]
    assert [p.name for p in out.iterdir()] == ["reference.json"]  # nothing trained here
    assert "another process is training" in capfd.readouterr().err
