"""The page ``calibdcd score`` writes beside its scores: an audit a person can look at.

One self-contained HTML file (no external file, script or font; figures are PNGs embedded as
base64): the verdict in words (the set-level test, the distribution check, the per-text
decisions and the fit's own check on the known texts, each with its numbers), the suspect
texts' scores against the held-out known non-members' (histograms and ECDFs, with the bundle's
threshold) and their p-values, the per-text table sorted by p-value, and the bundle's
provenance (target, detector, CalibDCD's selection, fit date and versions, FPR, sizes).

Everything on the page that comes from the bundle, the config or the texts passes
:func:`calibdcd.redact.redact` and is HTML-escaped. Figures need matplotlib (the ``report``
extra); without it the page is written with a note in their place.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibdcd.atomic import atomic_write_text
from calibdcd.redact import redact

__all__ = ["MAX_ROWS", "TEXT_CHARS", "report_path", "write_report"]

#: rows of the per-text table at most (the lowest p-values; every text is in the scores file)
MAX_ROWS = 5000
#: characters of each text shown in the table
TEXT_CHARS = 80

_SUSPECT, _NULL, _THRESHOLD = "#d95f02", "#7570b3", "#222222"

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em;
font-size:1.2em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em}
th,td{border:1px solid #ddd;padding:.25em .55em;text-align:right;vertical-align:top}
th{background:#f4f4f4}td.l,th.l{text-align:left}
td.text{font-family:ui-monospace,Menlo,Consolas,monospace;text-align:left;font-size:.95em}
tr.member td{background:#fff3e8}
.warn{background:#fff4f4;border-left:4px solid #c0392b;padding:.5em .8em;margin:.6em 0}
.note{color:#555;font-size:.88em}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
code{background:#f6f6f6;padding:.1em .3em;font-size:.9em}
"""


def report_path(out: str | Path) -> Path:
    """Where ``score -o OUT`` writes its page: OUT with its suffix replaced by ``.html``
    (``scores.jsonl`` -> ``scores.html``); an OUT that already ends in ``.html`` gets
    ``.report.html`` instead, so the page never replaces the scores."""
    p = Path(out)
    page = p.with_suffix(".html") if p.suffix else p.with_name(p.name + ".html")
    return p.with_name(p.stem + ".report.html") if page == p else page


def _e(value: Any) -> str:
    """A value from the bundle, the config or the texts, as page text: redacted and escaped."""
    return html.escape(redact(str(value)), quote=True)


