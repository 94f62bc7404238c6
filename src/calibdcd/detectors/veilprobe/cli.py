"""``calibdcd veilprobe ...``: offline helpers for VeilProbe's local models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="VeilProbe helpers (offline masked LM and proxy LM).", no_args_is_help=True)


@app.command("train-local-models")
def train_local_models(
    pool: Annotated[
        Path,
        typer.Option(help="texts: .jsonl/.json/.csv/.tsv/.parquet (a text column) or .txt"),
    ],
    cache_dir: Annotated[Path | None, typer.Option(help="artefact cache directory")] = None,
    field: Annotated[
        str | None, typer.Option(help="the text column (default: text, input or snippet)")
    ] = None,
    epochs: Annotated[int, typer.Option(help="training epochs for both models")] = 20,
    seed: Annotated[int, typer.Option(help="training seed")] = 0,
) -> None:
    """Train (or reuse) the tiny fill-mask model and causal proxy LM VeilProbe uses offline."""
    from calibdcd.data import load_texts
    from calibdcd.errors import CommandError

    from .config import MaskedLMConfig, default_veilprobe_cache
    from .mlm import train_causal_proxy, train_masked_lm

    # the reader fit and score use: a file gives the same texts whatever its format, and
    # every problem of it is one error naming file and line (a .json array was read as lines)
    try:
        texts = list(load_texts(pool, **({"text_field": field} if field else {})).texts)
    except (OSError, ValueError) as exc:
        raise CommandError(exc) from exc
    cfg = MaskedLMConfig(epochs=epochs, seed=seed)
    root = cache_dir or default_veilprobe_cache()
    mlm = train_masked_lm(texts, root, cfg)
    proxy = train_causal_proxy(texts, root, cfg)
    typer.echo(json.dumps({"masked_lm": str(mlm), "proxy": str(proxy), "texts": len(texts)}))
