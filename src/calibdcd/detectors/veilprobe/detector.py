"""The VeilProbe detector (Hu et al., 2025) behind calibdcd's ``Detector`` protocol.

Usage (the runner's glue, see :mod:`calibdcd.detectors.base`)::

    det = VeilProbe(VeilProbeConfig.cpu())
    det.prepare(pool_texts, target)           # suffixes, perturbation, mapping model (no labels)
    feats = det.extract(texts, target)         # Features with blocks E, D, dE, dD
    clf = det.new_classifier(seed).fit(feats.values[train], labels[train])
    scores = clf.score(feats.values[test])     # higher = member

``prepare`` trains the mapping model transductively on the whole candidate pool (Q4: the official
code trains it on every text, members and non-members, without labels); if it was not called, the
first ``extract`` call's texts are the pool. One mapping model is kept per target (its training
pairs are that target's suffixes under the original query e0), or two with
``mapping.shared_model=False`` (one on <s, s_out> for f(s), one on <r, r_out> for f(r)).

A CalibDCD view wraps the query of the text and of its perturbed copy; the features are then
recomputed with the *same* mapping model (phi is unchanged by CalibDCD). With
``features.decoder_input="suffix"`` the view's suffixes are teacher-forced through the decoder,
so the output-derived blocks ``calibration_blocks = ("D", "dD")`` move; with the official
``"constant"`` decoder input nothing moves (the observed output is ignored at feature time).
``features.encoder_input="view"`` lets the encoder read the view's query too (E and dE move).

``timings`` accumulates wall seconds per step: ``suffixes``, ``perturbation``, ``mapping``,
``features`` (the classifier's own fit time is ``VeilProbeClassifier.fit_seconds``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibdcd.atomic import atomic_savez
from calibdcd.persist import read_cached_arrays
from calibdcd.targets.base import GenerationParams

from ..base import (
    Features,
    NeedsSupervised,
    NormalizedClassifier,
    PersistableClassifier,
    PoolTrained,
    Timed,
)
from .cache import CACHE_FORMAT, content_key
from .config import VeilProbeConfig
from .features import DELTA_BLOCKS, OUTPUT_BLOCKS, Preprocessor, block_slices, compose
from .mapping import MappingModel, load_mapping_model, pooled_features, train_mapping_model
from .perturb import KeyTokenPerturber
from .protonet import ProtoNetIB
from .sampling import generation_params, sample_suffixes

__all__ = ["VeilProbe", "VeilProbeClassifier"]


class VeilProbeClassifier(NormalizedClassifier, PersistableClassifier):
    """Supervised-split preprocessing (Welch pruning of dE/dD, z-score) + ProtoNet-IB.

    Implements the ``Classifier`` protocol on raw VeilProbe features; refit it on corrected
    features to retrain (the preprocessing is refitted too). ``transform`` exposes the normalised
    space the ProtoNet consumes.
    """

    def __init__(self, config: VeilProbeConfig, prune_columns: np.ndarray, seed: int = 0):
        self.config = config
        self.seed = seed
        self.preprocessor = Preprocessor(
            prune_columns, prune_p=config.features.prune_p, normalize=config.features.normalize
        )
        self.protonet = ProtoNetIB(config.protonet, seed=seed)
        self.fit_seconds = 0.0

    def fit(self, z: np.ndarray, labels: np.ndarray) -> VeilProbeClassifier:
        t0 = time.perf_counter()
        self.preprocessor.fit(z, labels)
        self.protonet.fit(self.preprocessor.transform(z), labels)
        self.fit_seconds = time.perf_counter() - t0
        return self

    def transform(self, z: np.ndarray) -> np.ndarray:
        return self.preprocessor.transform(z)

    def score_transformed(self, zt: np.ndarray) -> np.ndarray:
        """The ProtoNet's score on already normalised features (``transform``'s output)."""
        return self.protonet.score(zt)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The fitted normaliser and ProtoNet as arrays (``pre.*`` / ``protonet.*``) + meta."""
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {"seed": self.seed}
        for name, part in (("pre", self.preprocessor), ("protonet", self.protonet)):
            a, m = part.state()
            arrays.update({f"{name}.{k}": v for k, v in a.items()})
            meta[name] = m
        return arrays, meta

    @classmethod
    def from_state(
        cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
    ) -> VeilProbeClassifier:
        """A fitted classifier from :meth:`state` (its ``config`` is not kept: ``None``; a refit
        uses the restored preprocessing and ProtoNet settings)."""

        def part(name: str) -> dict[str, np.ndarray]:
            return {k[len(name) + 1 :]: v for k, v in arrays.items() if k.startswith(name + ".")}

        clf = cls.__new__(cls)
        clf.config = None  # type: ignore[assignment]
        clf.seed = int(meta["seed"])
        clf.preprocessor = Preprocessor.from_state(part("pre"), meta["pre"])
        clf.protonet = ProtoNetIB.from_state(part("protonet"), meta["protonet"])
        clf.fit_seconds = 0.0
        return clf

    def score(self, z: np.ndarray) -> np.ndarray:
        return self.protonet.score(self.preprocessor.transform(z))


