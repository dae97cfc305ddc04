"""``RunConfig``: llama.cpp's run-time flags, with llama.cpp's defaults, validated.

Field names follow ``common_params`` / ``llama_context_params`` (llama.cpp common/common.h,
include/llama.h); each field lists its llama-server flag. Defaults are llama.cpp's own (common.h), not
llama-cpp-python's — where llama-cpp-python's ``Llama()`` differs (n_ctx 512, n_gpu_layers 0,
swa_full on) ``to_llama_kwargs`` always passes our value explicitly, so both backends run the same
configuration.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from v100lab.base.errors import ConfigError
from v100lab.base.safeio import short_repr

# common/arg.cpp: kv_cache_types (the values --cache-type-k/-v accept)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN = ("on", "off", "auto")
# common/arg.cpp common_arg_utils::is_truthy / is_falsey / is_autoy: the spellings -fa accepts
FLASH_ATTN_SPELLINGS = {"on": "on", "enabled": "on", "true": "on", "1": "on",
                        "off": "off", "disabled": "off", "false": "off", "0": "off",
                        "auto": "auto", "-1": "auto"}
# src/llama.cpp llama_max_devices() (16); common/arg.cpp -ts refuses split_arg.size() >= llama_max_devices()
MAX_DEVICES = 16
# llama.cpp include/llama.h: a token's position (llama_pos) is an int32_t, so no context holds more
MAX_POSITIONS = 2**31 - 1
# include/llama.h: the C types of llama_context_params / llama_model_params fields (ctypes would wrap a
# larger value silently, so it is refused here)
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
# llama.cpp include/llama.h: enum llama_flash_attn_type
FLASH_ATTN_ENUM = {"auto": -1, "off": 0, "on": 1}
# ggml type enum values (ggml/include/ggml.h) for llama_context_params.type_k/type_v
GGML_TYPE_ID = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                "iq4_nl": 20, "bf16": 30}

ALL_LAYERS = 999  # llama.cpp clamps -ngl to n_layer + 1; 999 means "every layer"
#: llama.cpp's load modes by name (``--load-mode``) → llama_cpp's ``LLAMA_LOAD_MODE_*`` constant
LOAD_MODE_CONSTANTS = {"none": "LLAMA_LOAD_MODE_NONE", "mmap": "LLAMA_LOAD_MODE_MMAP",
                       "mlock": "LLAMA_LOAD_MODE_MLOCK", "mmap+mlock": "LLAMA_LOAD_MODE_MMAP_MLOCK"}

# common/common.h (the vendored llama.cpp): LLM_FFN_EXPS_REGEX, the tensors --cpu-moe keeps on the CPU, and
# llm_ffn_block_regex / llm_add_n_cpu_ffn_overrides: --n-cpu-moe N adds "blk\.<i>" + that regex for i < N
LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU_BUFT = "CPU"

# common/speculative.cpp common_speculative_type_from_name: the values --spec-type accepts
SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# the types that need a draft model file (-md); the other draft-* read extra layers of the target itself
SPEC_TYPES_WITH_MODEL = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
# common/common.h common_params_speculative_ngram_map: size_n (lookup length) default, and
# common/ngram-map.cpp common_ngram_simple_draft: a draft shorter than size_n is never proposed
NGRAM_SIZE_N_DEFAULT = 12
# common/arg.cpp: the flag that sets the draft length, per --spec-type (draft-* share --spec-draft-n-max;
# ngram-cache has a fixed length of 8, common_speculative_n_max)
SPEC_DRAFT_MAX_FLAG = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
                       "ngram-map-k4v": "--spec-ngram-map-k4v-size-m", "ngram-mod": "--spec-ngram-mod-n-max"}
SPEC_SIZE_N_FLAG = {"ngram-simple": "--spec-ngram-simple-size-n", "ngram-map-k": "--spec-ngram-map-k-size-n",
                    "ngram-map-k4v": "--spec-ngram-map-k4v-size-n", "ngram-mod": "--spec-ngram-mod-n-match"}


@dataclass(frozen=True)
class RunConfig:
    """One llama.cpp run configuration (what `llama-server` flags set)."""

    n_gpu_layers: int = ALL_LAYERS   # -ngl/--gpu-layers (recent llama.cpp offloads all by default; old: 0)
    n_ctx: int = 4096                # -c/--ctx-size (0 = the model's n_ctx_train)
    n_batch: int = 2048              # -b/--batch-size (logical batch)
    n_ubatch: int = 512              # -ub/--ubatch-size (physical batch)
    cache_type_k: str = "f16"        # -ctk/--cache-type-k
    cache_type_v: str = "f16"        # -ctv/--cache-type-v
    flash_attn: str = "auto"         # -fa/--flash-attn on|off|auto
    n_parallel: int = 1              # -np/--parallel (sequences / server slots)
    kv_unified: bool = False         # --kv-unified (one KV buffer shared by all sequences)
    swa_full: bool = False           # --swa-full (full-size cache for sliding-window layers)
    use_mmap: bool = True            # --no-mmap turns it off
    use_mlock: bool = False          # --mlock
    n_threads: int = 0               # -t/--threads (0 = llama.cpp's choice: the CPU count)
    tensor_split: tuple[float, ...] = ()  # -ts/--tensor-split (per-GPU proportions)
    n_cpu_moe: int = 0               # -ncmoe/--n-cpu-moe (experts of the first N layers kept on the CPU)
    cpu_moe: bool = False            # -cmoe/--cpu-moe (every layer's experts kept on the CPU)
    override_tensor: tuple[str, ...] = ()  # -ot/--override-tensor PATTERN=BUFFER_TYPE entries
    # speculative decoding (common_params_speculative); 0 / "" = llama.cpp's default for the type
    spec_type: str = "none"          # --spec-type
    draft_max: int = 0               # --spec-draft-n-max, or the n-gram type's size-m / n-max (tokens drafted)
    draft_min: int = 0               # --spec-draft-n-min (--spec-ngram-mod-n-min for ngram-mod)
    draft_p_min: float = 0.0         # --spec-draft-p-min (stop drafting below this probability)
    draft_model: str = ""            # -md/--spec-draft-model (draft-simple's smaller model)
    ngram_size_n: int = 0            # --spec-ngram-*-size-n / --spec-ngram-mod-n-match (lookup length)

    def __post_init__(self):
        if isinstance(self.flash_attn, str):
            object.__setattr__(self, "flash_attn", normalize_flash_attn(self.flash_attn))
        if isinstance(self.tensor_split, list):
            object.__setattr__(self, "tensor_split", tuple(self.tensor_split))
        if isinstance(self.override_tensor, (str, list)):
            object.__setattr__(self, "override_tensor", parse_override_tensor(self.override_tensor))
        validate(self)

    # ---- derived -------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return self.n_threads or (os.cpu_count() or 1)

    @property
    def kv_quantized_v(self) -> bool:
        return self.cache_type_v not in ("f32", "f16", "bf16")

    def with_(self, **changes) -> "RunConfig":
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown run-config field(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tensor_split"] = list(self.tensor_split)
        d["override_tensor"] = list(self.override_tensor)
        return d

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "RunConfig":
        """Build from a dict (parameter file, JSON); unknown keys and wrong types are errors."""
        known = {f.name: f for f in fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"unknown run-config key '{key}' (known: {', '.join(known)})")
            default = known[key].default
            if key == "tensor_split":
                if not isinstance(value, (list, tuple)) or not all(isinstance(x, (int, float)) for x in value):
                    raise ConfigError(f"run-config key 'tensor_split' must be a list of numbers, "
                                      f"got {short_repr(value)}")
                value = tuple(float(x) for x in value)
            elif key == "override_tensor":
                if not isinstance(value, (str, list, tuple)):
                    raise ConfigError(f"run-config key 'override_tensor' must be a list of PATTERN=BUFFER_TYPE "
                                      f"strings, got {short_repr(value)}")
                value = parse_override_tensor(value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"run-config key '{key}' must be true or false, got {short_repr(value)}")
            elif isinstance(default, float):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"run-config key '{key}' must be a number, got {short_repr(value)}")
                value = float(value)
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"run-config key '{key}' must be an integer, got {short_repr(value)}")
            elif isinstance(default, str):
                if not isinstance(value, str):
                    raise ConfigError(f"run-config key '{key}' must be a string, got {short_repr(value)}")
            kwargs[key] = value
        return cls(**kwargs)

    # ---- conversions -----------------------------------------------------------------------
    @property
    def load_mode(self) -> str:
        """llama.cpp's load mode for ``use_mmap``/``use_mlock``: ``mmap``, ``none``, ``mlock``, ``mmap+mlock``
        (common/arg.cpp ``--load-mode``; include/llama.h ``enum llama_load_mode``, which replaced both flags)."""
        if self.use_mlock:
            return "mmap+mlock" if self.use_mmap else "mlock"
        return "mmap" if self.use_mmap else "none"

    def to_server_argv(self) -> list[str]:
        """llama-server flags (current spellings) for this configuration."""
        argv = ["--gpu-layers", str(self.n_gpu_layers), "--ctx-size", str(self.n_ctx),
                "--batch-size", str(self.n_batch), "--ubatch-size", str(self.n_ubatch),
                "--cache-type-k", self.cache_type_k, "--cache-type-v", self.cache_type_v,
                "--flash-attn", self.flash_attn, "--parallel", str(self.n_parallel)]
        if self.kv_unified:
            argv.append("--kv-unified")
        if self.swa_full:
            argv.append("--swa-full")
        if self.load_mode != "mmap":          # this build's llama-server: --load-mode (no --no-mmap/--mlock)
            argv += ["--load-mode", self.load_mode]
        if self.n_threads:
            argv += ["--threads", str(self.n_threads)]
        if self.tensor_split:
            argv += ["--tensor-split", ",".join(f"{x:g}" for x in self.tensor_split)]
        return argv + moe_offload_argv(self) + spec_argv(self)

    def to_llama_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``llama_cpp.Llama`` (llama-cpp-python's high-level class).

        ``Llama()`` cannot express everything: its ``flash_attn`` is a bool (no "auto") and it has no
        ``n_seq_max``/``kv_unified``. Those are set through ``apply_to_context_params`` by callers that
        build the context themselves (the measurement harness does); here "auto" maps to off, and
        ``n_parallel``/``kv_unified`` other than the defaults raise ConfigError.
        """
        if self.n_parallel != 1 or self.kv_unified:
            raise ConfigError("n_parallel/kv_unified: llama_cpp.Llama() cannot set them; "
                              "use the harness's in-process backend or the server backend")
        if self.spec_type != "none":
            raise ConfigError("spec_type: speculative decoding runs in llama-server only; use the server backend")
        if tensor_overrides(self):   # llama_cpp/llama.py Llama(): kv_overrides only, no tensor_buft_overrides
            raise ConfigError("n_cpu_moe/cpu_moe/override_tensor: llama_cpp.Llama() cannot place tensors; "
                              "use the harness's in-process backend or the llama-server backend")
        kw: dict[str, Any] = {
            "n_gpu_layers": -1 if self.n_gpu_layers >= ALL_LAYERS else self.n_gpu_layers,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "type_k": GGML_TYPE_ID[self.cache_type_k],
            "type_v": GGML_TYPE_ID[self.cache_type_v],
            "flash_attn": self.flash_attn == "on",
            "swa_full": self.swa_full,
            "use_mmap": self.use_mmap,
            "use_mlock": self.use_mlock,
            "n_threads": self.threads,
            "n_threads_batch": self.threads,
        }
        if self.tensor_split:
            kw["tensor_split"] = list(self.tensor_split)
        return kw

    def apply_to_model_params(self, mparams) -> None:
        """Set a ``llama_model_params`` struct (llama_cpp.llama_model_default_params()) from this config."""
        import llama_cpp  # heavy: loads the compiled llama.cpp library

        mparams.n_gpu_layers = -1 if self.n_gpu_layers >= ALL_LAYERS else self.n_gpu_layers
        # include/llama.h: enum llama_load_mode (replaced use_mmap/use_mlock)
        mparams.load_mode = getattr(llama_cpp, LOAD_MODE_CONSTANTS[self.load_mode])
        if tensor_overrides(self):
            set_tensor_overrides(mparams, tensor_overrides(self))

    def apply_to_context_params(self, cparams) -> None:
        """Set a ``llama_context_params`` struct (llama_cpp.llama_context_default_params())."""
        if self.spec_type != "none":
            raise ConfigError("spec_type: speculative decoding runs in llama-server only; use the server backend")
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_ubatch
        cparams.n_seq_max = self.n_parallel
        cparams.n_threads = self.threads
        cparams.n_threads_batch = self.threads
        cparams.type_k = GGML_TYPE_ID[self.cache_type_k]
        cparams.type_v = GGML_TYPE_ID[self.cache_type_v]
        cparams.flash_attn_type = FLASH_ATTN_ENUM[self.flash_attn]
        cparams.swa_full = self.swa_full
        cparams.kv_unified = self.kv_unified


