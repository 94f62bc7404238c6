"""`calibdcd report`: tables (Markdown, LaTeX, CSV), figures and the HTML page of a real run."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil

import numpy as np
import pytest

from calibdcd.report import write_report
from calibdcd.report.aggregate import (
    ablation_summary,
    load_results,
    selection_distribution,
)
from calibdcd.report.tables import build_tables
from calibdcd.stats import compare
from experiment_support import micro_run, micro_seeds_run


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
    expected = {"auc_main", "tpr_main", "paired", "ablation", "adaptive", "fp_recovery",
                "space", "settings", "selection_views", "selection_rank_strength",
                "selection_why", "base_vs_post"}  # fmt: skip
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
    # the controls, the blind baseline and the paired statistics sit in the main results
    main = page.split("<h2>Main results</h2>")[1].split("<h2>")[0]
    for words in ("placebo (random basis)", "noise floor (half-sample interval)",
                  "centred CalibDCD (beyond the paper)", "Blind (TF-IDF + LR)",
                  "Paired comparisons", "Half-width", "p (DeLong)"):  # fmt: skip
        assert words in main, words


def test_main_tables_hold_the_run_numbers(report):
    run_dir, html = report
    results = load_results(run_dir)
    post = [r for r in results if r["post_trained"]]
    md = {t.key: t for t in build_tables(results)}["auc_main"]
    assert md.header[1:-1] == [f"{r['benchmark']} / {r['target']}" for r in post]
    body = md.rows
    assert [r[0] for r in body] == [
        "Overlap",
        "Overlap + CalibDCD",
        "Overlap + placebo (random basis)",
        "Overlap noise floor (half-sample interval)",
        "Overlap + centred CalibDCD (beyond the paper)",
        "Overlap + abstaining CalibDCD (beyond the paper)",
        "Overlap + CalibDCD, normalised space (beyond the paper)",
        "Blind (TF-IDF + LR)",
    ]
    # one seed: the value alone (no ±), marks after it
    controls = ("placebo", "noise_floor", "centred", "abstain", "normalized", "blind")
    values = [post[0]["before"]["auc"]["estimate"], post[0]["after"]["auc"]["estimate"]] + [
        post[0]["controls"][c]["auc"] for c in controls
    ]
    nf = post[0]["controls"]["noise_floor"]  # the half-sample floor: an interval around it
    for row, v, c in zip(body, values, ["", "", *controls], strict=True):
        want = f"[{100 * nf['auc_low']:.1f}, {100 * nf['auc_high']:.1f}]"
        assert row[1].rstrip("▲▼†") == (want if c == "noise_floor" else f"{100 * v:.1f}")
    # the CSV is for machines: one number per column, not the display cells
    recs = list(csv.DictReader(io.StringIO((html.parent / "csv" / "auc_main.csv").read_text())))
    methods = ["noise_interval" if c == "noise_floor" else c for c in controls]
    assert [r["method"] for r in recs] == ["original", "calibdcd", *methods]
    for rec, v in zip(recs, values, strict=True):
        assert float(rec["auc"]) == pytest.approx(100 * v, abs=1e-9)
    d = post[0]["paired"]["calibdcd_vs_original"]["auc"]
    assert float(recs[1]["delta_auc"]) == pytest.approx(100 * d["estimate"], abs=1e-9)
    assert float(recs[1]["delta_auc_low"]) == pytest.approx(100 * d["low"], abs=1e-9)
    assert int(recs[1]["verdict"]) == d["verdict"]
    paired = list(csv.DictReader(io.StringIO((html.parent / "csv" / "paired.csv").read_text())))
    for rec in paired:
        for k in ("delta_auc", "delta_auc_low", "delta_auc_high", "delta_auc_half_width"):
            float(rec[k])  # numbers, not "66.1 [62.6, 69.6]"
    # the micro lab's members and non-members come from one distribution: the blind baseline
    # is near chance and the detector beats it (no †)
    assert abs(post[0]["controls"]["blind"]["auc"] - 0.5) < 0.15
    assert "†" not in body[0][1]
    # base-vs-post pairs the chat model with its base
    rows = list(csv.reader(io.StringIO((html.parent / "csv" / "base_vs_post.csv").read_text())))
    base = next(r for r in results if r["target"] == "base")
    chat = next(r for r in results if r["target"] == "chat-qwen")
    assert rows[1][:4] == ["lab", "Overlap", "base", "chat-qwen"]
    assert rows[1][4] == f"{100 * base['before']['auc']['estimate']:.1f}"
    assert rows[1][5] == f"{100 * chat['before']['auc']['estimate']:.1f}"
    assert rows[1][6] == f"{100 * chat['after']['auc']['estimate']:.1f}"


def test_marks_follow_the_paired_intervals(report):
    """▲/▼ and bold only where the paired interval excludes 0; † where the detector does not
    beat the blind baseline (forced here by making the blind scores the detector's own)."""
    run_dir, _ = report
    results = load_results(run_dir)
    tables = {t.key: t for t in build_tables(results)}
    table, paired = tables["auc_main"], tables["paired"]
    verdict = {(r[0], r[1]): r[7] for r in paired.rows}
    for j, col in enumerate(table.header[1:-1], start=1):
        v = verdict[("Overlap + CalibDCD vs Overlap", col)]
        cell = table.rows[1][j]
        assert cell.endswith("▲") == (v == "better") and cell.endswith("▼") == (v == "worse")
        assert ((1, j) in table.bold) == (v == "better")
        assert ((0, j) in table.bold) == (v == "worse")
        for i, key in ((2, "Overlap + placebo vs Overlap"),):  # (noise floor: an interval)
            v = verdict[(key, col)]
            assert table.rows[i][j].endswith("▲") == (v == "better")
            assert table.rows[i][j].endswith("▼") == (v == "worse")
    md = table.markdown()
    assert md.count("**") == 2 * len(table.bold)
    for r in results:
        if r.pool is not None:
            r.pool["blind"] = r.pool["original"].copy()
    forced = next(t for t in build_tables(results) if t.key == "auc_main")
    assert all(c.endswith("†") for c in forced.rows[0][1:-1])


def test_seed_axis_mean_spread_and_pooled_paired_statistics(tmp_path_factory):
    """Two seeds of one cell: the main table prints mean ± SD over the seeds and the paired
    table's numbers are the hierarchical bootstrap over both seeds' pools (scores.csv)."""
    _, run_dir = micro_seeds_run(tmp_path_factory)
    results = load_results(run_dir)
    assert sorted(r["seed"] for r in results) == [0, 1]
    splits = [json.loads((run_dir / "settings" / r["id"] / "split.json").read_text())
              for r in results]  # fmt: skip
    assert splits[0]["supervised"] != splits[1]["supervised"]
    tables = {t.key: t for t in build_tables(results)}
    row = tables["auc_main"].rows[0]
    per_seed = [r["before"]["auc"]["estimate"] for r in results]
    mean, sd = 100 * sum(per_seed) / 2, 100 * float(np.std(per_seed, ddof=1))
    assert row[1].rstrip("▲▼†") == f"{mean:.1f} ± {sd:.1f}"
    pools = []
    for r in sorted(results, key=lambda r: r["seed"]):
        with (run_dir / "settings" / r["id"] / "scores.csv").open() as fh:
            rows = [x for x in csv.DictReader(fh) if x["in_pool"] == "1"]
        pools.append((np.array([int(x["label"]) for x in rows]),
                      np.array([float(x["score_placebo"]) for x in rows]),
                      np.array([float(x["score_before"]) for x in rows])))  # fmt: skip
    want = compare(pools, n_boot=1000, seed=0)  # the run's n_boot is 50: at least 1000
    got = next(p for p in tables["paired"].rows if p[0] == "Overlap + placebo vs Overlap")
    assert got[2] == 2
    a = want["auc"]
    assert got[3] == f"{100 * a.estimate:+.1f}"
    assert got[4] == f"[{100 * a.low:+.1f}, {100 * a.high:+.1f}]"
    assert got[5] == f"{100 * a.half_width:.1f}" and got[6] == f"{a.p_value:.3g}"
    assert a.per_seed == pytest.approx(
        [r["controls"]["placebo"]["auc"] - r["before"]["auc"]["estimate"] for r in results]
    )


def test_lab_pooled_pools_the_settings_of_several_runs(tmp_path_factory):
    """benchmarks/lab_pooled.py: a cell's paired interval over the pools of every run given
    (here the two-seed run and the one-seed run of chat-qwen: three pools), the same bootstrap
    as a run's own report, fed each run's scores.csv."""
    import importlib.util

    from experiment_support import REPO

    spec = importlib.util.spec_from_file_location(
        "lab_pooled", REPO / "benchmarks" / "lab_pooled.py"
    )
    lab_pooled = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab_pooled)
    _, one = micro_run(tmp_path_factory)
    _, two = micro_seeds_run(tmp_path_factory)
    rows = lab_pooled.pooled([two, one], comparisons=("placebo",))
    row = next(r for r in rows if r["target"] == "chat-qwen")
    # the report's pool order: the cell's settings by split seed, runs in the order given
    assert row["pools"] == [f"{two.name}/s0", f"{one.name}/s0", f"{two.name}/s1"]
    pools = []
    for run, seed in ((two, 0), (one, 0), (two, 1)):
        (r,) = (r for r in load_results(run) if r.target == "chat-qwen" and r.seed == seed)
        with (run / "settings" / r.id / "scores.csv").open() as fh:
            xs = [x for x in csv.DictReader(fh) if x["in_pool"] == "1"]
        pools.append((np.array([int(x["label"]) for x in xs]),
                      np.array([float(x["score_placebo"]) for x in xs]),
                      np.array([float(x["score_before"]) for x in xs])))  # fmt: skip
    want = compare(pools, n_boot=1000, seed=0)["auc"]
    assert row["comparison"] == "Overlap + placebo vs Overlap"
    assert row["n_texts"] == sum(len(p[0]) for p in pools)
    pool_level = row["pool_level"]  # kept beside the build level (each run one lab build)
    assert (pool_level["estimate"], pool_level["low"], pool_level["high"]) == (
        round(100 * want.estimate, 2),
        round(100 * want.low, 2),
        round(100 * want.high, 2),
    )
    assert pool_level["per_pool"] == [round(100 * x, 2) for x in want.per_seed]
    assert row["builds"] == [two.name, one.name] and row["interval"].startswith("build level")
    assert (row["low"], row["high"]) == (row["build_level"]["low"], row["build_level"]["high"])
    assert not row["meets_power"]  # the power criterion is about "+ CalibDCD vs X" only
    where = lab_pooled.provenance([two, one])
    assert where.count("`micro-test` (commit ") == 2
    # its targets name no `lab:`; each run's machine and start date from its environment.json
    assert "seeds [0, 1]; " in where and "seeds [0]; " in where
    env = json.loads((one / "environment.json").read_text())
    machine = env.get("cpu") or env.get("machine")
    assert f"; {machine}, {env['started'][:10]})" in where
    assert "resumed" not in where  # every setting computed at its run's latest commit
    # a run whose settings were computed at two commits says so, as its own report does
    resumed = tmp_path_factory.mktemp("resumed") / one.name
    shutil.copytree(one, resumed)
    first = sorted((resumed / "settings").glob("*/result.json"))[0]
    rec = json.loads(first.read_text())
    rec["provenance"].update(commit="0" * 40, dirty=False)
    first.write_text(json.dumps(rec))
    from calibdcd.experiment.rundir import record_setting_digests

    record_setting_digests(first.parent)  # as the run at that commit wrote it (not an edit)
    where = lab_pooled.provenance([two, resumed])
    n = len(list((resumed / "settings").glob("*/result.json")))
    assert where.count("resumed across 2 commits: ") == 1 and "0000000 (1 setting)" in where
    assert f" ({n - 1} setting{'s' if n != 2 else ''})" in where
    assert "| Overlap + placebo vs Overlap | chat-qwen | 3 |" in lab_pooled.table(rows)
    # a cell whose scores are identical in every pool (CalibDCD corrected none) has a zero
    # half-width that resolves nothing: it is said so and does not meet the power criterion
    same = {**row, "delta_auc": 0.0, "low": 0.0, "high": 0.0, "half_width": 0.0}
    same["verdict"] = "not resolved"
    assert row["identical"] is False
    text = lab_pooled.table([{**same, "identical": True, "meets_power": False}])
    assert "| 0.0 (identical scores in every pool: nothing to resolve) | not resolved |" in text


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
    paired = {(p["target"], p["comparison"]): p for p in stored["paired"]}
    for r in results:
        d = paired[(r["target"], "calibdcd")]["auc"]
        assert d["estimate"] == pytest.approx(
            r["after"]["auc"]["estimate"] - r["before"]["auc"]["estimate"]
        )
        assert d["n_seeds"] == 1 and d["low"] <= d["estimate"] <= d["high"]
    # the calibration-space table names each setting (detector x target repeats over seeds)
    md = (html.parent / "tables.md").read_text().split("### Calibration space")[1]
    rows = [x for x in md.split("###")[0].splitlines() if x.startswith("| ") and "---" not in x]
    spaced = [r["id"] for r in everything if r["analyses"].get("space")]
    assert spaced and [x.split(" | ")[0][2:] for x in rows[1:]] == spaced, rows


