"""``calibdcd veilprobe ...``: offline helpers for VeilProbe's local models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="VeilProbe helpers (offline masked LM and proxy LM).", no_args_is_help=True)


def read_pool(path: Path, field: str | None = None) -> list[str]:
    """Texts from a .jsonl (``field``, else "text" or "input"), or one text per line otherwise."""
    if not path.is_file():
        raise typer.BadParameter(f"pool file {str(path)!r} does not exist")
    texts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                row = json.loads(line)
                key = field or next((k for k in ("text", "input") if k in row), None)
                if key is None or not isinstance(row.get(key), str):
                    raise typer.BadParameter(
                        f"{path}:{lineno}: no string field {field or 'text'!r}"
                    )
                texts.append(row[key])
            else:
                texts.append(line.rstrip("\n"))
    if not texts:
        raise typer.BadParameter(f"pool file {str(path)!r} holds no texts")
    return texts


@app.command("train-local-models")
def train_local_models(
    pool: Annotated[Path, typer.Option(help="texts (.jsonl with text/input, or .txt)")],
    cache_dir: Annotated[Path | None, typer.Option(help="artefact cache directory")] = None,
    field: Annotated[str | None, typer.Option(help="jsonl field holding the text")] = None,
    epochs: Annotated[int, typer.Option(help="training epochs for both models")] = 20,
    seed: Annotated[int, typer.Option(help="training seed")] = 0,
) -> None:
    """Train (or reuse) the tiny fill-mask model and causal proxy LM VeilProbe uses offline."""
    from .config import MaskedLMConfig, default_veilprobe_cache
    from .mlm import train_causal_proxy, train_masked_lm

    texts = read_pool(pool, field)
    cfg = MaskedLMConfig(epochs=epochs, seed=seed)
    root = cache_dir or default_veilprobe_cache()
    mlm = train_masked_lm(texts, root, cfg)
    proxy = train_causal_proxy(texts, root, cfg)
    typer.echo(json.dumps({"masked_lm": str(mlm), "proxy": str(proxy), "texts": len(texts)}))
