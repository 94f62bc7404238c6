"""The README's verdict table: "X + CalibDCD vs X" for every study and detector, generated from
the stored results, never typed.

    python benchmarks/verdict.py                    # print the table
    python benchmarks/verdict.py --write README.md  # rewrite <!-- calibdcd:verdict --> there
    python benchmarks/verdict.py --check README.md  # exit 1 when README.md's table differs

Where each study's numbers come from (nothing is re-implemented: the intervals are the run
report's own, :func:`calibdcd.report.aggregate.paired_cells`, or read from what it wrote):

* **lab-v2, pooled over lab seeds 0-2**: ΔAUC and interval from
  ``benchmarks/results/lab_v2_paper_pooled.json`` (``benchmarks/lab_pooled.py``, the block
  "lab-v2-pooled" of docs/results.md): the build-level interval, the lab build as the top level
  (a t-interval over the three build means, 2 df: :func:`calibdcd.stats.compare_builds`), is
  the verdict; the pool-level interval (the nine pools as one level) is named beside it in
  "Rests on"; the overlap rows, lab seed 0 only, have that build's own interval. The AUCs from
  the three stored run directories
  ``benchmarks/results/runs/lab-v2-paper-lab{0,1,2}.tar.xz``
  (:func:`~calibdcd.report.aggregate.main_cells` over their settings together).
* **real-regime**, **real-wikimia24**: the stored run directories
  ``benchmarks/results/runs/real-regime.tar.xz`` and ``real-wikimia24-paper.tar.xz``, unpacked
  into a temporary directory; the report's ``paired_cells`` and ``main_cells`` on their
  settings: the numbers of their docs/results.md blocks.
* **lab-micro**, whose run directory was not archived: the block "lab-micro" of
  docs/results.md itself (its paired table's "X + CalibDCD vs X" rows and its AUC table).

``tests/test_readme.py`` regenerates the table and compares it with README.md's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calibdcd.report import aggregate as agg
from calibdcd.report.readme import replace_verdict, results_block, verdict_block
from calibdcd.report.tables import pct

REPO = Path(__file__).resolve().parent.parent
STORED = REPO / "benchmarks" / "results"
RUNS = STORED / "runs"
POOLED_JSON = STORED / "lab_v2_paper_pooled.json"
POOLED_ARCHIVES = tuple(RUNS / f"lab-v2-paper-lab{i}.tar.xz" for i in range(3))
RESULTS_MD = REPO / "docs" / "results.md"
#: the run directory of each lab seed in the pooled archives (and the pooled JSON's pool names)
LAB_SEEDS = {"lab-v2": 0, "lab1": 1, "lab2": 2}

#: the detectors in the table's order; the overlap baseline is no detector of the paper's
DETECTORS = ("VeilProbe", "DPDLLM", "Overlap")
DETECTOR_LABELS = {"Overlap": "Overlap (beyond the paper)"}
#: (study label, archive of its run directory, what one pool is): the runs read whole
RUN_STUDIES = (
    ("real-regime", RUNS / "real-regime.tar.xz", "1 real-model lab build × {seeds}"),
    ("real-wikimia24", RUNS / "real-wikimia24-paper.tar.xz", "{seeds} of WikiMIA-24"),
)
#: (study label, block of docs/results.md, what one pool is): the study read from its block
BLOCK_STUDY = ("lab-micro", "lab-micro", "1 lab build × {seeds}")
#: the comparisons this table needs from a run's pools: only these columns are kept, so the
#: report's paired_cells computes no other comparison
_KEEP = ("label", "original", "calibdcd", "blind")


class MissingInput(FileNotFoundError):
    """A stored input of the table is absent (a fresh checkout without the archives)."""


@dataclasses.dataclass
class Row:
    study: str
    target: str
    detector: str
    delta: str  # "+0.0 [-0.2, +0.2]"
    verdict: str
    auc: str  # the detector's AUC, mean ± SD over the pools (with † where it applies)
    blind: str
    rests_on: str

    def cells(self) -> list[str]:
        label = DETECTOR_LABELS.get(self.detector, self.detector)
        return [self.study, self.target, label, self.delta, self.verdict, self.auc, self.blind,
                self.rests_on]  # fmt: skip


def _need(path: Path) -> Path:
    if not path.exists():
        raise MissingInput(f"{path.relative_to(REPO)}: not found (an input of the verdict table)")
    return path


@contextmanager
def unpacked(*archives: Path) -> Iterator[list[Path]]:
    """The run directory each archive holds, unpacked into one temporary directory (each into a
    folder of its own: two archives may hold run directories of the same name)."""
    with tempfile.TemporaryDirectory(prefix="calibdcd-verdict-") as tmp:
        runs = []
        for i, archive in enumerate(archives):
            dest = Path(tmp) / str(i)
            dest.mkdir()
            with tarfile.open(_need(archive), "r:xz") as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                    tar.extractall(dest, filter="data")
                else:
                    tar.extractall(dest)  # the repository's own archives
            (run,) = [p for p in dest.iterdir() if p.is_dir()]
            runs.append(run)
        yield runs


def _mean_sd(v: dict[str, Any] | None) -> str:
    """The report's own cell format (mean ± SD over seeds, percent)."""
    if v is None:
        return "–"
    return pct(v["mean"]) if v["sd"] is None else f"{pct(v['mean'])} ± {100 * v['sd']:.1f}"


