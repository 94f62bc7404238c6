"""A run directory reflects exactly its config and has one writer; secrets never reach a file or
a message; `calibdcd run` fails with one line (issue 15: 1, 5, 8)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from calibdcd.experiment import load_config, run_experiment
from calibdcd.experiment.rundir import RunDirLocked, lock_run_dir
from calibdcd.report import write_report
from calibdcd.report.aggregate import load_results, stale_settings
from experiment_support import lab_micro, micro_config_text

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.slow  # three real runs on the lab micro
def test_a_smaller_config_into_the_same_output_reports_only_its_settings(tmp_path):
    lab_micro()
    run = tmp_path / "run"
    two = _write(
        tmp_path / "two.yaml",
        micro_config_text(tmp_path / "cache", targets=("chat-qwen", "chat-llama")),
    )
    run_experiment(load_config(two), run, progress=False)
    one = _write(
        tmp_path / "one.yaml", micro_config_text(tmp_path / "cache", targets=("chat-qwen",))
    )
    log: list[str] = []
    run_experiment(load_config(one), run, progress=False, log=log.append)
    kept, gone = "lab__chat-qwen__Overlap__s0", "lab__chat-llama__Overlap__s0"
    assert f"skip {kept} (complete)" in log
    assert any("not in this config" in x and gone in x for x in log)
    assert [r["id"] for r in load_results(run)] == [kept]
    assert stale_settings(run) == [gone]
    assert (run / "settings" / ".stale" / gone / "result.json").is_file()  # moved, not deleted
    lines = (run / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == [kept]
    with pytest.warns(UserWarning, match=gone):
        html = write_report(run)
    page = html.read_text()
    assert "1 of 1 settings of the grid completed" in page and f"left out: {gone}" in page
    main = (html.parent / "csv" / "auc_main.csv").read_text()
    assert "chat-llama" not in main and "chat-qwen" in main
    # the removed target comes back: its stored result is moved back and reused
    log.clear()
    run_experiment(load_config(two), run, progress=False, log=log.append)
    assert f"skip {gone} (complete)" in log and stale_settings(run) == []


def test_one_writer_per_run_directory(tmp_path):
    lab_micro()
    cfg = load_config(
        _write(tmp_path / "c.yaml", micro_config_text(tmp_path / "cache", targets=("chat-qwen",)))
    )
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.mkdir()
        (run / ".lock").write_text(
            json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": "T0"})
        )
        with pytest.raises(RunDirLocked, match=rf"pid {holder.pid}, host .*started T0"):
            run_experiment(cfg, run, progress=False)
        assert not (run / "config.yaml").exists()  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (kill -9): its lock is taken over, and released at the end
    with pytest.warns(RuntimeWarning, match=f"taking over the lock of pid {holder.pid}"):
        with lock_run_dir(run) as lock:
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not (run / ".lock").exists()


@pytest.fixture
def loopback_server():
    from test_openai_target import FaultServer

    with FaultServer(lambda p, a: "ok") as srv:
        yield srv


def _openai_config(tmp_path: Path, url: str) -> Path:
    lab = lab_micro()
    host = url.removeprefix("http://")
    text = f"""
name: secret-test
secrets: [CALIBDCD_TEST_PLAIN]
benchmarks:
  - {{name: lab, path: {lab / "ground_truth.jsonl"}, label: lab}}
targets:
  - name: remote
    backend: openai
    model: tiny
    family: llama3
    options:
      base_url: "http://user:${{CALIBDCD_TEST_PASSWORD}}@{host}/v1"
      extra_body: {{note: "${{CALIBDCD_TEST_PLAIN}}"}}
      max_retries: 0
detectors:
  - {{name: overlap, label: Overlap, options: {{max_new_tokens: 4, positions: 4}}}}
analyses: {{ablations: false, adaptive_vs_fixed: false, fp_recovery: false}}
evaluation: {{n_boot: 20}}
cache_dir: {tmp_path / "cache"}
"""
    return _write(tmp_path / "remote.yaml", text)


@pytest.mark.slow  # three `calibdcd run` processes
def test_secrets_never_reach_files_or_messages(tmp_path, monkeypatch, loopback_server):
    password, plain = "pw-5f3a9c1e77", "listed-value-0b8d"
    monkeypatch.setenv("CALIBDCD_TEST_PASSWORD", password)
    monkeypatch.setenv("CALIBDCD_TEST_PLAIN", plain)
    cfg_path = _openai_config(tmp_path, loopback_server.url)
    env = dict(os.environ, PYTHONPATH=SRC, HF_HUB_OFFLINE="1")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "calibdcd", "run", str(cfg_path), "--out", str(run)]
    done = subprocess.run([*cmd, "--no-progress"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "report" / "index.html").is_file()
    assert "***@127.0.0.1" in (run / "config.yaml").read_text()
    for f in [*run.rglob("*"), *(tmp_path / "cache").rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert password.encode() not in data and plain.encode() not in data, f
    assert password not in done.stdout + done.stderr and plain not in done.stdout + done.stderr
    # an error names what failed in one line, with the URL redacted, no traceback
    loopback_server.plan = lambda p, a: "400"
    (run / "settings").rename(tmp_path / "old-settings")
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    failed = subprocess.run([*cmd, "--no-progress"], env=env, capture_output=True, text=True)
    assert failed.returncode == 1
    errors = [x for x in failed.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, failed.stderr[-2000:]
    assert "answered 400" in errors[0] and "in setting lab__remote__Overlap__s0" in errors[0]
    assert "http://***@127.0.0.1" in errors[0]
    assert "Traceback" not in failed.stderr and password not in failed.stderr
    debug = subprocess.run(
        [*cmd, "--no-progress", "--debug"], env=env, capture_output=True, text=True
    )
    assert "Traceback" in debug.stderr and password not in debug.stderr


def test_a_tiny_pool_and_empty_completions_warn_loudly(tmp_path, loopback_server):
    lab = lab_micro()
    rows = (lab / "ground_truth.jsonl").read_text().splitlines()
    ones = [r for r in rows if json.loads(r)["label"] == 1][:18]
    zeros = [r for r in rows if json.loads(r)["label"] == 0][:18]
    small = _write(tmp_path / "small.jsonl", "\n".join(ones + zeros) + "\n")
    loopback_server.plan = lambda p, a: "emptytext"
    cfg = _write(
        tmp_path / "c.yaml",
        f"""
