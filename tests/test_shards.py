"""Runs that scale past one process: `calibdcd run --shard i/n` runs a deterministic part of
the grid, and `calibdcd report SHARD_DIRS... -o MERGED` joins the parts into the run directory
an unsharded run writes (the same tables)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from calibdcd.experiment.runner import parse_shard, shard_of
from experiment_support import micro_run


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


def test_two_shards_merged_give_the_unsharded_report(tmp_path_factory, tmp_path):
    from calibdcd.cli import app
    from calibdcd.experiment import load_config, run_experiment
    from calibdcd.report import write_report

    cfg_path, run_dir = micro_run(tmp_path_factory)  # the unsharded run (its cache is shared)
    whole = (write_report(run_dir).parent / "tables.md").read_text()
    cfg = load_config(cfg_path)
    dirs = []
    for i in range(2):
        d = run_experiment(cfg, tmp_path / f"shard{i}", progress=False, shard=(i, 2))
        assert (d / "shard.json").is_file()
        dirs.append(d)
    assert len(list((dirs[0] / "settings").iterdir())) == 1  # one setting each
    merged = tmp_path / "merged"
    res = CliRunner().invoke(app, ["report", *map(str, dirs), "-o", str(merged)])
    assert res.exit_code == 0, res.output
    assert (merged / "report" / "tables.md").read_text() == whole
    assert (merged / "results.csv").read_text() == (run_dir / "results.csv").read_text()
    # a missing shard is named, not silently left out
    res = CliRunner().invoke(
        app, ["report", str(dirs[0]), str(dirs[0]), "-o", str(tmp_path / "m2")]
    )
    assert res.exit_code == 2 and "in none of the shards" in res.output