def test_report_cli(report, tmp_path):
    from typer.testing import CliRunner

    from calibdcd.cli import app

    run_dir, _ = report
    res = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "index.html").is_file()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "no such run directory" in bad.output


def test_paired_table_flags_an_estimate_outside_its_interval():
    """TPR at 5% FPR jumps with the few top non-member scores: when the bootstrap interval does
    not contain the estimate, the cell says so (‡) instead of printing it as if it did."""
    from calibdcd.report import aggregate as agg
    from calibdcd.report.tables import _paired_table
    from calibdcd.stats import PairedDelta

    def d(metric, est, low, high):
        return PairedDelta(metric, est, low, high, 0.95, 1000, 3, (est,) * 3)

    key = agg.COMPARISONS[0][0]
    paired = {
        ("VeilProbe", "lab", "chat"): {
            key: {"auc": d("auc", 0.01, -0.01, 0.02), "tpr": d("tpr", 0.05, -0.08, 0.047)}
        }
    }
    row = _paired_table([{"fpr": 0.05}], paired).rows[0]
    assert row[4] == "[-1.0, +2.0]"  # AUC: inside, unflagged
    assert row[9] == "[-8.0, +4.7]‡"
    assert row[11] == "–"  # not resolved either way


def test_a_base_model_run_on_its_own_gets_its_own_column_outside_the_average(report):
    """A base model that is no post-trained target's `base` (e.g. Gemma-3-270M base in
    configs/real-wikimia24.yaml) has no base-vs-post row, so the main and paired tables show it,
    labelled as a base model and outside Avg.; a base paired with its chat model stays out."""
    run_dir, _ = report
    results = load_results(run_dir)
    paired_base = {t.key: t for t in build_tables(results)}
    assert all("base" not in h for h in paired_base["auc_main"].header)
    alone = [r.model_copy(update={"base": None}) for r in results]  # the same run, unpaired
    tables = {t.key: t for t in build_tables(alone)}
    header = tables["auc_main"].header
    chat = next(r for r in results if r.target == "chat-qwen")
    base = next(r for r in results if r.target == "base")
    assert header[1:] == ["lab / chat-qwen", "lab / base (base model)", "Avg."]
    row = tables["auc_main"].rows[0]
    assert row[2].rstrip("▲▼†") == f"{100 * base.before.auc.estimate:.1f}"
    assert row[3] == f"{100 * chat.before.auc.estimate:.1f}"  # Avg. = the chat column alone
    assert "lab / base (base model)" in {r[1] for r in tables["paired"].rows}
    assert "base_vs_post" not in tables


