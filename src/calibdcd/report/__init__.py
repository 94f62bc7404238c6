"""Reports of a run directory: the paper's tables (Markdown, LaTeX, CSV), figures (PNG) and one
self-contained HTML page.

>>> from calibdcd.report import write_report
>>> write_report("runs/lab-small")            # doctest: +SKIP  -> runs/lab-small/report/index.html

Layout of the report directory::

    report/tables.md  report/tables.tex  report/csv/<table>.csv
    report/figures/*.png  report/analyses.json  report/index.html

Figures need matplotlib (the ``report`` extra); nothing here imports torch.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from calibdcd.atomic import read_json

__all__ = ["write_report"]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` (default into ``run_dir/report``); returns index.html."""
    import calibdcd.report.aggregate as agg
    from calibdcd.atomic import atomic_write_text, write_json
    from calibdcd.redact import redact
    from calibdcd.report.figures import make_figures
    from calibdcd.report.html import render_html
    from calibdcd.report.j_vs_auc import j_vs_auc
    from calibdcd.report.readme import provenance_line, setting_provenances
    from calibdcd.report.tables import build_tables

    run = Path(run_dir)
    results = agg.load_results(run)
    out = Path(out_dir) if out_dir is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    # the bootstrapped comparisons, computed once for the tables and analyses.json
    paired, variants = agg.paired_cells(results), agg.variant_pairs(results)
    tables = build_tables(results, paired, variants)
    atomic_write_text(out / "tables.md", "\n".join(t.markdown() for t in tables))
    atomic_write_text(out / "tables.tex", "\n".join(t.latex() for t in tables))
    for t in tables:
        atomic_write_text(out / "csv" / f"{t.key}.csv", t.csv())
    write_json(
        out / "analyses.json",
        {
            "ablations": agg.ablation_summary(results),
            "adaptive_vs_fixed": agg.adaptive_vs_fixed(results),
            "fp_recovery": agg.fp_recovery_summary(results),
            "selection": agg.selection_distribution(results),
            "base_vs_post": agg.base_vs_post(results),
            "j_vs_auc": j_vs_auc(results),
            "paired": [
                {
                    "detector": d,
                    "benchmark": b,
                    "target": tg,
                    "comparison": key,
                    **{m: v.as_dict() for m, v in res.items()},
                }
                for (d, b, tg), comps in paired.items()
                for key, res in comps.items()
            ],
            "variants": [
                {
                    "a": a,
                    "b": b,
                    "benchmark": bench,
                    "target": tg,
                    "detector": res["detector"],
                    "n_texts": res["n_texts"],
                    **{m: res[m].as_dict() for m in ("auc", "tpr")},
                }
                for (a, b, bench, tg), res in variants.items()
            ],
        },
    )
    grid = agg.grid_ids(run)  # "k of n settings" (None: an older run without grid.json)
    stale = agg.stale_settings(run)
    if stale:
        warnings.warn(
            f"{run}: {len(stale)} setting(s) not in the run's grid are left out of the report: "
            + ", ".join(stale),
            stacklevel=2,
        )
    figures = make_figures(run, results, out / "figures")
    env_path, cfg_path = run / "environment.json", run / "config.yaml"
    env = read_json(env_path) if env_path.is_file() else None
    cfg_text = cfg_path.read_text() if cfg_path.is_file() else None
    title = f"CalibDCD report: {run.resolve().name}"
    page = render_html(
        title=title,
        tables=tables,
        figures=figures,
        env=env,
        config_text=cfg_text,
        n_results=len(results),
        excluded=stale,
        warnings=[f"{r.id}: {w}" for r in results for w in r.warnings],
        grid_size=None if grid is None else len(grid),
        missing=[i for i in grid or [] if i not in {r.id for r in results}],
        provenance=provenance_line(
            run, env, len(results), setting_provenances(results), prefix="Provenance: "
        ),
    )
    atomic_write_text(out / "index.html", redact(page))
    return out / "index.html"
