"""One setting's features, each cached on disk under a key of everything it depends on
(detector fingerprint, target identity, view, texts, the detector's reference and pool texts,
the known non-members it was handed); the target is asked only on a miss, through the
generation cache."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from calibdcd.detectors.adapter import DetectorAdapter
from calibdcd.detectors.base import decoding_record
from calibdcd.experiment.resources import SettingInputs
from calibdcd.keys import digest
from calibdcd.targets.recording import RecordingTarget

__all__ = ["FeatureExtractor"]


def _view_id(view: Any | None) -> Any:
    if view is None:
        return "e0"
    return {"code": view.code, "prefix": view.prefix, "suffix": view.suffix}


class FeatureExtractor:
    """Cached feature extraction for one setting."""

    def __init__(self, inputs: SettingInputs, pool: list[str]):
        self.inputs = inputs
        self.detector = detector = inputs.detector
        self.pool = pool
        self.det_key = inputs.detector_key
        self.target_key = inputs.target_key
        self.adapter = DetectorAdapter(detector)
        self.takes_reference = self.adapter.takes_reference
        self.has_prepare = self.adapter.pool_trained
        self.takes_nonmembers = self.adapter.takes_nonmembers
        #: the known non-members handed to the detector (:meth:`use_nonmembers`)
        self.nonmembers: list[str] | None = None
        self.blocks: dict[str, slice] | None = None
        self.seconds = 0.0
        self.extracted = 0
        self.steps: dict[str, float] = {}  #: the detector's own per-step seconds, summed
        #: the target's decoding per kind of query (the detector's features' ``generation``)
        self.generation: dict[str, Any] = {}
        #: {kind: GenerationParams} of a detector whose features do not carry the record
        self.kinds: dict[str, Any] = dict(detector.generation_kinds)
        #: every completion the features used (``--log-samples``; empty otherwise)
        self.samples: list[dict[str, Any]] = []

    def use_nonmembers(self, texts: list[str]) -> None:
        """Hand the detector the known non-members its features need (through the adapter; a
        no-op for a detector that takes none); they key every later extraction."""
        if self.takes_nonmembers:
            self.adapter.use_nonmembers(texts)
            self.nonmembers = list(texts)

    def __call__(self, texts: list[str], view: Any | None, reference: list[str]) -> np.ndarray:
        key = digest(
            "features/v1",
            self.det_key,
            self.target_key,
            _view_id(view),
            texts,
            reference if self.takes_reference else None,
            self.pool if self.has_prepare else None,
            # only a detector that takes them: every other detector's keys stay as they were
            *([self.nonmembers] if self.takes_nonmembers else []),
        )
        hit = self.inputs.arrays.load_arrays("features", key, require=("values",))
        if hit is not None and self.inputs.log_samples and "samples" not in hit:
            hit = None  # cached without its completions: extracted again (from the generation
            # cache, so nothing is generated twice) to log them
        if hit is not None:
            if "samples" in hit:
                self.samples.extend(json.loads(str(hit["samples"])))
            self._set_blocks(hit)
            if "generation" in hit:
                self._add_generation(json.loads(str(hit["generation"])))
            elif self.kinds:
                # features cached before runs recorded decoding: what was asked, not what was used
                self._add_generation(
                    {
                        k: {"requested": p.as_dict(), "note": "cached before decoding was recorded"}
                        for k, p in self.kinds.items()
                    }
                )
            return hit["values"]
        t0 = time.perf_counter()
        target = self.inputs.target()
        recorder = RecordingTarget(target, "prepare") if self.inputs.log_samples else None
        if recorder is not None:
            target = recorder
        before = self.adapter.timings()
        self.adapter.prepare(self.pool, target)
        if recorder is not None:
            recorder.phase = "e0" if view is None else view.code
        feats = self.adapter.extract(texts, target, view, reference)
        # a detector keeps per-step seconds on itself (VeilProbe) or on its features (DPDLLM)
        after = self.adapter.timings()
        spent = {k: float(v) - float(before.get(k, 0.0)) for k, v in after.items()}
        for k, v in (getattr(feats, "timings", None) or {}).items():
            spent[k] = spent.get(k, 0.0) + float(v)
        for k, v in spent.items():
            self.steps[str(k)] = self.steps.get(str(k), 0.0) + v
        values = np.asarray(feats.values, dtype=np.float64)
        names = list(feats.blocks)
        bounds = np.array([[feats.blocks[n].start, feats.blocks[n].stop] for n in names])
        arrays = {"values": values, "block_names": np.array(names), "block_bounds": bounds}
        generation = decoding_record(self.detector, target, feats)
        if generation:
            arrays["generation"] = np.array(json.dumps(generation, sort_keys=True, default=str))
            self._add_generation(generation)
        if recorder is not None:  # kept with the features: a later hit logs them too
            arrays["samples"] = np.array(json.dumps(recorder.records, default=str))
            self.samples.extend(recorder.records)
        self.inputs.arrays.save_arrays("features", key, arrays)
        self._set_blocks(arrays)
        self.seconds += time.perf_counter() - t0
        self.extracted += 1
        return values

    def _add_generation(self, record: dict[str, Any]) -> None:
        for kind, rec in record.items():
            self.generation.setdefault(str(kind), rec)

    def _set_blocks(self, arrays: dict[str, np.ndarray]) -> None:
        if self.blocks is None and "block_names" in arrays:
            self.blocks = {
                str(n): slice(int(a), int(b))
                for n, (a, b) in zip(arrays["block_names"], arrays["block_bounds"], strict=True)
            }