def test_an_old_run_directory_says_it_ran_the_abstaining_normalised_variant(tmp_path):
    """A stored run from before the paper's method became the default (lab v2, lab seed 2)
    still reads, and its report names the variant it ran and why CalibDCD changed nothing."""
    import tarfile
    from pathlib import Path

    from calibdcd.report.aggregate import calibdcd_method, consensus_diagnostics

    tar = Path(__file__).resolve().parents[1] / "benchmarks/results/runs/lab-v2-lab2.tar.xz"
    with tarfile.open(tar) as tf:
        tf.extractall(tmp_path, filter="data")
    results = load_results(tmp_path / "lab2")
    method = calibdcd_method(results)
    assert "variant beyond the paper" in method and "abstains" in method
    assert "normalisation for VeilProbe" in method
    why = {(d["detector"], d["target"]): d for d in consensus_diagnostics(results)}
    vp = [d for (det, tgt), d in why.items() if det == "VeilProbe" and tgt != "base"]
    # the run's own record: VeilProbe abstained in 8 of its 9 chat settings (README)
    assert sum(d["settings"] - d["corrected"] for d in vp) == 8
    for d in why.values():
        assert d["settings"] == 3
        uncorrected = d["settings"] - d["corrected"]
        # abstention explains what the consensus does not: the counts never exceed the total
        assert d["uncorrected_empty_consensus"] + d["uncorrected_nonpositive_j"] <= uncorrected
        assert set(d["empty_at_rank"]) == {3, 4, 5, 6}
    tables = {t.key: t for t in build_tables(results)}
    assert "abstains when the best J" in tables["auc_main"].note
    assert "selection_why" in tables and "(0)" in tables["selection_rank_strength"].markdown()