def tensor_overrides(cfg) -> tuple[tuple[str, str], ...]:
    """(regex, buffer type) of a configuration's MoE offload flags, in the order llama.cpp tries them — the first
    match wins (src/llama-model-loader.cpp, create_tensor's buffer-type selection: ``std::regex_search`` on the
    tensor name). The order is the command line's of :func:`moe_offload_argv`: -ot entries, then --cpu-moe, then
    --n-cpu-moe. Reads ``override_tensor``, ``cpu_moe`` and ``n_cpu_moe`` where the configuration has them (the
    fields; an object without them: no overrides)."""
    entries = parse_override_tensor(getattr(cfg, "override_tensor", ()) or ())
    _check_override_tensor(entries)
    out = [tuple(e.split("=", 1)) for e in entries]
    if getattr(cfg, "cpu_moe", False):
        out.append((LLM_FFN_EXPS_REGEX, CPU_BUFT))
    n = getattr(cfg, "n_cpu_moe", 0) or 0
    if n < 0:
        raise ConfigError(f"n_cpu_moe: must be >= 0, got {n} (llama.cpp: 'invalid value')")
    out += [(rf"blk\.{i}{LLM_FFN_EXPS_REGEX}", CPU_BUFT) for i in range(n)]
    return tuple(out)


def moe_offload_argv(cfg) -> list[str]:
    """llama-server's flags for a configuration's MoE offload (common/arg.cpp spellings)."""
    argv: list[str] = []
    entries = parse_override_tensor(getattr(cfg, "override_tensor", ()) or ())
    if entries:
        argv += ["--override-tensor", ",".join(entries)]
    if getattr(cfg, "cpu_moe", False):
        argv.append("--cpu-moe")
    if getattr(cfg, "n_cpu_moe", 0):
        argv += ["--n-cpu-moe", str(cfg.n_cpu_moe)]
    return argv


