"""J against the AUC change in every report (issue 48 item 6): per detector x target the applied
correction's J against the evaluation ΔAUC, as a table (Spearman over settings with a bootstrap
interval) and a figure."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from scipy.stats import spearmanr

from calibdcd.report.j_vs_auc import (
    TOO_FEW,
    j_vs_auc,
    j_vs_auc_points,
    rank_correlation,
    selected_j,
)
from experiment_support import micro_run


def test_rank_correlation_is_spearman_with_a_seeded_interval():
    x = [0.0, 0.0, 1.2, -0.4, 2.5, 0.7, 0.7]  # ties, as uncorrected settings give
    y = [0.0, 0.0, 0.01, -0.02, 0.015, -0.005, 0.003]
    c = rank_correlation(x, y)
    assert c["rho"] == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    assert -1.0 <= c["low"] <= c["high"] <= 1.0 and c["note"] is None
    assert 0 < c["usable"] <= c["n_boot"] and c["n"] == 7
    assert rank_correlation(x, y) == c  # seeded
    assert rank_correlation(x, y, seed=1)["low"] is not None
    # too few settings, too few distinct points, a constant coordinate
    assert rank_correlation([1.0, 2.0], [1.0, 3.0])["note"] == TOO_FEW == "too few settings"
    assert rank_correlation([0.0, 0.0, -1.3], [0.0, 0.0, -0.01])["note"].startswith(
        "too few distinct points"
    )
    flat = rank_correlation([0.0, 0.0, 0.0], [0.1, 0.0, 0.2])
    assert flat["rho"] is None and "constant" in flat["note"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return micro_run(tmp_path_factory)[1]


def _variants(results, points):
    """Copies of the run's chat-qwen result as further seeds, each with the given applied J and
    ΔAUC (None: no correction)."""
    base = next(r for r in results if r.target == "chat-qwen")
    out = []
    for seed, (j, d) in enumerate(points):
        cal = dict(base.calibration)
        if j is None:
            cal.update(corrected=False, rank=None, strength=0.0)
            d = 0.0
        else:
            cal.update(corrected=True, rank=3, strength=0.7, objective={"3/0.7": j, "2/1": 9.9})
        auc = base.before.auc.model_copy(update={"estimate": base.before.auc.estimate + d})
        after = base.after.model_copy(update={"auc": auc})
        out.append(
            base.model_copy(
                update={
                    "id": base.id.replace("__s0", f"__s{seed}"),
                    "seed": seed,
                    "calibration": cal,
                    "after": after,
                }
            )
        )
    return out


def test_table_and_figure_for_a_run_match_scipy(run, tmp_path):
    from calibdcd.report.aggregate import load_results
    from calibdcd.report.figures import j_vs_auc_figure
    from calibdcd.report.tables import build_tables

    results = load_results(run)
    spec = [(0.8, 0.012), (None, None), (-0.3, 0.02), (1.5, -0.024), (0.2, 0.001), (None, None)]
    settings = _variants(results, spec)
    pts = j_vs_auc_points(settings)
    # J is the applied candidate's (not the best elsewhere), 0 where nothing was applied
    assert [p.j for p in pts] == [0.8, 0.0, -0.3, 1.5, 0.2, 0.0]
    assert selected_j(settings[0]) == 0.8
    xs, ys = [p.j for p in pts], [p.d_auc for p in pts]
    (cell,) = j_vs_auc(settings)["cells"]
    assert cell["settings"] == 6 and cell["corrected"] == 4
    assert cell["all"]["rho"] == pytest.approx(spearmanr(xs, ys)[0], abs=1e-12)
    kept = [i for i, s in enumerate(spec) if s[0] is not None]
    assert cell["corrected_only"]["rho"] == pytest.approx(
        spearmanr([xs[i] for i in kept], [ys[i] for i in kept])[0], abs=1e-12
    )
    assert cell["j_positive_auc_lost"] == 1 and cell["j_nonpositive_auc_gained"] == 1
    table = {t.key: t for t in build_tables(settings)}["j_vs_auc"]
    (rec,) = list(csv.DictReader(io.StringIO(table.csv())))
    assert float(rec["rho"]) == pytest.approx(spearmanr(xs, ys)[0], abs=1e-12)
    assert float(rec["rho_low"]) <= float(rec["rho_high"])
    assert table.rows[0][4] == f"{spearmanr(xs, ys)[0]:+.2f}"
    assert "Spearman" in table.markdown()
    png = j_vs_auc_figure(settings, tmp_path / "j.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_report_has_the_table_and_figure(run):
    """The micro run (one setting per detector x target): the table says too few settings."""
    from calibdcd.report import write_report

    html = write_report(run)
    out = html.parent
    assert (out / "figures" / "j_vs_auc.png").is_file()
    rows = list(csv.DictReader(io.StringIO((out / "csv" / "j_vs_auc.csv").read_text())))
    assert {r["target"] for r in rows} >= {"chat-qwen", "base"}
    assert all(r["rho_note"] == "too few settings" for r in rows)
    md = (out / "tables.md").read_text()
    assert "J against the evaluation ΔAUC" in md and "too few settings" in md
    page = html.read_text()
    assert "J against the AUC change" in page and "too few settings" in page
    assert np.isfinite([float(r["settings"]) for r in rows]).all()
