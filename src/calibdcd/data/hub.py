"""A hub dataset's files: its snapshot in the local hub cache, fetched there when it is not.

One path for every benchmark read from the hub (a named benchmark without ``path``, a ``hub:``
benchmark): :func:`dataset_snapshot` resolves the dataset repository in the local hub cache and,
when it is absent, downloads it there with :func:`calibdcd.model_refs.fetch_one`, the download
``calibdcd models fetch`` does. So a dataset read once online is read offline after, and the
source names the snapshot's commit. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``)
the hub is not contacted at all and :class:`HubUnavailableError` says how to fetch the dataset.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from calibdcd.errors import one_line

__all__ = ["HubUnavailableError", "dataset_snapshot", "hub_source", "read_snapshot"]


class HubUnavailableError(RuntimeError):
    """The benchmark cannot be read from the hub (offline, package missing, network error)."""


def dataset_snapshot(
    repo: str, *, revision: str | None = None, benchmark: str | None = None
) -> Path:
    """The snapshot directory of dataset repository ``repo`` (at ``revision``) in the local hub
    cache, downloaded into it first when absent and the hub is allowed. ``benchmark`` (a known
    benchmark's name) adds the hint to pass a local copy instead."""
    from calibdcd.model_refs import download_command, fetch_one, hub_offline
    from calibdcd.redact import redact

    ref = repo + (f"@{revision}" if revision else "")
    what = f"hub dataset {ref}" if benchmark is None else f"{benchmark!r} (hub dataset {ref})"
    fetch = (
        f"fetch it once with `calibdcd models fetch CONFIG` or `{download_command(ref, 'dataset')}`"
    )
    local = (
        ""
        if benchmark is None
        else f"; or pass a local copy: load_benchmark({benchmark!r}, path='/path/to/file-or-dir') "
        f"or `calibdcd data show {benchmark} --path /path/to/file-or-dir`"
    )
    # the local hub cache first (no request when it is there); a download says so on stderr
    got = fetch_one(
        ref, "dataset", say=lambda line: print(redact(line), file=sys.stderr, flush=True)
    )
    if got.resolved is not None:
        return got.resolved.path
    if (var := hub_offline("dataset")) is not None:
        raise HubUnavailableError(
            f"{what} is not in the local hub cache and the hub is disabled ({var} is set): "
            f"{fetch}{local}"
        )
    raise HubUnavailableError(f"could not fetch {what}: {got.error}; {fetch}{local}")


def hub_source(repo: str, snapshot: Path, *parts: str | None) -> str:
    """A hub benchmark's source, the one spelling for every reader: ``hf://datasets/`` the
    repository ``@`` the snapshot's commit, then what was read in it (a file, or a config and
    a split)."""
    return f"hf://datasets/{repo}@{snapshot.name}" + "".join(f"/{p}" for p in parts if p)


def read_snapshot(repo: str, snapshot: Path, config: str | None, split: str) -> tuple[Any, str]:
    """Split ``split`` of config ``config`` of a dataset snapshot, as its card (or the files'
    layout) defines them, read offline by ``datasets``; with its :func:`hub_source`."""
    try:
        import datasets  # the `data` extra (installed by `make`)
    except ImportError:
        raise HubUnavailableError(
            f"reading hub dataset {repo} needs the `datasets` package: pip install 'calibdcd[data]'"
        ) from None
    datasets.disable_progress_bars()  # its "Generating split" bars; the run has its own
    try:
        ds = datasets.load_dataset(str(snapshot), name=config, split=split)
    except Exception as exc:  # an unknown config or split, files it cannot parse: say which
        raise ValueError(f"hub dataset {repo}@{snapshot.name[:12]}: {one_line(exc)}") from exc
    return ds, hub_source(repo, snapshot, config, split)
