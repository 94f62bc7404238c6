"""A target's identity as a fitted-detector bundle records it, and checks it on load.

The record names the model without any machine path: backend, the model's name (a local
checkpoint: its directory name; a lab checkpoint: ``lab`` preset + name; a hub id as written),
a content hash of a local checkpoint's weights/config/tokenizer files
(:func:`calibdcd.models.checkpoint_identity`; a hub id: the commit of its cached
snapshot), the family and the decoding-relevant options (``device``, ``batch_size`` and
``progress`` left out: they do not change what the model is). On load the model fields
(:data:`calibdcd.fitted.detector.IDENTITY_FIELDS`) must match; other differences warn.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["target_record"]

#: target options that do not change which model answers (left out of the record)
_LOCATION_OPTIONS = ("device", "batch_size", "progress", "cache_dir")


def target_record(
    backend: str,
    model: str,
    *,
    model_dir: str | Path | None = None,
    family: str | None = None,
    lab: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The identity record of a target (``model_dir``: the checkpoint on disk, when local)."""
    rec: dict[str, Any] = {
        "backend": backend,
        "model": Path(model).name if Path(model).is_absolute() else model,
        "lab": lab,
        "family": family,
        "options": {k: v for k, v in sorted((options or {}).items()) if k not in _LOCATION_OPTIONS},
        "content": None,
        "revision": None,
    }
    local = Path(model_dir) if model_dir is not None else Path(model)
    if local.exists():
        from calibdcd.models import checkpoint_identity

        rec["content"] = checkpoint_identity(local)
    elif backend == "hf":
        from calibdcd.models import MissingModelError, is_hub_id, resolve_model

        if is_hub_id(model):
            try:
                rec["revision"] = resolve_model(model).revision
            except MissingModelError:
                pass
    return rec