def parse_override_tensor(value) -> tuple[str, ...]:
    """``-ot`` text (``"a=CPU,b=CUDA0"``) or a list of such entries → a tuple of ``PATTERN=BUFFER_TYPE`` entries,
    split on commas as common/arg.cpp parse_tensor_buffer_overrides does (``validate`` checks each)."""
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"override_tensor: entries are strings PATTERN=BUFFER_TYPE, got {short_repr(item)}")
        out += [p for p in item.split(",") if p != ""]
    return tuple(out)


def _check_override_tensor(entries: tuple) -> None:
    for e in entries:
        if not isinstance(e, str) or "=" not in e:
            raise ConfigError(f"override_tensor: '{e}' is not PATTERN=BUFFER_TYPE (llama.cpp: 'invalid value')")
        pattern, buft = e.split("=", 1)
        if not pattern or not buft:
            raise ConfigError(f"override_tensor: '{e}' needs a pattern and a buffer type (e.g. exps=CPU)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"override_tensor: pattern '{pattern}' is not a regular expression ({exc})") from None


_BUFT_KEEP: list = []    # ctypes objects referenced by llama_model_params.tensor_buft_overrides


def set_tensor_overrides(mparams, overrides) -> None:
    """Fill ``llama_model_params.tensor_buft_overrides`` (a NULL-terminated array of {pattern, buft}) from
    (regex, buffer type name) pairs, resolving names through ggml's device list as common/arg.cpp
    parse_tensor_buffer_overrides does ("CPU", "CUDA0", ...). Runs where llama.cpp is loaded (a worker)."""

    import llama_cpp  # heavy: loads the compiled llama.cpp library

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml.so"))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    base = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    bufts = {}
    for i in range(lib.ggml_backend_dev_count()):
        buft = lib.ggml_backend_dev_buffer_type(lib.ggml_backend_dev_get(i))
        if buft:
            bufts[base.ggml_backend_buft_name(buft).decode()] = buft

    class Override(ctypes.Structure):
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    arr = (Override * (len(overrides) + 1))()
    for k, (pattern, name) in enumerate(overrides):
        if name not in bufts:
            raise ConfigError(f"override_tensor: unknown buffer type '{name}' (this build has: {', '.join(bufts)})")
        arr[k].pattern = pattern.encode()
        arr[k].buft = bufts[name]
    arr[len(overrides)].pattern = None
    _BUFT_KEEP.append(arr)
    mparams.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p).value


