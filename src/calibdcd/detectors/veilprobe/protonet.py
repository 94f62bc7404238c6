"""Prototypical network with an information bottleneck (VeilProbe module C, CalibDCD Table 9).

Embedding g: Linear(d, h) -> ReLU -> Linear(h, h) -> ReLU -> Linear(h, m) (the bottleneck).
Training: ``episodes`` 2-way episodes; each samples ``n_support + n_query`` items per class without
replacement, prototypes are support means, query logits are -d(g(q), c_k) with
d = ``train_distance`` (official: squared Euclidean), loss = cross-entropy +
beta * sum_j log(1 + Var_q[g_j(q)]) (unbiased variance over the episode's queries; the official
deterministic "compression" penalty). Adam, lr 3e-4, weight decay 1e-5, one step per episode; the
final model is used (no model selection on any evaluation data).
Inference: prototypes from all training items; score = d(g(z), c_0) - d(g(z), c_1) with
d = ``distance`` (official: Euclidean; CalibDCD: squared Euclidean), higher = member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from .config import ProtoNetConfig
from .torchutil import cpu_threads

__all__ = ["ProtoNetIB"]


class ProtoNetIB:
    """Implements the ``Classifier`` protocol (``fit`` / ``score``). Deterministic for a seed."""

    def __init__(self, config: ProtoNetConfig | None = None, seed: int = 0):
        self.config = config or ProtoNetConfig()
        self.seed = seed
        self.net = None
        self.prototypes_ = None
        self.loss_history_: list[float] = []

    def _distance(self, a, b, kind: str):
        import torch

        d = torch.cdist(a, b, p=2.0)
        return d.pow(2) if kind == "sqeuclidean" else d

    def fit(self, z: np.ndarray, labels: np.ndarray) -> ProtoNetIB:
        # a small MLP on CPU: one intra-op thread is fastest (and deterministic)
        with cpu_threads(1):
            return self._fit(z, labels)

    def _fit(self, z: np.ndarray, labels: np.ndarray) -> ProtoNetIB:
        import torch
        from torch import nn

        cfg = self.config
        x = torch.as_tensor(np.asarray(z, dtype=np.float32))
        y = np.asarray(labels).astype(int)
        if x.ndim != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(f"z {tuple(x.shape)} and labels {y.shape} do not match")
        per_class = cfg.n_support + cfg.n_query
        idx = [np.flatnonzero(y == c) for c in (0, 1)]
        for c in (0, 1):
            if idx[c].size < per_class:
                raise ValueError(
                    f"class {c} has {idx[c].size} training items; an episode needs "
                    f"n_support + n_query = {per_class}"
                )
        gen = torch.Generator().manual_seed(self.seed)
        torch_state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)
        self.net = self._build_net(x.shape[1])
        torch.random.set_rng_state(torch_state)
        opt = torch.optim.Adam(
            self.net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        idx_t = [torch.as_tensor(i) for i in idx]
        q_labels = torch.arange(2).repeat_interleave(cfg.n_query)
        self.net.train()
        self.loss_history_ = []
        for _ in range(cfg.episodes):
            support, query = [], []
            for c in (0, 1):
                pick = idx_t[c][torch.randperm(idx_t[c].numel(), generator=gen)[:per_class]]
                support.append(pick[: cfg.n_support])
                query.append(pick[cfg.n_support :])
            protos = torch.stack([self.net(x[s]).mean(dim=0) for s in support])
            gq = self.net(x[torch.cat(query)])
            logits = -self._distance(gq, protos, cfg.train_distance)
            loss = nn.functional.cross_entropy(logits, q_labels)
            if cfg.use_ib:
                loss = loss + cfg.beta * torch.log1p(gq.var(dim=0, unbiased=True)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            self.loss_history_.append(float(loss.detach()))
        self.net.eval()
        with torch.no_grad():
            g = self.net(x)
            self.prototypes_ = torch.stack(
                [g[torch.as_tensor(idx[0])].mean(dim=0), g[torch.as_tensor(idx[1])].mean(dim=0)]
            )
        return self

    def _build_net(self, d_in: int) -> Any:
        from torch import nn

        cfg = self.config
        return nn.Sequential(
            nn.Linear(d_in, cfg.hidden),
            nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.hidden),
            nn.ReLU(),
            nn.Linear(cfg.hidden, cfg.latent),
        )

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The trained embedding's weights and the prototypes as arrays, the config as meta."""
        if self.net is None or self.prototypes_ is None:
            raise RuntimeError("ProtoNetIB.state called before fit")
        arrays = {f"net.{k}": v.detach().cpu().numpy() for k, v in self.net.state_dict().items()}
        arrays["prototypes"] = self.prototypes_.detach().cpu().numpy()
        meta = {"config": dataclasses.asdict(self.config), "seed": self.seed}
        meta["d_in"] = int(arrays["net.0.weight"].shape[1])
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> ProtoNetIB:
        import torch

        m = cls(ProtoNetConfig(**meta["config"]), seed=int(meta["seed"]))
        m.net = m._build_net(int(meta["d_in"]))
        weights = {
            k[len("net.") :]: torch.as_tensor(np.asarray(v))
            for k, v in arrays.items()
            if k.startswith("net.")
        }
        m.net.load_state_dict(weights, strict=True)
        m.net.eval()
        m.prototypes_ = torch.as_tensor(np.asarray(arrays["prototypes"]))
        return m

    def score(self, z: np.ndarray) -> np.ndarray:
        import torch

        if self.net is None:
            raise RuntimeError("ProtoNetIB.score called before fit")
        with torch.no_grad(), cpu_threads(1):
            g = self.net(torch.as_tensor(np.asarray(z, dtype=np.float32)))
            d = self._distance(g, self.prototypes_, self.config.distance)
        return (d[:, 0] - d[:, 1]).numpy().astype(np.float64)
