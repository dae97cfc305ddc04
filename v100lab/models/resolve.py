"""One entry point from any model argument to (path or None, ModelSpec).

A model is named in one of these ways, and :func:`resolve` turns each into the file it denotes (if any)
and its :class:`~v100lab.facts.spec.ModelSpec`:

* a zoo alias — ``default``, ``gemma3-270m``, ``synth-tiny``, ``synth-1b:Q4_0``, ``default:Q8_0`` … —
  found on disk by :func:`v100lab.models.zoo.model_path`. A synthetic model or a quant ladder rung that is not
  built yet is built only when the caller says so (``build=True``); otherwise the one-line error names
  the command that builds it;
* a path to a GGUF file (``str`` or ``os.PathLike``);
* an http(s) URL of a GGUF file: the header is read with Range requests; there is no local path;
* ``skeleton:ARCH:QUANT`` — an architecture spec (a shipped name or a YAML path) quantized to QUANT,
  described in memory by :func:`v100lab.gguf.skeleton.skeleton_spec`; there is no file;
* a binary file object, read from its current position; there is no path.

The GGUF reader (:mod:`v100lab.gguf.header`) parses a path, URL or file object only; the zoo finds and builds
files; this module is the one place that chooses between them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from v100lab.models import zoo
from v100lab.gguf.header import DEFAULT_MAX_HEADER_BYTES, is_url, read_spec
from v100lab.gguf.skeleton import parse_skeleton_name, skeleton_spec
from v100lab.facts.spec import ModelSpec


class ResolvedModel(NamedTuple):
    """A model argument resolved: ``path`` is the GGUF file on this machine (None for a URL, a skeleton
    or a file object) and ``spec`` its ModelSpec. Unpacks as ``path, spec = resolve(model)``."""

    path: Path | None
    spec: ModelSpec


def resolve(model, *, build: bool = False, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
            timeout: float = 30) -> ResolvedModel:
    """``model`` (alias, path, URL, ``skeleton:ARCH:QUANT`` or binary file object) → (path or None, ModelSpec).

    ``build=True`` lets a zoo alias whose file is missing be built (a synthetic model written, a ladder
    rung quantized by llama.cpp); without it a missing alias raises
    :class:`~v100lab.base.errors.ModelNotFoundError` naming ``v100lab models make``. ``max_header_bytes`` and
    ``timeout`` bound the header read (see :func:`v100lab.gguf.header.read_header`)."""
    if hasattr(model, "read"):
        return ResolvedModel(None, read_spec(model, max_header_bytes=max_header_bytes, timeout=timeout))
    parsed = parse_skeleton_name(model)
    if parsed is not None:
        return ResolvedModel(None, skeleton_spec(*parsed))
    if isinstance(model, str) and is_url(model):
        return ResolvedModel(None, read_spec(model, max_header_bytes=max_header_bytes, timeout=timeout))
    path = _model_path(model, build=build)
    return ResolvedModel(path, read_spec(path, max_header_bytes=max_header_bytes, timeout=timeout))


def _model_path(model: str | os.PathLike, *, build: bool = False) -> Path:
    """The GGUF file an alias or path names (an existing path is taken as it is, before any alias)."""
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    return zoo.model_path(text, build=build)
