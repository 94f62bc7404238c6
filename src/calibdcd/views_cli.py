"""``calibdcd views``: print the controlled view bank of a model family."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def views_command(
    family: Annotated[
        str | None,
        typer.Option(help="model family: qwen2.5, llama3.1, deepseek-r1-distill-qwen, or any"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer/model directory whose chat template gives the boundary views"),
    ] = None,
    text: Annotated[str, typer.Option(help="example text to show each view's full prompt")] = (
        "The quick brown fox jumps over the lazy dog."
    ),
    system: Annotated[
        str, typer.Option(help="system turn of boundary views: official | none")
    ] = "official",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print the original query and the ten controlled views (code, name, full prompt)."""
    from calibdcd.views import ORIGINAL, view_bank

    if family is None and tokenizer is None:
        raise typer.BadParameter("give --family or --tokenizer", param_hint="--family")
    try:
        bank = [ORIGINAL, *view_bank(family, tokenizer, system=system)]  # type: ignore[arg-type]
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--family") from e
    rows = [{**v.as_dict(), "prompt": v.apply(text)} for v in bank]
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['code']:<3} {r['name']}\n    {r['prompt']!r}")
