"""Config dataclasses as cache-key material that stays the same when a field is added.

A setting added to a config after artefacts were cached under keys computed from
``dataclasses.asdict`` would change every key, even for configs that keep the old behaviour.
:func:`added_field` declares such a field with the value that reproduces the earlier behaviour
(``legacy``); :func:`key_dict` is ``dataclasses.asdict`` without the added fields that hold their
legacy value. So a config that behaves as before keys as before, and one that uses the new
behaviour gets a new key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["added_field", "key_dict"]

_LEGACY = "calibdcd.key.legacy"


def added_field(default: Any, *, legacy: Any) -> Any:
    """A dataclass field added after keys were computed: ``legacy`` is the value that behaves as
    the config did before the field existed (left out of :func:`key_dict`)."""
    return dataclasses.field(default=default, metadata={_LEGACY: legacy})


def key_dict(obj: Any) -> Any:
    """``dataclasses.asdict(obj)`` without :func:`added_field` fields at their legacy value
    (nested dataclasses, lists, tuples and dicts are walked; other values kept as they are)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if _LEGACY in f.metadata and value == f.metadata[_LEGACY]:
                continue
            out[f.name] = key_dict(value)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(key_dict(v) for v in obj)
    if isinstance(obj, dict):
        return {k: key_dict(v) for k, v in obj.items()}
    return obj
