"""`calibdcd report RUN_DIR --readme FILE`: a Markdown file's results block written from a real
run's files (the micro run of experiment_support), with its provenance; nothing outside the block
changes; a missing or broken block is a clear error.

And the project's own pages: README.md is a short front page (the two commands first, at most
300 lines) whose one verdict table is what ``benchmarks/verdict.py`` generates from the stored
results; the result blocks live in docs/results.md, and the stored runs regenerate theirs
(slow)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibdcd.cli import app
from calibdcd.report.readme import (
    VERDICT_CLOSE,
    VERDICT_OPEN,
    BlockError,
    readme_block,
    replace_block,
    replace_verdict,
    results_block,
    verdict_block,
    write_readme,
)
from experiment_support import REPO, micro_run, verdict_module

README = REPO / "README.md"
RESULTS = REPO / "docs" / "results.md"
#: the result blocks of docs/results.md, in its order
BLOCKS = (
    "lab-demo",
    "lab-micro",
    "lab-v2",
    "lab-v2-pooled",
    "lab-v2-lab1-controls",
    "real-regime",
    "real-wikimia24",
)

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


def test_replace_verdict_keeps_everything_outside_and_reads_back():
    text = f"{BEFORE}{VERDICT_OPEN}\nold table\n{VERDICT_CLOSE}{AFTER}"
    new = replace_verdict(text, "| a |\n|---|\n| 1 |", source="README.md")
    assert new == f"{BEFORE}{VERDICT_OPEN}\n| a |\n|---|\n| 1 |\n{VERDICT_CLOSE}{AFTER}"
    assert verdict_block(new) == "| a |\n|---|\n| 1 |"
    assert replace_verdict(new, "| a |\n|---|\n| 1 |") == new
    with pytest.raises(BlockError, match=r"README\.md: no verdict block"):
        replace_verdict(BEFORE, "x", source="README.md")
    with pytest.raises(BlockError, match="the verdict block is not closed"):
        replace_verdict(f"{BEFORE}{VERDICT_OPEN}\nx\n", "x")
    with pytest.raises(BlockError, match="opens more than once"):
        verdict_block(f"{VERDICT_OPEN}\n{VERDICT_CLOSE}\n{VERDICT_OPEN}\n{VERDICT_CLOSE}")
    # a results block is read back as written
    block = replace_block(_readme("demo"), "demo", "| x |")
    assert results_block(block, "demo") == "| x |"


def test_readme_is_a_front_page():
    """The two commands first, exactly; at most 300 lines; no result block of its own (they are
    in docs/results.md), one verdict block."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    head = text.split("\n\n", 2)[1]
    assert head.splitlines() == [
        "```bash",
        "make demo   # sets up .venv, builds the demo lab, runs the detectors with and without "
        "CalibDCD",
        "make test   # sets up .venv and runs the fast test suite",
        "```",
    ]
    assert "<!-- calibdcd:results" not in text
    assert text.count(VERDICT_OPEN) == 1 and text.count(VERDICT_CLOSE) == 1
    for link in re.findall(r"\]\(((?:docs|configs)/[^)#]+)\)", text):
        assert (REPO / link).exists(), f"README.md links to {link}, which does not exist"


def test_results_md_holds_every_block():
    text = RESULTS.read_text(encoding="utf-8")
    assert re.findall(r"<!-- calibdcd:results ([a-z0-9-]+) -->", text) == list(BLOCKS)
    for name in BLOCKS:
        body = results_block(text, name, source="docs/results.md")
        assert body.startswith("Written by "), name  # every block names where it came from
    # the command that writes them, as the file itself says
    assert "calibdcd report RUN_DIR --readme docs/results.md" in " ".join(text.split())


def _stored_inputs(verdict) -> list[Path]:
    archives = [a for _, a, _ in verdict.RUN_STUDIES]
    return [verdict.POOLED_JSON, *verdict.POOLED_ARCHIVES, *archives, verdict.RESULTS_MD]


