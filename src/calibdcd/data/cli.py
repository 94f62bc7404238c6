"""``calibdcd data ...``: inspect benchmarks and the protocol's split sizes."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import typer

from calibdcd.data.benchmarks import (
    BENCHMARKS,
    PAPER_POOLS,
    PAPER_SIZES,
    benchmark_spec,
    load_benchmark,
    load_hub_benchmark,
)
from calibdcd.data.hub import HubUnavailableError
from calibdcd.data.protocol import SplitConfig, resolve_subsample_size, split_benchmark
from calibdcd.data.types import Benchmark
from calibdcd.data.validation import DataError
from calibdcd.errors import CommandError

app = typer.Typer(
    help="Inspect DCD benchmarks and the paper's split protocol.", no_args_is_help=True
)


def _parse_subsample(value: str) -> int | str | None:
    v = value.strip().lower()
    if v == "paper":
        return "paper"
    if v in ("all", "none"):
        return None
    try:
        return int(v)
    except ValueError:
        raise typer.BadParameter("expected 'paper', 'all' or an integer") from None


def _length_table(bench: Benchmark) -> list[str]:
    labels = bench.labels
    words = np.array([len(t.split()) for t in bench.texts])
    chars = np.array([len(t) for t in bench.texts])
    rows = [f"{'label':<16}{'count':>7}   words min / median / mean / max   chars mean"]
    for title, mask in (
        ("member (1)", labels == 1),
        ("non-member (0)", labels == 0),
        ("all", np.ones_like(labels, dtype=bool)),
    ):
        w = words[mask]
        if len(w) == 0:
            rows.append(f"{title:<16}{0:>7}")
            continue
        rows.append(
            f"{title:<16}{len(w):>7}   {w.min():>5} / {np.median(w):>6.0f} / {w.mean():>6.1f}"
            f" / {w.max():>5}   {chars[mask].mean():>10.1f}"
        )
    return rows


def _is_hub_id(name: str, path: str | None) -> bool:
    """``owner/name`` that is neither a known benchmark nor a file here: a hub dataset id."""
    from pathlib import Path

    return (
        path is None
        and benchmark_spec(name) is None
        and name.count("/") == 1
        and not Path(name).exists()
    )


@app.command("show")
def show(
    name: Annotated[
        str, typer.Argument(help="benchmark name (see `calibdcd data list`) or a file")
    ],
    path: Annotated[
        str | None, typer.Option(help="local file or directory (else the HF hub)")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(help="subset, e.g. 64 for WikiMIA length-64; a hub dataset's split"),
    ] = None,
    config: Annotated[
        str | None, typer.Option(help="a hub dataset's config (owner/name datasets)")
    ] = None,
    revision: Annotated[str | None, typer.Option(help="a hub dataset's revision")] = None,
    pairs: Annotated[
        str | None,
        typer.Option(
            help="a hub dataset with a member and a non-member text per row: MEMBER,NONMEMBER "
            "columns (MIMIR: member,nonmember)"
        ),
    ] = None,
    text_field: Annotated[str | None, typer.Option(help="text column (generic files)")] = None,
    label_field: Annotated[str | None, typer.Option(help="label column (generic files)")] = None,
    dedupe: Annotated[bool, typer.Option(help="drop repeated texts")] = False,
    protocol: Annotated[str, typer.Option(help="paper | strict")] = "paper",
    subsample: Annotated[str, typer.Option(help="paper | all | N")] = "paper",
    seed: Annotated[int, typer.Option(help="protocol seed")] = 0,
) -> None:
    """Print label counts, text lengths and the protocol's split sizes for one benchmark."""
    # warnings print as they arise, redacted, on the one error path's warning line
    try:
        if _is_hub_id(name, path):
            pair = tuple(pairs.split(",")) if pairs else None
            if pair is not None and len(pair) != 2:
                raise ValueError(f"--pairs takes MEMBER,NONMEMBER columns, got {pairs!r}")
            bench = load_hub_benchmark(
                name, config=config, split=split, revision=revision,
                text_field=text_field, label_field=label_field, dedupe=dedupe,
                pair_fields=pair,  # type: ignore[arg-type]
            )  # fmt: skip
        else:
            bench = load_benchmark(
                name,
                path=path,
                split=split,
                text_field=text_field,
                label_field=label_field,
                dedupe=dedupe,
                revision=revision,
            )
        config = SplitConfig(protocol=protocol, subsample=_parse_subsample(subsample))  # type: ignore[arg-type]
        size = resolve_subsample_size(config, bench.name, bench.subset)
        try:
            sp = split_benchmark(bench, config, seed=seed)
            split_error = None
        except ValueError as e:
            sp, split_error = None, str(e)
    except (DataError, HubUnavailableError, FileNotFoundError, ValueError) as e:
        raise CommandError(e) from e

    rep = bench.report
    out = [
        f"benchmark        {bench.key}",
        f"source           {bench.source}",
        f"detector length  L = {bench.default_length}",
        f"records read     {rep.n_records}"
        + (f" (+{rep.n_filtered} of other subsets skipped)" if rep.n_filtered else ""),
        f"kept             {len(bench)}  (dropped: {len(rep.dropped_empty)} empty, "
        f"{len(rep.dropped_duplicates)} duplicate)",
        f"duplicate texts  {len(rep.duplicates)}"
        + (
            f", {len(rep.conflicting_duplicates)} lines with conflicting labels"
            if rep.conflicting_duplicates
            else ""
        ),
        "",
        *_length_table(bench),
        "",
    ]
    sub_desc = "all" if size is None else str(size)
    out.append(f"split (protocol={protocol}, seed={seed}, subsample={sub_desc})")
    if sp is None:
        out.append(f"  not possible: {split_error}")
    else:
        out.append(f"  {'part':<14}{'total':>7}{'members':>9}{'non-members':>13}")
        for part, (n, n1, n0) in sp.sizes().items():
            out.append(f"  {part:<14}{n:>7}{n1:>9}{n0:>13}")
    if bench.name in PAPER_SIZES:
        m, nm = PAPER_POOLS[bench.name]
        out.append(
            f"paper's table    total {PAPER_SIZES[bench.name]}, supervised 100 (50/50), "
            f"evaluation pool {m + nm} ({m}/{nm})"
        )
    typer.echo("\n".join(out))


@app.command("list")
def list_benchmarks() -> None:
    """List the known benchmarks, their subsets and hub datasets."""
    for spec in BENCHMARKS.values():
        subsets = (
            f" subsets: {', '.join(spec.subsets)} (default {spec.default_subset})"
            if spec.subsets
            else ""
        )
        paper = f" paper size {spec.paper_size}." if spec.paper_size else ""
        typer.echo(f"{spec.name:<14}hf:{spec.hf_repo}. {spec.description}.{subsets}{paper}")