def blind_row(main: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The AUC table's one "Blind (TF-IDF + LR)" row as the report fills it (``tables.
    _main_table``): per (benchmark, target), the blind baseline of the first detector that has
    one, so each number is the one its result block prints."""
    row: dict[tuple[str, str], dict[str, Any]] = {}
    for det in main["detectors"]:
        for (d, bench, tgt), cell in main["cells"].items():
            v = cell["methods"].get("blind", {}).get("auc")
            if d == det and v is not None:
                row.setdefault((bench, tgt), v)
    return row


def _target(target: str, results: list[Any]) -> str:
    """The target, marked when it is a base model shown on its own (a control: it has no
    post-training shift for CalibDCD to remove)."""
    base = any(r.target == target and not r.post_trained for r in results)
    return f"{target} (base model, a control)" if base else target


#: how the report's first table note names the paper's CalibDCD (``aggregate.calibdcd_method``)
PAPER_METHOD = "CalibDCD here is the paper's method"
#: the pooled JSON's and the blocks' verdict words as the report's verdict numbers
VERDICTS = {"better": 1, "worse": -1}


def _paper_method(note: str, where: str) -> None:
    """Refuse a study that did not run the paper's CalibDCD (the table claims it did)."""
    if PAPER_METHOD not in note:
        raise ValueError(f"{where}: not the paper's CalibDCD (no {PAPER_METHOD!r} in its report)")


def _verdict(verdict: int, identical: bool) -> str:
    if identical:
        return "no change (identical scores)"
    return {1: "better", -1: "worse", 0: "not resolved"}[verdict]


def _seeds(seeds: list[int], what: str = "split seed", named: str = "") -> str:
    """``3 split seeds (0–2)``; ``3 lab builds (lab seeds 0–2)`` with ``named="lab seed"``."""
    s = sorted(set(seeds))
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        listed = f"{s[0]}–{s[-1]}"
    else:
        listed = ", ".join(str(x) for x in s)
    name = f"{named}{'s' if len(s) != 1 else ''} " if named else ""
    return f"{len(s)} {what}{'s' if len(s) != 1 else ''} ({name}{listed})"


def _slim(results: list[Any]) -> list[Any]:
    """The results with only the pool columns this table compares."""
    for r in results:
        if r.pool is not None:
            r.pool = {k: v for k, v in r.pool.items() if k in _KEEP}
    return results


