"""A served model's chat template, rendered by its server.

CalibDCD's two model-specific views come from the target's chat template
(:func:`calibdcd.views.template_views`). For a served model without a built-in family and without a
local tokenizer, the server itself can render the template: vLLM's ``POST /tokenize`` takes chat
``messages`` and returns the token ids of the rendered prompt (the template as the server applies
it to every chat request), and ``POST /detokenize`` turns ids back into text.
:class:`ServerChatTemplate` wraps the two in the small part of a transformers tokenizer's
interface that :func:`~calibdcd.views.template_views` reads, so the views are derived exactly as
from a local tokenizer (tests/test_real_server.py checks both give the same views on vLLM).

Only servers with these endpoints can do it: vLLM (tested, tests/test_real_server.py); SGLang's
endpoints of the same names are read the same way (its ``/detokenize`` answers ``text`` where
vLLM answers ``prompt``, and skips special tokens unless told not to), not tested here. For any
other server the error says to name a ``family`` or a ``tokenizer``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerChatTemplate", "ServerTemplateError", "server_root"]


class ServerTemplateError(ValueError):
    """The server cannot render the chat template (one line, naming the server)."""


def server_root(completions_url: str) -> str:
    """``http://host:port`` (with any path prefix a router adds) from a completions endpoint:
    vLLM serves ``/tokenize`` beside ``/v1``, not under it."""
    url = completions_url.removesuffix("/completions")
    return url.removesuffix("/v1")


class ServerChatTemplate:
    """A tokenizer stand-in whose chat template and tokenizer are the server's.

    ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` returns the text
    the server's template renders; calling it on a string returns ``{"input_ids": [...]}`` as
    the server tokenizes a completion prompt (``add_special_tokens`` as asked); ``bos_token`` /
    ``bos_token_id`` are the token the server adds by itself in front of a completion prompt
    (None when it adds none), read by comparing the two tokenizations of one word.
    """

    #: read by :func:`calibdcd.views.template_views` only as "has a template"
    chat_template = "<rendered by the server>"

    def __init__(
        self,
        completions_url: str,
        model: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.root = server_root(completions_url)
        self.model = model
        self.headers = dict(headers or {})
        self.timeout = timeout
        self._bos: tuple[str | None, int | None] | None = None

    @property
    def where(self) -> str:
        from calibdcd.redact import redact_url

        return redact_url(self.root)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        from calibdcd.redact import quote_answer

        try:
            with httpx.Client(timeout=self.timeout, follow_redirects=False) as c:
                r = c.post(
                    self.root + path, json={"model": self.model, **body}, headers=self.headers
                )
        except httpx.HTTPError as exc:
            raise ServerTemplateError(
                f"{self.where}{path}: cannot reach the server ({type(exc).__name__}: {exc})"
            ) from None
        if r.status_code in (404, 405, 501):
            # (vLLM also answers 404 for a model it does not serve: the body says which)
            raise ServerTemplateError(
                f"{self.where}: the server cannot render its chat template ({path} answers HTTP "
                f"{r.status_code}: {quote_answer(r.text, 160)}; vLLM can): name the target's "
                "family, or a local tokenizer with its template (tokenizer: PATH)"
            )
        if r.status_code != 200:
            raise ServerTemplateError(
                f"{self.where}{path}: HTTP {r.status_code}: {quote_answer(r.text, 200)}"
            )
        try:
            out = r.json()
        except ValueError:
            out = None
        if not isinstance(out, dict):
            raise ServerTemplateError(
                f"{self.where}{path}: not a JSON object: {quote_answer(r.text, 200)}"
            )
        return out

    def _ids(self, body: dict[str, Any], path: str = "/tokenize") -> list[int]:
        out = self._post(path, body)
        ids = out.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ServerTemplateError(
                f"{self.where}{path}: no token ids in the answer: {out!r:.200}"
            )
        return ids

    def _text(self, ids: list[int]) -> str:
        # special tokens kept (vLLM keeps them; SGLang drops them unless told not to)
        out = self._post("/detokenize", {"tokens": ids, "skip_special_tokens": False})
        text = out.get("prompt", out.get("text"))
        if not isinstance(text, str):
            raise ServerTemplateError(
                f"{self.where}/detokenize: no text in the answer: {out!r:.200}"
            )
        return text

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **_: Any,
    ) -> str | list[int]:
        # add_special_tokens=False: the template's own special tokens only (as a chat request)
        ids = self._ids(
            {
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "add_special_tokens": False,
            }
        )
        return ids if tokenize else self._text(ids)

    def __call__(
        self, text: str, add_special_tokens: bool = True, **_: Any
    ) -> dict[str, list[int]]:
        return {"input_ids": self._ids({"prompt": text, "add_special_tokens": add_special_tokens})}

    def _auto_bos(self) -> tuple[str | None, int | None]:
        if self._bos is None:
            plain = self("x", add_special_tokens=False)["input_ids"]
            special = self("x", add_special_tokens=True)["input_ids"]
            # a BOS in front (and perhaps an EOS behind, as some tokenizers add)
            if len(special) > len(plain) and special[1 : len(plain) + 1] == plain:
                self._bos = (self._text(special[:1]), special[0])
            else:
                self._bos = (None, None)
        return self._bos

    @property
    def bos_token(self) -> str | None:
        return self._auto_bos()[0]

    @property
    def bos_token_id(self) -> int | None:
        return self._auto_bos()[1]
