"""Reading a fit config (``calibdcd fit``): the schema is :class:`calibdcd.fitted.config.
FitConfig`; reading and checking it uses the run configs' reader (``${VAR}`` expansion, every
problem at once with its line and key path) and the detectors' option checks, which live in
this layer, so the reader lives here too (the fitted layer below does not import them)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from calibdcd.fitted.config import TARGET_FIELDS, FitConfig

if TYPE_CHECKING:
    from calibdcd.experiment.config import TargetEntry

__all__ = ["fit_config_from", "load_fit_config", "target_entry"]


def load_fit_config(path: str | Path, *, reach: bool = False) -> FitConfig:
    """Read and validate a fit config with the run configs' reader (``calibdcd run``): ``${VAR}``
    and ``${VAR:-default}`` expanded from the environment (secret ones registered for
    redaction), and every problem - schema, value, unset variable, the target's backend options,
    the detector's preset and options - reported at once in one
    :class:`~calibdcd.experiment.config.ConfigError`, each with its line and key path."""
    from calibdcd.experiment.config import ConfigError, read_yaml

    p = Path(path)
    data, lines = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigError("", f"a fit config is a mapping, got {type(data).__name__}", str(p))
    return fit_config_from(
        data, source=str(p), base_dir=p.resolve().parent, lines=lines, reach=reach
    )


def fit_config_from(
    data: dict[str, Any],
    *,
    source: str,
    base_dir: str | Path,
    lines: Any = None,
    reach: bool = False,
) -> FitConfig:
    """A fit config from its mapping (a YAML file's, or the command line's flags), checked as
    :func:`load_fit_config` checks a file; relative paths are read against ``base_dir``.
    ``reach`` (the dry run): when the config has problems, its served target is asked too, so
    an unreachable server is among them rather than found once the others are fixed (a config
    without problems is reached by the dry run itself)."""
    from calibdcd.experiment.config import (
        ConfigError,
        DetectorEntry,
        calibration_problems,
        expand_variables,
        local_target_paths,
        problems_at,
        register_listed_secrets,
        resolve_lab_ref,
    )
    from calibdcd.experiment.detector_entries import DETECTORS, detector_entry_problems

    found: list[tuple[tuple[Any, ...], str]] = []
    register_listed_secrets(data)
    data = expand_variables(data, (), found)
    data.setdefault("base_dir", str(base_dir))
    t = data.get("target")
    if isinstance(t, dict) and isinstance(t.get("model"), str):
        # a local model or tokenizer is read against the config's directory, as its data files
        # are and as a run config's targets are (it was read against the working directory)
        found_paths = local_target_paths(
            str(t.get("backend", "hf")), t["model"], t.get("lab"), t.get("tokenizer"),
            Path(base_dir),
        )  # fmt: skip
        data["target"] = {**t, **found_paths}
    cfg = None
    try:
        cfg = FitConfig(**data)
    except ValidationError as exc:
        for e in exc.errors():
            loc = tuple(
                x for x in e["loc"] if not isinstance(x, str) or not x.startswith("function-")
            )
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            found.append((loc, str(msg).removeprefix("Value error, ")))
    t, d = data.get("target"), data.get("detector")
    if isinstance(t, dict):
        found += [(("target", *k), m) for k, m in _target_problems(t)]
    if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"] in DETECTORS:
        options = d.get("options") if isinstance(d.get("options"), dict) else {}
        entry = DetectorEntry(name=d["name"], preset=d.get("preset"), options=options)
        bench = {"benchmarks": [{"name": d.get("benchmark") or ""}]}
        found += [(("detector", *k), m) for k, m in detector_entry_problems(entry, bench)]
    # CalibDCD's settings and the labs, checked as a run config's are (they were first read
    # when the fit had built its labs and target: a typo was a TypeError, an unknown lab
    # "not built yet" in the dry run)
    found += [(("calibdcd", *loc[1:]), m) for loc, m in calibration_problems(data.get("calibdcd"))]
    for section in ("target", "data"):
        part = data.get(section)
        spec = part.get("lab") if isinstance(part, dict) else None
        if isinstance(spec, str):
            ref = resolve_lab_ref(spec, cache_dir=cfg.cache_root() if cfg is not None else None)
            if isinstance(ref, str):
                found.append(((section, "lab"), ref))
    target_ok = not any(loc[:1] == ("target",) for loc, _ in found)
    if found and reach and target_ok and isinstance(t, dict):
        found += [(("target", *k), m) for k, m in _reach_problems(t)]
    if found:
        raise ConfigError("", "", source, problems=problems_at(found, lines))
    assert cfg is not None
    return cfg


def target_entry(section: Any) -> TargetEntry:
    """A fit config's (or a bundle's) ``target`` section, as a mapping or typed, as the run
    configs' :class:`TargetEntry`: the one conversion ``fit``, ``score``, their dry runs and
    ``models`` use (defaults: ``name: target``, ``backend: hf``). Raises for a malformed
    section (pydantic names what)."""
    from calibdcd.experiment.config import TargetEntry

    def get(key: str) -> Any:
        return section.get(key) if isinstance(section, Mapping) else getattr(section, key, None)

    options = get("options")
    fields: dict[str, Any] = {"name": "target", "backend": "hf"}
    fields.update({k: v for k in (*TARGET_FIELDS, "backend") if (v := get(k)) is not None})
    return TargetEntry(**fields, options=dict(options) if isinstance(options, Mapping) else {})


def _target_entry(t: dict[str, Any]) -> TargetEntry | None:
    """:func:`target_entry`, or None when the section is malformed (its schema problems are
    pydantic's)."""
    try:
        return target_entry(t)
    except (ValidationError, TypeError, ValueError):
        return None


def _target_problems(t: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """The run configs' checks of a target (``experiment.config``'s entry check: a known backend
    and family, the backend's options, values its constructor takes - a base URL that is a URL),
    applied to a fit config's ``target`` section; its schema problems are pydantic's."""
    from calibdcd.experiment.config import target_checks
    from calibdcd.targets.base import option_problems

    entry = _target_entry(t)
    if entry is None:  # a malformed section: the schema says what, the options are checked
        backend = t.get("backend", "hf")
        options = t.get("options") if isinstance(t.get("options"), dict) else {}
        if not isinstance(backend, str):
            return []
        return [(("options", *k), m) for k, m in option_problems(backend, options)]
    return target_checks(entry, {})


def _reach_problems(t: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """Whether a well-formed served target's server answers (its preflight), as a problem at
    its ``options.base_url``; nothing for a malformed section (its schema problems say what)."""
    from calibdcd.experiment.target_entries import preflight_target

    entry = _target_entry(t)
    if entry is None:
        return []
    try:
        preflight_target(entry)
    except (ValueError, TypeError, OSError) as exc:
        return [(("options", "base_url"), str(exc))]
    return []
