"""Cache-key material: config dataclasses that key the same when a field is added, and the one
digest of key material (:func:`digest`).

A setting added to a config after artefacts were cached under keys computed from
``dataclasses.asdict`` would change every key, even for configs that keep the old behaviour.
:func:`added_field` declares such a field with the value that reproduces the earlier behaviour
(``legacy``); :func:`key_dict` is ``dataclasses.asdict`` without the added fields that hold their
legacy value. So a config that behaves as before keys as before, and one that uses the new
behaviour gets a new key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

__all__ = ["added_field", "digest", "key_dict"]

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


def digest(*parts: Any) -> str:
    """sha256 of a JSON rendering of ``parts`` (sequences of strings hash their items in order)."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(repr((p.dtype.str, p.shape)).encode())
            h.update(np.ascontiguousarray(p).tobytes())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()
