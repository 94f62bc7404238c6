"""Post-training data the lab generates itself: instruction/response pairs in an assistant
register, built from background texts only (never from members or non-members).

Tasks (weights in :data:`TASK_WEIGHTS`): continue a text from its first half, summarise it in
one sentence, say what it is about, count its words, name its last word, and short chit-chat.
The same seeded conversations are rendered in every chat style; the reasoning style's assistant
turns carry a short ``<think>`` block before the answer.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from calibdcd.lab.chat import ENDOFTEXT, ChatStyle, render_chat
from calibdcd.lab.pool import PoolText
from calibdcd.lab.train import SFTExample

__all__ = ["TASK_WEIGHTS", "Conversation", "make_conversations", "tokenize_conversations"]

Conversation = tuple[str, str, str]  # (user, reasoning, answer)

TASK_WEIGHTS: dict[str, float] = {
    "continue": 0.40,
    "summarize": 0.15,
    "topic": 0.15,
    "count": 0.10,
    "last_word": 0.10,
    "chat": 0.10,
}

_CHITCHAT: tuple[tuple[str, str], ...] = (
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi, who are you?", "I am a helpful assistant. Ask me anything about a text."),
    ("Thank you!", "You're welcome! Let me know if there is anything else I can help with."),
    ("What can you do?", "I can continue, summarize and explain texts for you."),
    ("Good morning.", "Good morning! What would you like to work on?"),
    ("Can you help me?", "Of course. Please tell me what you need."),
    ("Are you a person?", "No, I am an AI assistant, but I am happy to help."),
    ("Bye!", "Goodbye! Have a great day."),
)

_REASONING = {
    "continue": "The user wants me to continue the text. I will write how it goes on.",
    "summarize": "The user wants a one-sentence summary. The first sentence states the main point.",
    "topic": "The user asks what the text is about. I will name its subject.",
    "count": "The user asks for the number of words. I will count them.",
    "last_word": "The user asks for the last word of the text. I will look at its end.",
    "chat": "The user is chatting. I will answer politely.",
}


def _first_sentence(text: str) -> str:
    m = re.search(r"^(.+?[.!?])(\s|$)", text)
    return m.group(1) if m else text


def _subject(source: str) -> str | None:
    if source.startswith("pydoc:"):
        return f'It is about the Python language topic "{source[6:]}".'
    if source.endswith(".py") or ".py:" in source:
        module = source.split(":", 1)[0][:-3].replace("/", ".").removesuffix(".__init__")
        return f'It is about the Python module "{module}".'
    return None


def _conversation(task: str, item: PoolText, rng: random.Random) -> Conversation | None:
    text = item.text
    words = text.split()
    if task == "continue":
        half = len(words) // 2
        return (
            f"Continue the text:\n{' '.join(words[:half])}",
            _REASONING[task],
            " ".join(words[half:]),
        )
    if task == "summarize":
        return (
            f"Summarize in one sentence:\n{text}",
            _REASONING[task],
            f"In short: {_first_sentence(text)}",
        )
    if task == "topic":
        subject = _subject(item.source)
        if subject is None:
            return None
        return (f"What is this text about?\n{text}", _REASONING[task], subject)
    if task == "count":
        return (
            f"How many words are in this text?\n{text}",
            _REASONING[task],
            f"The text has {len(words)} words.",
        )
    if task == "last_word":
        last = re.sub(r"\W+$", "", words[-1]) or words[-1]
        return (
            f"What is the last word of this text?\n{text}",
            _REASONING[task],
            f'The last word is "{last}".',
        )
    if task == "chat":
        user, answer = _CHITCHAT[rng.randrange(len(_CHITCHAT))]
        return (user, _REASONING[task], answer)
    raise ValueError(f"unknown post-training task {task!r}")


def make_conversations(
    texts: Sequence[PoolText], n: int, seed: int
) -> list[Conversation | PoolText]:
    """``n`` seeded examples; a :class:`PoolText` entry is a replay document (see callers)."""
    if not texts:
        raise ValueError("post-training needs background texts, got none")
    rng = random.Random(f"calibdcd-lab-sftdata-{seed}")
    tasks = list(TASK_WEIGHTS)
    weights = [TASK_WEIGHTS[t] for t in tasks]
    out: list[Conversation | PoolText] = []
    while len(out) < n:
        task = rng.choices(tasks, weights)[0]
        conv = _conversation(task, texts[rng.randrange(len(texts))], rng)
        if conv is not None:
            out.append(conv)
    return out


def tokenize_conversations(
    conversations: Sequence[Conversation],
    replay: Sequence[PoolText],
    style: ChatStyle,
    tokenizer,
    max_len: int,
) -> list[SFTExample]:
    """Token ids with labels on the assistant turn (through its end token) only.

    Replay documents are ``<|endoftext|>`` + text with the loss on every text token.
    """
    eos_id = tokenizer.convert_tokens_to_ids(style.eos_token)
    out: list[SFTExample] = []
    for user, reasoning, answer in conversations:
        content = f"<think>\n{reasoning}\n</think>\n\n{answer}" if style.reasoning else answer
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": content}]
        prompt = render_chat(style, msgs[:1], add_generation_prompt=True)
        full = render_chat(style, msgs)
        if not full.startswith(prompt):
            raise ValueError(f"{style.name}: the generation prompt is not a prefix of the chat")
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        f_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if f_ids[: len(p_ids)] != p_ids:
            raise ValueError(f"{style.name}: prompt tokens are not a prefix of the full chat")
        if len(f_ids) > max_len:
            continue
        end = max(i for i, t in enumerate(f_ids) if t == eos_id) + 1
        labels = [-100] * len(p_ids) + f_ids[len(p_ids) : end] + [-100] * (len(f_ids) - end)
        out.append(SFTExample(f_ids, labels))
    sep = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    for doc in replay:
        ids = [sep, *tokenizer(doc.text, add_special_tokens=False)["input_ids"]][:max_len]
        out.append(SFTExample(ids, [-100, *ids[1:]]))
    return out
