"""`calibdcd report`: tables (Markdown, LaTeX, CSV), figures and the HTML page of a real run."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from calibdcd.report import write_report
from calibdcd.report.aggregate import (
    ablation_summary,
    load_results,
    selection_distribution,
)
from calibdcd.report.tables import build_tables
from experiment_support import micro_run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    _, run_dir = micro_run(tmp_path_factory)
    html = write_report(run_dir)
    return run_dir, html


def test_report_files(report):
    run_dir, html = report
    out = html.parent
    assert html == run_dir / "report" / "index.html"
    for name in ("tables.md", "tables.tex", "analyses.json"):
        assert (out / name).is_file(), name
    csvs = sorted(p.stem for p in (out / "csv").glob("*.csv"))
    expected = {"auc_main", "tpr_main", "ablation", "adaptive", "fp_recovery", "space",
                "settings", "selection_views", "selection_rank_strength",
                "base_vs_post"}  # fmt: skip
    assert expected <= set(csvs)
    tex = (out / "tables.tex").read_text()
    assert tex.count(r"\begin{tabular}") == len(csvs) == tex.count(r"\bottomrule")
    md = (out / "tables.md").read_text()
    assert md.count("### ") == len(csvs)
    figs = sorted((out / "figures").glob("*.png"))
    names = {p.name for p in figs}
    assert {"selection.png", "ablation.png", "adaptive_vs_fixed.png", "base_vs_post.png"} <= names
    assert sum(n.startswith("setting_") for n in names) == 2
    for p in figs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, p.name


def test_html_is_self_contained(report):
    _, html = report
    page = html.read_text()
    figs = list((html.parent / "figures").glob("*.png"))
    assert page.count("src='data:image/png;base64,") == len(figs)
    assert not re.search(r"""(src|href)=['"](?!data:)""", page)  # nothing fetched from outside
    assert "AUC of the detectors with and without CalibDCD" in page
    assert "Resolved config" in page and "Environment" in page
    assert "Calibration space" in page


def test_main_tables_hold_the_run_numbers(report):
    run_dir, html = report
    results = load_results(run_dir)
    rows = list(csv.reader(io.StringIO((html.parent / "csv" / "auc_main.csv").read_text())))
    header, body = rows[0], rows[1:]
    post = [r for r in results if r["post_trained"]]
    assert header[1:-1] == [f"{r['benchmark']} / {r['target']}" for r in post]
    assert body[0][0] == "Overlap" and body[1][0] == "Overlap + CalibDCD"
    for stage, row in (("before", body[0]), ("after", body[1])):
        assert row[1] == f"{100 * post[0][stage]['auc']['estimate']:.1f}"
    # base-vs-post pairs the chat model with its base
    rows = list(csv.reader(io.StringIO((html.parent / "csv" / "base_vs_post.csv").read_text())))
    base = next(r for r in results if r["target"] == "base")
    chat = next(r for r in results if r["target"] == "chat-qwen")
    assert rows[1][:4] == ["lab", "Overlap", "base", "chat-qwen"]
    assert rows[1][4] == f"{100 * base['before']['auc']['estimate']:.1f}"
    assert rows[1][5] == f"{100 * chat['before']['auc']['estimate']:.1f}"
    assert rows[1][6] == f"{100 * chat['after']['auc']['estimate']:.1f}"


def test_bold_marks_the_better_of_each_pair(report):
    run_dir, _ = report
    results = load_results(run_dir)
    table = next(t for t in build_tables(results) if t.key == "auc_main")
    for j in range(1, len(table.header)):
        b, a = float(table.rows[0][j]), float(table.rows[1][j])
        if a > b:
            assert (1, j) in table.bold and (0, j) not in table.bold
        elif b > a:
            assert (0, j) in table.bold and (1, j) not in table.bold
        md = table.markdown()
        assert md.count("**") == 2 * len(table.bold)


def test_analysis_aggregates(report):
    run_dir, html = report
    everything = load_results(run_dir)
    # the paper's analyses are over the post-trained targets: the base model's setting is left out
    results = [r for r in everything if r["post_trained"]]
    assert 0 < len(results) < len(everything)
    sel = selection_distribution(everything)
    k = results[0]["calibration"]["config"]["n_views"]
    assert sel["positions"] == k * len(results) == sum(sel["by_code"].values())
    assert sum(sum(r) for r in sel["matrix"]) + sel["no_correction"] == len(results)
    abl = ablation_summary(everything)
    assert abl[0]["name"] == "CalibDCD" and abl[0]["n"] == len(results)
    mean_after = sum(r["after"]["auc"]["estimate"] for r in results) / len(results)
    assert abl[0]["auc"] == pytest.approx(mean_after)
    for row in abl[1:5]:
        d = [
            r["analyses"]["ablations"][row["key"]]["auc"] - r["after"]["auc"]["estimate"]
            for r in results
        ]
        assert row["d_auc"] == pytest.approx(sum(d) / len(d))
    stored = json.loads((html.parent / "analyses.json").read_text())
    assert stored["selection"]["positions"] == sel["positions"]


def test_report_cli(report, tmp_path):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    run_dir, _ = report
    res = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "index.html").is_file()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "no such run directory" in bad.output
