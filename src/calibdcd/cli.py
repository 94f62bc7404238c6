"""The ``calibdcd`` command line. Each feature area adds its sub-commands here."""

from __future__ import annotations

import typer

from calibdcd.data.cli import app as _data_app
from calibdcd.experiment.cli import demo_command, report_command, run_command

app = typer.Typer(
    name="calibdcd",
    help="Black-box pre-training data contamination detection with CalibDCD calibration.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(_data_app, name="data")
app.command("run")(run_command)
app.command("report")(report_command)
app.command("demo")(demo_command)

from calibdcd.lab.cli import app as _lab_app  # noqa: E402

app.add_typer(_lab_app, name="lab")


@app.command()
def version() -> None:
    """Print the calibdcd version."""
    from calibdcd import __version__

    typer.echo(__version__)


from calibdcd.detectors.veilprobe.cli import app as _veilprobe_app  # noqa: E402
from calibdcd.views_cli import views_command  # noqa: E402

app.add_typer(_veilprobe_app, name="veilprobe")

app.command("views")(views_command)


def main() -> None:  # pragma: no cover - entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
