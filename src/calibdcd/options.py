"""Checking option mappings against a typed component (a config dataclass, a constructor's
signature) without building it: unknown names with the closest known one, values of the wrong
type. Used by the experiment config (``targets[i].options``, ``detectors[i].options``)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping
from typing import Any

__all__ = [
    "OptionsError",
    "option_problems",
    "replace_nested",
    "suggestion",
    "type_hints",
    "type_problem",
]


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


class OptionsError(ValueError):
    """Options that do not fit a component's config: ``problems`` lists every one as (dotted
    key path, problem)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))


def option_problems(
    obj: Any, options: Mapping[str, Any], path: str = "options"
) -> list[tuple[str, str]]:
    """Every option that is not a field of the config dataclass ``obj`` (with the closest field)
    or whose value does not fit the field's annotation, as (dotted key path, problem)."""
    if not options:
        return []
    if not dataclasses.is_dataclass(obj):
        return [(path, f"cannot set fields on {type(obj).__name__}")]
    names = [f.name for f in dataclasses.fields(obj)]
    hints = type_hints(obj)
    out: list[tuple[str, str]] = []
    for k, v in options.items():
        if k not in names:
            out.append(
                (f"{path}.{k}", f"unknown field of {type(obj).__name__}{suggestion(k, names)}")
            )
            continue
        cur = getattr(obj, k)
        if isinstance(v, Mapping) and dataclasses.is_dataclass(cur):
            out.extend(option_problems(cur, v, f"{path}.{k}"))
        elif not isinstance(v, str) or not v.startswith("lab"):  # lab refs: resolved later
            problem = type_problem(hints.get(k), v)
            if problem is not None:
                out.append((f"{path}.{k}", problem))
    return out


def replace_nested(obj: Any, options: Mapping[str, Any], path: str = "options") -> Any:
    """``dataclasses.replace`` applied recursively: a mapping value for a field that holds a
    dataclass updates that dataclass; lists become tuples where the field holds a tuple.
    Raises :class:`OptionsError` listing every unknown field and mistyped value."""
    if not options:
        return obj
    problems = [p for p in option_problems(obj, options, path) if "unknown field" in p[1]]
    if not dataclasses.is_dataclass(obj) or problems:
        raise OptionsError(problems or [(path, f"cannot set fields on {type(obj).__name__}")])
    kw: dict[str, Any] = {}
    for k, v in options.items():
        cur = getattr(obj, k)
        if isinstance(v, Mapping) and dataclasses.is_dataclass(cur):
            kw[k] = replace_nested(cur, v, f"{path}.{k}")
        elif isinstance(v, list) and isinstance(cur, tuple):
            kw[k] = tuple(v)
        else:
            kw[k] = v
    try:
        return dataclasses.replace(obj, **kw)
    except (TypeError, ValueError) as exc:
        raise OptionsError([(path, str(exc))]) from None
