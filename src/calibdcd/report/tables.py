"""The paper's tables as :class:`Table` objects, rendered to Markdown, LaTeX (booktabs), CSV and
HTML. Metrics print as percentages with one decimal, as in the paper; within each
detector/detector+CalibDCD pair the better value is bold."""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import math
from typing import Any

from calibdcd.report import aggregate as agg

__all__ = ["Table", "build_tables"]

_LATEX_ESCAPES = (
    ("\\", r"\textbackslash{}"),
    ("&", r"\&"),
    ("%", r"\%"),
    ("_", r"\_"),
    ("#", r"\#"),
    ("λ", r"$\lambda$"),
    ("±", r"$\pm$"),
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
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
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


def pct(x: float | None, signed: bool = False) -> str | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _main_table(results: list[dict[str, Any]], metric: str, title: str, key: str) -> Table | None:
    m = agg.main_cells(results)
    if not m["cells"]:
        return None
    cols = [(b, t) for b in m["benchmarks"] for t in m["targets"]]
    cols = [c for c in cols if any((d, *c) in m["cells"] for d in m["detectors"])]
    header = ["Method"] + [f"{b} / {t}" for b, t in cols] + ["Avg."]
    rows: list[list[Any]] = []
    bold: set[tuple[int, int]] = set()
    for det in m["detectors"]:
        pair = []
        for stage, label in (("before", det), ("after", f"{det} + CalibDCD")):
            vals = [m["cells"].get((det, *c), {}).get(f"{metric}_{stage}") for c in cols]
            present = [v for v in vals if v is not None]
            avg = sum(present) / len(present) if present else None
            pair.append([*vals, avg])
            rows.append([label] + [pct(v) for v in vals] + [pct(avg)])
        i_after = len(rows) - 1
        for j, (b, a) in enumerate(zip(pair[0], pair[1], strict=True), start=1):
            if b is None or a is None:
                continue
            if round(a, 3) > round(b, 3):
                bold.add((i_after, j))
            elif round(b, 3) > round(a, 3):
                bold.add((i_after - 1, j))
    return Table(
        key, title, header, rows, bold, note="Percent; seed means; bold = better of each pair."
    )


def _detail_table(results: list[dict[str, Any]]) -> Table:
    def ci(d: dict[str, Any]) -> str:
        if d.get("low") is None:
            return pct(d["estimate"]) or "–"
        return f"{pct(d['estimate'])} [{pct(d['low'])}, {pct(d['high'])}]"

    rows = []
    for r in results:
        c = r["calibration"]
        rows.append(
            [
                r["id"],
                r["sizes"]["evaluation"][0],
                ci(r["before"]["auc"]),
                ci(r["after"]["auc"]),
                ci(r["before"]["tpr"]),
                ci(r["after"]["tpr"]),
                "none" if c["rank"] is None else f"{c['rank']}/{c['strength']:g}",
                " ".join(c["selected_views"]),
            ]
        )
    level = results[0]["before"]["auc"].get("level", 0.95) if results else 0.95
    return Table(
        "settings",
        "Every setting: AUC and TPR@FPR before → after CalibDCD",
        ["Setting", "Pool n", "AUC", "AUC + CalibDCD", "TPR", "TPR + CalibDCD", "r/λ", "Views"],
        rows,
        note=f"Percent with {100 * level:.0f}% stratified bootstrap intervals on the pool.",
    )


def _ablation_table(results: list[dict[str, Any]]) -> Table | None:
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


def _adaptive_table(results: list[dict[str, Any]]) -> Table | None:
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


def _fp_table(results: list[dict[str, Any]]) -> Table | None:
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


def _selection_tables(results: list[dict[str, Any]]) -> list[Table]:
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
    grid = Table(
        "selection_rank_strength",
        "Selected (r, λ): joint counts",
        ["r \\ λ"] + [f"{x:g}" for x in s["strengths"]],
        [[r, *row] for r, row in zip(s["ranks"], s["matrix"], strict=True)],
        note=f"Partial correction (λ<1) in {s['partial']} settings.",
    )
    return [views, grid]


def _base_table(results: list[dict[str, Any]]) -> Table | None:
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


def _space_table(results: list[dict[str, Any]]) -> Table | None:
    rows_in = agg.space_comparison(results)
    if not rows_in:
        return None

    def choice(c: Any) -> str:
        return "none" if c is None else f"{c[0]}/{c[1]:g}"

    rows = [
        [
            f"{r['detector']} · {r['target']}",
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
        note="Percent; r/λ = the selected correction, none = best J ≤ 0 or no consensus "
        "direction. The paper does not say which space; the run's is `calibration_space`.",
    )


def build_tables(results: list[dict[str, Any]]) -> list[Table]:
    fpr = results[0].get("fpr", 0.05) if results else 0.05
    tpr_name = f"TPR@{100 * fpr:g}%FPR"
    out = [
        _main_table(results, "auc", "AUC of the detectors with and without CalibDCD", "auc_main"),
        _main_table(
            results, "tpr", f"{tpr_name} of the detectors with and without CalibDCD", "tpr_main"
        ),
        _ablation_table(results),
        _adaptive_table(results),
        _fp_table(results),
        _space_table(results),
        *_selection_tables(results),
        _base_table(results),
        _detail_table(results),
    ]
    return [t for t in out if t is not None]
