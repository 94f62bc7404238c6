"""Resumable training: a long training loop's whole state, saved now and then, so that a run
stopped mid-training (``kill -9``, the end of a session, a full disk) starts again at its last
save and ends with the same bytes as a training that was never stopped.

A save holds the model's and the optimiser's state, the scheduler's, the loop's position (what the
caller passes as ``progress``: ints and lists of ints), the global torch random state (CPU and
every initialised CUDA device: dropout draws from it) and named ``torch.Generator`` states (a data
order's). It is written by the project's one atomic writer, so a reader sees the previous save or
the new one, never half of one. :meth:`ResumableTraining.restore` puts all of it back into freshly
built objects; a save that cannot be read (or belongs to another training: ``meta`` differs) is
named in a warning and the training starts over.

The caller keeps the loop: build (seeded) as for a fresh start, :meth:`~ResumableTraining.restore`,
skip to the returned position, call :meth:`~ResumableTraining.maybe_save` after every step, and
:meth:`~ResumableTraining.discard` once the trained model is stored.
"""

from __future__ import annotations

import glob
import math
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibdcd.atomic import atomic_file

__all__ = ["SAVE_EVERY_SECONDS", "ResumableTraining", "discard_saves_beside", "save_every"]

#: seconds between two saves by default: at most this much training is lost to a stop
SAVE_EVERY_SECONDS = 600.0


def save_every() -> float:
    """The default seconds between saves: ``$CALIBDCD_SAVE_EVERY`` (seconds; ``0`` after every
    step; ``off`` never), else :data:`SAVE_EVERY_SECONDS`."""
    raw = os.environ.get("CALIBDCD_SAVE_EVERY", "").strip().lower()
    if not raw:
        return SAVE_EVERY_SECONDS
    if raw in ("off", "never", "inf"):
        return math.inf
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(
            f"CALIBDCD_SAVE_EVERY={raw!r}: seconds between training saves (a number >= 0) or off"
        )
    return value


