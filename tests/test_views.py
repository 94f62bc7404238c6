"""The view bank: exact universal prefixes, family boundaries, and template derivation."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from calibdcd.cli import app
from calibdcd.views import (
    ORIGINAL,
    View,
    family_views,
    strip_reasoning,
    template_views,
    universal_views,
    view_bank,
)

# The official chat templates of the three paper families, abridged to the branches that a
# conversation of one user message (no tools) takes. Written from the published templates.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA31_TEMPLATE = (
    "{{- bos_token }}"
    '{%- set date_string = "26 Jul 2024" %}'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}'
    '{{- "Today Date: " + date_string + "\\n\\n" }}'
    '{{- "<|eot_id|>" }}'
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
DEEPSEEK_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)


def _tokenizer(template: str, bos: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>"] + ([bos] if bos else [])
    vocab = {t: i for i, t in enumerate([*specials, "x", "y"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab[bos])]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token=bos, chat_template=template
    )


def test_universal_views_exactly_as_paper():
    views = universal_views()
    assert [v.code for v in views] == [f"U{i}" for i in range(1, 9)]
    assert [v.prefix for v in views] == [
        "Assistant:\n\n",
        "User:\n",
        "Response:\n\n",
        "Answer:\n\n",
        "Reasoning:\n\n",
        "Final answer:\n\n",
        "Summary:\n\n",
        "Continue the text:\n",
    ]
    assert all(v.suffix == "" for v in views)
    assert views[0].apply("Call me Ishmael.") == "Assistant:\n\nCall me Ishmael."
    assert ORIGINAL.apply("abc") == "abc"


def test_view_is_frozen_and_checks_input():
    v = View("X", "x", "a", "b")
    assert v("q") == "aqb"
    with pytest.raises(AttributeError):
        v.prefix = "z"  # type: ignore[misc]
    with pytest.raises(ValueError, match="query"):
        v.apply(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("family", "codes", "suffixes"),
    [
        (
            "qwen2.5",
            ["Q1", "Q2"],
            ["<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>assistant\n\n"],
        ),
        (
            "llama3.1",
            ["L1", "L2"],
            [
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            ],
        ),
        ("deepseek-r1-distill-qwen", ["D1", "D2"], ["<｜Assistant｜>", "<｜Assistant｜><think>\n"]),
    ],
)
def test_family_boundaries(family, codes, suffixes):
    views = family_views(family)
    assert [v.code for v in views] == codes
    assert [v.suffix for v in views] == suffixes
    bank = view_bank(family)
    assert len(bank) == 10 and len({v.code for v in bank}) == 10
    # the text is kept verbatim (no trimming), between the user header and the boundary
    q = "  Some text\n"
    for v in views:
        out = v.apply(q)
        assert q in out and out.endswith(v.suffix)


@pytest.mark.parametrize(
    ("family", "template", "bos"),
    [
        ("qwen2.5", QWEN25_TEMPLATE, None),
        ("llama3.1", LLAMA31_TEMPLATE, "<|begin_of_text|>"),
        ("deepseek-r1-distill-qwen", DEEPSEEK_TEMPLATE, "<｜begin▁of▁sentence｜>"),
    ],
)
def test_template_derivation_reproduces_handwritten_views(family, template, bos):
    """The generic derivation applied to each family's official template gives the same two
    prompts as the hand-written views (so lab/other families get the same kind of pair)."""
    tok = _tokenizer(template, bos)
    derived = template_views(tok, family=family)
    official = family_views(family)
    for d, o in zip(derived, official, strict=True):
        assert (d.prefix, d.suffix) == (o.prefix, o.suffix)
        # the BOS the tokenizer adds by itself is not duplicated into the prompt
        if bos:
            assert not d.prefix.startswith(bos)
    # and the tokenizer path is what family_views uses for unknown families
    lab = family_views("lab-qwen", tok)
    assert [(v.prefix, v.suffix) for v in lab] == [(v.prefix, v.suffix) for v in derived]
    assert all(v.name.startswith("lab-qwen-") for v in lab)


def test_system_none_drops_system_turn():
    q1 = family_views("qwen2.5", system="none")[0]
    assert q1.prefix == "<|im_start|>user\n"
    l2 = family_views("llama3.1", system="none")[1]
    assert "Cutting Knowledge" not in l2.prefix
    assert "You are Qwen" in family_views("qwen2.5")[0].prefix


def test_unknown_family_errors():
    with pytest.raises(ValueError, match="tokenizer"):
        family_views("mystery")
    with pytest.raises(ValueError, match="chat_template"):
        template_views(_tokenizer(None, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="system"):
        family_views("qwen2.5", system="other")  # type: ignore[arg-type]


def test_strip_reasoning():
    assert strip_reasoning("<think>\nhmm\n</think>\n\nAnswer.") == "Answer."
    assert strip_reasoning("hmm, so</think>Answer.") == "Answer."  # D2: opener in the prompt
    assert strip_reasoning("A <think>x</think>B") == "A B"
    assert strip_reasoning("<think>never closed") == ""
    assert strip_reasoning("plain text") == "plain text"


def test_cli_views_json():
    res = CliRunner().invoke(app, ["views", "--family", "qwen2.5", "--json", "--text", "T!"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["code"] for r in rows] == ["E0", *[f"U{i}" for i in range(1, 9)], "Q1", "Q2"]
    assert rows[0]["prompt"] == "T!"
    assert rows[1]["prompt"] == "Assistant:\n\nT!"
    assert rows[-1]["prompt"].endswith("T!<|im_end|>\n<|im_start|>assistant\n\n")
    bad = CliRunner().invoke(app, ["views", "--family", "nope"])
    assert bad.exit_code != 0


def test_cli_views_from_tokenizer_dir(tmp_path):
    _tokenizer(QWEN25_TEMPLATE, None).save_pretrained(tmp_path)
    res = CliRunner().invoke(app, ["views", "--tokenizer", str(tmp_path), "--json", "--text", "T"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [r["code"] for r in rows[-2:]] == ["T1", "T2"]
    assert [r["prompt"] for r in rows[-2:]] == [v.apply("T") for v in family_views("qwen2.5")]


def test_one_resolver_says_where_a_targets_views_come_from(tmp_path):
    """target_views: a served model's family from its name; `tokenizer: server` only for a
    served target; an unreachable server asked for its template is one line naming it."""
    from calibdcd.experiment.config import TargetEntry
    from calibdcd.experiment.target_entries import target_views
    from calibdcd.targets.server_template import ServerTemplateError

    def served(model, **kw):
        opts = {"base_url": "http://127.0.0.1:9/v1", "dialect": "vllm"}
        return TargetEntry(name="t", backend="openai", model=model, options=opts, **kw)

    views = target_views(served("Qwen/Qwen2.5-7B-Instruct"), "official", dry=True)
    assert views is not None and [v.code for v in views][-2:] == ["Q1", "Q2"]
    with pytest.raises(ServerTemplateError, match=r"127\.0\.0\.1:9/tokenize: cannot reach"):
        target_views(served("my-finetune"), "official", dry=True)
    with pytest.raises(ServerTemplateError, match="cannot reach"):
        target_views(served("Qwen/Qwen2.5-7B-Instruct", tokenizer="server"), "official")
    hf = TargetEntry(name="t", backend="hf", model="gpt2", tokenizer="server")
    with pytest.raises(ValueError, match="'server' needs a served target"):
        target_views(hf, "official", root=tmp_path)


def test_a_server_templates_error_quotes_its_answer_with_secrets_masked_before_the_cut():
    """The server-template reader quoted `r.text[:200]` itself: a secret the answer echoes
    (an Authorization header) cut at the limit kept its first part through the later
    redaction. It quotes with the one quoting the completions client uses (redact.quote_answer:
    masked, then cut)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from calibdcd.redact import register_secret
    from calibdcd.targets.server_template import ServerChatTemplate, ServerTemplateError

    secret = "sk-proj-" + "7f3a9c2e" * 6
    register_secret(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # a proxy error page that echoes the request's headers
            self.rfile.read(int(self.headers["Content-Length"]))
            body = ("x" * 170 + " authorization: Bearer " + secret).encode()
            self.send_response(502)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/completions"
        tpl = ServerChatTemplate(url, "m", headers={"Authorization": f"Bearer {secret}"})
        with pytest.raises(ServerTemplateError, match="HTTP 502") as err:
            tpl.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    finally:
        httpd.shutdown()
    msg = str(err.value)
    assert secret[:12] not in msg and "sk-proj" not in msg, msg
    assert "authorization: Bearer ***" in msg, msg  # masked whole, within the limit
