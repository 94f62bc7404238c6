"""Lab references in a config, resolved: a lab spec to its directory (a prebuilt copy under
``$CALIBDCD_LAB_ROOT``, else the lab cache, built on first use), and ``lab:...`` /
``lab-clean-reference:...`` strings in detector options to paths (DPDLLM's clean reference LM
of a lab, trained on first use)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibdcd.experiment.config import option_strings, resolve_lab_ref
from calibdcd.paths import cache_root

__all__ = ["resolve_lab", "resolve_lab_refs", "unbuilt_clean_references"]


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
    ref = resolve_lab_ref(spec, cache_dir=root)  # the one resolver, which the config used
    if isinstance(ref, str):
        if not build:
            return None
        raise ValueError(ref)
    d = Path(str(ref.directory))
    if ref.prebuilt:
        return d
    if not build:
        return d if ref.built else None
    # experiments measure the lab themselves: skip the build's own ``lab check`` (~2 min on
    # small; it does not change the lab or its cache key)
    from calibdcd.lab import ensure_lab

    root = cache_root(root)
    return Path(ensure_lab(ref.preset, seed=ref.seed, root=root, check=False, progress=progress))


def resolve_lab_refs(
    value: Any, *, build: bool = True, root: str | Path | None = None, progress: bool = False
) -> Any:
    """Resolve lab references anywhere in nested detector options (with ``build`` False, only
    those whose lab or reference is built here; the others are left as written); labs and
    references live under the cache root ``root``
    (:func:`calibdcd.paths.cache_root`):

    * ``"lab:<preset>/<path>"``: that path inside the lab's directory;
    * ``"lab-clean-reference:<preset>"``: DPDLLM's clean reference LM for that lab (the lab's
      architecture pre-trained on its background texts only, no candidate text;
      ``calibdcd.lab.clean_reference.ensure_clean_reference``). The lab's own base
      model must not be the reference: it memorised the members, so a reference started from it
      detects membership without looking at the target's output.
    """
    if isinstance(value, str) and value.startswith("lab-clean-reference:"):
        if not build:  # its path when it is trained here, else as written
            ref = _clean_reference_dir(value, root)
            return str(ref) if ref is not None and _trained(ref) else value
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


def _clean_reference_dir(value: str, root: str | Path | None) -> Path | None:
    """Where ``lab-clean-reference:<preset>`` is (or will be) trained under the cache root
    ``root``; None while its lab is not built here."""
    from calibdcd.lab.clean_reference import clean_reference_dir

    lab = resolve_lab(value.split(":", 1)[1], build=False, root=root)
    return None if lab is None else clean_reference_dir(lab, cache_dir=cache_root(root))


def _trained(ref: Path) -> bool:
    return (ref / "reference.json").exists()


def unbuilt_clean_references(value: Any, *, root: str | Path | None = None) -> list[str]:
    """The ``lab-clean-reference:<preset>`` references in nested detector options that are not
    built under the cache root ``root`` (their would-be directory names). Trains nothing: a
    stale-result check must not start a reference's training."""
    out = []
    for v in option_strings(value):
        if not v.startswith("lab-clean-reference:"):
            continue
        ref = _clean_reference_dir(v, root)
        if ref is None:
            out.append(v)
        elif not _trained(ref):
            out.append(f"{v}={ref.name}")
    return out
