"""`calibdcd report RUN_DIR --readme FILE`: a README's results block written from a real run's
files (the micro run of experiment_support), with its provenance; nothing outside the block
changes; a missing or broken block is a clear error."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from calibdcd.cli import app
from calibdcd.report.readme import BlockError, readme_block, replace_block, write_readme
from experiment_support import micro_run

BEFORE = "# Title\n\nSome text the writer must keep.\n\n"
AFTER = "\n\n## Later section\n\nMore text, with a trailing space \nand no final newline"


def _readme(name: str, body: str = "hand-typed numbers 59.9 | 51.8\n") -> str:
    return f"{BEFORE}<!-- calibdcd:results {name} -->\n{body}<!-- /calibdcd:results -->{AFTER}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return micro_run(tmp_path_factory)[1]


def test_replace_block_keeps_everything_outside():
    text = _readme("demo")
    new = replace_block(text, "demo", "| a | b |\n|---|---|\n| 1 | 2 |")
    assert new.startswith(BEFORE + "<!-- calibdcd:results demo -->\n| a | b |")
    assert new.endswith("| 1 | 2 |\n<!-- /calibdcd:results -->" + AFTER)
    assert "59.9" not in new
    # idempotent: writing the same content again changes nothing
    assert replace_block(new, "demo", "| a | b |\n|---|---|\n| 1 | 2 |") == new


def test_replace_block_errors_name_the_problem():
    with pytest.raises(BlockError, match=r"(?s)README.md: no results block 'other'.*found: demo"):
        replace_block(_readme("demo"), "other", "x", source="README.md")
    unclosed = f"{BEFORE}<!-- calibdcd:results demo -->\nx\n"
    with pytest.raises(BlockError, match=r"README.md:5: results block 'demo' is not closed"):
        replace_block(unclosed, "demo", "x", source="README.md")
    twice = _readme("demo") + "\n" + _readme("demo")
    with pytest.raises(BlockError, match="opens more than once"):
        replace_block(twice, "demo", "x")


def test_write_readme_from_a_run(run_dir, tmp_path):
    env = json.loads((run_dir / "environment.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(_readme(env["config"]) + "\n" + _readme("other-run"))
    name = write_readme(run_dir, readme)
    assert name == env["config"] == "micro-test"
    text = readme.read_text()
    block = text.split("<!-- calibdcd:results micro-test -->\n", 1)[1].split(
        "<!-- /calibdcd:results -->", 1
    )[0]
    # the tables are the report's main tables, verbatim
    tables_md = (
        readme_block(run_dir).split("\n", 2)[2]  # after the provenance line and a blank line
    )
    assert tables_md.strip() in block
    assert "AUC of the detectors with and without CalibDCD" in block
    assert "Paired comparisons on the same texts" in block  # intervals and p-values
    assert "TPR@5%FPR" in block
    assert "59.9" not in block
    # provenance from environment.json
    assert f"commit {env['git']['commit'][:12]}" in block
    assert "config `micro-test`" in block and "seeds [0]" in block
    assert f"Python {env['python']}" in block and env["started"] in block
    # outside the block (and the other block) untouched
    assert text.startswith(BEFORE)
    assert text.endswith(_readme("other-run")[len(BEFORE) :])
    assert "hand-typed numbers" in text  # the other block's body


def test_readme_cli(run_dir, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(_readme("lab"))
    cli = CliRunner()
    out = cli.invoke(app, ["report", str(run_dir), "--readme", str(readme), "--name", "lab",
                           "--tables", "auc_main"])  # fmt: skip
    assert out.exit_code == 0, out.output
    text = readme.read_text()
    assert "AUC of the detectors" in text and "TPR@" not in text
    missing = cli.invoke(app, ["report", str(run_dir), "--readme", str(readme)])
    assert missing.exit_code == 2
    assert "no results block 'micro-test'" in missing.output
    assert readme.read_text() == text  # a failed write leaves the file as it was
