"""Checks for benchmark records, with errors that name the file, the line and the problem.

Label rule (:func:`parse_label`), applied to every label value read from any file:

* accepted as **1**: the int ``1``, ``True``, the float ``1.0``, and the strings ``"1"``,
  ``"1.0"``, ``"true"`` (any case, surrounding spaces ignored);
* accepted as **0**: the int ``0``, ``False``, the float ``0.0``, and the strings ``"0"``,
  ``"0.0"``, ``"false"`` (any case);
* **missing**: the field is absent, ``None``, NaN, or an empty/blank string;
* anything else (``2``, ``-1``, ``0.5``, ``"member"``, ...) is an error, unless a ``label_map``
  maps its string form (e.g. ``{"member": 1, "non-member": 0}``).

Text rule: the text must be a string with at least one non-whitespace character; it is kept
exactly as read (no stripping), so cached generations stay keyed by the original text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DataError",
    "DuplicateTextWarning",
    "Location",
    "Problem",
    "parse_label",
]

#: how many problems one DataError lists in its message
MAX_LISTED_PROBLEMS = 20

_TRUE = {"1", "1.0", "true"}
_FALSE = {"0", "0.0", "false"}


class DuplicateTextWarning(UserWarning):
    """A benchmark file repeats texts (reported with their lines; ``dedupe=True`` removes them)."""


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a record is: ``file`` plus a 1-based ``line`` (``unit`` "line" or "row")."""

    file: str
    line: int
    unit: str = "line"

    def __str__(self) -> str:
        return f"{self.file}, {self.unit} {self.line}"


@dataclasses.dataclass(frozen=True)
class Problem:
    location: Location
    problem: str

    def __str__(self) -> str:
        return f"{self.location}: {self.problem}"


class DataError(ValueError):
    """A bad benchmark file. ``file``, ``line`` and ``problem`` describe the first problem;
    ``problems`` lists all that were found in one pass over the file."""

    def __init__(self, problems: list[Problem] | Problem):
        if isinstance(problems, Problem):
            problems = [problems]
        if not problems:
            raise ValueError("DataError needs at least one problem")
        self.problems = list(problems)
        first = self.problems[0]
        self.file = first.location.file
        self.line = first.location.line
        self.problem = first.problem
        if len(self.problems) == 1:
            msg = str(first)
        else:
            shown = self.problems[:MAX_LISTED_PROBLEMS]
            more = len(self.problems) - len(shown)
            lines = [f"  {p}" for p in shown]
            if more:
                lines.append(f"  ... and {more} more")
            msg = f"{len(self.problems)} problems in {self.file}:\n" + "\n".join(lines)
        super().__init__(msg)


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def parse_label(value: Any, *, label_map: Mapping[str, int] | None = None) -> int:
    """Turn a raw label value into 0 or 1 following the module's label rule.

    Raises ``ValueError`` with a short problem description (without the location, which the
    caller adds): ``"missing label"`` or ``"label ... is not 0/1 ..."``.
    """
    if _is_missing(value):
        raise ValueError("missing label")
    if label_map is not None:
        key = value.strip() if isinstance(value, str) else str(value)
        if key in label_map:
            mapped = label_map[key]
            if isinstance(mapped, bool) or mapped not in (0, 1):
                raise ValueError(f"label_map maps {key!r} to {mapped!r}, which is not 0 or 1")
            return int(mapped)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if value in (0, 1):
            return int(value)
    elif isinstance(value, float):
        if value in (0.0, 1.0):
            return int(value)
    elif isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return 1
        if s in _FALSE:
            return 0
    hint = " (pass label_map to map other values)" if label_map is None else ""
    raise ValueError(f"label {value!r} is not 0/1 (accepted: 0, 1, true, false, '0', '1'){hint}")


def check_text(value: Any) -> str:
    """Return ``value`` if it is a usable text, else raise ``ValueError`` with the problem."""
    if value is None:
        raise ValueError("empty text (missing)")
    if not isinstance(value, str):
        raise ValueError(f"text is not a string (got {type(value).__name__} {value!r:.40})")
    if not value.strip():
        raise ValueError("empty text" if not value else "empty text (whitespace only)")
    return value