class VeilProbe(PoolTrained, Timed, NeedsSupervised):
    name = "veilprobe"
    calibration_blocks: tuple[str, ...] | None = OUTPUT_BLOCKS
    #: target queries per text (the text and its key-token perturbation): dry-run estimates
    queries_per_text = 2
    #: the recipe version of its cached artefacts (experiment feature caches include it)
    cache_version = CACHE_FORMAT

    def __init__(self, config: VeilProbeConfig | None = None):
        self.config = config or VeilProbeConfig.cpu()
        self.timings: dict[str, float] = defaultdict(float)
        self._suffix_memo: dict[tuple[str, str, str], list[str]] = {}
        self._mapping: dict[str, tuple[MappingModel, MappingModel]] = {}  # (for s, for r)
        self._pool: list[str] | None = None  # queries of the pool
        self._raw_pool: list[str] | None = None
        self._perturber = KeyTokenPerturber(
            self.config.perturb, self.config.cache_path, progress=self.config.progress
        )
        self._perturbed: dict[str, str] = {}

    # -- protocol -----------------------------------------------------------------------------
    @property
    def min_supervised_per_class(self) -> int:
        """ProtoNet episodes draw n_support + n_query texts of each class."""
        return self.config.protonet.n_support + self.config.protonet.n_query

    def query(self, text: str) -> str:
        """e0(s) = s: the whole text is the prompt, no instruction, no template (Q5).
        With ``sampling.prompt_fraction < 1``, the first words of the text (an extension)."""
        frac = self.config.sampling.prompt_fraction
        if frac >= 1.0:
            return text
        words = text.split()
        return " ".join(words[: max(1, math.ceil(frac * len(words)))])

    @property
    def blocks(self) -> dict[str, slice]:
        return block_slices(self.config.mapping.block_width)

    @property
    def generation_kinds(self) -> dict[str, GenerationParams]:
        """The decoding of each kind of target query (a run records what the target used)."""
        return {"suffix": generation_params(self.config.sampling)}

    def new_classifier(self, seed: int = 0) -> VeilProbeClassifier:
        cols = Features(np.zeros((1, 4 * self.config.mapping.block_width)), self.blocks).columns(
            DELTA_BLOCKS
        )
        return VeilProbeClassifier(self.config, cols, seed)

    def extract(self, texts: Sequence[str], target: Any, view: Any | None = None) -> Features:
        raw = _check_texts(texts)
        if _target_name(target) not in self._mapping:
            self.prepare(self._raw_pool or raw, target)
        texts = [self.query(t) for t in raw]
        mm_s, mm_r = self._mapping[_target_name(target)]
        perturbed = self.perturbed(texts)
        s_suf = self.suffixes(texts, target, view)
        r_suf = self.suffixes(perturbed, target, view)
        t0 = time.perf_counter()
        fcfg = self.config.features
        s_in, r_in = texts, perturbed
        if fcfg.encoder_input == "view" and view is not None:
            s_in, r_in = [view.apply(t) for t in texts], [view.apply(t) for t in perturbed]
        key = content_key(
            "features",
            mm_s.key,
            mm_r.key if mm_r is not mm_s else None,
            dataclasses.asdict(fcfg),
            s_in,
            r_in,
            s_suf,
            r_suf,
        )
        path = self.config.cache_path / "features" / f"{key}.npz"
        cached = read_cached_arrays(path, ("z",))
        if cached is not None:
            feats = Features(cached["z"], self.blocks)
        else:
            use_suffix = fcfg.decoder_input == "suffix"
            E_s, D_s = pooled_features(mm_s, s_in, s_suf if use_suffix else None, fcfg)
            E_r, D_r = pooled_features(mm_r, r_in, r_suf if use_suffix else None, fcfg)
            feats = compose(E_s, D_s, E_r, D_r)
            atomic_savez(path, {"z": feats.values})
        self.timings["features"] += time.perf_counter() - t0
        return feats

    # -- steps ---------------------------------------------------------------------------------
    def prepare(self, pool: Sequence[str], target: Any) -> MappingModel:
        """Train (or load from cache) the mapping model for ``target`` on the candidate pool:
        one model on every <s, s_out> and <r, r_out> pair (``mapping.shared_model``, official),
        else one per side. Returns the model that reads the original texts."""
        self._raw_pool = _check_texts(pool)
        pool = [self.query(t) for t in self._raw_pool]
        self._pool = pool
        perturbed = self.perturbed(pool)
        s_suf = self.suffixes(pool, target)
        r_suf = self.suffixes(perturbed, target)
        t0 = time.perf_counter()
        cfg, cache, progress = self.config.mapping, self.config.cache_path, self.config.progress
        if cfg.shared_model:
            mm_s = mm_r = train_mapping_model(
                pool + perturbed, s_suf + r_suf, cfg, cache, progress=progress
            )
        else:
            mm_s = train_mapping_model(pool, s_suf, cfg, cache, progress=progress)
            mm_r = train_mapping_model(perturbed, r_suf, cfg, cache, progress=progress)
        self.timings["mapping"] += time.perf_counter() - t0
        self._mapping[_target_name(target)] = (mm_s, mm_r)
        return mm_s

    def learnt_parts(self, target: Any) -> dict[str, Path]:
        """The trained mapping model(s) for ``target`` (one directory, two when not shared),
        and the proxy and masked LM when they were trained on the pool (no ``proxies`` /
        ``masked_lm`` configured): a bundle then scores with the very models it was fitted
        with, not ones trained again (another thread count trains other bytes)."""
        try:
            mm_s, mm_r = self._mapping[_target_name(target)]
        except KeyError:
            raise ValueError("the mapping model is not trained yet: call prepare first") from None
        parts = {"mapping": mm_s.path}
        if mm_r is not mm_s:
            parts["mapping_perturbed"] = mm_r.path
        return {**parts, **self._perturber.trained}

    def restore_parts(self, parts: Mapping[str, Path], pool: Sequence[str], target: Any) -> None:
        """Use saved mapping model(s) (:meth:`learnt_parts`) as if ``prepare(pool)`` trained
        them: nothing is trained, ``pool`` only seeds the perturbation's own pool (a bundle
        without the proxy or masked LM trains them on it, as before they were saved)."""
        self._perturber.use_trained(parts)
        self._raw_pool = _check_texts(pool)
        self._pool = [self.query(t) for t in self._raw_pool]
        mm_s = load_mapping_model(parts["mapping"], self.config.mapping)
        other = parts.get("mapping_perturbed")
        mm_r = mm_s if other is None else load_mapping_model(other, self.config.mapping)
        self._mapping[_target_name(target)] = (mm_s, mm_r)

    def perturbed(self, texts: Sequence[str]) -> list[str]:
        # ``texts`` here (and in ``suffixes``) are queries e0(s), i.e. ``self.query(text)``
        """The key-token-perturbed copy r of each text (proxy/MLM trained on the pool if needed)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._perturbed]
        if todo:
            t0 = time.perf_counter()
            out = self._perturber.perturb(todo, pool=self._pool or list(texts))
            self._perturbed.update(zip(todo, out, strict=True))
            self.timings["perturbation"] += time.perf_counter() - t0
        return [self._perturbed[t] for t in texts]

    def suffixes(
        self, texts: Sequence[str], target: Any, view: Any | None = None
    ) -> list[list[str]]:
        """The target's suffixes for each text under ``view`` (memoised per target/view/text)."""
        tname, vcode = _target_name(target), _view_code(view)
        todo = [t for t in dict.fromkeys(texts) if (tname, vcode, t) not in self._suffix_memo]
        if todo:
            t0 = time.perf_counter()
            got = sample_suffixes(todo, target, self.config.sampling, view)
            for t, s in zip(todo, got, strict=True):
                self._suffix_memo[(tname, vcode, t)] = s
            self.timings["suffixes"] += time.perf_counter() - t0
        return [self._suffix_memo[(tname, vcode, t)] for t in texts]


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, not a single string")
    out = list(texts)
    if not out:
        raise ValueError("texts is empty")
    for i, t in enumerate(out):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"texts[{i}] is not a non-empty string")
    return out


def _target_name(target: Any) -> str:
    name = getattr(target, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError("target has no string .name (needed to key its suffixes and model)")
    return name


def _view_code(view: Any | None) -> str:
    if view is None:
        return "e0"
    code = getattr(view, "code", None)
    if code is None:
        raise ValueError("view has no .code attribute")
    return f"view:{code}"
