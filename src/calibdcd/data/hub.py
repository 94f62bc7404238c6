"""Rows of a Hugging Face hub dataset, through the optional ``datasets`` package (lazy import).

Nothing here runs at import time; with ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) the
hub is not contacted at all and :class:`HubUnavailableError` tells the user to pass a local copy.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HubUnavailableError", "hub_offline", "load_hub_rows"]

_TRUTHY = {"1", "true", "yes", "on"}


class HubUnavailableError(RuntimeError):
    """The benchmark cannot be fetched from the hub (offline, package missing, network error)."""


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` forbids hub access."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUTHY
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _local_hint(benchmark: str) -> str:
    return (
        f"pass a local copy instead: load_benchmark({benchmark!r}, path='/path/to/file-or-dir') "
        f"or `calibdcd data show {benchmark} --path /path/to/file-or-dir`"
    )


def load_hub_rows(
    repo: str,
    *,
    benchmark: str,
    config: str | None = None,
    split: str = "train",
    revision: str | None = None,
) -> list[dict[str, Any]]:
    """All rows of ``repo`` (config ``config``, split ``split``) as plain dicts."""
    where = f"hf://datasets/{repo}" + (f" (config {config!r})" if config else "") + f" [{split}]"
    if hub_offline():
        raise HubUnavailableError(
            f"cannot load {benchmark!r} from {where}: the Hugging Face hub is disabled "
            f"(HF_HUB_OFFLINE=1) and the dataset is not in the local hub cache; fetch it once "
            f"with `calibdcd models fetch CONFIG` (or `hf download --repo-type dataset {repo}`), "
            f"or {_local_hint(benchmark)}"
        )
    try:
        import datasets  # optional dependency: pip install 'calibdcd[data]'
    except ImportError as e:
        raise HubUnavailableError(
            f"loading {benchmark!r} from {where} needs the `datasets` package "
            f"(pip install 'calibdcd[data]'); or {_local_hint(benchmark)}"
        ) from e
    try:
        ds = datasets.load_dataset(repo, name=config, split=split, revision=revision)
    except Exception as e:  # network, auth, missing split: all mean "not available here"
        raise HubUnavailableError(
            f"could not load {benchmark!r} from {where}: {type(e).__name__}: {e}; "
            f"{_local_hint(benchmark)}"
        ) from e
    return [dict(row) for row in ds]