class ResumableTraining:
    """Saves and restores one training's state at ``path`` (a single file).

    ``every_seconds``: :meth:`maybe_save` writes when at least this long has passed since the
    last save (or the start); ``0`` saves after every step, ``math.inf`` never; None:
    :func:`save_every`. A save left by an earlier run is restored whatever the interval.
    ``meta``: JSON-like identity of the training (e.g. its recipe's hash), stored with the
    state and compared on restore."""

    def __init__(
        self,
        path: str | Path,
        *,
        every_seconds: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ):
        self.path = Path(path)
        self.every_seconds = save_every() if every_seconds is None else float(every_seconds)
        self.meta = dict(meta or {})
        self._last = time.monotonic()
        #: how many times this object restored a saved state (0 or 1) and wrote one
        self.restored = 0
        self.saves = 0

    @classmethod
    def beside(cls, artefact: str | Path, what: str, digest: str, **kw: Any) -> ResumableTraining:
        """The save of the training ``what`` whose result goes into ``artefact`` (a directory
        renamed into place when complete), kept beside it as ``.<name>.<what>.resume.pt`` so
        it outlives the temporary directory the artefact is built in; ``digest`` (the
        recipe's hash) tells a save of another recipe for the same place apart."""
        artefact = Path(artefact)
        path = artefact.parent / f".{artefact.name}.{what}.resume.pt"
        return cls(path, meta={"what": what, "digest": digest}, **kw)

    # -- writing ---------------------------------------------------------------------------------
    def maybe_save(
        self,
        progress: Mapping[str, Any],
        model,
        optimizer,
        scheduler=None,
        generators: Mapping[str, Any] | None = None,
        *,
        now: bool = False,
    ) -> bool:
        """Write the whole state (atomically) when ``every_seconds`` have passed since the last
        save, or at once with ``now``; True when it wrote."""
        import torch

        if not now and time.monotonic() - self._last < self.every_seconds:
            return False
        state = {
            "meta": self.meta,
            "progress": dict(progress),
            "model": _trained_state(model),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng_cpu": torch.random.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
            "generators": {k: g.get_state() for k, g in (generators or {}).items()},
        }
        try:
            with atomic_file(self.path) as tmp:
                torch.save(state, tmp)
        except (OSError, RuntimeError) as exc:  # a full disk (torch's writer raises
            # RuntimeError) costs the save, never the training
            warnings.warn(
                f"{self.path}: training state not saved, training goes on without it "
                f"({type(exc).__name__}: {exc})",
                stacklevel=2,
            )
            self._last = time.monotonic()
            return False
        self.saves += 1
        self._last = time.monotonic()
        return True

    # -- reading ---------------------------------------------------------------------------------
    def restore(
        self,
        model,
        optimizer,
        scheduler=None,
        generators: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Load the saved state into ``model``, ``optimizer``, ``scheduler``, the random states
        and ``generators``; returns the saved ``progress``, or None when there is nothing to
        resume (no save, or a save that is unreadable or of another training: a warning names
        the file, which is then removed)."""
        import torch

        if not self.path.is_file():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
            _check(state, self.meta, model, optimizer, scheduler, generators or {})
        except Exception as exc:  # any unusable save means: start over
            warnings.warn(
                f"{self.path}: saved training state not usable, training from the start "
                f"({type(exc).__name__}: {exc})",
                stacklevel=2,
            )
            self.discard()
            return None
        # checked above: nothing below meets a state it cannot take
        model.load_state_dict(state["model"], strict=False)  # the trained part: _trained_state
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        torch.random.set_rng_state(state["rng_cpu"])
        if state["rng_cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng_cuda"])
        for name, g in (generators or {}).items():
            g.set_state(state["generators"][name])
        self.restored += 1
        self._last = time.monotonic()
        return dict(state["progress"])

    def discard(self) -> None:
        """Remove the saved state (once the trained model is stored), and the temporary file of
        a save a stop interrupted."""
        self.path.unlink(missing_ok=True)
        for p in self.path.parent.glob(f".{glob.escape(self.path.name)}.*.tmp"):
            p.unlink(missing_ok=True)


def _check(state: Any, meta: dict, model, optimizer, scheduler, generators: Mapping) -> None:
    """Raise ValueError unless ``state`` is a save of this training that the objects can take
    whole (checked before any of them is changed, so a refused save leaves them as built)."""
    if not isinstance(state, dict):
        raise ValueError("not a saved training state")
    if state.get("meta") != meta:
        raise ValueError(f"saved for {state.get('meta')!r}, not {meta!r}")
    if set(state.get("generators", {})) != set(generators):
        raise ValueError(f"saved generators {sorted(state.get('generators', {}))}")
    want = {k: tuple(v.shape) for k, v in _trained_state(model).items()}
    got = {k: tuple(v.shape) for k, v in state["model"].items()}
    if got != want:
        raise ValueError(f"model parameters differ ({len(set(got) ^ set(want))} names differ)")
    groups = [len(g["params"]) for g in optimizer.state_dict()["param_groups"]]
    saved = [len(g["params"]) for g in state["optimizer"]["param_groups"]]
    if groups != saved:
        raise ValueError(f"optimiser groups of {saved} parameters saved, {groups} built")
    if (scheduler is None) != (state.get("scheduler") is None):
        raise ValueError("scheduler saved for a training without one, or the reverse")
    if not isinstance(state.get("progress"), dict):
        raise ValueError("no progress saved")
    import torch

    if state["rng_cuda"] and len(state["rng_cuda"]) > torch.cuda.device_count():
        raise ValueError(f"saved on {len(state['rng_cuda'])} CUDA devices, not on this machine")
    for name, g in generators.items():
        if state["generators"][name].shape != g.get_state().shape:
            raise ValueError(f"generator {name!r} saved with another state size")


def _trained_state(model) -> dict[str, Any]:
    """What a training changes in ``model``: the parameters that take gradients and the
    buffers (a LoRA training's save leaves out the frozen base, rebuilt as it was)."""
    keep = {n for n, p in model.named_parameters() if p.requires_grad}
    keep |= {n for n, _ in model.named_buffers()}
    return {k: v for k, v in model.state_dict().items() if k in keep}


def discard_saves_beside(artefact: str | Path) -> None:
    """Remove every training save kept beside ``artefact`` (once it is complete)."""
    artefact = Path(artefact)
    name = glob.escape(artefact.name)
    # and the atomic writer's temporary files of a save that a stop interrupted
    for pattern in (f".{name}.*.resume.pt", f"..{name}.*.resume.pt.*.tmp"):
        for p in artefact.parent.glob(pattern):
            p.unlink(missing_ok=True)