def normalize_flash_attn(value: str) -> str:
    """llama.cpp's spellings of -fa (on/enabled/true/1, off/disabled/false/0, auto/-1) → on, off or auto;
    anything else is returned unchanged (``validate`` names it)."""
    return FLASH_ATTN_SPELLINGS.get(value, value) if isinstance(value, str) else value


# field → (lowest, highest, C type) for the integer fields
_INT_RANGES = {
    "n_gpu_layers": (-1, INT32_MAX, "int32"),
    "n_ctx": (0, UINT32_MAX, "uint32"),
    "n_batch": (1, UINT32_MAX, "uint32"),
    "n_ubatch": (1, UINT32_MAX, "uint32"),
    "n_parallel": (1, UINT32_MAX, "uint32"),
    "n_threads": (0, INT32_MAX, "int32"),
    "n_cpu_moe": (0, INT32_MAX, "int32"),
}
SPEC_MAX_TOKENS = 1024   # common/arg.cpp: the n-gram sizes' upper bound; a draft longer than this is no use either


def _check_types(cfg: RunConfig) -> None:
    """Every field has its type (a RunConfig built by hand could hold anything)."""
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(f.default, tuple):        # tensor_split (and any tuple-valued field)
            ok = isinstance(v, tuple)
        elif isinstance(f.default, bool):
            ok = isinstance(v, bool) or type(v).__name__ == "bool_"    # numpy's bool too
        elif isinstance(f.default, float):
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
        elif isinstance(f.default, int):
            ok = isinstance(v, numbers.Integral) and not isinstance(v, bool)
        else:
            ok = isinstance(v, str)
        if not ok:
            raise ConfigError(f"{f.name}: expected {type(f.default).__name__}, got {type(v).__name__}")


