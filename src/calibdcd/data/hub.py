"""A hub dataset's files: its snapshot in the local hub cache, fetched there when it is not.

One path for every benchmark read from the hub (a named benchmark without ``path``, a ``hub:``
benchmark): :func:`dataset_snapshot` resolves the dataset repository in the local hub cache and,
when it is absent, downloads it there with :func:`calibdcd.model_refs.fetch_one`, the download
``calibdcd models fetch`` does. So a dataset read once online is read offline after, and the
source names the snapshot's commit. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``)
the hub is not contacted at all and :class:`HubUnavailableError` says how to fetch the dataset.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HubUnavailableError", "dataset_snapshot"]


class HubUnavailableError(RuntimeError):
    """The benchmark cannot be read from the hub (offline, package missing, network error)."""


def dataset_snapshot(
    repo: str, *, revision: str | None = None, benchmark: str | None = None
) -> Path:
    """The snapshot directory of dataset repository ``repo`` (at ``revision``) in the local hub
    cache, downloaded into it first when absent and the hub is allowed. ``benchmark`` (a known
    benchmark's name) adds the hint to pass a local copy instead."""
    from calibdcd.model_refs import download_command, fetch_one, hub_offline

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
    got = fetch_one(ref, "dataset")  # the local hub cache first; no request when it is there
    if got.resolved is not None:
        return got.resolved.path
    if hub_offline("dataset"):
        raise HubUnavailableError(
            f"{what} is not in the local hub cache and the hub is disabled "
            f"(HF_HUB_OFFLINE=1): {fetch}{local}"
        )
    raise HubUnavailableError(f"could not fetch {what}: {got.error}; {fetch}{local}")
