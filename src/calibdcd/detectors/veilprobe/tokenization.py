"""WordPiece tokenizers trained offline on a text pool (BERT-style specials).

The official code uses ``bert-base-uncased`` (mapping model) and ``bert-base-cased`` (fill-mask);
neither can be downloaded here, so VeilProbe trains a tokenizer of the same kind on the texts it
is given. Any local tokenizer directory can be used instead.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SPECIAL_TOKENS", "train_wordpiece"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece(texts: Iterable[str], *, vocab_size: int, lowercase: bool):
    """A fast BERT-style tokenizer (``[CLS] text [SEP]``, pad id 0) trained on ``texts``;
    the same texts always give the same vocabulary.

    ``tokenizers``' own WordPiece trainer is not reproducible across processes: it numbers the
    ``##``-continuation symbols in hash-map order and breaks ties between equally frequent merges
    by those numbers, so two runs on the same texts learn different vocabularies (and every
    model trained on top differs; VeilProbe's lab AUC moved by up to 8 points between runs).
    Its BPE trainer without a continuation prefix is reproducible (the alphabet is numbered in
    sorted order), so the pieces are learnt by BPE and each becomes both a word-initial piece
    ``p`` and a continuation piece ``##p`` of the WordPiece vocabulary (about ``vocab_size / 2``
    pieces each way).
    """
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    if vocab_size < len(SPECIAL_TOKENS) + 2:
        raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS) + 1}, got {vocab_size}")
    normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizer
    bpe.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    n_pieces = (vocab_size - len(SPECIAL_TOKENS)) // 2
    bpe.train_from_iterator(
        list(texts), trainers.BpeTrainer(vocab_size=n_pieces, show_progress=False)
    )
    pieces = sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for piece, _ in pieces:
        for token in (piece, f"##{piece}"):
            vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