def _check_tensor_split(split: tuple) -> None:
    if len(split) >= MAX_DEVICES:
        raise ConfigError(f"tensor_split: {len(split)} values, but llama.cpp takes at most {MAX_DEVICES - 1} "
                          f"(llama_max_devices() is {MAX_DEVICES})")
    for x in split:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or x > 1e9:
            raise ConfigError(f"tensor_split: proportions must be finite numbers in [0, 1e9], got "
                              f"{list(split)}")


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first bad field."""
    _check_types(cfg)
    for name, (low, high, ctype) in _INT_RANGES.items():
        v = getattr(cfg, name)
        if v > high:
            raise ConfigError(f"{name}: {v} does not fit llama.cpp's {ctype} (at most {high})")
    _check_tensor_split(cfg.tensor_split)
    if cfg.cache_type_k not in CACHE_TYPES:
        raise ConfigError(f"cache_type_k: unknown cache type '{cfg.cache_type_k}' (allowed: {', '.join(CACHE_TYPES)})")
    if cfg.cache_type_v not in CACHE_TYPES:
        raise ConfigError(f"cache_type_v: unknown cache type '{cfg.cache_type_v}' (allowed: {', '.join(CACHE_TYPES)})")
    if cfg.flash_attn not in FLASH_ATTN:
        raise ConfigError(f"flash_attn: must be on, off or auto (or llama.cpp's 1/true/enabled, 0/false/disabled, "
                          f"-1), got '{cfg.flash_attn}'")
    if cfg.n_gpu_layers < -1:
        raise ConfigError(f"n_gpu_layers: must be >= -1, got {cfg.n_gpu_layers}")
    if cfg.n_ctx < 0:
        raise ConfigError(f"n_ctx: must be >= 0 (0 = the model's training context), got {cfg.n_ctx}")
    if cfg.n_batch < 1:
        raise ConfigError(f"n_batch: must be >= 1, got {cfg.n_batch}")
    if cfg.n_ubatch < 1:
        raise ConfigError(f"n_ubatch: must be >= 1, got {cfg.n_ubatch}")
    if cfg.n_ubatch > cfg.n_batch:
        raise ConfigError(f"n_ubatch: {cfg.n_ubatch} is larger than n_batch {cfg.n_batch}")
    if cfg.n_parallel < 1:
        raise ConfigError(f"n_parallel: must be >= 1, got {cfg.n_parallel}")
    if cfg.n_threads < 0:
        raise ConfigError(f"n_threads: must be >= 0, got {cfg.n_threads}")
    tensor_overrides(cfg)    # n_cpu_moe >= 0, each override_tensor entry PATTERN=BUFFER_TYPE with a regex
    _check_speculative(cfg)


def _check_speculative(cfg) -> None:
    """The speculative-decoding fields agree with each other and with what llama-server accepts."""
    t = cfg.spec_type
    if t not in SPEC_TYPES:
        raise ConfigError(f"spec_type: unknown --spec-type '{t}' (allowed: {', '.join(SPEC_TYPES)})")
    for name in ("draft_max", "draft_min", "ngram_size_n"):
        if not 0 <= getattr(cfg, name) <= SPEC_MAX_TOKENS:
            raise ConfigError(f"{name}: must be in 0..{SPEC_MAX_TOKENS}, got {getattr(cfg, name)}")
    if not (math.isfinite(cfg.draft_p_min) and 0.0 <= cfg.draft_p_min <= 1.0):
        raise ConfigError(f"draft_p_min: a probability in [0, 1], got {cfg.draft_p_min}")
    if cfg.draft_max and cfg.draft_min > cfg.draft_max:
        raise ConfigError(f"draft_min: {cfg.draft_min} is larger than draft_max {cfg.draft_max}")
    if t == "none":
        if cfg.draft_model or cfg.draft_max or cfg.draft_min or cfg.ngram_size_n or cfg.draft_p_min:
            raise ConfigError("draft_model/draft_max/draft_min/draft_p_min/ngram_size_n need --spec-type "
                              f"(one of {', '.join(SPEC_TYPES[1:])})")
        return
    if t in SPEC_TYPES_WITH_MODEL and not cfg.draft_model:
        raise ConfigError(f"spec_type {t} needs a draft model (-md/--spec-draft-model FILE)")
    if cfg.draft_model and t not in SPEC_TYPES_WITH_MODEL:
        raise ConfigError(f"draft_model: --spec-type {t} does not use a draft model "
                          f"(those that do: {', '.join(SPEC_TYPES_WITH_MODEL)})")
    if cfg.ngram_size_n and t not in SPEC_SIZE_N_FLAG:
        raise ConfigError(f"ngram_size_n: --spec-type {t} has no n-gram lookup length "
                          f"(those that do: {', '.join(SPEC_SIZE_N_FLAG)})")
    if t == "ngram-cache" and cfg.draft_max:
        raise ConfigError("draft_max: ngram-cache drafts a fixed 8 tokens (common_speculative_n_max); leave it 0")
    if t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v") and cfg.draft_max:
        size_n = cfg.ngram_size_n or NGRAM_SIZE_N_DEFAULT
        if cfg.draft_max < size_n:   # common/ngram-map.cpp: copy_max < n_draft_min → no draft, ever
            raise ConfigError(f"draft_max: {t} never drafts fewer tokens than its lookup length "
                              f"(ngram_size_n {size_n}); set ngram_size_n <= {cfg.draft_max}")


def spec_argv(cfg) -> list[str]:
    """llama-server's speculative-decoding flags for a configuration (common/arg.cpp spellings; the draft length
    goes to the flag of its --spec-type, :data:`SPEC_DRAFT_MAX_FLAG`)."""
    t = getattr(cfg, "spec_type", "none")
    if t == "none":
        return []
    argv = ["--spec-type", t]
    if cfg.draft_model:
        argv += ["--spec-draft-model", str(cfg.draft_model)]
    if cfg.draft_max:
        argv += [SPEC_DRAFT_MAX_FLAG.get(t, "--spec-draft-n-max"), str(cfg.draft_max)]
    if cfg.draft_min:
        argv += ["--spec-ngram-mod-n-min" if t == "ngram-mod" else "--spec-draft-n-min", str(cfg.draft_min)]
    if cfg.draft_p_min:
        argv += ["--spec-draft-p-min", f"{cfg.draft_p_min:g}"]
    if cfg.ngram_size_n:
        argv += [SPEC_SIZE_N_FLAG[t], str(cfg.ngram_size_n)]
    return argv


def add_flag_arguments(parser) -> None:
    """Add llama.cpp's flags (llama.cpp spellings) to an argparse parser; see ``from_flag_args``."""
    d = RunConfig()
    g = parser.add_argument_group("llama.cpp flags")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=int, default=d.n_gpu_layers,
                   help=f"layers to offload to the GPU (default {d.n_gpu_layers} = all)")
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, default=d.n_ctx, help=f"context size (default {d.n_ctx})")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, default=d.n_batch, help=f"logical batch (default {d.n_batch})")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, default=d.n_ubatch,
                   help=f"physical batch (default {d.n_ubatch})")
    g.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", default=d.cache_type_k, help="K cache type")
    g.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", default=d.cache_type_v, help="V cache type")
    g.add_argument("-fa", "--flash-attn", dest="flash_attn", default=d.flash_attn,
                   help="on, off or auto (llama.cpp's 1/true/enabled, 0/false/disabled, -1 too)")
    g.add_argument("-np", "--parallel", dest="n_parallel", type=int, default=d.n_parallel, help="parallel sequences")
    g.add_argument("--kv-unified", dest="kv_unified", action="store_true", help="one KV buffer for all sequences")
    g.add_argument("--swa-full", dest="swa_full", action="store_true", help="full-size cache for SWA layers")
    g.add_argument("--no-mmap", dest="use_mmap", action="store_false", help="read the model instead of mapping it")
    g.add_argument("--mlock", dest="use_mlock", action="store_true", help="lock the model in RAM")
    g.add_argument("-lm", "--load-mode", dest="load_mode", choices=tuple(LOAD_MODE_CONSTANTS), default=None,
                   help="llama.cpp's current spelling of --no-mmap/--mlock: none, mmap, mlock or mmap+mlock")
    g.add_argument("-t", "--threads", dest="n_threads", type=int, default=d.n_threads, help="CPU threads (0 = all)")
    g.add_argument("-ts", "--tensor-split", dest="tensor_split", default="",
                   help="per-GPU proportions, e.g. 3,1")
    g.add_argument("-ncmoe", "--n-cpu-moe", dest="n_cpu_moe", type=int, default=d.n_cpu_moe,
                   help="keep the MoE expert weights of the first N layers on the CPU")
    g.add_argument("-cmoe", "--cpu-moe", dest="cpu_moe", action="store_true",
                   help="keep every layer's MoE expert weights on the CPU")
    g.add_argument("-ot", "--override-tensor", dest="override_tensor", action="append", default=[],
                   metavar="PATTERN=BUFFER_TYPE,...", help="tensor buffer-type overrides (repeatable), e.g. exps=CPU")
    s = parser.add_argument_group("speculative decoding (llama-server)")
    s.add_argument("--spec-type", dest="spec_type", default=d.spec_type,
                   help="none, draft-simple (with -md), draft-mtp, ngram-simple, ngram-mod, ... (llama.cpp's names)")
    s.add_argument("--spec-draft-n-max", "--draft-max", "--draft", dest="draft_max", type=int, default=d.draft_max,
                   help="tokens drafted per pass (0 = llama.cpp's default for the type)")
    s.add_argument("--spec-draft-n-min", "--draft-min", dest="draft_min", type=int, default=d.draft_min,
                   help="fewest tokens to draft")
    s.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=float, default=d.draft_p_min,
                   help="stop drafting below this probability (draft models)")
    s.add_argument("-md", "--spec-draft-model", "--model-draft", dest="draft_model", default=d.draft_model,
                   metavar="FILE", help="draft model GGUF for --spec-type draft-simple")
    s.add_argument("--spec-ngram-size-n", dest="ngram_size_n", type=int, default=d.ngram_size_n,
                   help="n-gram lookup length (0 = llama.cpp's default for the type)")


