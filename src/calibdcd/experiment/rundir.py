"""One writer per run directory, and a run directory that reflects exactly its config.

* ``lock_run_dir``: ``RUN_DIR/.lock`` (created with ``O_EXCL``) names the process writing the
  directory (pid, host, start time). A second run into the same directory stops at once with a
  message naming the holder; a lock left by a process that no longer runs (same host, pid gone,
  e.g. after ``kill -9``) is taken over with a warning.
* ``set_aside_stale``: settings of an earlier config that are not in this run's grid are moved to
  ``settings/.stale/<id>`` (nothing is deleted); the report reads only the grid's settings and
  lists the stale ones.
* digests (:func:`record_setting_digests`, :func:`verify_setting`, :func:`write_inputs`,
  :func:`check_shards`, :func:`run_progress`): each setting's ``digests.json`` holds the digest
  of the files the report reads (``result.json``, ``scores.csv``), written just after
  ``result.json``; the run's ``inputs.json`` holds the digests of the targets' models and the
  detectors' configurations it used, beside ``benchmarks.json`` (the data) and ``models.json``
  (every model the config names). A merge of shards refuses shards whose inputs differ and
  results whose files were changed after the run wrote them; a result without ``digests.json``
  (written before calibdcd recorded them) is read as *unverified*, with a note.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from calibdcd.run_results import (
    SETTING_DIGESTS,
    grid_status,
    record_setting_digests,
    verify_setting,
)

__all__ = [
    "INPUTS_NAME",
    "LOCK_NAME",
    "SETTING_DIGESTS",
    "STALE_DIR",
    "RunDirLocked",
    "RunProgress",
    "check_shards",
    "lock_run_dir",
    "record_setting_digests",
    "run_progress",
    "set_aside_stale",
    "verify_setting",
    "write_inputs",
]

LOCK_NAME = ".lock"
STALE_DIR = ".stale"
#: ``RUN_DIR/inputs.json``: the digests of the targets' models and the detectors' configurations
INPUTS_NAME = "inputs.json"


class RunDirLocked(RuntimeError):
    """Another live process is writing the run directory."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder(path: Path) -> dict[str, object] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def lock_run_dir(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir/.lock`` for the duration of the block (see the module docstring)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    path = run / LOCK_NAME
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            info = _holder(path)
            if info is None:  # being written right now, or garbage: look again shortly
                time.sleep(0.2)
                info = _holder(path) or {}
            pid, host = info.get("pid"), info.get("host")
            dead = host == me["host"] and isinstance(pid, int) and not _alive(pid)
            if not dead:
                raise RunDirLocked(
                    f"{run} is being written by another run (pid {pid}, host {host}, started "
                    f"{info.get('started')}; lock file {path}). Wait for it to finish, use "
                    "another --out, or delete the lock file if that process is gone."
                ) from None
            warnings.warn(
                f"{path}: taking over the lock of pid {pid} (started {info.get('started')}), "
                "which is no longer running",
                RuntimeWarning,
                stacklevel=3,
            )
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
        break
    else:
        raise RunDirLocked(f"{run}: could not take the lock file {path}")
    try:
        yield path
    finally:
        if (_holder(path) or {}).get("pid") == me["pid"]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def set_aside_stale(run_dir: str | Path, grid_ids: Iterable[str]) -> list[str]:
    """Move ``settings/<id>`` directories whose id is not in ``grid_ids`` to
    ``settings/.stale/<id>``; returns the ids moved (sorted). A grid setting found only in
    ``.stale`` is moved back (its result is reused when its hashes still match)."""
    settings = Path(run_dir) / "settings"
    if not settings.is_dir():
        return []
    keep = set(grid_ids)
    for i in sorted(keep):
        old = settings / STALE_DIR / i
        if old.is_dir() and not (settings / i).exists():
            os.replace(old, settings / i)
    moved = []
    for d in sorted(settings.iterdir()):
        if d.name.startswith(".") or not d.is_dir() or d.name in keep:
            continue
        dest = settings / STALE_DIR / d.name
        dest.parent.mkdir(exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(d, dest)
        moved.append(d.name)
    return moved


# --------------------------------------------------------------------------------------------
# Digests: what a setting wrote, and what a run read
# --------------------------------------------------------------------------------------------


def write_inputs(run_dir: str | Path, inputs: dict[str, dict[str, str]]) -> None:
    """``RUN_DIR/inputs.json``: ``{"targets": {name: digest of its model}, "detectors":
    {"<label> on <benchmark> seed <s>": fingerprint}}`` for what this run (or shard) used (the
    data's digests are in ``benchmarks.json``, the models the config names in ``models.json``)."""
    from calibdcd.atomic import write_json

    write_json(Path(run_dir) / INPUTS_NAME, {"format": 1, **inputs})


#: how each kind of input is named in a message
_KINDS = {
    "benchmark": "benchmark {!r} (its texts, labels and ids; benchmarks.json)",
    "model": "model {} (models.json)",
    "target": "target {!r}'s model (inputs.json)",
    "detector": "detector {} (inputs.json)",
}


def _recorded_inputs(run_dir: Path) -> dict[str, dict[str, str]]:
    """What a run directory records of its inputs, ``{kind: {name: digest}}`` (empty for what
    it does not record: a run written before calibdcd recorded them)."""
    out: dict[str, dict[str, str]] = {}
    bench = run_dir / "benchmarks.json"
    if bench.is_file():
        out["benchmark"] = {
            str(r["label"]): str(r["content_digest"])
            for r in json.loads(bench.read_text(encoding="utf-8"))
            if r.get("content_digest")
        }
    models = run_dir / "models.json"
    if models.is_file():
        out["model"] = {
            str(r["where"]): (
                f"{r['repo_id']}@{r.get('revision')}" if r.get("repo_id") else f"local {r['ref']}"
            )
            for r in json.loads(models.read_text(encoding="utf-8"))
        }
    inputs = run_dir / INPUTS_NAME
    if inputs.is_file():
        data = json.loads(inputs.read_text(encoding="utf-8"))
        out["target"] = {str(k): str(v) for k, v in (data.get("targets") or {}).items()}
        out["detector"] = {str(k): str(v) for k, v in (data.get("detectors") or {}).items()}
    return out


def _grid_difference(a: list[dict], b: list[dict]) -> str:
    ha = {e["id"]: e["setting_hash"] for e in a}
    hb = {e["id"]: e["setting_hash"] for e in b}
    changed = [i for i in ha if i in hb and ha[i] != hb[i]]
    parts = []
    if changed:
        parts.append(f"setting {changed[0]} hashes {hb[changed[0]]}, not {ha[changed[0]]}")
        if len(changed) > 1:
            parts[-1] += f" ({len(changed) - 1} more setting(s) differ)"
    if only := [i for i in hb if i not in ha]:
        parts.append(f"settings only here: {_names(only)}")
    if only := [i for i in ha if i not in hb]:
        parts.append(f"settings missing here: {_names(only)}")
    return "; ".join(parts) or "the same settings in another order"


def _names(ids: list[str], most: int = 6) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def check_shards(run_dirs: list[Path]) -> list[str]:
    """Check that ``run_dirs`` are shards of one run that read the same inputs: the same
    ``grid.json`` (the config, as its settings' hashes) and, for every input two of them
    recorded (a benchmark's digest, a model's commit, a target model's digest, a detector's
    fingerprint), the same digest. Raises ValueError, one line naming the shard and the input
    that differs; returns notes on shards whose inputs are unverified (no digests recorded)."""
    from calibdcd.atomic import read_json

    grids = []
    for d in run_dirs:
        g = d / "grid.json"
        if not g.is_file():
            raise FileNotFoundError(f"{g}: not a run directory (no grid.json)")
        grids.append(read_json(g))
    for d, g in zip(run_dirs[1:], grids[1:], strict=True):
        if g != grids[0]:
            raise ValueError(
                f"{d}: another grid than {run_dirs[0]} ({_grid_difference(grids[0], g)}; other "
                "config or code): not shards of one run"
            )
    seen: dict[tuple[str, str], tuple[str, Path]] = {}
    notes = []
    for d in run_dirs:
        try:
            rec = _recorded_inputs(d)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{d}: its record of its inputs is damaged ({exc})") from None
        if "target" not in rec:
            notes.append(
                f"note: {d} has no {INPUTS_NAME} (written before calibdcd recorded its inputs' "
                "digests): its target models and detectors are unverified"
                + ("" if "benchmark" in rec else ", and its data too")
            )
        for kind, values in rec.items():
            for name, value in values.items():
                first = seen.setdefault((kind, name), (value, d))
                if first[0] != value:
                    raise ValueError(
                        f"{d}: {_KINDS[kind].format(name)} differs from {first[1]}'s ({value[:24]} "
                        f"here, {first[0][:24]} there): shards of one run must read the same "
                        "inputs; re-run the shards on the same data and models"
                    )
    return notes


@dataclasses.dataclass(frozen=True)
class RunProgress:
    """How far a run directory is: ``done`` of the ``total`` settings of its grid have a
    current result (``missing``: those without; ``outdated``: a ``result.json`` of another
    setting hash, recomputed by the next run); ``unverified``: results without
    ``digests.json``; ``shard``: ``(i, n)`` for a directory of ``run --shard i/n``, whose part
    of the grid is ``part``."""

    run_dir: Path
    done: tuple[str, ...]
    total: int
    missing: tuple[str, ...]
    outdated: tuple[str, ...]
    unverified: tuple[str, ...]
    shard: tuple[int, int] | None = None
    part: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What ``calibdcd report`` prints: "k of n settings" (and which are missing), then a
        note on unverified results."""
        k, n = len(self.done), self.total
        line = f"{self.run_dir}: {k} of {n} settings of the grid"
        if self.shard is not None:
            i, c = self.shard
            done = set(self.done)
            mine = sum(1 for s in self.part if s in done)
            line += f" (shard {i}/{c}: {mine} of its {len(self.part)})"
        if self.missing:
            line += f"; missing: {_names(list(self.missing))}"
            if self.shard is not None:
                line += " (report every shard's directory together, with -o MERGED)"
            else:
                line += " (an unfinished run: `calibdcd run` with its config resumes it)"
        if self.outdated:
            line += (
                f"; outdated (a result.json of another config, recomputed by the next run): "
                f"{_names(list(self.outdated))}"
            )
        out = [line]
        if self.unverified:
            out.append(
                f"note: {len(self.unverified)} result(s) carry no {SETTING_DIGESTS} (written "
                f"before calibdcd recorded digests), unverified: {_names(list(self.unverified))}"
            )
        return out


def run_progress(run_dir: str | Path) -> RunProgress:
    """The :class:`RunProgress` of ``run_dir``, every result verified against its
    ``digests.json`` (:func:`verify_setting`: an edited result raises ValueError naming it). A
    run directory without ``grid.json`` (older runs) counts the results it has."""
    run = Path(run_dir)
    st = grid_status(run)  # an edited result raises here, naming it
    shard, part = None, ()
    spec = run / "shard.json"
    if spec.is_file():
        from calibdcd.experiment.plan import shard_of

        try:
            info = json.loads(spec.read_text(encoding="utf-8"))
            shard = (int(info["index"]), int(info["count"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{spec}: not a valid shard file ({exc})") from None
        part = tuple(shard_of([sid for sid, _ in st.grid], shard))
    return RunProgress(
        run, st.done, len(st.grid), st.missing, st.outdated, st.unverified, shard, part
    )
