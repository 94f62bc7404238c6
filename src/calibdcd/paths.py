"""Where calibdcd keeps what it builds: one cache root per run.

The root is the run config's ``cache_dir`` when it sets one, else ``$CALIBDCD_CACHE``, else the
user cache (``~/.cache/calibdcd``). Everything a run builds lives under it: generations,
features and fitted models, VeilProbe's artefacts, DPDLLM's reference LMs, GGUF conversions,
checkpoint digests and the contamination labs (``<root>/lab/...``). Labs are shared by every
run that uses the same root; two processes that need the same missing lab build it once (the
second waits on the lab's file lock). This module is the only place that knows the rule.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_root", "default_shared", "user_cache_root"]

#: the environment variable naming the cache root of runs whose config sets no ``cache_dir``
CACHE_ENV = "CALIBDCD_CACHE"


def user_cache_root() -> Path:
    """``$CALIBDCD_CACHE``, else ``~/.cache/calibdcd`` (the root when a run configures none)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "calibdcd"


def cache_root(configured: str | os.PathLike[str] | None = None) -> Path:
    """The cache root of a run: ``configured`` (the config's ``cache_dir``) when given, else
    :func:`user_cache_root`."""
    return Path(configured) if configured else user_cache_root()


def default_shared() -> str | None:
    """``$CALIBDCD_SHARED``, else the nearest directory named ``shared`` beside the repository
    or beside one of its parent directories (a worktree's ``../../shared``), else None: where
    the offline benchmark copies live (``<shared>/data``)."""
    env = os.environ.get("CALIBDCD_SHARED")
    if env:
        return env
    for parent in Path(__file__).resolve().parents[2].parents:
        if (parent / "shared").is_dir():
            return str(parent / "shared")
    return None
