"""Which stored results of a run directory can be read: the one check that a resume, a shard
merge, ``calibdcd report`` and every table read through (below the experiment and the report,
which both use it).

* digests: each setting's ``digests.json`` holds the digest of the files the report reads
  (``result.json``, ``scores.csv``), written just after ``result.json``
  (:func:`record_setting_digests`); :func:`verify_setting` refuses a file changed after the run
  wrote it, and reads a result without ``digests.json`` (written before calibdcd recorded
  them) as unverified;
* the grid: ``grid.json`` names each setting of the run's config and its setting hash;
  :func:`grid_status` sorts them into done, missing and outdated (a ``result.json`` of another
  setting hash: another config's, recomputed by the next run).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from calibdcd.results import RESULT_FILE, holds_setting

__all__ = [
    "DIGESTED",
    "GRID_FILE",
    "SETTING_DIGESTS",
    "GridStatus",
    "grid_entries",
    "grid_status",
    "record_setting_digests",
    "verify_setting",
]

#: ``settings/<id>/digests.json``: the digest of each file of a setting that the report reads
SETTING_DIGESTS = "digests.json"
#: the files of a setting whose digests ``digests.json`` records
DIGESTED = (RESULT_FILE, "scores.csv")
#: ``RUN_DIR/grid.json``: every setting of the run's config (id, setting hash), in grid order
GRID_FILE = "grid.json"


def _content_digest(path: Path) -> str:
    """The digest (:func:`calibdcd.keys.digest`) of a run-directory file's content:
    a JSON file by its parsed content (the same values written with other whitespace are the
    same content), any other file by its text."""
    from calibdcd.atomic import read_json
    from calibdcd.keys import digest

    if path.suffix == ".json":
        return digest(read_json(path))
    return digest(path.read_text(encoding="utf-8"))


def record_setting_digests(setting_dir: str | Path) -> None:
    """Write ``settings/<id>/digests.json``: the digest of each of the setting's files that the
    report reads (``result.json``, ``scores.csv``), once ``result.json`` is written."""
    from calibdcd.atomic import write_json

    d = Path(setting_dir)
    write_json(
        d / SETTING_DIGESTS,
        {name: _content_digest(d / name) for name in DIGESTED if (d / name).is_file()},
    )


def verify_setting(setting_dir: str | Path) -> bool:
    """Whether the setting's ``digests.json`` vouches for its files: True when every file it
    records has that content; False when there is no ``digests.json`` (a result written before
    calibdcd recorded digests: unverified). Raises ValueError, one line naming the file, when a
    file was changed or removed after the run wrote it (or ``digests.json`` is damaged)."""
    d = Path(setting_dir)
    path = d / SETTING_DIGESTS
    if not path.is_file():
        return False
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError("not a mapping of file names to digests")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: damaged ({exc}); re-run the setting (delete {d})") from None
    for name, want in recorded.items():
        f = d / name
        if not f.is_file():
            raise ValueError(f"{f}: missing, but {path.name} records it; re-run the setting")
        try:
            have = _content_digest(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{f}: unreadable ({exc}); re-run the setting") from None
        if have != want:
            raise ValueError(
                f"{f}: changed after the run wrote it (digest {have[:12]}, {path.name} records "
                f"{want[:12]}): an edited result is neither merged nor reported; re-run the "
                f"setting (delete {d}) or restore the file"
            )
    return True


def grid_entries(run_dir: str | Path) -> list[tuple[str, str | None]] | None:
    """``(id, setting hash)`` of every setting of the run's grid (``grid.json``), in its order;
    None when the file is absent (a run written before grids were recorded)."""
    path = Path(run_dir) / GRID_FILE
    if not path.is_file():
        return None
    try:
        return [(e["id"], e["setting_hash"]) for e in json.loads(path.read_text("utf-8"))]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a valid grid file ({exc})") from None


@dataclasses.dataclass(frozen=True)
class GridStatus:
    """The settings of a run's grid by state: ``done`` (a current result, digests checked),
    ``missing``, ``outdated`` (another setting's ``result.json``), ``unverified`` (done or
    outdated, without ``digests.json``); ``grid``: every ``(id, setting hash)``."""

    grid: tuple[tuple[str, str | None], ...]
    done: tuple[str, ...]
    missing: tuple[str, ...]
    outdated: tuple[str, ...]
    unverified: tuple[str, ...]


def grid_status(run_dir: str | Path) -> GridStatus:
    """Every setting of ``run_dir``'s grid by state, each result verified against its
    ``digests.json`` (:func:`verify_setting`: an edited result raises ValueError naming it). A
    run directory without ``grid.json`` counts the results it has, in id order."""
    run = Path(run_dir)
    settings = run / "settings"
    grid = grid_entries(run)
    if grid is None:
        grid = [(p.parent.name, None) for p in sorted(settings.glob(f"*/{RESULT_FILE}"))]
    done, missing, outdated, unverified = [], [], [], []
    for sid, shash in grid:
        res = settings / sid / RESULT_FILE
        if not res.is_file():
            missing.append(sid)
            continue
        if not verify_setting(res.parent):
            unverified.append(sid)
        if shash is not None and not holds_setting(res, shash):
            outdated.append(sid)
            continue
        done.append(sid)
    return GridStatus(tuple(grid), tuple(done), tuple(missing), tuple(outdated), tuple(unverified))
