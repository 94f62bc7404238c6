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
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CACHE_ENV",
    "cache_root",
    "check_output",
    "default_shared",
    "path_name",
    "strip_locations",
    "user_cache_root",
]

#: the environment variable naming the cache root of runs whose config sets no ``cache_dir``
CACHE_ENV = "CALIBDCD_CACHE"


def user_cache_root() -> Path:
    """``$CALIBDCD_CACHE``, else ``~/.cache/calibdcd`` (the root when a run configures none)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "calibdcd"


def cache_root(configured: str | os.PathLike[str] | None = None) -> Path:
    """The cache root of a run: ``configured`` (the config's ``cache_dir``) when given, else
    :func:`user_cache_root`. A root that exists as something other than a directory is a
    one-line error naming where it came from."""
    root = Path(configured) if configured else user_cache_root()
    if root.exists() and not root.is_dir():
        where = "the configured cache_dir" if configured else (
            f"${CACHE_ENV}" if os.environ.get(CACHE_ENV) else "the user cache"
        )  # fmt: skip
        raise NotADirectoryError(
            f"{root} ({where}): is a file, not a directory; the cache root must be a directory"
        )
    return root


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def check_output(
    out: str | os.PathLike[str],
    kind: str,
    *,
    inputs: Collection[str | os.PathLike[str]] = (),
    protected: Collection[str | os.PathLike[str]] = (),
    option: str = "-o",
) -> Path:
    """``out`` checked before anything is computed, the same way by every command that writes:
    ``kind`` ``"file"`` (it must not be a directory) or ``"directory"`` (it must not be a file);
    it must not be one of the command's ``inputs`` (nor, for a directory, hold one), nor lie
    inside (or be) a ``protected`` directory such as a bundle. Raises a one-line ValueError
    saying so; returns ``out`` as a Path."""
    path = Path(out).expanduser()
    if kind == "file" and path.is_dir():
        raise IsADirectoryError(f"{option} {path}: is a directory; name the file to write")
    if kind == "directory" and path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{option} {path}: is a file; name a directory to write")
    for src in map(Path, inputs):
        if _same(path, src) or (kind == "directory" and _inside(src, path)):
            raise FileExistsError(
                f"{option} {path}: is {'' if _same(path, src) else 'the directory of '}an "
                f"input of this command ({src}); writing there would overwrite it, so nothing "
                "was written: choose another path"
            )
    for d in map(Path, protected):
        if _same(path, d) or _inside(path, d):
            raise FileExistsError(
                f"{option} {path}: lies inside {d}, which this command reads; writing there "
                "would damage it, so nothing was written: choose another path"
            )
    return path


def _inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` lies strictly below ``directory``."""
    try:
        path.resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return not _same(path, directory)


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


def path_name(path: str) -> str:
    """An absolute path's last component (trailing separators ignored; ``/`` stays ``/``)."""
    return os.path.basename(path.rstrip("/\\")) or path


def strip_locations(
    value: Any,
    *,
    drop_keys: Collection[str] = (),
    path: Callable[[str], Any] = path_name,
) -> Any:
    """``value`` (nested mappings, lists, tuples) without where things live on this machine:
    every absolute path string replaced by ``path(it)`` (default: its last component), every
    mapping key in ``drop_keys`` dropped; tuples become lists. The one helper behind setting
    hashes (:func:`calibdcd.experiment.setting.setting_hash`) and detector fingerprints
    (:func:`calibdcd.experiment.detector_entries.detector_fingerprint`), so a hash is the same in
    every checkout and cache location."""
    if isinstance(value, Mapping):
        return {
            k: strip_locations(v, drop_keys=drop_keys, path=path)
            for k, v in value.items()
            if k not in drop_keys
        }
    if isinstance(value, (list, tuple)):
        return [strip_locations(v, drop_keys=drop_keys, path=path) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return path(value)
    return value
