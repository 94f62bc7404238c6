"""VeilProbe's offline-trained WordPiece tokenizer: reproducible across processes (tokenizers'
own WordPiece trainer is not), BERT-style specials, lossless on its training words."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from calibdcd.detectors.veilprobe.tokenization import SPECIAL_TOKENS, train_wordpiece

TEXTS = [
    "The exponent of a result has been altered in order to fit the constraints.",
    "Return a new array of bytes, optionally initialised from an iterable of integers.",
    "Raised when an operation or function receives an argument of the right type.",
    "The interpreter caches small integers; identity tests on them are an accident.",
] * 5

_SCRIPT = """
import json, sys
from calibdcd.detectors.veilprobe.tokenization import train_wordpiece
texts = json.loads(sys.stdin.read())
print(json.dumps(train_wordpiece(texts, vocab_size=300, lowercase=False).get_vocab()))
"""


def _vocab_in_a_new_process() -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        input=json.dumps(TEXTS),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_same_texts_give_the_same_vocabulary_in_every_process():
    # each process has its own hash-map seeds: the library's WordPiece trainer numbered the
    # continuation pieces differently in every one of these
    first, second = _vocab_in_a_new_process(), _vocab_in_a_new_process()
    assert first == second
    assert first == train_wordpiece(TEXTS, vocab_size=300, lowercase=False).get_vocab()


def test_bert_layout_and_round_trip():
    tok = train_wordpiece(TEXTS, vocab_size=300, lowercase=True)
    vocab = tok.get_vocab()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.pad_token_id == 0 and len(vocab) <= 300
    assert any(t.startswith("##") for t in vocab) and "the" in vocab
    ids = tok("The interpreter caches small integers.")["input_ids"]
    assert ids[0] == vocab["[CLS]"] and ids[-1] == vocab["[SEP]"]
    assert vocab["[UNK]"] not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "the interpreter caches small integers."
    assert tok("[MASK] caches")["input_ids"][1] == vocab["[MASK]"]
    with pytest.raises(ValueError, match="vocab_size"):
        train_wordpiece(TEXTS, vocab_size=6, lowercase=False)
