"""The built-in detectors' registrations (VeilProbe, DPDLLM, continuation overlap).

Importing this module is cheap: each factory imports its detector only when it builds one, so a
dry run can list the detectors and check their modules without loading torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibdcd.detectors.base import register_detector

__all__ = ["replace_nested"]


def replace_nested(obj: Any, options: Mapping[str, Any], path: str = "options") -> Any:
    """``dataclasses.replace`` applied recursively: a mapping value for a field that holds a
    dataclass updates that dataclass; lists become tuples where the field holds a tuple."""
    if not options:
        return obj
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"{path}: cannot set fields on {type(obj).__name__}")
    names = {f.name for f in dataclasses.fields(obj)}
    kw: dict[str, Any] = {}
    for k, v in options.items():
        if k not in names:
            raise ValueError(
                f"{path}.{k}: unknown field of {type(obj).__name__} "
                f"(fields: {', '.join(sorted(names))})"
            )
        cur = getattr(obj, k)
        if isinstance(v, Mapping) and dataclasses.is_dataclass(cur):
            kw[k] = replace_nested(cur, v, f"{path}.{k}")
        elif isinstance(v, list) and isinstance(cur, tuple):
            kw[k] = tuple(v)
        else:
            kw[k] = v
    try:
        return dataclasses.replace(obj, **kw)  # type: ignore[type-var]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _veilprobe(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.veilprobe import PRESETS, VeilProbe, VeilProbeConfig

    preset = preset or "paper"
    if preset not in PRESETS:
        raise ValueError(f"preset: VeilProbe presets are {', '.join(PRESETS)}; got {preset!r}")
    cfg = VeilProbeConfig.preset(preset)
    opts = dict(options)
    opts.setdefault("cache_dir", str(Path(cache_dir) / "veilprobe"))
    opts.setdefault("progress", False)
    return VeilProbe(replace_nested(cfg, opts))


def _dpdllm(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.dpdllm import DPDLLM
    from calibdcd.detectors.dpdllm.detector import DPDLLMConfig

    if preset not in (None, "paper"):
        raise ValueError(f"preset: DPDLLM has the preset 'paper' only, got {preset!r}")
    cfg = DPDLLMConfig.for_benchmark(benchmark)
    opts = dict(options)
    opts.setdefault("progress", False)
    return DPDLLM(replace_nested(cfg, opts))


def _overlap(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.overlap import ContinuationOverlap, OverlapConfig

    if preset not in (None, "default"):
        raise ValueError(f"preset: the overlap detector has no presets, got {preset!r}")
    opts = {k: v for k, v in options.items() if k != "progress"}  # no bars: nothing to wait for
    return ContinuationOverlap(replace_nested(OverlapConfig(), opts))


register_detector(
    "veilprobe",
    _veilprobe,
    description="VeilProbe: mapping-model features + key-token perturbation, ProtoNet-IB",
    module="calibdcd.detectors.veilprobe",
    model_fields=(
        ("perturb.proxies", "model"),
        ("perturb.masked_lm", "model"),
        ("mapping.tokenizer", "tokenizer"),
    ),
)
register_detector(
    "dpdllm",
    _dpdllm,
    description="DPDLLM: reference-LM probabilities of the continuation, Gaussian NB",
    module="calibdcd.detectors.dpdllm",
    model_fields=(("reference.model_path", "model"),),
)
register_detector(
    "overlap",
    _overlap,
    description="continuation overlap with the true second half, logistic regression",
    module="calibdcd.detectors.overlap",
)