def test_paper_method_is_named_for_a_run_with_the_defaults(report):
    from calibdcd.report.aggregate import calibdcd_method, consensus_diagnostics

    run_dir, _ = report
    results = load_results(run_dir)
    assert calibdcd_method(results).startswith("CalibDCD here is the paper's method")
    for r in results:
        assert r.calibration["config"]["guard"] is False and r.space == "raw"
        diag = r.calibration["diagnostics"]
        assert (diag["reason"] is None) == r.calibration["corrected"]
    rows = consensus_diagnostics(results)
    assert sum(d["settings"] for d in rows) == len([r for r in results if r.calibration])
    # the per-setting table says why a setting was left uncorrected
    table = {t.key: t for t in build_tables(results)}["settings"]
    col = table.header.index("Why no correction")
    for r, row in zip(results, table.rows, strict=True):
        assert row[col] == (r.calibration["diagnostics"]["reason"] or "")


@pytest.fixture(scope="module")
def real_regime(tmp_path_factory):
    """The stored real-regime run (SmolLM2 lab, split seeds 0-2), read back."""
    import tarfile
    from pathlib import Path

    tar = Path(__file__).resolve().parents[1] / "benchmarks/results/runs/real-regime.tar.xz"
    out = tmp_path_factory.mktemp("real-regime")
    with tarfile.open(tar) as tf:
        tf.extractall(out, filter="data")
    return load_results(out / "real-regime")