def test_the_readme_verdict_table_is_the_generated_one():
    """`python benchmarks/verdict.py --write README.md` regenerates the README's verdict table
    from the stored results: the table in README.md is exactly that, never typed."""
    verdict = verdict_module()
    missing = [p for p in _stored_inputs(verdict) if not p.exists()]
    if missing:
        pytest.skip(f"inputs of the verdict table absent: {[str(p) for p in missing]}")
    table = verdict.verdict_table()
    have = verdict_block(README.read_text(encoding="utf-8"), source="README.md")
    assert have == table.strip("\n"), "README.md's verdict table is stale: rerun " \
        "`python benchmarks/verdict.py --write README.md`"  # fmt: skip
    # one row per study x target x detector, the paper's detectors and the overlap baseline
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| Study")]
    studies = [r.split(" | ")[0].lstrip("| ") for r in rows]
    assert set(studies) == {"lab-v2, pooled", "lab-v2, lab seed 0", "real-regime",
                            "real-wikimia24", "lab-micro"}  # fmt: skip
    assert len(rows) == 21
    # the pooled rows are the pooled JSON's, digit for digit
    pooled = json.loads(verdict.POOLED_JSON.read_text(encoding="utf-8"))["rows"]
    for rec in pooled:
        cell = f"{rec['delta_auc']:+.1f} [{rec['low']:+.1f}, {rec['high']:+.1f}]"
        assert any(f"| {rec['target']} |" in r and rec["detector"] in r and cell in r
                   for r in rows), rec  # fmt: skip
    # the lab-micro rows are its block's paired rows
    block = results_block(RESULTS.read_text(encoding="utf-8"), "lab-micro")
    assert "| DPDLLM + CalibDCD vs DPDLLM | lab / chat-qwen | 3 | +0.0 | [+0.0, +0.0] |" in block


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, archive",
    [
        ("real-regime", "real-regime.tar.xz"),
        ("real-wikimia24", "real-wikimia24-paper.tar.xz"),
        ("lab-v2", "lab-v2-paper-lab0.tar.xz"),
        ("lab-v2-lab1-controls", "lab-v2-lab1-dpdllm-controls.tar.xz"),
    ],
)
def test_a_stored_run_rewrites_its_results_block(name, archive):
    """Each stored run directory regenerates its docs/results.md block byte for byte (what
    `calibdcd report RUN --readme docs/results.md` would write)."""
    verdict = verdict_module()
    path = verdict.RUNS / archive
    if not path.exists():
        pytest.skip(f"{path} absent")
    with verdict.unpacked(path) as (run,):
        got = readme_block(run)
    assert got.strip("\n") == results_block(RESULTS.read_text(encoding="utf-8"), name)


def test_the_time_to_a_verdict_in_scaling_md_is_the_generated_one():
    """docs/scaling.md's time-to-verdict table is `benchmarks/time_to_verdict.py
    configs/paper.yaml`'s output (its completions counted from the config's plan), never typed;
    and its count is the dry run's rule: per text, VeilProbe's paper preset asks 3 sampled
    suffixes for the text and its perturbation (6), DPDLLM one continuation."""
    from calibdcd.report.readme import results_block

    if not (REPO.parent / "shared" / "data" / "BookTection").is_dir():
        pytest.skip("the shared benchmark copies are absent: paper.yaml's sizes cannot be read")
    spec = importlib.util.spec_from_file_location(
        "time_to_verdict", REPO / "benchmarks" / "time_to_verdict.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["time_to_verdict"] = mod  # (its dataclass looks its module up)
    spec.loader.exec_module(mod)
    rate = mod._measured_rate()
    if rate is None:
        pytest.skip("benchmarks/results/engine_throughput.json is absent")
    table = mod.table(REPO / "configs" / "paper.yaml", [rate], mod.STORED_RUN)
    doc = (REPO / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert results_block(doc, "time-to-verdict") == table.strip("\n"), (
        "docs/scaling.md's time-to-verdict block is stale: rerun "
        "`python benchmarks/time_to_verdict.py configs/paper.yaml --write docs/scaling.md`"
    )
    work = {w.label: w for w in mod.count_work(REPO / "configs" / "paper.yaml")}
    assert work["VeilProbe"].completions == 6 * work["VeilProbe"].texts
    assert work["DPDLLM"].completions == work["DPDLLM"].texts


#: docs/scaling.md's blocks a benchmark script writes from its stored record:
#: (block, script, the script's table function, stored record, the command that rewrites both)
SCALING_BLOCKS = [
    (
        "client-throughput",
        "client_throughput",
        "table",
        "client_throughput.json",
        "python benchmarks/client_throughput.py --out benchmarks/results/client_throughput.json "
        "--write docs/scaling.md",
    ),
    (
        "generation-parity",
        "targets",
        "parity_table",
        "parity_smollm2.json",
        "python benchmarks/targets.py --parity packaged:smollm2-135m-instruct "
        "--json benchmarks/results/parity_smollm2.json --write docs/scaling.md",
    ),
]


@pytest.mark.parametrize("block,script,fn,stored,command", SCALING_BLOCKS)
def test_a_scaling_md_table_is_its_stored_record(block, script, fn, stored, command):
    """docs/scaling.md's benchmark tables are what their scripts write from the stored records
    in benchmarks/results/, never typed, and each record names its commit and kernel level."""
    from calibdcd.report.readme import results_block

    if script == "targets":
        pytest.importorskip("torch")  # (targets.py imports it at the top)
    spec = importlib.util.spec_from_file_location(
        f"bench_{script}", REPO / "benchmarks" / f"{script}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    record = json.loads((REPO / "benchmarks" / "results" / stored).read_text())
    doc = (REPO / "docs" / "scaling.md").read_text(encoding="utf-8")
    assert results_block(doc, block) == getattr(mod, fn)(record), (
        f"docs/scaling.md's {block} block is stale: rerun `{command}`"
    )
    assert record["git"]["commit"] and record["kernel"]  # the numbers name their run


def test_the_generation_parity_record_meets_the_bar():
    """Issue 47's bar: HFTarget's generated tokens/s at least 0.8x batched model.generate's on
    SmolLM2-135M at batch 16 (the median of at least three runs)."""
    record = json.loads((REPO / "benchmarks" / "results" / "parity_smollm2.json").read_text())
    assert record["ratio_median"] >= 0.8 and len(record["runs"]) >= 3
