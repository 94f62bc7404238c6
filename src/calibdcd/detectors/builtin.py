"""The built-in detectors' registrations (VeilProbe, DPDLLM, continuation overlap, and the
field's standard attacks: LOSS, zlib, Min-K%, Min-K%++, SaMIA, ReCaLL).

Each is registered as parameters apart from construction: a ``params`` function turns a preset
and option overrides into the detector's config dataclass (checked and fingerprinted without
building anything), a ``build`` function makes the detector from it. Importing this module is
cheap: each imports its detector only when it builds one, so a dry run can list the detectors
and check their modules without loading torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibdcd.detectors.registry import register_detector
from calibdcd.options import replace_nested
from calibdcd.paths import cache_root

__all__ = ["replace_nested"]


def _veilprobe(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.veilprobe import PRESETS, VeilProbeConfig

    preset = preset or "paper"
    if preset not in PRESETS:
        raise ValueError(f"preset: VeilProbe presets are {', '.join(PRESETS)}; got {preset!r}")
    cfg = VeilProbeConfig.preset(preset)
    opts = dict(options)
    opts.setdefault("cache_dir", str(Path(cache_dir) / "veilprobe"))
    opts.setdefault("progress", False)
    return replace_nested(cfg, opts)


def _build_veilprobe(config: Any) -> Any:
    from calibdcd.detectors.veilprobe import VeilProbe

    return VeilProbe(config)


def _dpdllm(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.dpdllm.detector import DPDLLMConfig

    if preset not in (None, "paper"):
        raise ValueError(f"preset: DPDLLM has the preset 'paper' only, got {preset!r}")
    cfg = DPDLLMConfig.for_benchmark(benchmark)
    opts = dict(options)
    opts.setdefault("progress", False)
    # the fine-tuned reference LMs live under the run's cache root
    reference = dict(opts.get("reference") or {})
    reference.setdefault("cache_dir", str(cache_root(cache_dir)))
    opts["reference"] = reference
    return replace_nested(cfg, opts)


def _build_dpdllm(config: Any) -> Any:
    from calibdcd.detectors.dpdllm import DPDLLM

    return DPDLLM(config)


def _overlap(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.overlap import OverlapConfig

    if preset not in (None, "default"):
        raise ValueError(f"preset: the overlap detector has no presets, got {preset!r}")
    opts = {k: v for k, v in options.items() if k != "progress"}  # no bars: nothing to wait for
    return replace_nested(OverlapConfig(), opts)


def _build_overlap(config: Any) -> Any:
    from calibdcd.detectors.overlap import ContinuationOverlap

    return ContinuationOverlap(config)


register_detector(
    "veilprobe",
    params=_veilprobe,
    build=_build_veilprobe,
    description="VeilProbe: mapping-model features + key-token perturbation, ProtoNet-IB",
    module="calibdcd.detectors.veilprobe",
    model_fields=(
        ("perturb.proxies", "model"),
        ("perturb.masked_lm", "model"),
        ("mapping.tokenizer", "tokenizer"),
    ),
    progress=True,
)
register_detector(
    "dpdllm",
    params=_dpdllm,
    build=_build_dpdllm,
    description="DPDLLM: reference-LM probabilities of the continuation, Gaussian NB",
    module="calibdcd.detectors.dpdllm",
    model_fields=(("reference.model_path", "model"),),
    progress=True,
)
register_detector(
    "overlap",
    params=_overlap,
    build=_build_overlap,
    description="continuation overlap with the true second half, logistic regression",
    module="calibdcd.detectors.overlap",
    uses_torch=False,
)


def _attack_params(statistic: str) -> Any:
    """The params function of the gray-box attack ``statistic`` (its config: AttackConfig)."""

    def params(
        preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
    ) -> Any:
        from calibdcd.detectors.attacks.common import AttackConfig

        if preset not in (None, "paper"):
            raise ValueError(f"preset: {statistic} has the preset 'paper' only, got {preset!r}")
        opts = {k: v for k, v in options.items() if k != "progress"}
        if opts.get("statistic", statistic) != statistic:
            raise ValueError(f"statistic: detector {statistic!r} computes {statistic!r} only")
        return replace_nested(AttackConfig(statistic=statistic), opts)  # type: ignore[arg-type]

    return params


def _build_attack(config: Any) -> Any:
    from calibdcd.detectors.attacks.common import LogprobAttack

    return LogprobAttack(config)


def _build_recall(config: Any) -> Any:
    from calibdcd.detectors.attacks.recall import ReCaLL

    return ReCaLL(config)


def _samia(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.attacks.samia import SamiaConfig

    if preset not in (None, "paper"):
        raise ValueError(f"preset: SaMIA has the preset 'paper' only, got {preset!r}")
    opts = {k: v for k, v in options.items() if k != "progress"}
    return replace_nested(SamiaConfig(), opts)


def _build_samia(config: Any) -> Any:
    from calibdcd.detectors.attacks.samia import SaMIA

    return SaMIA(config)


for _name, _what in (
    ("loss", "LOSS: mean token log-likelihood (gray-box, score-only)"),
    ("zlib", "zlib: log-perplexity over zlib entropy (gray-box, score-only)"),
    ("mink", "Min-K%: mean of the lowest k% token log-probabilities (gray-box, score-only)"),
    ("mink++", "Min-K%++: lowest k% of normalised token log-probabilities (gray-box, score-only)"),
):
    register_detector(
        _name,
        params=_attack_params(_name),
        build=_build_attack,
        description=_what,
        module="calibdcd.detectors.attacks.common",
        uses_torch=False,
        needs_logprobs=True,
        score_only=True,
    )
register_detector(
    "samia",
    params=_samia,
    build=_build_samia,
    description="SaMIA: ROUGE-1 of sampled continuations with the true second half (score-only)",
    module="calibdcd.detectors.attacks.samia",
    uses_torch=False,
    score_only=True,
)
register_detector(
    "recall",
    params=_attack_params("recall"),
    build=_build_recall,
    description="ReCaLL: LL(x | non-member prefix) / LL(x) (gray-box, score-only)",
    module="calibdcd.detectors.attacks.recall",
    uses_torch=False,
    needs_logprobs=True,
    score_only=True,
)


def _logprofile(
    preset: str | None, options: Mapping[str, Any], benchmark: str | None, cache_dir: str
) -> Any:
    from calibdcd.detectors.attacks.profile import ProfileConfig

    if preset not in (None, "default"):
        raise ValueError(f"preset: the logprofile detector has no presets, got {preset!r}")
    opts = {k: v for k, v in options.items() if k != "progress"}
    return replace_nested(ProfileConfig(), opts)


def _build_logprofile(config: Any) -> Any:
    from calibdcd.detectors.attacks.profile import LogProfile

    return LogProfile(config)


register_detector(
    "logprofile",
    params=_logprofile,
    build=_build_logprofile,
    description="log-probability profile: Min-K% at several k, moments, zlib, per-segment "
    "means; logistic regression (gray-box, ours)",
    module="calibdcd.detectors.attacks.profile",
    uses_torch=False,
    needs_logprobs=True,
)
