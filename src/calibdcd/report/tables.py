"""The paper's tables as :class:`Table` objects, rendered to Markdown, LaTeX (booktabs), CSV and
HTML. Metrics print as percentages with one decimal, as in the paper.

Main tables: per cell the mean ± SD over seeds of the detector, the detector + CalibDCD, the
controls (placebo, noise floor), the variants beyond the paper (centred, abstaining, normalised
space) and the blind baseline. A
CalibDCD or control cell is marked better (▲, and bold for CalibDCD) or worse (▼, the detector
bold) than the detector only when the paired 95% interval of the difference excludes 0; a
detector cell is marked † when it does not beat the blind baseline (its paired interval against
the blind baseline does not lie above 0). The ``paired`` table lists every comparison's ΔAUC and
ΔTPR with interval, half-width (the smallest difference the setting can resolve) and p-value."""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import math
from collections import Counter
from typing import Any

import calibdcd.report.aggregate as agg
from calibdcd.results import Estimate, SettingResult

__all__ = ["Table", "build_tables"]

_LATEX_ESCAPES = (
    ("\\", r"\textbackslash{}"),
    ("&", r"\&"),
    ("%", r"\%"),
    ("_", r"\_"),
    ("#", r"\#"),
    ("λ", r"$\lambda$"),
    ("±", r"$\pm$"),
    ("▲", r"$\blacktriangle$"),
    ("▼", r"$\blacktriangledown$"),
    ("†", r"\dag{}"),
    ("→", r"$\to$"),
)


