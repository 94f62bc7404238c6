"""The ``calibdcd`` command line. Each feature area defines its sub-commands in its own module;
this file only assembles them (and must stay cheap to import: no torch here)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from calibdcd.data.cli import app as _data_app
from calibdcd.detectors.veilprobe.cli import app as _veilprobe_app
from calibdcd.experiment.cli import demo_command, report_command, run_command
from calibdcd.fitted_cli import fit_command, score_command
from calibdcd.lab.cli import app as _lab_app
from calibdcd.models_cli import app as _models_app
from calibdcd.views_cli import views_command

app = typer.Typer(
    name="calibdcd",
    help="Black-box pre-training data contamination detection with CalibDCD calibration.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from calibdcd import __version__

        typer.echo(__version__)
        raise typer.Exit()


def _version_option() -> Any:
    return typer.Option(
        False,
        "--version",
        callback=_version,
        is_eager=True,
        expose_value=False,
        help="Print the version and exit.",
    )


def _usage_errors() -> tuple[type[BaseException], ...]:
    """A command's usage errors (``typer.BadParameter`` and the rest), which typer reports
    itself (the usage, the message, exit 2). Recent typer vendors click and raises its own
    classes, whose base is ``typer.TyperException`` and not the installed click's (a check for
    ``click.ClickException`` alone turned them into ``error: BadParameter: ...``, exit 1); older
    typer raises click's."""
    found = [c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"][:1]
    try:
        import click

        found.append(click.ClickException)
    except ImportError:  # typer without click installed beside it
        pass
    return tuple(found)


_USAGE_ERRORS = _usage_errors()


def _one_error_path(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the command line's one error path (:mod:`calibdcd.errors`): an error the
    command does not handle itself is one redacted line (exit 2 for a user mistake, else 1),
    the traceback only with ``CALIBDCD_DEBUG=1``; warnings print as ``warning: ...`` lines."""
    if getattr(func, "_one_error_path", False):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import warnings

        from calibdcd.errors import exit_code, render, show_warning_line

        def err(line: str) -> None:
            typer.echo(line, err=True)

        with warnings.catch_warnings():
            # a caller that records warnings (a test's pytest.warns) keeps its own display
            if warnings.showwarning is getattr(warnings, "_showwarning_orig", None):
                warnings.showwarning = show_warning_line(err)
            try:
                return func(*args, **kwargs)
            except (typer.Exit, typer.Abort, KeyboardInterrupt, SystemExit):
                raise
            except _USAGE_ERRORS:
                raise  # typer prints the usage and the message, exit 2
            except Exception as exc:
                for line in render(exc):
                    err(line)
                raise typer.Exit(exit_code(exc)) from None

    wrapper._one_error_path = True  # type: ignore[attr-defined]
    return wrapper


def _versioned(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with an eager ``--version`` among its options (one dialect on every subcommand:
    ``calibdcd fit --version`` answers as ``calibdcd --version`` does). typer reads a command's
    options from its signature, so the flag is added to the signature once here rather than as
    a parameter of every command function; its value is never passed on to ``func``."""
    sig = inspect.signature(func, eval_str=True)  # typer reads a set __signature__ as it is
    if "_version" in sig.parameters:
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("_version", None)  # typer passes every signature parameter
        return func(*args, **kwargs)

    flag = inspect.Parameter(
        "_version", inspect.Parameter.KEYWORD_ONLY, default=_version_option(), annotation=bool
    )
    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), flag])  # type: ignore[attr-defined]
    return wrapper


@app.callback()
def _main(version: bool = _version_option()) -> None:
    """Black-box pre-training data contamination detection with CalibDCD calibration."""


app.command("demo")(demo_command)
app.command("run")(run_command)
app.command("report")(report_command)
app.command("views")(views_command)
app.command("fit")(fit_command)
app.command("score")(score_command)
app.add_typer(_data_app, name="data")
app.add_typer(_lab_app, name="lab")
app.add_typer(_models_app, name="models")
app.add_typer(_veilprobe_app, name="veilprobe")


@app.command()
def schema(
    what: str = typer.Argument("result", help="result: a setting's result.json"),
) -> None:
    """Print the JSON Schema of a file calibdcd writes ("result": settings/<id>/result.json)."""
    import json

    if what != "result":
        from calibdcd.errors import CommandError

        raise CommandError(f"unknown schema {what!r}; known: result")
    from calibdcd.results import result_json_schema

    typer.echo(json.dumps(result_json_schema(), indent=2, sort_keys=True))


@app.command()
def version() -> None:
    """Print the calibdcd version."""
    from calibdcd import __version__

    typer.echo(__version__)


def _group_options(version: bool = _version_option()) -> None:
    pass


def _summary(func: Callable[..., Any]) -> str | None:
    """The first paragraph of ``func``'s docstring on one line: typer lists a command by that
    paragraph with the docstring's own line breaks kept, which broke the list of commands into
    ragged lines."""
    doc = inspect.getdoc(func)
    return " ".join(doc.split("\n\n")[0].split()) if doc else None


def _version_everywhere(typer_app: typer.Typer) -> None:
    """Every command of ``typer_app`` and its groups gets the one error path, ``--version`` and
    a one-line summary in the list of commands."""
    for info in typer_app.registered_commands:
        if info.callback is not None:
            if info.short_help is None and info.help is None:
                info.short_help = _summary(info.callback)
            info.callback = _versioned(_one_error_path(info.callback))
    for group in typer_app.registered_groups:
        sub = group.typer_instance
        if sub is None:
            continue
        if sub.registered_callback is None:  # a group answers --version too (`calibdcd lab
            sub.callback()(_group_options)  # --version`); no docstring: its help stays its own
        _version_everywhere(sub)


_version_everywhere(app)


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