def pooled_rows() -> tuple[list[Row], list[str]]:
    """lab-v2 pooled over lab seeds: the interval from the pooled JSON, the AUCs from the three
    stored run directories (every pool the interval rests on); notes for the legend."""
    data = json.loads(_need(POOLED_JSON).read_text(encoding="utf-8"))
    with unpacked(*POOLED_ARCHIVES) as runs:
        results = [r for run in runs for r in agg.load_results(run)]
        _paper_method(agg.calibdcd_method(results), "the pooled lab-v2 runs")
        main = agg.main_cells(results)
        cells, blinds = main["cells"], blind_row(main)
        names = {run.name for run in runs}
    notes = []
    rows = []
    order = {d: i for i, d in enumerate(DETECTORS)}
    targets = list(dict.fromkeys(r.target for r in results if r.post_trained))
    for rec in sorted(
        data["rows"], key=lambda x: (order[x["detector"]], targets.index(x["target"]))
    ):
        cell = cells[(rec["detector"], rec["benchmark"], rec["target"])]
        pools = rec["pools"]
        orig = cell["methods"]["original"]["auc"]
        if orig["n"] != len(pools):
            raise ValueError(
                f"{POOLED_JSON.name}: {rec['comparison']} × {rec['target']} pools {len(pools)} "
                f"settings, the stored runs have {orig['n']}: the JSON is not from these runs"
            )
        builds = list(dict.fromkeys(p.split("/")[0] for p in pools))
        split = [int(p.rsplit("/s", 1)[1]) for p in pools]
        # the archives' run directories are lab seeds 0, 1, 2 (lab-v2, lab1, lab2)
        lab_seeds = sorted(LAB_SEEDS[b] for b in builds)
        rests = (
            f"{len(pools)} pools: {_seeds(lab_seeds, 'lab build', 'lab seed')} × {_seeds(split)}"
        )
        if len(builds) > 1:
            b, p = rec.get("build_level"), rec.get("pool_level")
            if b is None or p is None or not rec.get("interval", "").startswith("build level"):
                raise ValueError(
                    f"{POOLED_JSON.name}: {rec['comparison']} × {rec['target']} pools "
                    f"{len(builds)} lab builds but has no build-level interval: rerun "
                    "benchmarks/lab_pooled.py"
                )
            rests += (
                f"; the interval over the {b['n_builds']} build means (t, {b['df']} df); "
                f"pool level {p['estimate']:+.1f} [{p['low']:+.1f}, {p['high']:+.1f}]"
            )
        study = "lab-v2, pooled" if len(builds) > 1 else f"lab-v2, lab seed {lab_seeds[0]}"
        blind = blinds.get((rec["benchmark"], rec["target"]))
        blind_txt = _mean_sd(blind)
        if blind is not None and blind["n"] < len(pools):
            blind_txt += "*"
            note = (
                f"*: the blind baseline over the {blind['n']} pools of lab seed 0 only (lab seeds "
                "1 and 2 ran VeilProbe and DPDLLM alone, `benchmarks/lab_bands.py --bands-only`)"
            )
            if note not in notes:
                notes.append(note)
        rows.append(
            Row(
                study=study,
                target=rec["target"],
                detector=rec["detector"],
                delta=f"{rec['delta_auc']:+.1f} [{rec['low']:+.1f}, {rec['high']:+.1f}]",
                verdict=_verdict(VERDICTS.get(rec["verdict"], 0), rec["identical"]),
                auc=_mean_sd(orig),
                blind=blind_txt,
                rests_on=rests,
            )
        )
    if names != set(LAB_SEEDS):
        raise ValueError(f"the pooled archives hold runs {sorted(names)}, not {sorted(LAB_SEEDS)}")
    return rows, notes


