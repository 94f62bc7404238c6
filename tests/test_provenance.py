"""Provenance across resumes (issue 48 item 5): ``environment.json`` keeps every start, each
``result.json`` names the commit and host that computed it, and the report says when a run was
resumed across commits. Old results (without the new field) stay valid and unchanged."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from calibdcd.provenance import commit_history, record_start, resumed_phrase, start_record
from calibdcd.results import TypedSettingResult, parse_result, read_result
from experiment_support import REPO, micro_config_text, micro_run

A, B, C = "a" * 40, "b" * 40, "c" * 40


def _env(commit: str, started: str, host: str | None = "h", dirty: bool = False) -> dict:
    return {"git": {"commit": commit, "dirty": dirty}, "started": started, "host": host}


def test_record_start_keeps_every_start_and_the_latest_keys():
    first = record_start(_env(A, "T1"), None)
    assert first["starts"] == [start_record(_env(A, "T1"))]
    second = record_start(_env(B, "T2", host="other"), first)
    assert [s["commit"] for s in second["starts"]] == [A, B]
    assert second["starts"][1] == {"commit": B, "dirty": False, "host": "other", "started": "T2"}
    # the top-level keys are the latest start's, as readers of older directories expect
    assert second["git"]["commit"] == B and second["started"] == "T2"
    # an environment.json written before the list existed counts as one start
    old = {"git": {"commit": A, "dirty": True}, "started": "T0"}
    resumed = record_start(_env(B, "T2"), old)
    assert resumed["starts"][0] == {"commit": A, "dirty": True, "host": None, "started": "T0"}


def test_resumed_phrase_from_results_else_from_starts():
    env = record_start(_env(B, "T2"), record_start(_env(A, "T1"), None))
    a, b = {"commit": A, "dirty": False}, {"commit": B, "dirty": False}
    assert resumed_phrase(env, [a, a, b]) == (
        "resumed across 2 commits: aaaaaaa (2 settings), bbbbbbb (1 setting)"
    )
    # no result says which start computed it: the starts' list, with their times
    text = resumed_phrase(env, [None, None])
    assert text.startswith("resumed across 2 commits: aaaaaaa (started T1), bbbbbbb (started T2)")
    # one commit computed everything, the latest start's: nothing to say
    assert resumed_phrase(env, [b, b]) is None
    # a later start that computed nothing does not hide the commit that did
    assert resumed_phrase(env, [a, a]) == "every setting computed at aaaaaaa (2 settings)"
    # a dirty tree is another code state
    dirty = {"commit": B, "dirty": True}
    assert "bbbbbbb (uncommitted changes) (1 setting)" in resumed_phrase(env, [b, dirty])
    hist = commit_history(env, [a, None])
    assert hist["unrecorded"] == 1 and [c["commit"] for c in hist["commits"]] == [A, B]
    assert resumed_phrase(None, []) is None


def test_an_old_result_without_provenance_validates_and_writes_back_unchanged(tmp_path):
    tar = REPO / "benchmarks" / "results" / "runs" / "lab-v2-paper-lab0.tar.xz"
    with tarfile.open(tar) as fh:
        member = next(m for m in fh.getmembers() if m.name.endswith("/result.json"))
        data = json.loads(fh.extractfile(member).read())
    assert "provenance" not in data
    res = parse_result(data, member.name)
    assert res.provenance is None
    TypedSettingResult.model_validate(data)  # the schema write_result checks against
    assert res.to_json() == data  # no new key when written back (results.jsonl, a merge)
    with_prov = parse_result(
        {**data, "provenance": {"commit": A, "dirty": False, "host": "h", "started": "T"}}
    )
    assert with_prov.provenance.commit == A and with_prov.to_json()["provenance"]["host"] == "h"
    TypedSettingResult.model_validate(with_prov.to_json())


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """The micro config (its cache shared with the session's micro run: generations and features
    are read, not computed) run in two starts at two fake commits on two hosts, then started a
    third time at a third commit that computes nothing."""
    from calibdcd.experiment import load_config, run_experiment

    micro_run(tmp_path_factory)  # fills the shared cache
    base = tmp_path_factory.getbasetemp() / "micro-run"
    cfg_path = base / "micro-resumed.yaml"
    cfg_path.write_text(micro_config_text(base / "cache"))
    run_dir = base / "run-resumed"
    with pytest.MonkeyPatch.context() as mp:
        for commit, host, stop in ((A, "host-a", 1), (B, "host-b", None), (C, "host-c", None)):
            mp.setattr(
                "calibdcd.provenance.git_commit", lambda c=commit: {"commit": c, "dirty": False}
            )
            mp.setattr("calibdcd.provenance.hostname", lambda h=host: h)
            run_experiment(load_config(cfg_path), run_dir, progress=False, stop_after=stop)
    return run_dir


def test_a_run_resumed_across_commits_keeps_both_and_the_report_names_them(resumed_run):
    from calibdcd.experiment.rundir import verify_setting
    from calibdcd.report import write_report
    from calibdcd.report.readme import readme_block

    run = resumed_run
    env = json.loads((run / "environment.json").read_text())
    assert [(s["commit"], s["host"]) for s in env["starts"]] == [
        (A, "host-a"),
        (B, "host-b"),
        (C, "host-c"),
    ]
    assert env["git"]["commit"] == C and env["host"] == "host-c"  # the latest start's keys
    grid = json.loads((run / "grid.json").read_text())
    by_id = {}
    for row in grid:
        res = read_result(run / "settings" / row["id"] / "result.json")
        assert res.setting_hash == row["setting_hash"]  # the record is in no hash
        assert verify_setting(run / "settings" / row["id"])  # digests of the file as written
        by_id[row["id"]] = res
    first, second = (by_id[row["id"]] for row in grid)
    assert (first.provenance.commit, first.provenance.host) == (A, "host-a")
    assert (second.provenance.commit, second.provenance.host) == (B, "host-b")
    # the same settings of the unresumed micro run carry the same hashes
    micro = run.parent / "run"
    for sid, res in by_id.items():
        other = read_result(micro / "settings" / sid / "result.json")
        assert (other.setting_hash, other.inputs_hash) == (res.setting_hash, res.inputs_hash)
    phrase = "resumed across 2 commits: aaaaaaa (1 setting), bbbbbbb (1 setting)"
    block = readme_block(run)
    assert phrase in block.splitlines()[0]  # the provenance line
    assert f"commit {C[:12]}" in block.splitlines()[0]
    page = write_report(run).read_text()
    assert phrase in page


def test_merged_shards_keep_every_start(tmp_path):
    from calibdcd.experiment.runner import _all_starts

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "environment.json").write_text(json.dumps(record_start(_env(B, "T2"), None)))
    (two / "environment.json").write_text(json.dumps({"git": {"commit": A}, "started": "T1"}))
    starts = _all_starts([one, two])
    assert [s["commit"] for s in starts] == [A, B]


def test_stored_environment_without_starts_reads_as_before():
    """A stored run's environment.json has no ``starts`` and its results no ``provenance``:
    its report's provenance line is the one it always had."""
    from calibdcd.report.readme import provenance_line

    env = {"git": {"commit": A, "dirty": False}, "started": "T0", "config": "x", "seeds": [0]}
    line = provenance_line(Path("run"), env, 2, [None, None])
    assert "resumed" not in line and f"commit {A[:12]}" in line


