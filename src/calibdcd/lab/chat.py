"""Chat styles of the lab's post-trained models.

Three styles mimic the chat formats whose model-specific views CalibDCD exercises:

``qwen2.5``
    ``<|im_start|>role\\n...<|im_end|>\\n`` turns with a default system turn (Qwen2.5-Instruct).
``llama3.1``
    ``<|begin_of_text|><|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>`` with the
    Llama 3.1 knowledge-date system block.
``deepseek-r1-distill-qwen``
    ``<｜begin▁of▁sentence｜>{system}<｜User｜>...<｜Assistant｜><think>\\n...\\n</think>\\n\\n
    answer<｜end▁of▁sentence｜>`` (DeepSeek-R1-Distill): the generation prompt opens the think
    block and earlier assistant turns are shown without their reasoning.

Each style is a Jinja ``chat_template`` (stored in the tokenizer) plus a pure-Python renderer
that produces exactly the same string; the tests check that the two agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

__all__ = [
    "CHAT_STYLES",
    "ENDOFTEXT",
    "PAD",
    "SPECIAL_TOKENS",
    "ChatStyle",
    "get_style",
    "render_chat",
    "split_reasoning",
]

ENDOFTEXT = "<|endoftext|>"
PAD = "<|pad|>"
# DeepSeek's special tokens use fullwidth bars (U+FF5C) and the lower-one-eighth block (U+2581).
DS_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
DS_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
DS_USER = "<\uff5cUser\uff5c>"
DS_ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

#: every chat token of every style; all are added special tokens of the base tokenizer
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    PAD,
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    DS_BOS,
    DS_EOS,
    DS_USER,
    DS_ASSISTANT,
    THINK_OPEN,
    THINK_CLOSE,
)

QWEN_SYSTEM = "You are a helpful assistant."
LLAMA_SYSTEM_HEADER = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"

_QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QWEN_SYSTEM + "<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_LLAMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set system_message = '' %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message + '<|eot_id|>' }}"
    "{%- for message in loop_messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

_R1_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '" + DS_USER + "' + message['content'] }}"
    "{%- else %}"
    "{%- set content = message['content'] %}"
    "{%- if not loop.last and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip() %}"
    "{%- endif %}"
    "{{- '" + DS_ASSISTANT + "' + content + '" + DS_EOS + "' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '" + DS_ASSISTANT + "<think>\\n' }}{%- endif %}"
)


@dataclasses.dataclass(frozen=True)
class ChatStyle:
    name: str  # also the Target.family a detector sees
    dirname: str  # sub-directory of the lab
    lab_family: str  # calibdcd.json "family"
    template: str  # Jinja chat template
    bos_token: str | None  # what the template starts with (None: nothing)
    eos_token: str  # end of an assistant turn
    reasoning: bool = False  # answers after a <think>...</think> block

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        """Generation stops at the end of the assistant turn or at a document end."""
        return (self.eos_token, ENDOFTEXT)


CHAT_STYLES: dict[str, ChatStyle] = {
    "qwen2.5": ChatStyle("qwen2.5", "chat-qwen", "lab-qwen", _QWEN_TEMPLATE, None, "<|im_end|>"),
    "llama3.1": ChatStyle(
        "llama3.1", "chat-llama", "lab-llama", _LLAMA_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>"
    ),
    "deepseek-r1-distill-qwen": ChatStyle(
        "deepseek-r1-distill-qwen",
        "chat-reasoning",
        "lab-reasoning",
        _R1_TEMPLATE,
        DS_BOS,
        DS_EOS,
        reasoning=True,
    ),
}


def get_style(name: str) -> ChatStyle:
    if name not in CHAT_STYLES:
        raise ValueError(f"unknown chat style {name!r}; choose one of {sorted(CHAT_STYLES)}")
    return CHAT_STYLES[name]


def _check_messages(messages: Sequence[Mapping[str, str]]) -> None:
    if not messages:
        raise ValueError("messages must not be empty")
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{i}]['role'] must be system/user/assistant, got {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}]['content'] must be a string")


def render_chat(
    style: ChatStyle | str,
    messages: Sequence[Mapping[str, str]],
    add_generation_prompt: bool = False,
) -> str:
    """Render ``messages`` exactly as the style's Jinja template does (pure Python)."""
    st = get_style(style) if isinstance(style, str) else style
    _check_messages(messages)
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = list(messages[1:] if system is not None else messages)
    out: list[str] = []
    if st.name == "qwen2.5":
        out.append(f"<|im_start|>system\n{QWEN_SYSTEM if system is None else system}<|im_end|>\n")
        for m in turns:
            out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
    elif st.name == "llama3.1":
        out.append(st.bos_token or "")
        out.append(
            "<|start_header_id|>system<|end_header_id|>\n\n"
            f"{LLAMA_SYSTEM_HEADER}{system or ''}<|eot_id|>"
        )
        for m in turns:
            out.append(
                f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
            )
        if add_generation_prompt:
            out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    elif st.name == "deepseek-r1-distill-qwen":
        out.append((st.bos_token or "") + (system or ""))
        for i, m in enumerate(turns):
            if m["role"] == "user":
                out.append(DS_USER + m["content"])
            else:
                content = m["content"]
                if i != len(turns) - 1 and THINK_CLOSE in content:
                    content = content.split(THINK_CLOSE)[-1].lstrip()
                out.append(DS_ASSISTANT + content + DS_EOS)
        if add_generation_prompt:
            out.append(DS_ASSISTANT + "<think>\n")
    else:  # pragma: no cover - guarded by get_style
        raise ValueError(st.name)
    return "".join(out)


def split_reasoning(completion: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of a reasoning-style completion.

    The answer is the text after the last ``</think>``; a completion that never closes its think
    block has no answer (the whole text is reasoning).
    """
    if THINK_CLOSE not in completion:
        return completion, ""
    reasoning, answer = completion.rsplit(THINK_CLOSE, 1)
    return reasoning, answer.lstrip("\n")
