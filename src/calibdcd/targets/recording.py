"""A target wrapper that keeps every completion it hands out: the per-prompt log behind
``calibdcd run --log-samples`` (as lm-evaluation-harness's ``--log_samples``).

A detector may send several prompts per text (VeilProbe's perturbations), so a record names the
prompt, not a text id: the prompt is the query e0(s) or its view, exactly as sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calibdcd.targets.base import GenerationParams

__all__ = ["RecordingTarget"]


class RecordingTarget:
    """Delegates everything to ``inner`` and appends one record per prompt of every
    :meth:`generate` call: ``{"phase", "prompt", "completions", "params"}`` (``phase`` is what
    the caller set before the call, e.g. the view's code)."""

    def __init__(self, inner: Any, phase: str = "") -> None:
        self.inner = inner
        self.phase = phase
        self.records: list[dict[str, Any]] = []

    def generate(self, prompts: Sequence[str], params: GenerationParams) -> list[list[str]]:
        out = self.inner.generate(prompts, params)
        requested = params.as_dict()
        for prompt, completions in zip(prompts, out, strict=True):
            self.records.append(
                {
                    "phase": self.phase,
                    "prompt": prompt,
                    "completions": list(completions),
                    "params": requested,
                }
            )
        return out

    def __getattr__(self, name: str) -> Any:  # name, family, resolve_params, ...
        return getattr(self.inner, name)
