"""The one error path of the command line: every error a command does not handle itself is
printed as one line (redacted, see :mod:`calibdcd.redact`), with its type unless it is a plain
user error, and the command exits 2 for a user mistake (a bad value or file) or 1 otherwise.
``CALIBDCD_DEBUG=1`` (or a command's ``--debug``) shows the traceback too."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable

from calibdcd.redact import redact

__all__ = [
    "DEBUG_VAR",
    "CommandError",
    "block",
    "exit_code",
    "one_line",
    "render",
    "show_warning_line",
]

DEBUG_VAR = "CALIBDCD_DEBUG"

#: types whose name adds nothing to their message (the message says what went wrong)
_PLAIN = (
    "ValueError", "RuntimeError", "OpenAITargetError", "RunDirLocked", "DataError",
    "ConfigError", "FileNotFoundError", "IsADirectoryError", "NotADirectoryError",
    "FileExistsError", "PermissionError", "TargetMismatchError", "BundleIntegrityError",
)  # fmt: skip


class CommandError(Exception):
    """A mistake a command diagnosed and explains in full (a bad option, file, config or
    bundle): printed on the one error path as ``error: MESSAGE``, redacted, on the lines the
    message has (a config's list of problems), without its type or the traceback hint; exit 2
    (a user mistake) unless ``exit_code``, or the explained error's own, says otherwise; the
    explained error's notes are kept. Raise it ``from`` the error it explains, so
    ``CALIBDCD_DEBUG=1`` shows where that came from."""

    cli_block = True

    def __init__(self, message: object, *, exit_code: int | None = None):
        text = str(message)
        notes = getattr(message, "__notes__", None)  # e.g. the setting an error arose in
        if notes:
            text += f" ({'; '.join(notes)})"
        super().__init__(text)
        # an error that states its own exit code keeps it (the list of missing models: 1)
        self.exit_code = exit_code or getattr(message, "exit_code", None) or 2


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: its type (unless a plain user error), its message and its notes
    (the runner notes the setting it failed in)."""
    msg = " ".join(str(exc).split()) or "(no message)"
    kind = type(exc).__name__
    notes = "; ".join(getattr(exc, "__notes__", []))
    return redact((msg if kind in _PLAIN else f"{kind}: {msg}") + (f" ({notes})" if notes else ""))


def exit_code(exc: BaseException) -> int:
    """2 for a user mistake (a bad value, a missing or unreadable file), else 1; an error that
    states its own (a :func:`block` error) exits with that."""
    own = getattr(exc, "exit_code", None)
    if isinstance(own, int):
        return own
    return 2 if isinstance(exc, (ValueError, OSError)) else 1


def block(exc: BaseException) -> bool:
    """Whether ``exc`` is a complete message of several lines for the command line (its class
    sets ``cli_block = True``, e.g. the list of every model a config names that cannot be used
    here): printed as it is, redacted, without its type or a traceback hint."""
    return bool(getattr(exc, "cli_block", False))


def debugging() -> bool:
    return os.environ.get(DEBUG_VAR, "").strip() not in ("", "0", "false", "no")


def render(exc: BaseException, *, debug: bool = False, hint: str | None = None) -> list[str]:
    """The lines to print for ``exc``: the traceback first when debugging, then the one line
    and, without the traceback, how to see it (``hint``, default: set CALIBDCD_DEBUG=1)."""
    lines = []
    if debug or debugging():
        lines.append(redact("".join(traceback.format_exception(exc)).rstrip()))
    if block(exc):
        lines.append(redact(f"error: {exc}"))
    else:
        lines.append(f"error: {one_line(exc)}")
    if not (debug or debugging() or block(exc)):
        lines.append(hint or f"(set {DEBUG_VAR}=1 for the traceback)")
    return lines


def show_warning_line(echo: Callable[[str], None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``warning: MESSAGE`` on one line (no source path,
    secrets redacted)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        kind = "" if category in (UserWarning, RuntimeWarning) else f" ({category.__name__})"
        echo(redact(f"warning: {text}{kind}"))

    return show