def parse_tensor_split(text: str) -> tuple[float, ...]:
    """``-ts 3,1`` (or ``3/1``) → (3.0, 1.0), as common/arg.cpp splits it (on runs of "," and "/");
    ConfigError for anything not a list of finite numbers >= 0."""

    parts = [p for p in re.split(r"[,/]+", str(text).strip()) if p != ""]
    try:
        split = tuple(float(p) for p in parts)
    except ValueError:
        raise ConfigError(f"tensor_split: not a list of numbers: '{text}'") from None
    if not split:
        raise ConfigError(f"tensor_split: not a list of numbers: '{text}'")
    _check_tensor_split(split)
    return split


def from_flag_args(args) -> RunConfig:
    """The RunConfig that ``add_flag_arguments``' parsed flags describe."""
    split = parse_tensor_split(args.tensor_split) if args.tensor_split else ()
    mode = getattr(args, "load_mode", None)
    if mode is not None:   # --load-mode wins over --no-mmap/--mlock, as the one flag llama.cpp has now
        args.use_mmap, args.use_mlock = mode in ("mmap", "mmap+mlock"), mode in ("mlock", "mmap+mlock")
    return RunConfig(n_gpu_layers=args.n_gpu_layers, n_ctx=args.n_ctx, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                     cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v, flash_attn=args.flash_attn,
                     n_parallel=args.n_parallel, kv_unified=args.kv_unified, swa_full=args.swa_full,
                     use_mmap=args.use_mmap, use_mlock=args.use_mlock, n_threads=args.n_threads, tensor_split=split,
                     n_cpu_moe=getattr(args, "n_cpu_moe", 0), cpu_moe=getattr(args, "cpu_moe", False),
                     override_tensor=parse_override_tensor(getattr(args, "override_tensor", None) or ()),
                     spec_type=getattr(args, "spec_type", "none"), draft_max=getattr(args, "draft_max", 0),
                     draft_min=getattr(args, "draft_min", 0), draft_p_min=getattr(args, "draft_p_min", 0.0),
                     draft_model=getattr(args, "draft_model", ""), ngram_size_n=getattr(args, "ngram_size_n", 0))
