"""The blind baseline: a model-free text classifier that never queries the target.

TF-IDF over word 1-2-grams + logistic regression (scikit-learn), trained on a setting's
supervised split and scored on its evaluation pool. Members and non-members of most membership
benchmarks come from different distributions (dates, topics, books), and this classifier reads
only that difference. A detector whose AUC does not exceed this row's has shown nothing about
the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["BLIND_LABEL", "blind_scores"]

BLIND_LABEL = "Blind (TF-IDF + LR)"


def blind_scores(
    train_texts: Sequence[str],
    train_labels: Sequence[int] | np.ndarray,
    texts: Sequence[str],
    *,
    seed: int = 0,
) -> np.ndarray:
    """Fit TF-IDF (word 1-2-grams, sublinear tf) + L2 logistic regression on the labelled
    texts and return its decision values (higher = member) for ``texts``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    y = np.asarray(train_labels).astype(int)
    if len(train_texts) != y.size:
        raise ValueError(f"{len(train_texts)} training texts but {y.size} labels")
    if set(np.unique(y).tolist()) != {0, 1}:
        raise ValueError("the blind baseline needs members (1) and non-members (0) to train on")
    model = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True),
        LogisticRegression(C=1.0, max_iter=1000, random_state=seed),
    )
    model.fit(list(train_texts), y)
    return np.asarray(model.decision_function(list(texts)), dtype=np.float64)
