"""``${VAR}`` and ``${VAR:-default}`` in configuration strings: the one expansion (a run's
config, a fit config, the real-model lab's pool paths).

A variable is read from the environment; ``CALIBDCD_SHARED`` unset defaults to
:func:`calibdcd.paths.default_shared`; the value of a secret variable
(:func:`calibdcd.redact.is_secret_var`) is registered for redaction as it is read. An unset
variable without a default is a problem at its key path, and the text is left as written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from calibdcd.paths import default_shared
from calibdcd.redact import is_secret_var, register_secret

__all__ = ["expand", "expand_variables"]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

Loc = tuple[str | int, ...]


def expand_variables(v: Any, loc: Loc, problems: list[tuple[Loc, str]]) -> Any:
    """``${VAR}`` expanded in every string of the tree (keys excepted); an unset variable is a
    problem at its key path (the value is left as written)."""
    if isinstance(v, str):
        missing: list[str] = []

        def sub(m: re.Match[str]) -> str:
            var, default = m.group(1), m.group(2)
            if var in os.environ:
                if is_secret_var(var):
                    register_secret(os.environ[var])
                return os.environ[var]
            if var == "CALIBDCD_SHARED" and default_shared() is not None:
                return default_shared()  # type: ignore[return-value]
            if default is not None:
                return default
            missing.append(var)
            return m.group(0)

        out = _ENV.sub(sub, v)
        for var in missing:
            problems.append((loc, f"environment variable {var} is not set"))
        return out
    if isinstance(v, Mapping):
        return {k: expand_variables(x, (*loc, str(k)), problems) for k, x in v.items()}
    if isinstance(v, list):
        return [expand_variables(x, (*loc, i), problems) for i, x in enumerate(v)]
    return v


def expand(text: str, where: str) -> str:
    """``text`` with its variables expanded; an unset one is a :class:`ValueError` naming
    ``where`` (e.g. the setting the text came from) and every unset variable."""
    problems: list[tuple[Loc, str]] = []
    out = expand_variables(text, (), problems)
    if problems:
        raise ValueError(f"{where}: {text}: {'; '.join(m for _, m in problems)}")
    return out
