"""``calibdcd lab build|check``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from calibdcd.lab import KNOWN_PRESETS

app = typer.Typer(help="The controlled contamination lab (tiny LMs with known members).")


@app.command()
def build(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the lab into.")],
    preset: Annotated[
        str,
        typer.Option(
            help=f"{' | '.join(KNOWN_PRESETS)} (src/calibdcd/lab/config.py; base needs a GPU, "
            "real-* are real LMs, calibdcd.lab.real)."
        ),
    ] = "micro",
    pool: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional on py3.10
        typer.Option(
            help="texts: .jsonl/.json/.csv/.tsv/.parquet (a text column) or .txt (default: "
            "prose from CPython's own docs)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for split, initialisation, data order.")] = 0,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = "auto",
    check: Annotated[bool, typer.Option(help="Run `lab check` and store it in lab.json.")] = True,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="Config override section.field=value (--set sft.lr=2e-4)."),
    ] = None,
    cache_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="cache root, where the pre-trained base is kept for reuse (default, as every "
            "command: $CALIBDCD_CACHE, else the user cache)"
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
    quiet: Annotated[bool, typer.Option(hidden=True, help="= --no-progress (older flag).")] = False,
) -> None:
    """Build a lab: base model, post-trained chat variants, ground truth, lab.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from calibdcd.lab import build_lab, format_check

    overrides: dict[str, object] = {"device": device, "check": check}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise typer.BadParameter(f"--set {item!r}: expected section.field=value")
        section, field = key.split(".", 1)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        overrides[f"{section}__{field}"] = parsed
    path = build_lab(
        preset, out, seed=seed, pool=pool, progress=progress and not quiet, cache=cache_dir,
        **overrides,
    )  # fmt: skip
    meta = json.loads((path / "lab.json").read_text())
    timings = meta.get("timings", {})
    # (a real-model lab times its build and its check apart: no "total")
    total = timings.get("total", timings.get("build", 0.0) + timings.get("check", 0.0))
    typer.echo(f"lab written to {path} ({total:.0f} s)")
    if meta.get("kind") == "real" and "skipped" not in meta.get("check", {}):
        for name, sig in meta.get("check", {}).items():
            typer.echo(
                f"{name:<10} loss AUC {sig['loss_auc']:.3f}  greedy ROUGE-L AUC "
                f"{sig['greedy_rougeL_auc']:.3f}  ({sig['n_per_class']} per class)"
            )
    elif "check" in meta:
        typer.echo(format_check(meta["check"]))


@app.command("check")
def check_cmd(
    lab_dir: Annotated[Path, typer.Argument(help="A lab directory.")],
    model: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(help="Only these model dirs (repeatable)."),
    ] = None,
    mode: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(help="raw and/or chat (default both)."),
    ] = None,
    n: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="At most N members and N non-members."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the full JSON report.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
    quiet: Annotated[bool, typer.Option(hidden=True, help="= --no-progress (older flag).")] = False,
) -> None:
    """Loss AUC and black-box continuation AUCs (ROUGE-L, exact prefix) of every lab model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import dataclasses

    from calibdcd.lab.evaluate import check_lab, format_check, lab_eval_config

    cfg = lab_eval_config(lab_dir)
    if n is not None:
        cfg = dataclasses.replace(cfg, n_per_class=n)
    report = check_lab(
        lab_dir,
        cfg,
        models=model or None,
        modes=tuple(mode or ("raw", "chat")),
        device=device,
        progress=progress and not quiet,
    )
    typer.echo(json.dumps(report, indent=2) if as_json else format_check(report))