@dataclasses.dataclass
class Table:
    key: str
    title: str
    header: list[str]
    rows: list[list[Any]]
    bold: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    note: str = ""
    #: the table's numbers one per column, for machines (``csv()``): None = the display cells
    records: list[dict[str, Any]] | None = None

    def _cell(self, v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        return str(v)

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.note:
            out += [self.note, ""]
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "|".join("---" for _ in self.header) + "|")
        for i, r in enumerate(self.rows):
            cells = [
                f"**{self._cell(v)}**" if (i, j) in self.bold else self._cell(v)
                for j, v in enumerate(r)
            ]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"

    def latex(self) -> str:
        def esc(s: str) -> str:
            for a, b in _LATEX_ESCAPES:
                s = s.replace(a, b)
            return s

        cols = "l" + "r" * (len(self.header) - 1)
        out = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            rf"\caption{{{esc(self.title)}}}",
            rf"\label{{tab:{self.key}}}",
            rf"\begin{{tabular}}{{{cols}}}",
            r"\toprule",
            " & ".join(rf"\textbf{{{esc(h)}}}" for h in self.header) + r" \\",
            r"\midrule",
        ]
        for i, r in enumerate(self.rows):
            cells = [
                rf"\textbf{{{esc(self._cell(v))}}}" if (i, j) in self.bold else esc(self._cell(v))
                for j, v in enumerate(r)
            ]
            out.append(" & ".join(cells) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        return "\n".join(out) + "\n"

    def csv(self) -> str:
        """The table for machines: its ``records`` (numbers in separate columns: estimate, low,
        high, half-width, p) when it has them, else its display cells."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if self.records is not None:
            keys = list(dict.fromkeys(k for rec in self.records for k in rec))
            w.writerow(keys)
            for rec in self.records:
                w.writerow([_csv_value(rec.get(k)) for k in keys])
            return buf.getvalue()
        w.writerow(self.header)
        for r in self.rows:
            w.writerow(["" if v is None else v for v in r])
        return buf.getvalue()

    def html(self) -> str:
        out = [f"<h3>{html.escape(self.title)}</h3>"]
        if self.note:
            out.append(f"<p class='note'>{html.escape(self.note)}</p>")
        out.append("<table><thead><tr>")
        out += [f"<th>{html.escape(h)}</th>" for h in self.header]
        out.append("</tr></thead><tbody>")
        for i, r in enumerate(self.rows):
            out.append("<tr>")
            for j, v in enumerate(r):
                c = html.escape(self._cell(v))
                out.append(f"<td><b>{c}</b></td>" if (i, j) in self.bold else f"<td>{c}</td>")
            out.append("</tr>")
        out.append("</tbody></table>")
        return "".join(out)


def _csv_value(v: Any) -> Any:
    """Empty for a missing number; floats as ``repr`` (exact, parsable)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return int(v)
    return repr(v) if isinstance(v, float) else v


def _pp(x: float | None) -> float | None:
    """A fraction in percentage points (the display's unit), None kept."""
    return None if x is None else 100.0 * float(x)


def pct(x: float | None, signed: bool = False) -> str | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


UP, DOWN, NOT_ABOVE_BLIND = "▲", "▼", "†"


def _mean_sd(v: dict[str, Any] | None) -> str | None:
    if v is None:
        return None
    if "low" in v:  # the half-sample noise floor: an interval around the detector
        return f"[{pct(v['low'])}, {pct(v['high'])}]"
    if v["sd"] is None:
        return pct(v["mean"])
    return f"{pct(v['mean'])} ± {100 * v['sd']:.1f}"


def _mark(paired: dict[str, Any] | None, metric: str) -> int:
    d = (paired or {}).get(metric)
    return 0 if d is None else d.verdict


def _column(bench: str, target: str, results: list[SettingResult]) -> str:
    """``benchmark / target``, with "(base model)" for a target that is not post-trained (a base
    model shown on its own, :func:`aggregate.main_targets`: CalibDCD has no post-training
    shift to remove there, so its rows are a control)."""
    base = any(r.get("target") == target and not r.get("post_trained", True) for r in results)
    return f"{bench} / {target}" + (" (base model)" if base else "")


def _cell_record(
    det: str | None, method: str, bench: str, tgt: str, metric: str, v: dict[str, Any], d: Any
) -> dict[str, Any]:
    """One main-table cell for machines: the seed mean and SD, and (for a method compared with
    its detector) the paired difference with its interval and verdict; percentage points."""
    return {
        "detector": det,
        "method": method,
        "benchmark": bench,
        "target": tgt,
        "n_seeds": v.get("n"),
        metric: _pp(v["mean"]),
        f"{metric}_sd": _pp(v.get("sd")),
        f"delta_{metric}": None if d is None else _pp(d.estimate),
        f"delta_{metric}_low": None if d is None else _pp(d.low),
        f"delta_{metric}_high": None if d is None else _pp(d.high),
        "verdict": None if d is None else int(d.verdict),
        # the half-sample noise floor's interval around the detector (None for other methods)
        f"{metric}_low": _pp(v.get("low")),
        f"{metric}_high": _pp(v.get("high")),
    }


def _main_table(
    results: list[SettingResult],
    metric: str,
    title: str,
    key: str,
    paired: dict[tuple[str, str, str], dict[str, Any]] | None = None,
) -> Table | None:
    m = agg.main_cells(results)
    if not m["cells"]:
        return None
    paired = agg.paired_cells(results) if paired is None else paired
    cols = [(b, t) for b in m["benchmarks"] for t in m["targets"]]
    cols = [c for c in cols if any((d, *c) in m["cells"] for d in m["detectors"])]
    header = ["Method"] + [_column(b, t, results) for b, t in cols] + ["Avg."]
    # the average is over the post-trained columns (the paper's); a base model shown on its
    # own is a control and enters it only in a run of base models alone
    post = {r.target for r in results if r.post_trained}
    in_avg = [not post or t in post for _, t in cols]
    rows: list[list[Any]] = []
    bold: set[tuple[int, int]] = set()

    def add_row(label: str, vals: list[dict[str, Any] | None], marks: list[str]) -> None:
        kept = [v for v, a in zip(vals, in_avg, strict=True) if v is not None and a]
        avg = sum(v["mean"] for v in kept) / len(kept) if kept else None
        shown = pct(avg)
        if kept and all("low" in v for v in kept):  # an interval row: the intervals' average
            lo, hi = (sum(v[e] for v in kept) / len(kept) for e in ("low", "high"))
            shown = _mean_sd({"low": lo, "high": hi})
        cells = [
            None if s is None else s + mk
            for s, mk in zip((_mean_sd(v) for v in vals), marks, strict=True)
        ]
        rows.append([label, *cells, shown])

    records: list[dict[str, Any]] = []
    blind_vals: list[dict[str, Any] | None] = [None] * len(cols)
    for det in m["detectors"]:
        cells = [m["cells"].get((det, *c)) for c in cols]
        pairs = [paired.get((det, *c), {}) for c in cols]
        i_det = len(rows)
        for method, (_, suffix) in agg.METHODS.items():
            vals = [None if c is None else c["methods"].get(method, {}).get(metric) for c in cells]
            if method == "blind":
                pairs_bv = zip(blind_vals, vals, strict=True)
                blind_vals = [b if b is not None else v for b, v in pairs_bv]
                continue
            if all(v is None for v in vals):
                continue
            for (bench, tgt), v in zip(cols, vals, strict=True):
                if v is not None:
                    comp = paired.get((det, bench, tgt), {}).get(method)
                    d = None if comp is None or method == "original" else comp[metric]
                    records.append(_cell_record(det, method, bench, tgt, metric, v, d))
            if method == "original":
                marks = [
                    NOT_ABOVE_BLIND if "vs_blind" in p and _mark(p["vs_blind"], "auc") < 1 else ""
                    for p in pairs
                ]
            else:
                verdicts = [_mark(p.get(method), metric) for p in pairs]
                marks = [UP if v > 0 else DOWN if v < 0 else "" for v in verdicts]
                if method == "calibdcd":
                    for j, v in enumerate(verdicts, start=1):
                        if v:
                            bold.add((len(rows) if v > 0 else i_det, j))
            add_row(f"{det}{suffix}", vals, marks)
    if any(v is not None for v in blind_vals):
        from calibdcd.blind import BLIND_LABEL

        add_row(BLIND_LABEL, blind_vals, [""] * len(cols))
        for (bench, tgt), v in zip(cols, blind_vals, strict=True):
            if v is not None:
                records.append(_cell_record(None, "blind", bench, tgt, metric, v, None))
    n_seeds = sorted({c["n"] for c in m["cells"].values()})
    seeds = "/".join(str(n) for n in n_seeds)
    return Table(
        key,
        title,
        header,
        rows,
        bold,
        records=records,
        note=(
            agg.calibdcd_method(results) + " "
            f"Percent; mean ± SD over {seeds} seed(s) (no ± with one seed). ▲/▼ (bold = the "
            "better of detector and detector + CalibDCD): the paired 95% interval of the "
            "difference from the detector (hierarchical bootstrap over seeds and texts) lies "
            "above/below 0; unmarked = not resolved. †: the detector does not beat the blind "
            "baseline (paired ΔAUC interval vs the blind baseline not above 0). Placebo: a "
            f"random basis of CalibDCD's size; {_noise_floor_note(results)}; centred (around "
            "the non-members' mean), abstaining (no "
            "correction when the best J ≤ 0) and normalised space (corrected after the "
            "classifier's normalisation): variants beyond the paper, one setting changed each; "
            "blind baseline: TF-IDF + "
            "logistic regression on the texts alone, never querying the model. A base model "
            "shown on its own is a control, outside Avg. when post-trained targets are present."
        ),
    )


def _noise_floor_note(results: list[SettingResult]) -> str:
    """The table note's words on the noise floors its settings computed (a run before the
    half-sample floor keeps its note as it was written)."""
    methods = {
        (c.get("method") or "bootstrap")
        for r in results
        if (c := r.controls.get("noise_floor")) is not None
    }
    half = (
        "noise floor (half-sample interval): the detector's value ± z × the classifier's spread "
        "at its training set's size (retrained on stratified halves without replacement: "
        "docs/interpretations.md), the root mean square over seeds"
    )
    boot = "noise floor: the classifier retrained on a bootstrap resample"
    if not methods:
        note = "noise floor: none computed"
    elif methods == {"half_sample"}:
        note = half
    elif "half_sample" in methods:
        note = f"{half}; {boot} (a smaller training set, one-sided)"
    else:
        note = boot
    if any(agg.score_only(r.detector_name) and r.controls for r in results):
        note += "; none for a score-only detector (its classifier learns nothing from its texts)"
    return note


def _delta_record(a: Any, t: Any) -> dict[str, Any]:
    """A paired comparison's ΔAUC (``a``) and ΔTPR (``t``) as a table record's fields."""
    rec: dict[str, Any] = {"n_seeds": a.n_seeds}
    for name, d in (("auc", a), ("tpr", t)):
        rec.update(
            {
                f"delta_{name}": _pp(d.estimate), f"delta_{name}_low": _pp(d.low),
                f"delta_{name}_high": _pp(d.high),
                f"delta_{name}_half_width": _pp(d.half_width),
                f"delta_{name}_p": d.p_value, f"delta_{name}_verdict": int(d.verdict),
            }
        )  # fmt: skip
    return rec


def _delta_cells(a: Any, t: Any) -> list[Any]:
    """A paired comparison's cells: seeds, then ΔAUC, its interval, half-width, p and verdict,
    then the same for ΔTPR (no p): the columns of :func:`_delta_columns`."""

    def verdict(d: Any) -> str:
        return "better" if d.verdict > 0 else "worse" if d.verdict < 0 else "–"

    def interval(d: Any) -> str:
        # ‡: the estimate lies outside its own percentile interval, the sign of a
        # statistic that is a step function of a few texts (TPR at a low FPR: the
        # threshold is the (k+1)-th largest of ~100 non-member scores)
        flag = "‡" if not (d.low - 1e-12 <= d.estimate <= d.high + 1e-12) else ""
        return f"[{pct(d.low, True)}, {pct(d.high, True)}]{flag}"

    return [
        a.n_seeds,
        pct(a.estimate, True),
        interval(a),
        f"{100 * a.half_width:.1f}",
        "–" if a.p_value is None else f"{a.p_value:.3g}",
        verdict(a),
        pct(t.estimate, True),
        interval(t),
        f"{100 * t.half_width:.1f}",
        verdict(t),
    ]


def _delta_columns(level: float, fpr: float) -> list[str]:
    return [
        "Seeds",
        "ΔAUC",
        f"{100 * level:.0f}% CI",
        "Half-width",
        "p (DeLong)",
        "AUC",
        f"ΔTPR@{100 * fpr:g}%FPR",
        f"{100 * level:.0f}% CI",
        "Half-width",
        "TPR",
    ]


#: how the paired tables' intervals, half-widths, p-values and marks are read
_DELTA_NOTE = (
    "Percentage points. Intervals: hierarchical paired bootstrap (seeds resampled, then "
    "each seed's pool texts within label; both methods on the same resampled texts). "
    "Half-width = the smallest difference this setting can resolve (0 with Δ = 0 means "
    "identical scores, e.g. CalibDCD selected no correction, not infinite resolution: "
    "read the placebo's and the noise floor's half-widths). p: per-seed DeLong z "
    "averaged over seeds against N(0, 1), conservative for seeds that share texts. "
    "better/worse only when the interval excludes 0. ‡: the estimate lies outside its "
    "own interval: the statistic jumps with a few texts (TPR at a low FPR is set by the "
    "(k+1)-th largest non-member score), so the estimate is unstable and the interval, "
    "not the estimate, is what to read (docs/statistics.md)."
)


def _paired_table(
    results: list[SettingResult], paired: dict[tuple[str, str, str], dict[str, Any]]
) -> Table | None:
    if not any(paired.values()):
        return None
    labels = {k: lab for k, lab, _, _ in agg.COMPARISONS}
    pairs = {k: (a, b) for k, _, a, b in agg.COMPARISONS}
    rows = []
    records: list[dict[str, Any]] = []
    level = 0.95
    for (det, bench, tgt), comps in paired.items():
        for key, res in comps.items():
            a, t = res["auc"], res["tpr"]
            level = a.level
            rec: dict[str, Any] = {
                "comparison": labels[key].format(d=det), "key": key, "a": pairs[key][0],
                "b": pairs[key][1], "detector": det, "benchmark": bench, "target": tgt,
            }  # fmt: skip
            records.append({**rec, **_delta_record(a, t)})
            rows.append(
                [labels[key].format(d=det), _column(bench, tgt, results), *_delta_cells(a, t)]
            )
    fpr = results[0].get("fpr", 0.05) if results else 0.05
    return Table(
        "paired",
        "Paired comparisons on the same texts (A vs B = A − B), pooled over seeds",
        ["Comparison", "Benchmark / target", *_delta_columns(level, fpr)],
        rows,
        note=_DELTA_NOTE,
        records=records,
    )


def _variants_table(
    results: list[SettingResult], pairs: dict[tuple[str, str, str, str], dict[str, Any]]
) -> Table | None:
    """Two variants of one detector (one family under two labels) on the same texts,
    uncalibrated (``pairs``: :func:`calibdcd.report.aggregate.variant_pairs`)."""
    if not pairs:
        return None
    rows, records = [], []
    level = 0.95
    for (a, b, bench, tgt), res in pairs.items():
        d, t = res["auc"], res["tpr"]
        level = d.level
        rec = {
            "comparison": f"{a} vs {b}", "a": a, "b": b, "detector": res["detector"],
            "benchmark": bench, "target": tgt, "n_texts": res["n_texts"],
        }  # fmt: skip
        records.append({**rec, **_delta_record(d, t)})
        rows.append([f"{a} vs {b}", _column(bench, tgt, results), *_delta_cells(d, t)])
    fpr = results[0].get("fpr", 0.05) if results else 0.05
    return Table(
        "variants",
        "Variants of one detector on the same texts, uncalibrated (A vs B = A − B), pooled over "
        "seeds",
        ["Comparison", "Benchmark / target", *_delta_columns(level, fpr)],
        rows,
        note=(
            "Each split seed's evaluation texts that both variants scored, joined by text id "
            "(their number over the seeds in the CSV's n_texts); every target, the base models "
            "included; A is the later in the config. " + _DELTA_NOTE
        ),
        records=records,
    )


def _detail_table(results: list[SettingResult]) -> Table:
    def ci(d: Estimate) -> str:
        if d.low is None:
            return pct(d.estimate) or "–"
        return f"{pct(d.estimate)} [{pct(d.low)}, {pct(d.high)}]"

    rows = []
    records = []
    for r in results:
        c = r.calibration
        rec: dict[str, Any] = {"id": r.id, "n_pool": r.sizes.evaluation[0]}
        for name, est in (
            ("auc", r.before.auc), ("auc_calibdcd", r.after.auc),
            ("tpr", r.before.tpr), ("tpr_calibdcd", r.after.tpr),
        ):  # fmt: skip
            rec.update(
                {
                    name: _pp(est.estimate),
                    f"{name}_low": _pp(est.low),
                    f"{name}_high": _pp(est.high),
                }
            )
        rec.update(
            {
                "rank": c["rank"], "strength": c["strength"],
                "views": " ".join(c["selected_views"]),
                "no_correction_reason": (c.get("diagnostics") or {}).get("reason"),
                "auc_placebo": _pp(r.controls.get("placebo", {}).get("auc")),
                "auc_blind": _pp(r.controls.get("blind", {}).get("auc")),
            }
        )  # fmt: skip
        records.append(rec)
        rows.append(
            [
                r.id,
                r.sizes.evaluation[0],
                ci(r.before.auc),
                ci(r.after.auc),
                ci(r.before.tpr),
                ci(r.after.tpr),
                "none" if c["rank"] is None else f"{c['rank']}/{c['strength']:g}",
                " ".join(c["selected_views"]),
                (c.get("diagnostics") or {}).get("reason") or "",
                pct(r.controls.get("placebo", {}).get("auc")),
                pct(r.controls.get("blind", {}).get("auc")),
            ]
        )
    level = (results[0].before.auc.level or 0.95) if results else 0.95
    return Table(
        "settings",
        "Every setting: AUC and TPR@FPR before → after CalibDCD",
        [
            "Setting",
            "Pool n",
            "AUC",
            "AUC + CalibDCD",
            "TPR",
            "TPR + CalibDCD",
            "r/λ",
            "Views",
            "Why no correction",
            "AUC placebo",
            "AUC blind",
        ],
        rows,
        note=f"Percent with {100 * level:.0f}% stratified bootstrap intervals on the pool.",
        records=records,
    )


def _ablation_table(results: list[SettingResult]) -> Table | None:
    rows_in = agg.ablation_summary(results)
    if not rows_in:
        return None
    rows = []
    for r in rows_in:
        auc = pct(r["auc"])
        tpr = pct(r["tpr"])
        if r["d_auc"] is not None:
            auc = f"{auc} ({pct(r['d_auc'], True)})"
            tpr = f"{tpr} ({pct(r['d_tpr'], True)})"
        wins = "–" if r["wins_auc"] is None else f"{r['wins_auc']} / {r['wins_tpr']}"
        rows.append([r["name"], r["n"], auc, tpr, wins])
    return Table(
        "ablation",
        "Ablations on the post-trained targets (percent; parentheses: mean change from the "
        "complete method on the same settings)",
        ["Configuration", "n", "AUC", "TPR@5%FPR", "Complete better (AUC / TPR)"],
        rows,
    )


def _adaptive_table(results: list[SettingResult]) -> Table | None:
    a = agg.adaptive_vs_fixed(results)
    if not a["by_detector"]:
        return None
    f = a["fixed"] or {}
    rows = [
        [
            det,
            v["n"],
            pct(v["auc_original"]),
            pct(v["auc_fixed"]),
            pct(v["auc_adaptive"]),
            pct(v["tpr_original"]),
            pct(v["tpr_fixed"]),
            pct(v["tpr_adaptive"]),
        ]
        for det, v in a["by_detector"].items()
    ]
    fixed = f"r={f.get('rank')}, λ={f.get('strength')}"
    return Table(
        "adaptive",
        f"Adaptive (r, λ) selection vs the fixed configuration ({fixed}), means",
        [
            "Detector",
            "n",
            "AUC orig.",
            "AUC fixed",
            "AUC adaptive",
            "TPR orig.",
            "TPR fixed",
            "TPR adaptive",
        ],
        rows,
    )


def _fp_table(results: list[SettingResult]) -> Table | None:
    s = agg.fp_recovery_summary(results)
    if not s["overall"]["settings"]:
        return None
    rows = []

    def add(group: str, name: str, v: dict[str, Any]) -> None:
        p = v["pool"]
        rate = "–" if v["rate"] is None else f"{100 * v['rate']:.1f}%"
        rows.append([group, name, v["settings"], v["cases"], v["recovered"], rate,
                     p.get("recovered", 0), p.get("new_fp", 0), p.get("members_lost", 0),
                     p.get("members_gained", 0)])  # fmt: skip

    add("all", "all", s["overall"])
    for k, v in s["by_benchmark"].items():
        add("benchmark", k, v)
    for k, v in s["by_detector"].items():
        add("detector", k, v)
    return Table(
        "fp_recovery",
        "False-positive recovery at the 5%-FPR operating points",
        [
            "Group",
            "Name",
            "Settings",
            "Affected FPs",
            "Recovered",
            "Rate",
            "Pool: NM recovered",
            "Pool: new FP",
            "Pool: members lost",
            "Pool: members gained",
        ],
        rows,
        note=(
            "Affected FPs: calibration non-members whose score the top-FPP view raised and that "
            "the "
            "original detector flags at its 5%-FPR threshold; recovered = below the calibrated "
            "detector's own 5%-FPR threshold. Pool columns count evaluation-pool decisions that "
            "changed between the two operating points."
        ),
    )


def _selection_tables(results: list[SettingResult]) -> list[Table]:
    s = agg.selection_distribution(results)
    views = Table(
        "selection_views",
        f"View selection over {s['positions']} top-k positions",
        ["View", "Selected"],
        [[k, v] for k, v in s["by_code"].items()],
        note=(
            f"Settings with at least one model-specific view: "
            f"{s['settings_with_model_specific']} of {len(results)}; "
            f"no correction selected in {s['no_correction']}."
        ),
    )
    paper = Counter(agg.PAPER_SELECTIONS)
    grid = Table(
        "selection_rank_strength",
        "Selected (r, λ): joint counts, this run (the paper's 24 settings)",
        ["r \\ λ"] + [f"{x:g}" for x in s["strengths"]],
        [
            [
                r,
                *(
                    f"{n} ({paper.get((int(r), float(x)), 0)})"
                    for n, x in zip(row, s["strengths"], strict=True)
                ),
            ]
            for r, row in zip(s["ranks"], s["matrix"], strict=True)
        ],
        note=(
            f"Partial correction (λ<1) in {s['partial']} settings; no correction in "
            f"{s['no_correction']}. In brackets: the paper's selections (Appendix, 'Selected "
            "calibration configurations'): every setting corrected, λ<1 in 18 of 24."
        ),
    )
    return [views, grid, _why_table(results)]


def _tau(tau: float | None) -> str:
    return "" if tau is None else f" = {tau:g}"


def _why_table(results: list[SettingResult]) -> Table:
    rows_in = agg.consensus_diagnostics(results)
    ranks = sorted({r for d in rows_in for r in d["empty_at_rank"]})
    tau = next((d["tau"] for d in rows_in if d["tau"] is not None), None)
    rows = [
        [
            d["detector"],
            d["target"],
            d["settings"],
            d["corrected"],
            d["uncorrected_empty_consensus"],
            d["uncorrected_nonpositive_j"],
            *(d["empty_at_rank"].get(r, 0) for r in ranks),
            None if d["max_gamma"] is None else f"{d['max_gamma']:.3f}",
            d["nonempty_nonpositive"],
        ]
        for d in rows_in
    ]
    return Table(
        "selection_why",
        "Why CalibDCD changed nothing where it did: consensus and objective per detector x target",
        [
            "Detector",
            "Target",
            "Settings",
            "Corrected",
            "None: consensus empty at every rank",
            "None: every non-empty candidate J ≤ 0",
            *(f"Empty at r={r}" for r in ranks),
            "Largest γ",
            "Every non-empty J ≤ 0",
        ],
        rows,
        note=(
            "Counts of settings (benchmarks x seeds). A rank's consensus is empty when no "
            f"eigenvalue γ of the views' averaged projector reaches τ{_tau(tau)}; then A = I "
            "and J = 0 there. The paper's argmax applies any non-empty candidate "
            "that beats J = 0, and the best one even when J < 0 if no rank is empty; it changes "
            "nothing only when the consensus is empty at every rank, or when some rank is empty "
            "and every non-empty candidate has J ≤ 0. 'Every non-empty J ≤ 0' counts settings "
            "where no candidate lowered the non-members' mean score, corrected or not."
        ),
    )


def _rho(c: dict[str, Any]) -> tuple[str, str | None]:
    """A rank correlation's display cells: ρ (or why none) and its interval."""
    if c["rho"] is None:
        return c["note"] or "–", None
    if c["low"] is None:
        return f"{c['rho']:+.2f}", None
    return f"{c['rho']:+.2f}", f"[{c['low']:+.2f}, {c['high']:+.2f}]"


def _j_vs_auc_table(results: list[SettingResult]) -> Table | None:
    """The selected candidate's J against the evaluation ΔAUC: Spearman over settings per
    detector x target (:mod:`calibdcd.report.j_vs_auc`)."""
    from calibdcd.report.j_vs_auc import MIN_SETTINGS, j_vs_auc

    cells = j_vs_auc(results)["cells"]
    if not cells:
        return None
    rows, records = [], []
    for c in cells:
        a, k = c["all"], c["corrected_only"]
        rows.append(
            [
                c["detector"],
                c["target"],
                c["settings"],
                c["corrected"],
                *_rho(a),
                *_rho(k),
                f"{c['sign_agrees']}/{c['corrected']}" if c["corrected"] else None,
                c["j_positive_auc_lost"],
                c["j_nonpositive_auc_gained"],
            ]
        )
        rec: dict[str, Any] = {
            "detector": c["detector"],
            "target": c["target"],
            "settings": c["settings"],
            "corrected": c["corrected"],
        }
        for name, v in (("rho", a), ("rho_corrected", k)):
            rec.update(
                {
                    name: v["rho"],
                    f"{name}_low": v["low"],
                    f"{name}_high": v["high"],
                    f"{name}_usable_resamples": v["usable"],
                    f"{name}_note": v["note"],
                }
            )
        rec.update(
            level=a["level"],
            n_boot=a["n_boot"] or k["n_boot"],
            sign_agrees=c["sign_agrees"],
            j_positive_auc_lost=c["j_positive_auc_lost"],
            j_nonpositive_auc_gained=c["j_nonpositive_auc_gained"],
        )
        records.append(rec)
    level = next((c["all"]["level"] for c in cells), 0.95)
    pct_level = f"{100 * level:g}%"
    return Table(
        "j_vs_auc",
        "Does the objective predict the effect? The selected candidate's J against the "
        "evaluation ΔAUC, rank correlation over settings",
        [
            "Detector",
            "Target",
            "Settings",
            "Corrected",
            "Spearman ρ (all settings)",
            f"{pct_level} interval",
            "Spearman ρ (corrected only)",
            f"{pct_level} interval",
            "Corrected: sign of J = sign of ΔAUC",
            "Corrected: J > 0, AUC lost",
            "Corrected: J ≤ 0, AUC gained",
        ],
        rows,
        records=records,
        note=(
            "One point per setting (benchmarks x seeds): J of the applied correction (the "
            "mean drop of the detector's score over the calibration non-members; 0 when no "
            "correction was applied) and ΔAUC = AUC with CalibDCD − AUC of the detector on the "
            "evaluation pool (0 when uncorrected). Spearman's ρ over the settings (ties at "
            "average ranks); interval: percentile bootstrap over settings (seeded; draws with "
            "a constant J or ΔAUC left out). ρ > 0: a larger J went with a larger AUC gain, as "
            "the method assumes. Fewer than "
            f"{MIN_SETTINGS} settings: too few settings; fewer than {MIN_SETTINGS} distinct "
            "points (uncorrected settings all sit at (0, 0)): too few distinct points, as "
            "ρ would be ±1 from the tie alone. With 3 settings ρ takes few values and the "
            "interval is close to [−1, 1]. 'all targets': the detector's "
            "settings on every target together. Figure j_vs_auc.png shows the points."
        ),
    )


def _base_table(results: list[SettingResult]) -> Table | None:
    rows_in = agg.base_vs_post(results)
    if not rows_in:
        return None
    rows = [
        [
            r["benchmark"],
            r["detector"],
            r["base"],
            r["target"],
            pct(r["auc_base"]),
            pct(r["auc_post"]),
            pct(r["auc_post_calibrated"]),
            pct(r["tpr_base"]),
            pct(r["tpr_post"]),
            pct(r["tpr_post_calibrated"]),
        ]
        for r in rows_in
    ]
    return Table(
        "base_vs_post",
        "Base vs post-trained target (original detector) and the post-trained target with CalibDCD",
        [
            "Benchmark",
            "Detector",
            "Base",
            "Post-trained",
            "AUC base",
            "AUC post",
            "AUC post+CalibDCD",
            "TPR base",
            "TPR post",
            "TPR post+CalibDCD",
        ],
        rows,
    )


def _space_table(results: list[SettingResult]) -> Table | None:
    rows_in = agg.space_comparison(results)
    if not rows_in:
        return None

    def choice(c: Any) -> str:
        return "none" if c is None else f"{c[0]}/{c[1]:g}"

    rows = [
        [
            r["id"],  # a setting: detector x target repeats over seeds and benchmarks
            pct(r["auc_original"]),
            f"{pct(r['auc'])} ({r['space']}, {choice(r['choice'])})",
            f"{pct(r['auc_other'])} ({r['other_space']}, {choice(r['choice_other'])})",
        ]
        for r in rows_in
    ]
    return Table(
        "space",
        "Calibration space: CalibDCD in the classifier's normalised space vs the raw features",
        ["Setting", "AUC orig.", "AUC + CalibDCD (run's space, r/λ)", "AUC + CalibDCD (other)"],
        rows,
        note="Percent; r/λ = the selected correction, none = no correction (table "
        "'selection_why' says why). The paper corrects the extractor's output (raw, the "
        "default); the normalised space is a variant beyond it; the run's is "
        "`calibration_space`.",
    )


def build_tables(
    results: list[SettingResult],
    paired: dict[tuple[str, str, str], dict[str, Any]] | None = None,
    variants: dict[tuple[str, str, str, str], dict[str, Any]] | None = None,
) -> list[Table]:
    """The report's tables; ``paired`` and ``variants`` (:func:`~calibdcd.report.aggregate.
    paired_cells`, :func:`~calibdcd.report.aggregate.variant_pairs` of ``results``) are
    computed here unless a caller that also writes them elsewhere passes them in."""
    fpr = results[0].get("fpr", 0.05) if results else 0.05
    tpr_name = f"TPR@{100 * fpr:g}%FPR"
    paired = agg.paired_cells(results) if paired is None else paired
    variants = agg.variant_pairs(results) if variants is None else variants
    out = [
        _main_table(
            results, "auc", "AUC of the detectors with and without CalibDCD", "auc_main", paired
        ),
        _main_table(
            results,
            "tpr",
            f"{tpr_name} of the detectors with and without CalibDCD",
            "tpr_main",
            paired,
        ),
        _paired_table(results, paired),
        _variants_table(results, variants),
        _ablation_table(results),
        _adaptive_table(results),
        _fp_table(results),
        _space_table(results),
        *_selection_tables(results),
        _j_vs_auc_table(results),
        _base_table(results),
        _detail_table(results),
    ]
    return [t for t in out if t is not None]