def _variant(results, detector: str, label: str, change):
    """Copies of ``detector``'s settings under ``label`` (one family, another variant), their
    texts in another order and the last few dropped, scores replaced by ``change(label, score)``."""
    import numpy as np

    out = []
    for r in results:
        if r.detector != detector:
            continue
        v = r.model_copy(update={"detector": label})
        order = np.random.default_rng(r.seed).permutation(len(r.pool["id"]))[:-5]
        pool = {k: a[order] for k, a in r.pool.items()}
        pool["original"] = change(pool["label"], pool["original"])
        v.pool = pool
        out.append(v)
    return out


def test_two_variants_of_one_detector_are_compared_on_the_texts_both_scored(real_regime):
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from calibdcd.report.aggregate import variant_pairs

    assert variant_pairs(real_regime) == {}  # no family under two labels in the stored run
    vp = [r for r in real_regime if r.detector == "VeilProbe"]  # (tables of one detector: fast)
    assert "variants" not in {t.key for t in build_tables(vp)}
    same = _variant(vp, "VeilProbe", "VeilProbe-copy", lambda y, s: s)
    pairs = variant_pairs(vp + same, n_boot=200)
    assert set(pairs) == {
        ("VeilProbe-copy", "VeilProbe", "real-regime", t) for t in ("base", "chat")
    }
    for (_, _, _, tgt), res in pairs.items():  # the same scores, joined by id: Δ = 0
        assert res["auc"].estimate == 0 and res["auc"].half_width == 0 and res["auc"].n_seeds == 3
        # each seed's texts less the five the copy dropped
        assert res["n_texts"] == sum(len(r.pool["id"]) - 5 for r in vp if r.target == tgt)
        assert res["detector"] == "veilprobe"
    # three labels of one family: every two of them, the later one as A
    third = _variant(vp, "VeilProbe", "VeilProbe-third", lambda y, s: -s)
    keys = {k[:2] for k in variant_pairs(vp + same + third, n_boot=50)}
    assert keys == {
        ("VeilProbe-copy", "VeilProbe"),
        ("VeilProbe-third", "VeilProbe"),
        ("VeilProbe-third", "VeilProbe-copy"),
    }
    # two settings that gave one text two labels did not read the same benchmark: refused
    bad = _variant(vp, "VeilProbe", "VeilProbe-bad", lambda y, s: s)
    bad[0].pool["label"] = 1 - bad[0].pool["label"]
    with pytest.raises(ValueError, match="one text id with two labels"):
        variant_pairs(vp + bad, n_boot=50)

    # a variant that reads membership better on the texts (labels shifted into the scores)
    def stronger(y, s):
        return s + 3.0 * np.std(s) * y

    strong = _variant(vp, "VeilProbe", "VeilProbe-strong", stronger)
    res = variant_pairs(vp + strong, n_boot=200)[
        ("VeilProbe-strong", "VeilProbe", "real-regime", "chat")
    ]
    assert res["auc"].verdict > 0 and res["auc"].low > 0
    # the estimate: the seeds' ΔAUC on the joined texts, computed here from the pools
    deltas = []
    for r in (r for r in vp if r.target == "chat"):
        v = next(x for x in strong if x.seed == r.seed and x.target == "chat")
        _, ia, ib = np.intersect1d(r.pool["id"], v.pool["id"], return_indices=True)
        y = r.pool["label"][ia]
        deltas.append(
            roc_auc_score(y, v.pool["original"][ib]) - roc_auc_score(y, r.pool["original"][ia])
        )
    assert res["auc"].estimate == pytest.approx(np.mean(deltas), abs=1e-9)
    table = {t.key: t for t in build_tables(vp + strong)}["variants"]
    assert "VeilProbe-strong vs VeilProbe" in table.markdown()
    assert {rec["target"] for rec in table.records} == {"base", "chat"}
