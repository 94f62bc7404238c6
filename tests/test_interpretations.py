"""Every setting docs/interpretations.md names as "the alternative" exists: a key of the run
config's schema, or (``detectors[NAME].options.…``) a key of that detector's options."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

DOC = Path(__file__).resolve().parents[1] / "docs" / "interpretations.md"
#: a setting as the table writes it: a key path (``a.b``, ``list[].key``,
#: ``detectors[NAME].options.key``), optionally ``: value``; a bare word is a value (``paper``)
_SETTING = re.compile(
    r"^(detectors\[(?P<det>\w+)\]\.options\.)?"
    r"(?P<path>[a-z_]+(\[\])?(\.[a-z_]+(\[\])?)*)(?P<value>: .+)?$"
)


def _is_setting(token: str) -> bool:
    m = _SETTING.match(token)
    return bool(m) and ("." in m["path"] or "[" in token or m["value"] is not None)


def _detector_config(name: str) -> type:
    if name == "veilprobe":
        from calibdcd.detectors.veilprobe.config import VeilProbeConfig

        return VeilProbeConfig
    if name == "dpdllm":
        from calibdcd.detectors.dpdllm.detector import DPDLLMConfig

        return DPDLLMConfig
    from calibdcd.detectors.registry import create_detector_config

    return type(create_detector_config(name))  # any registered detector's config class


def _unwrap(tp: typing.Any) -> list[typing.Any]:
    """The classes a field's annotation may hold (Optional, Annotated, list[...] opened)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin is not None:
        return [c for a in typing.get_args(tp) for c in _unwrap(a)]
    return [tp]


def _fields(cls: typing.Any) -> dict[str, typing.Any]:
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return {k: f.annotation for k, f in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls):
        return typing.get_type_hints(cls)
    return {}


def _resolves(root: type, path: str) -> bool:
    classes = [root]
    for part in path.split("."):
        name = part.removesuffix("[]")
        found = [f[name] for c in classes if name in (f := _fields(c))]
        if not found:
            return False
        classes = [c for tp in found for c in _unwrap(tp)]
    return True


def _named_settings() -> list[str]:
    rows = [ln for ln in DOC.read_text().splitlines() if ln.startswith("| ") and "---" not in ln]
    header, *body = rows
    assert header.split("|")[-2].strip().startswith("The alternative"), header
    named = []
    for row in body:
        cell = row.split("|")[-2]
        named += [t for t in re.findall(r"`([^`]+)`", cell) if _is_setting(t)]
    return named


def test_the_table_names_settings():
    assert len(_named_settings()) >= 15


@pytest.mark.parametrize("setting", _named_settings())
def test_every_named_setting_exists(setting):
    from calibdcd.experiment.config import ExperimentConfig

    m = _SETTING.match(setting)
    assert m is not None
    root = _detector_config(m["det"]) if m["det"] else ExperimentConfig
    assert _resolves(root, m["path"]), f"{setting}: no such key in {root.__name__}"
