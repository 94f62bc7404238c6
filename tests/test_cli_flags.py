"""The command line speaks one dialect: the same flags mean the same on every subcommand."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from calibdcd import __version__
from calibdcd.cli import app

REPO = Path(__file__).resolve().parents[1]

#: subcommands that write something (their --out has the short form -o)
WRITERS = [["run"], ["demo"], ["report"], ["fit"], ["score"], ["lab", "build"]]
#: subcommands that can wait long enough to show progress bars
WAITERS = [["run"], ["demo"], ["fit"], ["score"], ["lab", "build"], ["lab", "check"]]


def _help(cmd: list[str]) -> str:
    res = CliRunner().invoke(app, [*cmd, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return re.sub(r"\x1b\[[0-9;]*m", "", res.output)


def test_out_has_one_short_form_everywhere():
    for cmd in WRITERS:
        text = _help(cmd)
        assert re.search(r"--out\s+-o\b", text), (cmd, text)


def test_progress_is_one_pair_of_flags_everywhere():
    for cmd in WAITERS:
        text = _help(cmd)
        assert re.search(r"--progress\s+--no-progress", text), (cmd, text)
        assert "--quiet" not in text, cmd  # the old lab flag is hidden, not advertised


#: subcommands that read or write the cache
CACHERS = [["run"], ["demo"], ["fit"], ["score"], ["lab", "build"]]


def test_cache_dir_is_one_flag_everywhere():
    for cmd in CACHERS:
        assert "--cache-dir" in _help(cmd), cmd


def test_run_cache_dir_replaces_the_config_cache(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "run",
            str(REPO / "configs" / "lab-micro.yaml"),
            "--dry-run",
            "--cache-dir",
            str(tmp_path),
        ],
    )
    assert f"cache: {tmp_path};" in res.output, res.output


def _leaf_commands() -> list[list[str]]:
    import typer

    out: list[list[str]] = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
        else:
            out.append(path)

    walk(typer.main.get_command(app), [])
    return out


def test_version_flag_and_command():
    for args in (["--version"], ["version"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0 and res.output.strip() == __version__


def test_every_subcommand_and_group_answers_version_before_its_arguments():
    leaves = _leaf_commands()
    assert ["fit"] in leaves and ["lab", "build"] in leaves and len(leaves) >= 15
    groups = [["data"], ["lab"], ["models"], ["veilprobe"]]
    for cmd in leaves + groups:
        # eager: answered even though the command's required arguments are missing
        res = CliRunner().invoke(app, [*cmd, "--version"])
        assert res.exit_code == 0 and res.output.strip() == __version__, (cmd, res.output)


def test_dry_run_names_the_out_directory_it_would_use(tmp_path):
    res = CliRunner().invoke(
        app, ["run", str(REPO / "configs" / "lab-micro.yaml"), "--dry-run", "-o", str(tmp_path)]
    )
    assert f"output: {tmp_path}" in res.output, res.output


def test_every_list_of_commands_shows_each_summary_on_unbroken_lines():
    """A list of commands shows each command's summary (its short help, else its docstring's
    first paragraph) wrapped to the terminal only: typer keeps a docstring's own line breaks
    there, which broke `calibdcd --help` into ragged rows ("... on its post-trained and base",
    then a row beginning "models (configs/demo.yaml by default)")."""
    import typer

    def leaves(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from leaves(sub, [*path, name])
        else:
            yield path, cmd

    seen = 0
    for path, cmd in leaves(typer.main.get_command(app), []):
        listed = cmd.short_help or (cmd.help or "").split("\n\n")[0]
        assert listed and "\n" not in listed.strip(), (path, listed)
        seen += 1
    assert seen >= 15
    # the rendered list: the first command's summary continues on the next row, unbroken
    text = _help([])
    assert re.search(r"on\s+its post-trained and base models \(configs/demo.yaml", text), text


def test_a_usage_error_raised_by_a_command_is_typers_usage_error():
    """typer.BadParameter raised inside a command prints the usage and the message and exits 2,
    as typer's own checks do. Recent typer raises the click it vendors, not the installed
    click's classes: the one error path took it for a failure (exit 1, "error: BadParameter:
    ..." and a traceback hint)."""
    for cmd, words in (
        (["views"], "give --family or --tokenizer"),
        (["lab", "build", "-o", "never-built", "--set", "nodot"], "expected section.field=value"),
    ):
        res = CliRunner().invoke(app, cmd, env={"COLUMNS": "200", "NO_COLOR": "1"})
        text = re.sub(r"\x1b\[[0-9;]*m", "", res.output)
        assert res.exit_code == 2, (cmd, res.exit_code, text)
        assert "Usage: " in text and words in text and "BadParameter" not in text, (cmd, text)