name: tiny
benchmarks: [{{name: lab, path: {small}, label: lab}}]
targets:
  - {{name: remote, backend: openai, model: tiny, family: llama3,
     options: {{base_url: "{loopback_server.url}/v1", max_retries: 0}}}}
detectors:
  - {{name: overlap, label: Overlap, options: {{max_new_tokens: 4, positions: 4}}}}
split: {{n_supervised_per_class: 10}}
analyses: {{ablations: false, adaptive_vs_fixed: false, fp_recovery: false}}
evaluation: {{n_boot: 20}}
cache_dir: {tmp_path / "cache"}
""",
    )
    log: list[str] = []
    with pytest.warns(RuntimeWarning) as caught:
        run = run_experiment(load_config(cfg), tmp_path / "run", progress=False, log=log.append)
    said = " ".join(str(w.message) for w in caught)
    assert "evaluation pool has only" in said and "completions of the target were empty" in said
    (res,) = load_results(run)
    assert len(res["warnings"]) == 2 and res["sizes"]["evaluation"][0] < 20
    assert sum(x.startswith("WARNING lab__remote__Overlap__s0") for x in log) == 2
    page = write_report(run).read_text()
    assert "mostly noise" in page and "measures nothing" in page


def test_log_samples_writes_every_completion_a_setting_used(tmp_path, loopback_server):
    """``--log-samples``: settings/<id>/samples.jsonl holds one record per prompt the
    setting's features used (e0 and every view), with its completions and decoding; features
    cached without them are extracted again (from the generation cache: the server is asked
    nothing new), and a complete setting without the file is run again."""
    from typer.testing import CliRunner

    from calibdcd.cli import app

    lab = lab_micro()
    rows = (lab / "ground_truth.jsonl").read_text().splitlines()
    ones = [r for r in rows if json.loads(r)["label"] == 1][:60]
    zeros = [r for r in rows if json.loads(r)["label"] == 0][:60]
    small = _write(tmp_path / "small.jsonl", "\n".join(ones + zeros) + "\n")
    cfg = _write(
        tmp_path / "c.yaml",
        f"""
name: samples
benchmarks: [{{name: lab, path: {small}, label: lab}}]
targets:
  - {{name: remote, backend: openai, model: tiny, family: llama3,
     options: {{base_url: "{loopback_server.url}/v1", max_retries: 0, dialect: vllm}}}}
detectors:
  - {{name: overlap, label: Overlap, options: {{max_new_tokens: 4, positions: 4}}}}
split: {{n_supervised_per_class: 20}}
analyses: {{ablations: false, adaptive_vs_fixed: false, fp_recovery: false, blind: false}}
evaluation: {{n_boot: 20}}
cache_dir: {tmp_path / "cache"}
""",
    )
    runner = CliRunner()
    base = ["run", str(cfg), "--no-progress", "--no-report", "--out"]
    res = runner.invoke(app, [*base, str(tmp_path / "plain")])
    assert res.exit_code == 0, res.output
    sid = "lab__remote__Overlap__s0"
    assert not (tmp_path / "plain" / "settings" / sid / "samples.jsonl").exists()
    asked = len(loopback_server.log)
    res = runner.invoke(app, [*base, str(tmp_path / "plain"), "--log-samples"])
    assert res.exit_code == 0, res.output
    assert "skip" not in res.output  # complete, but without its samples: run again
    assert len(loopback_server.log) == asked  # from the caches: nothing asked twice
    lines = (tmp_path / "plain" / "settings" / sid / "samples.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    phases = {r["phase"] for r in recs}
    result = json.loads((tmp_path / "plain" / "settings" / sid / "result.json").read_text())
    assert phases == {"e0", *result["views"]}, phases
    assert all(r["params"]["max_new_tokens"] == 4 and len(r["completions"]) == 1 for r in recs)
    served = {(b["prompt"]) for b in loopback_server.bodies}
    assert {r["prompt"] for r in recs} <= served  # each logged prompt is one the server got
    # a second directory, same cache: the samples come with the cached features
    assert runner.invoke(app, [*base, str(tmp_path / "again"), "--log-samples"]).exit_code == 0
    again = (tmp_path / "again" / "settings" / sid / "samples.jsonl").read_text().splitlines()
    assert sorted(again) == sorted(lines) and len(loopback_server.log) == asked