def test_measured_on_names_the_machine_and_the_commit_a_benchmark_ran():
    """Every benchmarks/ record names its numbers by provenance.measured_on: one line with the
    CPU, its cores and the kernel level (what a time figure must name), and the code's commit."""
    import platform
    import re
    import subprocess

    from calibdcd.provenance import measured_on

    rec = measured_on()
    assert rec["machine"] == f"{rec['cpu']}, {rec['cores']} cores, kernel {platform.release()}"
    assert rec["cores"] == os.cpu_count() and rec["python"] == platform.python_version()
    assert rec["memory_gb"] is None or rec["memory_gb"] > 0
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if re.fullmatch(r"[0-9a-f]{40}", head):  # (a checkout without git: nothing to compare)
        assert rec["git"]["commit"] == head and isinstance(rec["git"]["dirty"], bool)
    json.dumps(rec)  # a record the scripts write as it is


def test_every_benchmark_stores_its_record_through_save_measurement(tmp_path):
    """One way a benchmark stores what it measured (provenance.save_measurement): its folder
    made, atomically (no temporary file left), numpy values as JSON; no script in benchmarks/
    writes a record by hand (several did, non-atomically, one without its folder)."""
    import re

    import numpy as np

    from calibdcd.provenance import measured_on, save_measurement

    assert save_measurement(None, {"x": 1}) is None
    out = tmp_path / "new" / "deeper" / "figures.json"
    rec = {**measured_on(), "seconds": np.float64(1.5), "n": np.int64(3)}
    assert save_measurement(out, rec) == out
    assert json.loads(out.read_text())["seconds"] == 1.5 and sorted(
        p.name for p in out.parent.iterdir()
    ) == ["figures.json"]
    # (JSON lines appended one record at a time, as lab_recipes.py's resumable log, are a log)
    by_hand = re.compile(
        r"write_text\(\s*json\.dumps|\bwrite_json\(|\bjson\.dump\(|atomic_write_text\(.*json\.dumps"
    )
    offenders = [
        f.name
        for f in sorted((REPO / "benchmarks").glob("*.py"))
        # import_footprint writes the run config it measures (JSON as YAML), not a record
        if by_hand.search(f.read_text()) and f.name != "import_footprint.py"
    ]
    assert offenders == [], offenders
