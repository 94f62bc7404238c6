"""A target's identity, in one place: the feature cache's key and a fitted bundle's record.

Both identify the model without any machine path: the backend, the model's name (a local
checkpoint: its directory or file name; a hub id as written), a content hash of a local
checkpoint's weights/config/tokenizer files (:func:`calibdcd.model_refs.checkpoint_identity`) or,
for a hub id, the commit of its cached snapshot. They differ only in which options they keep:

* :func:`target_key` (experiment feature cache keys) keeps every option that can change a
  feature's bytes, ``device`` and ``dtype`` included; ``batch_size`` and ``progress`` do not
  (greedy and seeded sampling are batch-invariant here: docs/reproducibility.md).
* :func:`target_record` (a fitted detector's bundle, checked on load) says *which model answers*:
  it also leaves out where it runs (``device``, ``cache_dir``), so a bundle fitted on a GPU
  loads on a CPU with a warning from the version check, not a refusal.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibdcd.targets.base import loads_hub_models

__all__ = ["model_fields", "target_key", "target_record"]

#: options left out of the feature cache key (they do not change a feature's bytes)
KEY_IGNORED_OPTIONS = ("progress", "batch_size")
#: options left out of a bundle's record (they do not change which model answers)
RECORD_IGNORED_OPTIONS = ("device", "batch_size", "progress", "cache_dir")


def model_fields(
    backend: str, model: str, *, local: str | Path | None = None, root: str | Path | None = None
) -> dict[str, Any]:
    """``model`` (a name, never a directory), and ``content`` (a local checkpoint at ``local``,
    default ``model``) or ``revision`` (the cached snapshot of a hub id, for a backend that loads
    hub ids: :func:`calibdcd.targets.base.loads_hub_models`) when they exist."""
    path = Path(local) if local is not None else Path(model)
    named = Path(model)
    out: dict[str, Any] = {"model": named.name if named.exists() or named.is_absolute() else model}
    if path.exists():
        from calibdcd.model_refs import checkpoint_identity

        out["content"] = checkpoint_identity(path, root)
    elif loads_hub_models(backend):
        from calibdcd.model_refs import MissingModelError, is_hub_id, resolve_model

        if is_hub_id(model):
            try:
                out["revision"] = resolve_model(model).revision
            except MissingModelError:
                pass
    return out


def target_key(
    backend: str,
    model: str,
    *,
    family: str | None = None,
    options: Mapping[str, Any] | None = None,
    root: str | Path | None = None,
) -> str:
    """The feature cache's identity of a target, computed without loading it (20 hex digits)."""
    parts: dict[str, Any] = {
        "backend": backend,
        "family": family,
        "options": {k: v for k, v in (options or {}).items() if k not in KEY_IGNORED_OPTIONS},
        **model_fields(backend, model, root=root),
    }
    body = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:20]


def target_record(
    backend: str,
    model: str,
    *,
    model_dir: str | Path | None = None,
    family: str | None = None,
    lab: str | None = None,
    options: Mapping[str, Any] | None = None,
    root: str | Path | None = None,
) -> dict[str, Any]:
    """A fitted bundle's record of a target (``model_dir``: its checkpoint on disk, when local;
    ``model`` then is the name it goes by, e.g. a lab model's; ``root``: the cache root where
    its checkpoint digest is memoised)."""
    fields = model_fields(backend, model, local=model_dir, root=root)
    return {
        "backend": backend,
        "model": fields["model"],
        "lab": lab,
        "family": family,
        "options": {
            k: v for k, v in sorted((options or {}).items()) if k not in RECORD_IGNORED_OPTIONS
        },
        "content": fields.get("content"),
        "revision": fields.get("revision"),
    }
