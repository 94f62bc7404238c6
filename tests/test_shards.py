"""Runs that scale past one process: `calibdcd run --shard i/n` runs a deterministic part of
the grid, and `calibdcd report SHARD_DIRS... -o MERGED` joins the parts into the run directory
an unsharded run writes (the same tables). A merge checks what it merges: shards that read
other data are refused, so is a result edited after its run wrote it (each setting's
``digests.json``), and a run directory of part of the grid is reported as "k of n settings"."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from calibdcd.experiment.runner import parse_shard, shard_of
from experiment_support import micro_run

CHAT, BASE = "lab__chat-qwen__Overlap__s0", "lab__base__Overlap__s0"  # shard 0's, shard 1's


def test_shards_partition_the_grid_deterministically():
    items = list(range(11))
    parts = [shard_of(items, (i, 4)) for i in range(4)]
    assert [x for p in parts for x in p] == items  # contiguous, in order, each once
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert shard_of(items, None) == items
    assert parse_shard("2/5") == (2, 5)
    for bad in ("5/5", "-1/3", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """(config path, the unsharded run, [shard 0's directory, shard 1's]) of the micro run."""
    from calibdcd.experiment import load_config, run_experiment

    cfg_path, run_dir = micro_run(tmp_path_factory)  # the unsharded run (its cache is shared)
    base = tmp_path_factory.mktemp("shards")
    cfg = load_config(cfg_path)
    dirs = [run_experiment(cfg, base / f"shard{i}", progress=False, shard=(i, 2)) for i in range(2)]
    return cfg_path, run_dir, dirs


def _report(*args: object):
    from calibdcd.cli import app

    return CliRunner().invoke(app, ["report", *map(str, args)])


def test_two_shards_merged_give_the_unsharded_report(shards, tmp_path):
    from calibdcd.report import write_report

    _, run_dir, dirs = shards
    whole = (write_report(run_dir).parent / "tables.md").read_text()
    for d, sid in zip(dirs, (CHAT, BASE), strict=True):
        assert (d / "shard.json").is_file()
        assert [p.name for p in (d / "settings").iterdir()] == [sid]  # one setting each
        # what the shard read and what it wrote, as digests
        assert (d / "settings" / sid / "digests.json").is_file()
        inputs = json.loads((d / "inputs.json").read_text())
        assert list(inputs["targets"]) == [sid.split("__")[1]] and inputs["detectors"]
    merged = tmp_path / "merged"
    res = _report(*dirs, "-o", merged)
    assert res.exit_code == 0, res.output
    assert f"{merged}: 2 of 2 settings of the grid" in res.output and "note" not in res.output
    assert (merged / "report" / "tables.md").read_text() == whole
    assert (merged / "results.csv").read_text() == (run_dir / "results.csv").read_text()
    assert json.loads((merged / "benchmarks.json").read_text()) == json.loads(
        (run_dir / "benchmarks.json").read_text()
    )
    assert set(json.loads((merged / "inputs.json").read_text())["targets"]) == {"chat-qwen", "base"}
    # a missing shard is named, not silently left out
    res = _report(dirs[0], dirs[0], "-o", tmp_path / "m2")
    assert res.exit_code == 2 and "in none of the shards" in res.output


def test_a_partial_run_is_reported_as_k_of_n_settings(shards, tmp_path):
    _, run_dir, dirs = shards
    # one shard alone: its part is complete, the grid is not
    res = _report(dirs[0], "-o", tmp_path / "r0")
    assert res.exit_code == 0, res.output
    assert "1 of 2 settings of the grid (shard 0/2: 1 of its 1); missing: " + BASE in res.output
    assert "1 of 2 settings of the grid completed" in (tmp_path / "r0" / "index.html").read_text()
    # a run killed after its first setting
    killed = tmp_path / "killed"
    shutil.copytree(run_dir, killed, ignore=shutil.ignore_patterns("report"))
    shutil.rmtree(killed / "settings" / BASE)
    res = _report(killed)
    assert res.exit_code == 0, res.output
    assert f"1 of 2 settings of the grid; missing: {BASE} (an unfinished run" in res.output


def test_shards_of_other_data_are_refused(shards, tmp_path):
    """The issue's case: labels flipped in the benchmark file between the two shards' runs."""
    from calibdcd.experiment import load_config, run_experiment

    cfg_path, _, dirs = shards
    lab_file = next(
        line.split("path: ")[1].split(",")[0]
        for line in cfg_path.read_text().splitlines()
        if "ground_truth.jsonl" in line
    )
    rows = [json.loads(x) for x in open(lab_file, encoding="utf-8")]
    for r in rows[:40]:
        r["label"] = 1 - int(r["label"])
    data = tmp_path / "data" / "ground_truth.jsonl"  # same file name: the same setting hashes
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "flipped.yaml"
    cfg.write_text(cfg_path.read_text().replace(lab_file, str(data)))
    other = run_experiment(load_config(cfg), tmp_path / "flipped1", progress=False, shard=(1, 2))
    merged = tmp_path / "merged"
    res = _report(dirs[0], other, "-o", merged)
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith(f"error: {other}: benchmark 'lab'") and "differs from" in line
    assert str(dirs[0]) in line and "\n" not in line
    assert not merged.exists() or not any(merged.iterdir())


def test_an_edited_result_is_refused_and_an_older_one_unverified(shards, tmp_path):
    from calibdcd.experiment import load_config, run_experiment

    cfg_path, _, dirs = shards
    edited = tmp_path / "edited"
    shutil.copytree(dirs[1], edited)
    res_path = edited / "settings" / BASE / "result.json"
    original = res_path.read_text()
    result = json.loads(original)
    result["after"]["auc"]["estimate"] = 0.99
    res_path.write_text(json.dumps(result, indent=2))
    for args in ((dirs[0], edited, "-o", tmp_path / "m"), (edited, "-o", tmp_path / "r")):
        res = _report(*args)
        assert res.exit_code == 2, res.output
        assert res.output.startswith(f"error: {res_path}: changed after the run wrote it")
        assert res.output.count("\n") == 1
    # the same values written with other whitespace are the same content
    res_path.write_text(json.dumps(json.loads(original)))
    assert _report(dirs[0], edited, "-o", tmp_path / "m1").exit_code == 0
    # a run resumed over an edited result computes the setting again
    res_path.write_text(json.dumps(result))
    with pytest.warns(RuntimeWarning, match="changed after the run wrote it.*recomputing"):
        run_experiment(load_config(cfg_path), edited, progress=False, shard=(1, 2))
    assert json.loads(res_path.read_text())["after"] == json.loads(original)["after"]
    assert _report(edited, "-o", tmp_path / "r1").exit_code == 0
    # a run directory written before digests were recorded: merged and reported, unverified
    old = tmp_path / "old"
    shutil.copytree(dirs[1], old)
    (old / "settings" / BASE / "digests.json").unlink()
    (old / "inputs.json").unlink()
    res = _report(dirs[0], old, "-o", tmp_path / "m2")
    assert res.exit_code == 0, res.output
    assert f"note: {old} has no inputs.json" in res.output
    assert "note: 1 result(s) carry no digests.json" in res.output and BASE in res.output


def test_an_outdated_result_is_left_out_of_the_reports_tables(shards, tmp_path):
    """`report` said a result was outdated (of another config) yet its tables read it:
    load_results reads what run_progress counts as done, so the tables, the README block and
    every benchmark script leave it out, with a warning naming it."""
    from calibdcd.report.aggregate import load_results

    _, run_dir, _ = shards
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    grid = json.loads((run / "grid.json").read_text())
    everything = load_results(run)
    assert len(everything) == len(grid)
    gone = grid[0]["id"]
    grid[0]["setting_hash"] = "0" * 16  # the config changed for this setting since it ran
    (run / "grid.json").write_text(json.dumps(grid))
    with pytest.warns(UserWarning, match=f"1 outdated result.*{gone}"):
        kept = load_results(run)
    assert len(kept) == len(grid) - 1
    assert everything[0].setting_hash not in {r.setting_hash for r in kept}
    res = _report(run, "-o", tmp_path / "r")
    assert res.exit_code == 0 and "outdated (a result.json of another config" in res.output


def test_report_out_is_never_inside_the_run_nor_a_shard(shards, tmp_path):
    """``report -o``: a file, a directory inside the run (other than its report/), a shard's
    directory are refused in one line and nothing is written; an existing directory elsewhere
    takes the report."""
    _, run_dir, dirs = shards
    before = sorted(p.name for p in (run_dir / "settings").iterdir())
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, said in (
        (afile, "is a file"),
        (run_dir / "settings", "lies inside"),
        (run_dir / "config.yaml", "is a file"),
        (run_dir / "newdir", "lies inside"),
    ):
        res = _report(run_dir, "-o", out)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert said in res.output, res.output
    assert sorted(p.name for p in (run_dir / "settings").iterdir()) == before
    assert afile.read_text() == "x"
    res = _report(*dirs, "-o", dirs[0])
    assert res.exit_code == 2 and "an input of this command" in res.output, res.output
    existing = tmp_path / "existing"
    existing.mkdir()
    res = _report(run_dir, "-o", existing)
    assert res.exit_code == 0 and (existing / "index.html").is_file(), res.output
    res = _report(run_dir, "-o", run_dir / "report")
    assert res.exit_code == 0, res.output