def _num(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "–"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "+∞" if v > 0 else "−∞"
    return format(v, fmt)


def _snippet(text: str, width: int = TEXT_CHARS) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figures(
    suspect: np.ndarray, null: np.ndarray, p: np.ndarray, threshold: float, fpr: float
) -> list[tuple[str, str]] | str:
    """(base64 PNG, caption) of the score figure and the p-value figure; a note (str) when
    matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return (
            "Figures need matplotlib: <code>pip install 'calibdcd[report]'</code> and score "
            "again (the numbers below do not need it)."
        )
    out: list[tuple[str, str]] = []
    fig = Figure(figsize=(10.0, 3.4))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    both = np.r_[suspect, null]
    edges = np.histogram_bin_edges(both, bins=min(40, max(10, int(np.sqrt(both.size)) + 1)))
    if edges[0] == edges[-1]:  # one value everywhere
        edges = np.array([edges[0] - 0.5, edges[0] + 0.5])
    ax1.hist(null, bins=edges, density=True, alpha=0.55, color=_NULL,
             label=f"held-out known non-members (n = {null.size:,})")  # fmt: skip
    ax1.hist(suspect, bins=edges, density=True, alpha=0.55, color=_SUSPECT,
             label=f"suspect texts (n = {suspect.size:,})")  # fmt: skip
    for ax in (ax1, ax2):
        if math.isfinite(threshold):
            ax.axvline(threshold, color=_THRESHOLD, ls="--", lw=1.2,
                       label=f"threshold at FPR {fpr:g}")  # fmt: skip
        ax.set_xlabel("score (higher = more member-like)")
    ax1.set_ylabel("density")
    ax1.set_title("Scores: suspect texts against the known non-members")
    curves = ((null, _NULL, "known non-members"), (suspect, _SUSPECT, "suspect texts"))
    for values, color, name in curves:
        xs = np.sort(values)
        ax2.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", color=color, label=name)
    ax2.set_ylabel("share of texts scoring at most x")
    ax2.set_title("ECDF: a suspect curve to the right = higher scores")
    ax1.legend(fontsize=7, loc="best")
    ax2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out.append(
        (
            _png(fig),
            "Left: histograms (each normalised to area 1) of the suspect texts' scores and of "
            "the held-out known non-members' (the null every p-value is computed against); "
            "right: their empirical distribution functions. A suspect set that was in the "
            "training data sits to the right of the non-members; scores right of the dashed "
            "threshold are declared members.",
        )
    )
    fig = Figure(figsize=(5.2, 3.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.hist(p, bins=np.linspace(0.0, 1.0, 21), density=True, color=_SUSPECT, alpha=0.7,
            label=f"suspect texts (n = {p.size:,})")  # fmt: skip
    ax.axhline(1.0, color=_NULL, ls="-", lw=1.2, label="non-members' (uniform)")
    ax.axvline(fpr, color=_THRESHOLD, ls="--", lw=1.2, label=f"FPR {fpr:g}")
    ax.set_xlim(0, 1)
    ax.set_xlabel("p-value against the held-out non-members")
    ax.set_ylabel("density")
    ax.set_title("p-values of the suspect texts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.append(
        (
            _png(fig),
            "The suspect texts' p-values. Fresh non-members give p-values spread evenly over "
            "(0, 1] (the flat line); members pile up near 0.",
        )
    )
    return out


# --------------------------------------------------------------------------------------------
# Words
# --------------------------------------------------------------------------------------------


def _set_test_words(st: Mapping[str, Any] | None, alpha: float) -> str:
    if not st:
        return (
            "<b>Set-level test:</b> not run: no suspect text is at once distinct, outside the "
            "fit's own texts and scored with finite features."
        )
    reject = bool(st.get("reject"))
    verdict = (
        "<b>the set is MORE member-like than the known non-members</b>: evidence that it was "
        "in the target's training data, provided the known non-members are a fair reference "
        "for it (the distribution check below)"
        if reject
        else "<b>the set is not distinguishable from the known non-members</b> (which is not "
        "evidence that it was left out of training: the detector may not see it; the fit's "
        "check below says how well it sees known members)"
    )
    return (
        f"<b>Set-level test:</b> the {int(st['n_suspect']):,} suspect texts it counts against "
        f"the {int(st['n_null']):,} held-out known non-members: AUC {_num(st.get('auc'), '.3f')} "
        "(the chance that a suspect text outscores a known non-member; 0.5 = no difference), "
        f"one-sided Mann–Whitney U = {_num(st.get('statistic'), '.1f')}, permutation p-value "
        f"{_num(st.get('p_value'))} (9,999 seeded relabellings). At α = {alpha:g}: {verdict}."
    )


def _distribution_words(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "<b>Distribution check:</b> not run (no suspect text counts in the set test)."
    sample = ""
    if d.get("n_suspect_used") and d.get("n_suspect_used") != d.get("n_suspect"):
        sample = (
            f" (on a random {int(d['n_suspect_used']):,} of the {int(d['n_suspect']):,} "
            "suspect texts)"
        )
    head = (
        "<b>Distribution check:</b> a model-free classifier (TF-IDF word 1–2-grams + logistic "
        f"regression, {int(d.get('folds', 0))}-fold cross-validated, never querying the model) "
        "tells the suspect texts from the held-out known non-members with AUC "
        f"{_num(d.get('auc'), '.3f')} [{_num(d.get('low'), '.3f')}, {_num(d.get('high'), '.3f')}] "
        f"({float(d.get('level', 0.95)):.0%} bootstrap interval){sample}. "
    )
    if d.get("differ"):
        return head + (
            "<b>The interval lies above 0.5: the two sets differ as texts</b> (dates, topics, "
            "sources), so a set-level rejection may reflect that shift rather than membership. "
            "Use known non-members from the suspect texts' distribution."
        )
    return head + (
        "The interval reaches 0.5: the check finds no difference as texts, so the known "
        "non-members are a fair reference as far as it can tell."
    )


def _decisions_words(summary: Mapping[str, Any], n_null: int) -> str:
    fpr = float(summary["fpr"])
    thr = float(summary["threshold"])
    floor = 1.0 / (n_null + 1)
    if math.isinf(thr):
        rule = (
            f"no text can be declared a member: with {n_null:,} held-out non-members the "
            f"smallest p-value is {floor:.3g}, above the FPR"
        )
    else:
        rule = (
            f"score above the threshold {_num(thr)}, i.e. p-value ≤ {fpr:g}; with {n_null:,} "
            f"held-out non-members the smallest possible p-value is {floor:.3g}"
        )
    return (
        f"<b>Per text:</b> {int(summary['n_members_declared']):,} of "
        f"{int(summary['n_texts']):,} texts declared members at FPR {fpr:g} ({rule})."
    )


def _separation_words(sep: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """(sentence, warning) about the fit's cross-validated AUC on its known texts."""
    if not sep:
        return (
            "<b>The fit's check on its known texts:</b> not recorded (a bundle written before "
            "calibdcd checked it).",
            None,
        )
    if sep.get("auc") is None:
        return (
            f"<b>The fit's check on its known texts:</b> not run ({_e(sep.get('skipped'))}).",
            None,
        )
    said = (
        "<b>The fit's check on its known texts:</b> the detector ranks known members above "
        "known non-members it did not train on with cross-validated AUC "
        f"{_num(sep['auc'], '.3f')} [{_num(sep['low'], '.3f')}, {_num(sep['high'], '.3f')}] "
        f"({int(sep['folds'])}-fold over {int(sep['n_members']):,} members and "
        f"{int(sep['n_nonmembers']):,} non-members, {float(sep['level']):.0%} bootstrap "
        "interval)."
    )
    return said, sep.get("warning")


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _order(p: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Row order: p-value ascending, then score descending, then input order; NaN last."""
    pk = np.where(np.isfinite(p), p, np.inf)
    sk = np.where(np.isfinite(scores), -scores, np.inf)
    return np.lexsort((np.arange(p.size), sk, pk))


def _text_table(
    result: Any, texts: Sequence[str], ids: Sequence[Any], max_rows: int
) -> tuple[str, int]:
    scores = np.asarray(result.scores, dtype=np.float64)
    p = np.asarray(result.p_values, dtype=np.float64)
    order = _order(p, scores)
    shown = order[:max_rows]
    in_fit = list(result.in_fit) or [None] * len(texts)
    rows = [
        "<table id='texts'><thead><tr><th>rank</th><th>p-value</th><th>score</th>"
        "<th class='l'>member</th><th class='l'>id</th><th>index</th><th class='l'>in fit</th>"
        f"<th class='l'>text (first {TEXT_CHARS} characters)</th></tr></thead><tbody>"
    ]
    for rank, i in enumerate(shown, start=1):
        member = bool(result.decisions[i])
        rows.append(
            f"<tr{' class=member' if member else ''}><td>{rank}</td><td>{_num(p[i])}</td>"
            f"<td>{_num(scores[i])}</td><td class='l'>{'member' if member else ''}</td>"
            f"<td class='l'>{_e('' if ids[i] is None else ids[i])}</td><td>{int(i)}</td>"
            f"<td class='l'>{_e(in_fit[i] or '')}</td>"
            f"<td class='text'>{_e(_snippet(texts[i]))}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "\n".join(rows), len(shown)


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th class='l'>{k}</th><td class='l'>{v}</td></tr>" for k, v in rows)
    return f"<table class='kv'>{body}</table>"


def _compact(value: Any) -> str:
    return _e(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str))


def _calibdcd_words(header: Mapping[str, Any]) -> str:
    if header.get("calibration_config") is None:
        return "not applied (the detector's own classifier scores)"
    cal = header.get("calibration") or {}
    space = f" in the {_e(header.get('space'))} space"
    if cal.get("rank") is None:
        return (
            f"applied{space}; no correction selected (the objective found none worth it): the "
            "original classifier scores"
        )
    views = ", ".join(_e(v) for v in cal.get("selected_views") or []) or "–"
    return (
        f"applied{space}; correction selected: rank {int(cal['rank'])}, strength "
        f"{_num(cal.get('strength'), '.3g')}, from views {views}; the classifier retrained on "
        "the corrected features scores"
    )


def _decoding_words(generation: Mapping[str, Any]) -> str:
    parts = []
    for kind, rec in sorted((generation or {}).items()):
        if kind == "completions" or not isinstance(rec, Mapping):
            continue
        req = rec.get("requested") or {}
        keys = ("max_new_tokens", "temperature", "top_p", "n", "seed")
        said = ", ".join(f"{k} {req[k]}" for k in keys if k in req)
        parts.append(f"{_e(kind)}: {_e(said) or _compact(rec)}")
    comp = (generation or {}).get("completions") or {}
    if comp:
        parts.append(
            f"completions served at fit: {int(comp.get('served', 0)):,} "
            f"({int(comp.get('empty', 0)):,} empty)"
        )
    return "; ".join(parts) or "–"


def _provenance(
    header: Mapping[str, Any], sources: Mapping[str, str], alpha: float, n_null: int
) -> str:
    t = header.get("target") or {}
    d = header.get("detector") or {}
    s = header.get("sizes") or {}
    fpr = float(header.get("fpr", float("nan")))
    spent = math.floor(fpr * (n_null + 1) + 1e-12) / (n_null + 1)
    target = f"{_e(t.get('backend'))} <code>{_e(t.get('model'))}</code>"
    extra = [f"{k} {_e(t[k])}" for k in ("name", "family", "lab") if t.get(k)]
    ident = [f"{k} {_e(str(t[k])[:16])}" for k in ("content", "revision") if t.get(k)]
    versions = header.get("versions") or {}
    sep = header.get("separation") or {}
    rows = [
        ("target", target + (f" ({', '.join(extra)})" if extra else "")),
        ("target options", _compact(t.get("options") or {})),
        ("target identity", ", ".join(ident) or "–"),
        (
            "detector",
            f"{_e(d.get('name'))}"
            + (f", preset {_e(d['preset'])}" if d.get("preset") else ", no preset")
            + f"; options {_compact(d.get('options') or {})}",
        ),
        ("mode", _e(header.get("mode"))),
        ("CalibDCD", _calibdcd_words(header)),
        (
            "decision FPR",
            f"{fpr:g} (spent by the threshold: {spent:.3g} = ⌊fpr·(n+1)⌋/(n+1) with n = "
            f"{n_null:,}); threshold {_num(header.get('threshold'))}",
        ),
        (
            "fit texts",
            f"{int(s.get('supervised', 0)):,} supervised ({int(s.get('supervised_members', 0)):,}"
            f" members), {int(s.get('calibration', 0)):,} calibration and "
            f"{int(s.get('heldout', 0)):,} held-out non-members with finite features; fit pool "
            f"{int(s.get('pool', 0)):,}",
        ),
        (
            "known-text check",
            (
                f"cross-validated AUC {_num(sep.get('auc'), '.3f')} [{_num(sep.get('low'), '.3f')}"
                f", {_num(sep.get('high'), '.3f')}]: {_e(sep.get('method'))}"
            )
            if sep.get("auc") is not None
            else _e(sep.get("skipped") or "not recorded"),
        ),
        ("decoding", _decoding_words(header.get("generation") or {})),
        ("fitted", _e(header.get("fitted_at") or "not recorded (an older bundle)")),
        (
            "versions at fit",
            ", ".join(f"{_e(k)} {_e(v)}" for k, v in sorted(versions.items()) if v) or "–",
        ),
        (
            "bundle",
            f"<code>{_e(sources.get('bundle', ''))}</code> (format "
            f"{_e(header.get('format_version'))}, header sha256 "
            f"{_e(str(header.get('header_sha256', '–'))[:12])})",
        ),
        ("suspect texts", f"<code>{_e(sources.get('texts', ''))}</code>"),
        ("scores", f"<code>{_e(sources.get('scores', ''))}</code> (every text, JSON lines)"),
        ("set-test level", f"α = {alpha:g}"),
    ]
    return _kv_table(rows)


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------


def write_report(
    path: str | Path,
    *,
    header: Mapping[str, Any],
    null: np.ndarray,
    result: Any,
    summary: Mapping[str, Any],
    texts: Sequence[str],
    ids: Sequence[Any],
    alpha: float,
    sources: Mapping[str, str],
    max_rows: int = MAX_ROWS,
) -> Path:
    """Write the audit page (see the module doc) for one ``score``: ``header`` is the bundle's
    ``bundle.json``, ``null`` its held-out scores, ``result`` the
    :class:`~calibdcd.fitted.detector.ScoreResult` of ``texts`` (with ``ids``), ``summary``
    the scores file's summary line; ``sources`` names the bundle, texts and scores files."""
    from calibdcd.provenance import library_versions

    version = dict(library_versions(("calibdcd",))).get("calibdcd") or "?"
    null = np.asarray(null, dtype=np.float64)
    scores = np.asarray(result.scores, dtype=np.float64)
    p = np.asarray(result.p_values, dtype=np.float64)
    use = np.asarray(result.in_set_test, dtype=bool)
    if use.size != scores.size or not use.any():  # nothing counted: show every finite score
        use = np.isfinite(scores)
    finite = use & np.isfinite(scores)
    n = len(texts)
    det = header.get("detector") or {}
    tgt = header.get("target") or {}
    title = f"Audit of {n:,} suspect texts: {det.get('name')} on {tgt.get('model')}"
    sep_said, sep_warn = _separation_words(header.get("separation"))
    words = [
        _set_test_words(result.set_test, alpha),
        _distribution_words(result.distribution),
        _decisions_words(summary, int(null.size)),
        sep_said,
    ]
    warns = [str(w) for w in result.warnings]
    if sep_warn:
        warns.append(f"At fit: {sep_warn}")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class='note'>Written by calibdcd {_e(version)} on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Every number "
        "here is also in the scores file; the method is in docs/fitted.md.</p>",
        "<h2>The answer</h2>",
        *[f"<p>{w}</p>" for w in words],
    ]
    if warns:
        parts.append("<h2>Warnings</h2>")
        parts += [f"<div class='warn'>{_e(w)}</div>" for w in warns]
    parts.append("<h2>Scores against the known non-members</h2>")
    if finite.any():
        left = n - int(finite.sum())
        parts.append(
            f"<p class='note'>{int(finite.sum()):,} suspect texts shown"
            + (
                f" ({left:,} left out: repeated texts, the fit's own texts and texts without "
                "finite features, as in the set-level test)"
                if left
                else ""
            )
            + f", against the {null.size:,} held-out known non-members.</p>"
        )
        figs = _figures(scores[finite], null, p[finite], float(summary["threshold"]),
                        float(summary["fpr"]))  # fmt: skip
        if isinstance(figs, str):
            parts.append(f"<p class='note'>{figs}</p>")
        else:
            for (data, caption), alt in zip(figs, ("the scores", "the p-values"), strict=False):
                parts.append(
                    f"<figure><img alt='{alt}' "
                    f"src='data:image/png;base64,{data}'/><figcaption class='note'>"
                    f"{html.escape(caption)}</figcaption></figure>"
                )
    else:
        parts.append("<p class='note'>No suspect text has a finite score: nothing to plot.</p>")
    table, shown = _text_table(result, texts, ids, max_rows)
    parts.append("<h2>Every text, most member-like first</h2>")
    parts.append(
        "<p class='note'>Sorted by p-value (then by score); <i>member</i>: declared at the "
        "bundle's FPR; <i>in fit</i>: the fit's own part holding the text (its score is not "
        "out-of-sample); <i>index</i>: its position in the suspect file, from 0."
        + (
            f" The {shown:,} lowest p-values of {n:,} texts are shown; every text is in the "
            "scores file."
            if shown < n
            else ""
        )
        + "</p>"
    )
    parts.append(table)
    parts.append("<h2>Provenance</h2>")
    parts.append(_provenance(header, sources, alpha, int(null.size)))
    parts.append("</body></html>")
    out = Path(path)
    atomic_write_text(out, "\n".join(parts) + "\n")
    return out
