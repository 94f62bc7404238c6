"""Key-token perturbation (VeilProbe module A'): pick ~gamma of the tokens that matter most to the
proxies and replace each with a masked-LM "synonym".

Aggregation across proxies (official ``keyperturb_agg.py``, restated): each proxy keeps its
top ``top_k_factor * n_key`` positions (k halved until it fits the text); kept entries are grouped
by token string across proxies; a string's score is the mean of its scores; the ``n_key`` strings
with the highest score are kept, each at its most frequent location.

Deliberate deviations (documented, all for tokenizer-independence):

* locations are character spans in the original text, not proxy-token positions, so proxies with
  different tokenizers can be aggregated and the replacement goes exactly where the key token is
  (the official string-level ``replace`` can hit an earlier occurrence of the word: quirk 7);
* ``n_key=None``: ceil(gamma * p) key tokens, p = the first proxy's token count (the official
  13, from the top 26 of each proxy, is ``n_key=13``, the default).

Replacement (as official): each key token is masked in the *unperturbed* text and predicted
independently; from the top ``fill_top_k`` predictions drop the word itself and anything with a
character outside ``[A-Za-z0-9-]``; pick one uniformly at random (seeded per text); positions with
no candidate stay unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from calibdcd.keys import key_dict
from calibdcd.progress import inner_bar

from .attribution import TokenScore, attribute, load_proxy
from .cache import atomic_write_text, content_key
from .config import PerturbConfig
from .mlm import fill_mask, load_masked_lm, train_causal_proxy, train_masked_lm

__all__ = [
    "KeyToken",
    "KeyTokenPerturber",
    "aggregate_key_tokens",
    "key_token_count",
]

_ALLOWED = re.compile(r"^[A-Za-z0-9-]+$")


@dataclasses.dataclass(frozen=True)
class KeyToken:
    token: str
    start: int
    end: int
    score: float


def _model_identity(path: str | Path, cache_dir: Path) -> dict:
    """A proxy or masked LM in cache keys: its name and
    :func:`calibdcd.model_refs.checkpoint_identity` (never its location, so a moved cache keeps
    its perturbations)."""
    from calibdcd.model_refs import checkpoint_identity

    return {"name": Path(path).name, "content": checkpoint_identity(path, cache_dir)}


def key_token_count(config: PerturbConfig, n_tokens: int) -> int:
    """How many key tokens a text of ``n_tokens`` proxy tokens gets: ``config.n_key`` (official
    13) or ``ceil(gamma * n_tokens)``; 0 for an empty text."""
    if n_tokens <= 0:
        return 0
    if config.n_key is not None:
        return config.n_key
    return math.ceil(config.gamma * n_tokens)


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def aggregate_key_tokens(
    per_proxy: Sequence[Sequence[TokenScore]], text: str, n_key: int, top_k_factor: int = 2
) -> list[KeyToken]:
    """Cross-proxy aggregation of token importances into at most ``n_key`` key tokens."""
    if n_key < 1:
        return []
    scores: dict[str, list[float]] = defaultdict(list)
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    first_seen: dict[str, int] = {}
    for scored in per_proxy:
        usable = []
        for ts in scored:
            start, end = _strip_span(text, ts.start, ts.end)
            if end > start:
                usable.append((ts.score, start, end))
        if not usable:
            continue
        k = top_k_factor * n_key
        while k > len(usable) and k > 1:
            k //= 2
        ranked = sorted(usable, key=lambda x: -x[0])[:k]
        for score, start, end in ranked:
            word = text[start:end]
            first_seen.setdefault(word, len(first_seen))
            scores[word].append(score)
            spans[word].append((start, end))
    agg = sorted(scores, key=lambda w: (-sum(scores[w]) / len(scores[w]), first_seen[w]))
    out = []
    for word in agg[:n_key]:
        (start, end), _ = Counter(spans[word]).most_common(1)[0]
        out.append(KeyToken(word, start, end, sum(scores[word]) / len(scores[word])))
    return out


def _local(ref: str) -> str:
    """A model reference as a directory (:func:`calibdcd.targets.packaged.checkpoint_dir`: hub
    ids their snapshot in the local hub cache, ``packaged:<name>`` its converted checkpoint)."""
    from calibdcd.targets.packaged import checkpoint_dir

    return str(checkpoint_dir(ref))


class KeyTokenPerturber:
    """Perturb texts by replacing their key tokens; results cached on disk by their inputs.

    ``pool`` (texts) is only needed when a tiny local proxy or masked LM must be trained
    (``config.proxies`` empty / ``config.masked_lm`` None); it defaults to the texts perturbed.
    """

    def __init__(self, config: PerturbConfig, cache_dir: str | Path, *, progress: bool = True):
        self.config = config
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self._proxies = None
        self._mlm = None
        self._proxy_paths: list[str] | None = list(config.proxies) or None
        self._mlm_path: str | None = config.masked_lm
        #: the models trained here on the pool (``proxy``, ``masked_lm``): learnt parts
        self.trained: dict[str, Path] = {}

    def use_trained(self, parts: Mapping[str, Path]) -> None:
        """Use saved copies of models :meth:`prepare` trained on a pool (:attr:`trained`) as
        if trained here: nothing is trained again for them."""
        if "proxy" in parts and not self.config.proxies:
            self._proxy_paths = [str(parts["proxy"])]
            self.trained["proxy"] = Path(parts["proxy"])
        if "masked_lm" in parts and self.config.masked_lm is None:
            self._mlm_path = str(parts["masked_lm"])
            self.trained["masked_lm"] = Path(parts["masked_lm"])

    def prepare(self, pool: Sequence[str]) -> None:
        """Resolve (training if needed) the proxy and masked-LM paths. Hub ids become their
        snapshot directories in the local hub cache (named by commit, so cache keys follow)."""
        if self._proxy_paths is not None:
            self._proxy_paths = [_local(p) for p in self._proxy_paths]
        if self._mlm_path is not None:
            self._mlm_path = _local(self._mlm_path)
        if self._proxy_paths is None:
            proxy = train_causal_proxy(
                pool, self.cache_dir, self.config.mlm, progress=self.progress
            )
            self._proxy_paths = [str(proxy)]
            self.trained["proxy"] = Path(proxy)
        if self._mlm_path is None:
            mlm = train_masked_lm(pool, self.cache_dir, self.config.mlm, progress=self.progress)
            self._mlm_path = str(mlm)
            self.trained["masked_lm"] = Path(mlm)

    def _key(self) -> str:
        assert self._proxy_paths is not None and self._mlm_path is not None
        cfg = key_dict(self.config)  # fields added later key as before at their old value
        cfg.pop("proxies")
        cfg.pop("masked_lm")
        if cfg["n_key"] is None:  # the rule of earlier versions: their cached texts stay valid
            cfg.pop("n_key")
        return content_key(
            cfg,
            [_model_identity(p, self.cache_dir) for p in self._proxy_paths],
            _model_identity(self._mlm_path, self.cache_dir),
        )

    def _load(self):
        if self._proxies is None:
            self._proxies = [load_proxy(p) for p in self._proxy_paths or []]
            self._mlm = load_masked_lm(self._mlm_path)

    def key_tokens(self, text: str) -> list[KeyToken]:
        self._load()
        per_proxy = [attribute(px, text, self.config.attribution) for px in self._proxies]
        p = len(per_proxy[0]) if per_proxy else 0
        return aggregate_key_tokens(
            per_proxy, text, key_token_count(self.config, p), self.config.top_k_factor
        )

    def _replace(self, text: str, keys: list[KeyToken], seed_key: str) -> str:
        tok, model = self._mlm
        keys = sorted(keys, key=lambda k: k.start)
        chosen, last_end = [], -1
        for k in keys:  # drop overlapping spans
            if k.start >= last_end:
                chosen.append(k)
                last_end = k.end
        # context window around each mask so it survives the masked LM's length limit
        w = 2 * int(getattr(model.config, "max_position_embeddings", 512))
        masked = [
            text[max(0, k.start - w) : k.start] + tok.mask_token + text[k.end : k.end + w]
            for k in chosen
        ]
        preds = fill_mask(tok, model, masked, top_k=self.config.fill_top_k)
        rng = random.Random(f"{self.config.seed}:{seed_key}")
        out, cursor = [], 0
        for k, cands in zip(chosen, preds, strict=True):
            word = text[k.start : k.end]
            ok = [c for c in cands if c != word and _ALLOWED.match(c)]
            out.append(text[cursor : k.start])
            out.append(rng.choice(ok) if ok else word)
            cursor = k.end
        out.append(text[cursor:])
        return "".join(out)

    def perturb(self, texts: Sequence[str], pool: Sequence[str] | None = None) -> list[str]:
        """The perturbed copy r of every text (cached in ``<cache>/perturbed/<key>.jsonl``)."""
        texts = list(texts)
        self.prepare(pool if pool is not None else texts)
        path = self.cache_dir / "perturbed" / f"{self._key()}.jsonl"
        done = _read_perturbed(path)
        todo = [t for t in dict.fromkeys(texts) if content_key(t) not in done]
        if todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                bar = inner_bar(
                    todo, desc="key-token perturbation", unit="text", enabled=self.progress
                )
                for t in bar:
                    keys = self.key_tokens(t)
                    r = self._replace(t, keys, content_key(t))
                    done[content_key(t)] = r
                    row = {
                        "text_key": content_key(t),
                        "perturbed": r,
                        "key_tokens": [dataclasses.asdict(k) for k in keys],
                    }
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    f.flush()
        return [done[content_key(t)] for t in texts]


def _read_perturbed(path: Path) -> dict[str, str]:
    """The cached perturbations (text key -> perturbed text) of an append-only ``.jsonl``.

    Rows are appended one text at a time, so a killed run can leave a torn last line; a line that
    does not parse is dropped with a warning naming the file and line (those texts are redone),
    and the file is rewritten atomically with the good rows so later appends start clean."""
    done: dict[str, str] = {}
    if not path.exists():
        return done
    good: list[str] = []
    bad: list[int] = []
    with path.open("rb") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
                done[row["text_key"]] = row["perturbed"]
            except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
                bad.append(i)
                first_error = exc
                continue
            good.append(raw.decode("utf-8").rstrip("\n") + "\n")
    if bad:
        warnings.warn(
            f"{path}: {len(bad)} unreadable cache line(s) dropped (line {bad[0]}: "
            f"{type(first_error).__name__}: {first_error}); those texts are perturbed again",
            RuntimeWarning,
            stacklevel=3,
        )
        atomic_write_text(path, "".join(good))
    return done
