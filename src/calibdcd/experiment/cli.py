"""``calibdcd run CONFIG.yaml`` and ``calibdcd report RUN_DIR``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calibdcd.errors import CommandError

__all__ = ["demo_command", "finish_dry_run", "report_command", "run_command"]


def finish_dry_run(
    lines: list[str],
    problems: list[str],
    *,
    code: int = 1,
) -> None:
    """The end of every ``--dry-run`` (``run``, ``fit``): the plan's lines on stdout, then each
    problem as an ``error:`` line and their count on stderr and exit ``code``, or ``dry run:
    OK``; every line redacted (a secret in a server's answer or a config's URL never prints)."""
    from calibdcd.redact import redact

    def echo(line: str, err: bool = False) -> None:
        typer.echo(redact(line), err=err)

    for line in lines:
        echo(line)
    for p in problems:
        echo(f"error: {p}", err=True)
    if problems:
        echo(f"dry run: {len(problems)} problem(s)", err=True)
        raise typer.Exit(code)
    echo("dry run: OK")


def run_command(
    config: Annotated[Path, typer.Argument(help="experiment config (YAML)")],
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="resolve and validate everything (every model must be in the local hub cache); "
            "load no model",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="run directory (default: the config's output)"),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="cache root (default: the config's cache_dir, else $CALIBDCD_CACHE, "
            "else the user cache)"
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="i/n: run only the i-th of n parts of the grid (0-based), e.g. one per machine; "
            "`calibdcd report DIR_0 ... DIR_n-1 -o MERGED` joins their run directories"
        ),
    ] = None,
    report: Annotated[bool, typer.Option(help="write the report when the grid is complete")] = True,
    log_samples: Annotated[
        bool,
        typer.Option(
            "--log-samples",
            help="write settings/<id>/samples.jsonl: every prompt, completion and decoding a "
            "setting's features used",
        ),
    ] = False,
    progress: Annotated[bool, typer.Option(help="progress bars")] = True,
    debug: Annotated[
        bool, typer.Option("--debug", help="show the full traceback of an error")
    ] = False,
) -> None:
    """Run (or resume) an experiment grid: benchmarks x targets x detectors x seeds."""
    from calibdcd.experiment.config import ConfigError, locate, read_config
    from calibdcd.experiment.runner import dry_run as check
    from calibdcd.experiment.runner import parse_shard, run_experiment
    from calibdcd.redact import redact

    def echo(line: str, err: bool = False) -> None:
        typer.echo(redact(line), err=err)

    try:
        part = parse_shard(shard) if shard is not None else None
        cfg, config_problems = read_config(config, cache_dir=cache_dir)
    except (ValueError, ConfigError) as exc:
        raise CommandError(exc) from exc
    if config_problems and not dry_run:
        raise CommandError(ConfigError("", "", str(config), problems=config_problems))
    if dry_run:
        # every problem at once: the config's (with lines), then what needs the files and models
        problems = [p.render(str(config)) for p in config_problems]
        lines: list[str] = []
        if cfg is not None:
            lines, more = check(cfg, options=False, out=out, shard=part)
            problems += [locate(p, config) for p in more]
        finish_dry_run(lines, problems, code=2 if cfg is None else 1)
        return
    assert cfg is not None
    try:
        run_dir = run_experiment(
            cfg, out, progress=progress, log=echo, shard=part, log_samples=log_samples
        )
        echo(f"run directory: {run_dir}")
        if report and part is None:
            from calibdcd.report import write_report

            html = write_report(run_dir)
            echo(f"report: {html}")
    except (KeyboardInterrupt, typer.Exit):
        raise
    except Exception as exc:
        # the one error path's lines (the list of missing models prints as its block), with
        # this command's --debug; exit 1 for any failure once the config is read (the run's own
        # errors are not the user's mistakes, which the one path's 2 would say), or the error's
        from calibdcd.errors import render

        for line in render(exc, debug=debug, hint="(run again with --debug for the traceback)"):
            echo(line, err=True)
        raise typer.Exit(getattr(exc, "exit_code", 1)) from None


def report_command(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="a run directory written by `calibdcd run`; or the directories of its shards "
            "(`run --shard i/n`), merged into --out first"
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="report directory (default: RUN_DIR/report)")
    ] = None,
    readme: Annotated[
        Path | None,
        typer.Option(
            "--readme",
            help="also rewrite the block <!-- calibdcd:results NAME --> ... "
            "<!-- /calibdcd:results --> of this Markdown file with the main tables",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="the block's NAME (default: the run's config name)"),
    ] = None,
    tables: Annotated[
        str | None,
        typer.Option(
            "--tables", help="comma-separated table keys for --readme (default: the *_main ones)"
        ),
    ] = None,
) -> None:
    """Write the paper's tables (Markdown, LaTeX, CSV), figures and one HTML page; with
    --readme, also the run's main tables (and where they came from) into a results block of a
    Markdown file (docs/results.md)."""
    from calibdcd.experiment.rundir import run_progress
    from calibdcd.paths import check_output
    from calibdcd.report import write_report

    try:
        if len(run_dirs) > 1:  # shards of one run: merged into one run directory, then reported
            from calibdcd.experiment.runner import merge_runs

            if out is None:
                raise ValueError("several run directories (shards) need --out: the merged run")
            check_output(out, "directory", inputs=run_dirs)  # never a shard, nor holding one
            # refused: shards of other inputs, edited results (one line naming what differs)
            run_dir = merge_runs(list(run_dirs), out, log=typer.echo)
            out = None
            typer.echo(f"merged {len(run_dirs)} shard(s) into {run_dir}")
        else:
            run_dir = run_dirs[0]
            if not run_dir.is_dir():
                raise FileNotFoundError(f"{run_dir}: no such run directory")
            if out is not None and out.resolve() != (run_dir / "report").resolve():
                # outside the run directory (or its own report/): never among its settings
                check_output(out, "directory", protected=[run_dir])
        # k of n settings (and which are missing); an edited result is refused
        for line in run_progress(run_dir).lines():
            typer.echo(line)
        html = write_report(run_dir, out)
        if readme is not None:
            from calibdcd.report.readme import write_readme

            keys = [k.strip() for k in tables.split(",") if k.strip()] if tables else None
            used = write_readme(run_dir, readme, name, keys)
    except (OSError, ValueError) as exc:
        raise CommandError(exc) from exc
    typer.echo(f"report: {html}")
    if readme is not None:
        typer.echo(f"{readme}: results block {used!r} rewritten")


def demo_command(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="run directory")] = None,
    preset: Annotated[
        str | None,
        typer.Option(
            help="lab preset (default: demo, micro's base and chat-qwen; micro when --chat-model "
            "names another chat model; v2: the study's lab)"
        ),
    ] = None,
    chat_model: Annotated[
        list[str] | None,
        typer.Option(
            "--chat-model",
            help="post-trained lab model(s): chat-qwen / chat-llama / chat-reasoning "
            "(repeat; default chat-qwen)",
        ),
    ] = None,
    detector: Annotated[
        list[str] | None,
        typer.Option(
            "--detector",
            "-d",
            help="veilprobe / dpdllm / overlap (repeat; default all three)",
        ),
    ] = None,
    seed: Annotated[
        list[int] | None,
        typer.Option(
            "--seed",
            help="split seed(s) (repeat; default 0: one seed, illustrative; 0 1 2 is "
            "configs/lab-micro.yaml's)",
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(help="cache root: lab, generations, features (default: the user cache)"),
    ] = None,
    progress: Annotated[bool, typer.Option(help="progress bars")] = True,
) -> None:
    """Build the lab, run every detector with and without CalibDCD on its post-trained and base
    models (configs/demo.yaml by default), print the comparison and write the HTML report."""
    from calibdcd.experiment.demo import DEMO_CHAT_MODELS, DEMO_DETECTORS, DEMO_SEEDS, run_demo

    try:
        html, text = run_demo(
            out,
            preset=preset,
            chat_models=tuple(chat_model) if chat_model else DEMO_CHAT_MODELS,
            detectors=tuple(detector) if detector else DEMO_DETECTORS,
            seeds=tuple(seed) if seed else DEMO_SEEDS,
            cache_dir=cache_dir,
            progress=progress,
            log=typer.echo,
        )
    except ValueError as exc:
        raise CommandError(exc) from exc
    typer.echo(text)
    typer.echo(f"report: {html}")
