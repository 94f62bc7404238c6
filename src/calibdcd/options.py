"""Checking option mappings against a typed component (a config dataclass, a constructor's
signature) without building it: unknown names with the closest known one, values of the wrong
type. Used by the experiment config (``targets[i].options``, ``detectors[i].options``)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Any

__all__ = ["suggestion", "type_hints", "type_problem"]


def suggestion(name: str, known: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, else a list of the known ones."""
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known here: {', '.join(sorted(known))})" if known else ""


def type_hints(obj: Any) -> dict[str, Any]:
    """The resolved annotations of a dataclass (type or instance) or a callable's parameters
    ({} when they cannot be resolved)."""
    target = type(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else obj
    if isinstance(target, type) and not dataclasses.is_dataclass(target):
        target = target.__init__
    try:
        return typing.get_type_hints(target)
    except Exception:  # an annotation that does not resolve here: no type check
        return {}


@functools.lru_cache(maxsize=512)
def _adapter(hint: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


def _plain(value: Any) -> Any:
    """YAML's lists as tuples where a tuple is expected is the only conversion allowed."""
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def type_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` (from YAML) does not fit the annotation ``hint``, or None. Strict: no
    string to number, no bool to int; an int is a float and a list is a tuple."""
    if hint is None or hint is Any:
        return None
    try:
        adapter = _adapter(hint)
    except Exception:  # not a type pydantic knows (a protocol, a callable): not checked
        return None
    candidates = [value]
    if isinstance(value, list):
        candidates.append(_plain(value))
    if isinstance(value, int) and not isinstance(value, bool):
        candidates.append(float(value))
    for v in candidates:
        try:
            adapter.validate_python(v, strict=True)
            return None
        except Exception:
            continue
    shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    return f"must be {shown}, got {value!r}"
