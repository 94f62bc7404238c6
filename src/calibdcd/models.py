"""Model references: one place that turns a name in a config into files on disk.

A model reference (``ref``) is what a user writes wherever a model is named: a target's
``model``, VeilProbe's proxies, masked LM and mapping tokenizer, DPDLLM's reference LM. It is

* a local path (a checkpoint directory, or a ``.gguf`` file), used as it is; or
* a hub id (``org/name`` or a bare canonical id such as ``gpt2``), optionally pinned with
  ``@revision``, resolved through ``huggingface_hub`` into its cache.

:func:`resolve_model` never downloads: a hub id that is not in the local hub cache raises
:class:`MissingModelError`. Fetching is an explicit step (``calibdcd models fetch CONFIG``).

This module is the shared entry point; every loader calls :func:`resolve_model` and uses
``.path``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

__all__ = ["MissingModelError", "ResolvedModel", "is_hub_id", "resolve_model"]

_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


class MissingModelError(ValueError):
    """A hub model that is not in the local hub cache (and downloading is not allowed)."""

    def __init__(self, ref: str, reason: str = "not in the local hub cache"):
        self.ref = ref
        self.reason = reason
        super().__init__(f"model {ref!r}: {reason}")


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """``ref`` as written; ``path`` on disk; for hub models the repo id and the commit hash."""

    ref: str
    path: Path
    repo_id: str | None = None
    revision: str | None = None

    def record(self) -> dict[str, str | None]:
        """What a run directory records (no absolute path)."""
        return {"ref": self.ref, "repo_id": self.repo_id, "revision": self.revision}


def is_hub_id(ref: str) -> bool:
    """True when ``ref`` is not an existing path and looks like a hub id."""
    if Path(ref).expanduser().exists() or ref.startswith((".", "/", "~")):
        return False
    return bool(_HUB_ID.match(ref))


def resolve_model(ref: str | Path) -> ResolvedModel:
    """Resolve a model reference to files on disk, without any network access."""
    text = str(ref)
    p = Path(text).expanduser()
    if p.exists():
        return ResolvedModel(ref=text, path=p)
    if not is_hub_id(text):
        raise MissingModelError(text, "no such path")
    repo_id, _, revision = text.partition("@")
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(repo_id, revision=revision or None, local_files_only=True)
    except Exception as e:  # LocalEntryNotFoundError and friends
        raise MissingModelError(text, f"not in the local hub cache ({type(e).__name__})") from None
    snap_path = Path(snap)
    return ResolvedModel(ref=text, path=snap_path, repo_id=repo_id, revision=snap_path.name)