def run_rows(study: str, archive: Path, pool: str) -> list[Row]:
    """A stored run's "X + CalibDCD vs X" rows, by the report's own paired_cells."""
    with unpacked(archive) as (run,):
        # the table's detectors only (a run may carry others, e.g. the gray-box attacks:
        # their rows are in its docs/results.md block)
        results = _slim([r for r in agg.load_results(run) if r.detector in DETECTORS])
        _paper_method(agg.calibdcd_method(results), archive.name)
        paired = agg.paired_cells(results)
        main = agg.main_cells(results)
        cells, blinds = main["cells"], blind_row(main)
    order = {d: i for i, d in enumerate(DETECTORS)}
    targets = list(dict.fromkeys(r.target for r in results))
    rows = []
    for (det, bench, tgt), comps in sorted(
        paired.items(), key=lambda kv: (order[kv[0][0]], targets.index(kv[0][2]))
    ):
        d = comps["calibdcd"]["auc"]
        identical = d.half_width == 0 and all(x == 0 for x in d.per_seed)
        seeds = [
            r.seed for r in results if (r.detector, r.benchmark, r.target) == (det, bench, tgt)
        ]
        dagger = "†" if "vs_blind" in comps and comps["vs_blind"]["auc"].verdict < 1 else ""
        methods = cells[(det, bench, tgt)]["methods"]
        rows.append(
            Row(
                study=study,
                target=_target(tgt, results),
                detector=det,
                delta=f"{pct(d.estimate, True)} [{pct(d.low, True)}, {pct(d.high, True)}]",
                verdict=_verdict(d.verdict, identical),
                auc=_mean_sd(methods["original"]["auc"]) + dagger,
                blind=_mean_sd(blinds.get((bench, tgt))),
                rests_on=f"{d.n_seeds} pools: " + pool.format(seeds=_seeds(seeds)),
            )
        )
    return rows


