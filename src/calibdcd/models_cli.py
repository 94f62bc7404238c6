"""``calibdcd models list CONFIG`` and ``calibdcd models fetch CONFIG``: the models and hub
datasets (benchmarks named without a path) a config uses, whether they are in the local hub
cache, and fetching the missing ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help=(
        "Models and hub datasets a config names (hub ids, local paths): list them, fetch the "
        "missing ones."
    ),
    no_args_is_help=True,
)

ConfigArg = Annotated[Path, typer.Argument(help="experiment config (YAML)")]


def _is_fit_config(config: Path) -> bool:
    """A fit config (``calibdcd fit``) has one ``target``; a run config has ``targets``."""
    import yaml

    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the run reader reports it, with its line
    return isinstance(data, dict) and "target" in data and "targets" not in data


def _uses(config: Path):
    """The model uses of a run config or of a fit config (the same command for both)."""
    from calibdcd.experiment.config import ConfigError, load_config
    from calibdcd.experiment.fit_config import load_fit_config
    from calibdcd.experiment.model_uses import models_in_config, models_in_fit_config

    try:
        if _is_fit_config(config):
            return models_in_fit_config(load_fit_config(config))
        return models_in_config(load_config(config))
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("list")
def list_command(config: ConfigArg) -> None:
    """Each model or hub dataset CONFIG uses: present or missing, repo id, commit (exit 1 if one
    is missing)."""
    from calibdcd.models import MissingModelError, hub_cache_dir, resolve_model

    uses = _uses(config)
    missing = 0
    for use in uses:
        try:
            rm = resolve_model(use.ref, need=use.need)
        except MissingModelError as exc:
            missing += 1
            state, detail = "missing", exc.reason
        else:
            state = "present"
            detail = f"{rm.repo_id} @ {rm.revision}" if rm.is_hub else "local path"
        typer.echo(f"{state:8} {use.ref}  [{detail}]  {use.describe()}")
    typer.echo(
        f"{len(uses)} model and dataset use(s), {missing} missing; hub cache {hub_cache_dir()}"
    )
    if missing:
        typer.echo(f"fetch the missing ones with: calibdcd models fetch {config}")
        raise typer.Exit(1)


@app.command("fetch")
def fetch_command(
    config: ConfigArg,
    progress: Annotated[bool, typer.Option(help="huggingface_hub's progress bars")] = True,
) -> None:
    """Download every missing hub model (only the files transformers needs) and hub dataset of
    CONFIG."""
    from calibdcd.models import fetch_models

    results = fetch_models(_uses(config), progress=progress, log=typer.echo)
    failed = 0
    for r in results:
        if r.status == "failed":
            failed += 1
            typer.echo(f"failed   {r.ref}: {r.error}", err=True)
        else:
            rm = r.resolved
            detail = f"{rm.repo_id} @ {rm.revision}" if rm is not None and rm.is_hub else "local"
            typer.echo(f"{r.status:8} {r.ref}  [{detail}]")
    if failed:
        typer.echo(f"{failed} model(s) could not be fetched", err=True)
        raise typer.Exit(1)
