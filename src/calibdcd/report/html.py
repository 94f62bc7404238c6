"""One self-contained HTML page: tables inline, figures embedded as base64 PNG."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibdcd.report.tables import Table

__all__ = ["render_html"]

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;
color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em}
th,td{border:1px solid #ddd;padding:.25em .55em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:.85em;margin:.2em 0}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
code,pre{background:#f6f6f6;padding:.1em .3em;font-size:.85em}
details{margin:.5em 0}
"""


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'/>"


def _completed(n_results: int, grid_size: int | None) -> str:
    """The page's count: k of the grid's n settings when the grid is known, else k completed."""
    if grid_size is None:
        return f"{n_results} completed setting(s)"
    return f"{n_results} of {grid_size} settings of the grid completed"


def render_html(
    *,
    title: str,
    tables: Sequence[Table],
    figures: dict[str, list[Path]],
    env: dict[str, Any] | None,
    config_text: str | None,
    n_results: int,
    excluded: Sequence[str] = (),
    warnings: Sequence[str] = (),
    grid_size: int | None = None,
    missing: Sequence[str] = (),
    provenance: str | None = None,
) -> str:
    by_key = {t.key: t for t in tables}
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{_completed(n_results, grid_size)}. Scores: higher = member. Metrics on the "
        "evaluation pool; CalibDCD is fitted on the calibration non-members only.</p>",
    ]
    if provenance:  # config, commit(s), machine, start (a resumed run names every commit)
        parts.append(f"<p class='note'>{html.escape(provenance)}</p>")
    if missing:
        parts.append(
            f"<p class='note'>{len(missing)} setting(s) of the grid have no result yet (an "
            "unfinished run, or one shard of several) and are not in the tables: "
            + html.escape(", ".join(missing))
            + "</p>"
        )
    if warnings:
        parts.append(
            "<p class='note'><b>Warnings</b></p><ul>"
            + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
            + "</ul>"
        )
    if excluded:
        parts.append(
            f"<p class='note'>{len(excluded)} setting(s) in the run directory are not in its "
            "config and are left out: " + html.escape(", ".join(excluded)) + "</p>"
        )

    def section(name: str, keys: Sequence[str], figs: Sequence[str] = ()) -> None:
        body = [by_key[k].html() for k in keys if k in by_key]
        imgs = [p for p in figures.get("summary", []) if p.name in figs]
        if not body and not imgs:
            return
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.extend(body)
        parts.extend(_img(p, p.stem) for p in imgs)

    section("Main results", ["auc_main", "tpr_main", "paired", "variants"])
    section("Ablations", ["ablation"], ["ablation.png"])
    section("Adaptive vs fixed correction", ["adaptive"], ["adaptive_vs_fixed.png"])
    section("False-positive recovery", ["fp_recovery"], ["fp_recovery.png"])
    section("Calibration space", ["space"])
    section(
        "Selection distributions", ["selection_views", "selection_rank_strength"], ["selection.png"]
    )
    section("J against the AUC change", ["j_vs_auc"], ["j_vs_auc.png"])
    section("Base vs post-trained", ["base_vs_post"], ["base_vs_post.png"])
    section("Every setting", ["settings"])
    per = figures.get("settings", [])
    if per:
        parts.append("<h2>ROC curves and score histograms per setting</h2>")
        for p in per:
            parts.append(
                f"<details><summary>{html.escape(p.stem.removeprefix('setting_'))}</summary>"
            )
            parts.append(_img(p, p.stem) + "</details>")
    if env:
        parts.append(
            "<h2>Environment</h2><pre>" + html.escape(json.dumps(env, indent=2)) + "</pre>"
        )
    if config_text:
        parts.append("<h2>Resolved config</h2><pre>" + html.escape(config_text) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)