def _table(md: str, first: str) -> list[list[str]]:
    """The rows of the Markdown table whose header starts with ``| first |`` (cells stripped of
    bold)."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first} |"))
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip().replace("**", "") for c in ln.strip().strip("|").split("|")])
    return rows  # header, separator, rows


def block_rows(study: str, name: str, pool: str) -> list[Row]:
    """A study's rows read from its block in docs/results.md (its run directory was not kept):
    the paired table's "X + CalibDCD vs X" rows, the AUC table's detector and blind rows."""
    text = _need(RESULTS_MD).read_text(encoding="utf-8")
    block = results_block(text, name, source=str(RESULTS_MD.relative_to(REPO)))
    _paper_method(block, f"block {name!r}")
    main = _table(block, "Method")
    paired = _table(block, "Comparison")
    header, main_rows = main[0], {r[0]: r for r in main[2:]}
    ph = paired[0]
    col = {h: ph.index(h) for h in ("Comparison", "Benchmark / target", "Seeds", "ΔAUC", "AUC")}
    ci = ph.index("ΔAUC") + 1  # the ΔAUC interval
    hw = ph.index("ΔAUC") + 2  # its half-width
    seeds = re.search(r"seeds \[([0-9, ]+)\]", block)  # the block's provenance line
    if seeds is None:
        raise ValueError(f"{RESULTS_MD.name}: block {name!r} names no seeds in its first line")
    seed_list = [int(s) for s in seeds.group(1).split(",")]
    rows = []
    for det in DETECTORS:
        for r in paired[2:]:
            if r[col["Comparison"]] != f"{det} + CalibDCD vs {det}":
                continue
            column = r[col["Benchmark / target"]]
            j = header.index(column)
            blind = main_rows.get("Blind (TF-IDF + LR)")
            identical = r[col["ΔAUC"]] in ("+0.0", "-0.0") and r[ci] == "[+0.0, +0.0]"
            identical = identical and r[hw] == "0.0"  # the block's note: identical scores
            verdict = VERDICTS.get(r[col["AUC"]], 0)
            target = column.split(" / ", 1)[1].replace("(base model)", "(base model, a control)")
            rows.append(
                Row(
                    study=study,
                    target=target,
                    detector=det,
                    delta=f"{r[col['ΔAUC']]} {r[ci]}",
                    verdict=_verdict(verdict, identical),
                    auc=main_rows[det][j].replace("▲", "").replace("▼", ""),
                    blind="–" if blind is None else blind[j],
                    rests_on=f"{r[col['Seeds']]} pools: " + pool.format(seeds=_seeds(seed_list)),
                )
            )
    return rows


HEADER = ["Study", "Target", "Detector X", "X + CalibDCD vs X: ΔAUC [95% CI]", "Verdict",
          "X's AUC", "Blind baseline's AUC", "Rests on"]  # fmt: skip


def verdict_table() -> str:
    """The verdict block's Markdown: provenance line, table, legend."""
    rows, notes = pooled_rows()
    for study, archive, pool in RUN_STUDIES:
        rows += run_rows(study, archive, pool)
    rows += block_rows(*BLOCK_STUDY)
    rel = {p: p.relative_to(REPO).as_posix() for p in (POOLED_JSON, RESULTS_MD)}
    archives = ", ".join(f"`{a.name}`" for a in POOLED_ARCHIVES)
    sources = (
        "Written by `python benchmarks/verdict.py --write README.md`, never typed: lab-v2 pooled "
        f"from `{rel[POOLED_JSON]}` (its ΔAUC and build-level interval) and the stored runs "
        f"{archives} (the AUCs); "
        + "; ".join(
            f"{study} from the stored run `{archive.relative_to(REPO).as_posix()}` (the report's "
            "own paired comparisons)"
            for study, archive, _ in RUN_STUDIES
        )
        + f'; {BLOCK_STUDY[0]} from the block "{BLOCK_STUDY[1]}" of `{rel[RESULTS_MD]}` (its '
        "run directory was not kept). Every study's full tables and its words: "
        "[docs/results.md](docs/results.md)."
    )
    lines = [sources, "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    legend = (
        "AUC points. ΔAUC = (X + CalibDCD) − X on the same texts, the paper's CalibDCD; 95% "
        "interval by the hierarchical paired bootstrap (pools, then texts within each pool; "
        "lab-v2 pooled: below); "
        "better/worse only where the interval excludes 0. A pool is one setting: one split seed "
        "of one lab build or benchmark. lab-v2 pooled: the lab build is the top level (builds, "
        "then split seeds, then texts): the interval and the verdict are a t-interval over the "
        "three build means (2 df; each build's Δ the mean over its split seeds), never narrower "
        "than the builds' own noise allows; the pool-level interval, which resamples the nine "
        "pools as one level and so treats the builds as exchangeable with the split seeds, is "
        "named in Rests on and is not the verdict (docs/statistics.md). AUCs: mean ± SD over "
        "the pools; †: X does not beat the blind baseline (its paired ΔAUC interval against it "
        "is not above 0; not computed for lab-v2 pooled). "
        "Blind baseline: TF-IDF + logistic regression trained on the same supervised texts, "
        "never querying the model: the AUC table's one Blind row, as each result block prints "
        "it (scored on the first detector's evaluation texts; † compares X with it on X's own)."
    )
    lines += ["", legend]
    lines += ["", *notes] if notes else []
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="rewrite the verdict block of this file")
    group.add_argument("--check", type=Path, help="exit 1 when this file's block differs")
    args = ap.parse_args()
    try:
        table = verdict_table()
    except MissingInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.write:
        old = args.write.read_text(encoding="utf-8")
        new = replace_verdict(old, table, source=str(args.write))
        if new != old:  # atomically: a killed rewrite never leaves half a README
            from calibdcd.atomic import atomic_write_text

            atomic_write_text(args.write, new)
        print(f"{args.write}: verdict block {'rewritten' if new != old else 'unchanged'}")
    elif args.check:
        have = verdict_block(args.check.read_text(encoding="utf-8"), source=str(args.check))
        if have != table.strip("\n"):
            print(f"{args.check}: the verdict block differs from the stored results; rerun with "
                  f"--write {args.check}", file=sys.stderr)  # fmt: skip
            return 1
        print(f"{args.check}: the verdict block matches the stored results")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
