"""llama.cpp's load log, captured through its log callback and parsed into facts.

llama.cpp says what it did while loading — how many layers went to the GPU, how big each buffer is
on each device, whether flash attention ended up on, how many KV cells and layers — only in its log.
``capture_llama_log()`` installs a log callback (``llama_cpp.llama_log_set``) for the duration of a
``with`` block; ``parse_load_log(text)`` turns the text into a frozen :class:`LoadFacts`.

The patterns mirror llama.cpp's own format strings (checked against the llama.cpp sources):

* src/llama-model.cpp, ``load_tensors``:
  ``"%s: offloading %d repeating layers to GPU\\n"``, ``"%s: offloading output layer to GPU\\n"``,
  ``"%s: offloaded %d/%d layers to GPU\\n"``, ``"%s: %12s model buffer size = %8.2f MiB\\n"``,
  ``"%s: layer %3d assigned to device %s, is_swa = %d\\n"``; older builds print
  ``"%s: %10s buffer size = %8.2f MiB\\n"`` (no "model").
* src/llama-kv-cache.cpp, ``llama_kv_cache::llama_kv_cache``:
  ``"%s: %10s KV buffer size = %8.2f MiB\\n"`` and
  ``"%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB\\n"``
  (older: ``%2u seqs``); src/llama-kv-cache-iswa.cpp: ``"%s: creating non-SWA KV cache, size = %u cells\\n"``,
  ``"%s: creating     SWA KV cache, size = %u cells\\n"``.
* src/llama-memory-recurrent.cpp: ``"%s: %10s RS buffer size = %8.2f MiB\\n"`` and
  ``"%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs[ %2u rs_seq]), R (%s): %7.2f MiB, S (%s): %7.2f MiB"``.
* src/llama-context.cpp: ``"%s: %10s  output buffer size = %8.2f MiB\\n"``,
  ``"%s: %10s compute buffer size = %8.2f MiB\\n"``, ``"%s: %-21s = %u\\n"``-style parameter lines
  (``n_ctx``, ``n_ctx_seq``, ``n_batch``, ``n_ubatch``, ``flash_attn``, ...),
  ``"%s: Flash Attention was auto, set to %s\\n"`` (newer builds: ``resolve_fused_ops: Flash Attention
  enabled``), ``"%s: layer %d is assigned to device %s but the Flash Attention tensor is assigned to device
  %s (usually due to missing support)\\n"``, ``graph nodes  = %d`` / ``graph splits = %d``.

Buffer names say where memory lives: ``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``CUDA_Host`` (pinned host
memory) are the host; ``CUDA0``, ``ROCm1``, ``Vulkan0``, ``Metal``/``MTL0`` are devices. Lines the parser does
not know are kept in ``unknown_lines``.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Iterator

from v100lab.facts.config import RunConfig
from v100lab.base.errors import RunFailed

HOST = "host"

# ggml/include/ggml.h: enum ggml_log_level (current order; llama-cpp-python's _logger.py comment shows an
# older one): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the previous line)
LOG_NONE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = range(6)


# ------------------------------------------------------------------------------------------------
# facts
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BufferFact:
    """One ``<name> <kind> buffer size = X MiB`` line."""

    kind: str        # model | KV | RS | compute | output
    buffer: str      # llama.cpp's buffer name: CPU_Mapped, CUDA0, CUDA_Host, Metal, ...
    device: str      # "host" for host memory, else the device name (CUDA0, Metal, ...)
    mib: float

    @property
    def bytes(self) -> int:
        return int(round(self.mib * 2**20))


@dataclass(frozen=True)
class KVCacheFact:
    """One ``llama_kv_cache: size = ...`` line. ``tag`` is "SWA"/"non-SWA" for the two caches of an iSWA model."""

    size_mib: float
    cells: int
    layers: int
    seqs: int
    streams: int | None   # None in builds that print only "N seqs"
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float
    tag: str | None = None


@dataclass(frozen=True)
class RecurrentFact:
    """One ``llama_memory_recurrent: size = ...`` line (SSM / linear-attention state)."""

    size_mib: float
    cells: int
    layers: int
    seqs: int
    type_r: str
    r_mib: float
    type_s: str
    s_mib: float
    rs_seq: int | None = None


@dataclass(frozen=True)
class LoadFacts:
    """What llama.cpp reported while loading a model and creating a context."""

    offloaded_layers: int | None = None     # N of "offloaded N/M layers to GPU" (None: no GPU-capable build)
    offloadable_layers: int | None = None   # M (n_layer + 1)
    repeating_layers_offloaded: int | None = None
    output_layer_offloaded: bool | None = None
    layer_devices: tuple[tuple[int, str], ...] = ()      # (layer, device) from "layer N assigned to device"
    kv_layer_devices: tuple[tuple[int, str], ...] = ()   # (layer, device) from "llama_kv_cache: layer N: dev = X"
    buffers: tuple[BufferFact, ...] = ()
    kv_caches: tuple[KVCacheFact, ...] = ()
    recurrent: tuple[RecurrentFact, ...] = ()
    flash_attn_requested: str | None = None   # "auto", "enabled", "disabled", "1", ... as printed
    flash_attn: str | None = None             # resolved: "enabled" | "disabled" | None (not reported)
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_seq_max: int | None = None
    kv_unified: bool | None = None
    n_ctx_train: int | None = None
    graph_nodes: int | None = None
    graph_splits: int | None = None
    cpu_fallbacks: tuple[str, ...] = ()   # tensors/ops llama.cpp put on the CPU although a device was wanted
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    build: str | None = None
    system_info: str | None = None
    model_info: tuple[tuple[str, str], ...] = ()   # print_info: key = value
    unknown_lines: tuple[str, ...] = ()

    # ---- convenience ------------------------------------------------------------------------
    def buffer_mib(self, kind: str, device: str | None = None) -> float:
        """Sum of the buffers of one kind (on one device, or everywhere)."""
        return sum(b.mib for b in self.buffers if b.kind == kind and (device is None or b.device == device))

    def buffer_bytes(self, kind: str, device: str | None = None) -> int:
        return sum(b.bytes for b in self.buffers if b.kind == kind and (device is None or b.device == device))

    def by_device(self) -> dict[str, dict[str, float]]:
        """device → kind → MiB (summed over buffers of that kind on that device)."""
        out: dict[str, dict[str, float]] = {}
        for b in self.buffers:
            d = out.setdefault(b.device, {})
            d[b.kind] = d.get(b.kind, 0.0) + b.mib
        return out

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.device for b in self.buffers))

    @property
    def kv_cells(self) -> int | None:
        return max((k.cells for k in self.kv_caches), default=None)

    @property
    def kv_size_mib(self) -> float:
        return sum(k.size_mib for k in self.kv_caches)

    @property
    def recurrent_size_mib(self) -> float:
        return sum(r.size_mib for r in self.recurrent)

    @property
    def model_meta(self) -> dict[str, str]:
        return dict(self.model_info)

    def as_dict(self, with_unknown: bool = False) -> dict:
        """JSON-ready dict (unknown lines left out unless asked for: they can be long)."""
        d = asdict(self)
        d["layer_devices"] = {str(k): v for k, v in self.layer_devices}
        d["kv_layer_devices"] = {str(k): v for k, v in self.kv_layer_devices}
        d["model_info"] = dict(self.model_info)
        d["by_device_mib"] = self.by_device()
        if not with_unknown:
            d.pop("unknown_lines")
            d["n_unknown_lines"] = len(self.unknown_lines)
        return d


# ------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------

_NUM = r"[-+]?\d+(?:\.\d+)?"
_RE_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_RE_OFFLOADING = re.compile(r"offloading (\d+) repeating layers to GPU")
_RE_OUTPUT_OFFLOAD = re.compile(r"offloading (?:output|non-repeating) layers? to GPU")
_RE_LAYER_DEV = re.compile(r"^load_tensors: layer +(\d+) assigned to device (\S+?),")
_RE_KV_LAYER_DEV = re.compile(r"^llama_kv_cache\w*: layer +(\d+): dev = (\S+)")
# "<func>: <name> [model|KV|RS|compute|output] buffer size = X MiB"; old builds: "<func>: <name> buffer size = X MiB"
_RE_BUFFER = re.compile(r"^(~?\w+): +(\S+) +(?:(model|KV|RS|compute|output) +)?buffer size = +(" + _NUM + r") MiB")
_RE_KV_SIZE = re.compile(
    r"^(\w+): size = +(" + _NUM + r") MiB \( *(\d+) cells, +(\d+) layers, +(\d+)(?:/(\d+))? seqs\), "
    r"K \((\w+)\): +(" + _NUM + r") MiB, V \((\w+)\): +(" + _NUM + r") MiB")
_RE_RS_SIZE = re.compile(
    r"^(\w+): size = +(" + _NUM + r") MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs(?: +(\d+) rs_seq)?\), "
    r"R \((\w+)\): +(" + _NUM + r") MiB, S \((\w+)\): +(" + _NUM + r") MiB")
_RE_ISWA = re.compile(r"creating +(non-SWA|SWA) KV cache, size = (\d+) cells")
_RE_CTX_PARAM = re.compile(r"^llama_context: (n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|n_seq_max|"
                           r"flash_attn|kv_unified|causal_attn) += (\S+)")
_RE_FA_AUTO = re.compile(r"Flash Attention was auto, set to (enabled|disabled)")
# newer builds (llama_context::resolve_fused_ops): "Flash Attention enabled" /
# "Flash Attention not supported, set to disabled"
_RE_FA_FUSED = re.compile(r"^\w+: Flash Attention (?:not supported, set to )?(enabled|disabled)\s*$")
_RE_FA_CPU = re.compile(r"layer \d+ is assigned to device \S+ but (?:the )?Flash Attention(?: tensor)? is assigned to device")
_RE_GRAPH_NODES = re.compile(r"graph(?: nodes)? *(?:=|:) *(\d+)|graph: nodes = (\d+), splits = (\d+)")
_RE_GRAPH_SPLITS = re.compile(r"graph splits = (\d+)")
_RE_PRINT_INFO = re.compile(r"^print_info: ([\w .()-]+?) += (.*)$")
_RE_BUILD = re.compile(r"^(?:\w+: )?build(?: info)?[:=] ?(.+)$")
_RE_FALLBACK = re.compile(r"cannot be used with preferred buffer type (\S+), using (\S+) instead")

# families of lines that carry nothing for these facts (known, not "unknown")
_NOISE_PREFIXES = ("create_tensor:", "llama_graph_n_input_tensors:", "llama_model_loader:", "load:",
                   "init_tokenizer:", "graph_reserve:", "sched_reserve:", "llama_context:", "llama_kv_cache",
                   "resolve_fused_ops:", "set_abort_callback:", "repack:", "load_tensors:", "print_info:",
                   "~llama_context:", "done_getting_tensors:", "llama_memory_recurrent:", "llama_model_load",
                   "llm_load_tensors:", "llm_load_print_meta:", "ggml_", "llama_init_from_model:")
_WARN_WORDS = re.compile(r"\b(warning|warn|failed|error|not supported|unsupported|cannot|insufficient|"
                         r"out of memory|will not be utilized|refus)", re.I)


def buffer_fallback(line: str) -> tuple[str, str] | None:
    """``(wanted, got)`` buffer types of a "cannot be used with preferred buffer type X, using Y instead"
    line (tensors that could not go where llama.cpp preferred), None for any other line."""
    m = _RE_FALLBACK.search(line)
    return (m.group(1), m.group(2)) if m else None


def buffer_device(name: str) -> str:
    """Map a ggml buffer name to where its memory lives: "host" for host memory, else the device."""
    if name.startswith("CPU") or name.endswith("_Host") or name.lower().startswith("cpu"):
        return HOST
    for suffix in ("_Split", "_Mapped"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _to_bool(v: str) -> bool | None:
    v = v.lower()
    if v in ("1", "true", "on", "enabled", "yes"):
        return True
    if v in ("0", "false", "off", "disabled", "no"):
        return False
    return None


# tools/server and common/log.cpp: with timestamps and prefixes on (llama-server's default), every line
# starts "<h>.<mm>.<ss>.<us> <level> " and server-side lines add a tag such as "srv  " before "func:".
_RE_SERVER_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWEDT] ")
_RE_SERVER_TAG = re.compile(r"^(?:srv|cmn|slot|spec|que|res|mtmd|log|ctx) +(?=[\w~]+:)")


def normalize_line(raw: str) -> str:
    """One log line without llama-server's ``<time> <level> [tag ]`` prefix and without progress dots."""
    line = _RE_SERVER_PREFIX.sub("", raw.rstrip(), count=1)
    line = _RE_SERVER_TAG.sub("", line, count=1)
    stripped = line.strip()
    return stripped.lstrip(".") if stripped.startswith(".") else stripped


def split_lines(text: str) -> list[str]:
    """Log text → normalized lines (see :func:`normalize_line`); empty lines are dropped."""
    return [line for line in (normalize_line(raw) for raw in text.splitlines()) if line]


def parse_load_log(text: str, records: list[tuple[int, str]] | None = None) -> LoadFacts:
    """Parse llama.cpp's load log (the text of one model load + context creation) into facts.

    ``records`` — (level, text) pairs from :func:`capture_llama_log` — add llama.cpp's own WARN/ERROR
    levels to the pattern-based warning detection. When a log holds several loads, later lines win
    for scalar facts and buffers accumulate (parse one load at a time for clean numbers)."""
    f: dict = {"buffers": [], "kv_caches": [], "recurrent": [], "layer_devices": {}, "kv_layer_devices": {},
               "cpu_fallbacks": [], "warnings": [], "errors": [], "model_info": {}, "unknown_lines": []}
    pending_tag: str | None = None

    for line in split_lines(text):
        body = line.strip()
        known = False
        if m := _RE_OFFLOADED.search(body):
            f["offloaded_layers"], f["offloadable_layers"] = int(m.group(1)), int(m.group(2))
            known = True
        elif m := _RE_OFFLOADING.search(body):
            f["repeating_layers_offloaded"] = int(m.group(1))
            f.setdefault("output_layer_offloaded", False)
            known = True
        elif _RE_OUTPUT_OFFLOAD.search(body):
            f["output_layer_offloaded"] = True
            known = True
        elif m := _RE_LAYER_DEV.match(body):
            f["layer_devices"][int(m.group(1))] = m.group(2)
            known = True
        elif m := _RE_KV_LAYER_DEV.match(body):
            f["kv_layer_devices"][int(m.group(1))] = m.group(2)
            known = True
        elif m := _RE_BUFFER.match(body):
            func, name, kind, mib = m.group(1), m.group(2), m.group(3), float(m.group(4))
            if kind is None:  # old format: "load_tensors: CPU buffer size = ..."
                kind = "model" if "load_tensors" in func else "KV" if "kv" in func else "compute"
            if not func.startswith("~"):   # "~llama_context: ... is X MiB, matches expectation" is teardown
                f["buffers"].append(BufferFact(kind=kind, buffer=name, device=buffer_device(name), mib=mib))
            known = True
        elif m := _RE_KV_SIZE.match(body):
            f["kv_caches"].append(KVCacheFact(
                size_mib=float(m.group(2)), cells=int(m.group(3)), layers=int(m.group(4)), seqs=int(m.group(5)),
                streams=int(m.group(6)) if m.group(6) else None, type_k=m.group(7), k_mib=float(m.group(8)),
                type_v=m.group(9), v_mib=float(m.group(10)), tag=pending_tag))
            pending_tag = None
            known = True
        elif m := _RE_RS_SIZE.match(body):
            f["recurrent"].append(RecurrentFact(
                size_mib=float(m.group(2)), cells=int(m.group(3)), layers=int(m.group(4)), seqs=int(m.group(5)),
                rs_seq=int(m.group(6)) if m.group(6) else None, type_r=m.group(7), r_mib=float(m.group(8)),
                type_s=m.group(9), s_mib=float(m.group(10))))
            known = True
        elif m := _RE_ISWA.search(body):
            pending_tag = m.group(1)
            known = True
        elif m := _RE_CTX_PARAM.match(body):
            key, val = m.group(1), m.group(2)
            if key == "n_ctx_per_seq":
                key = "n_ctx_seq"
            if key == "flash_attn":
                f["flash_attn_requested"] = val
                b = _to_bool(val)
                if b is not None and "flash_attn" not in f:  # an explicit on/off is also the resolved state
                    f["flash_attn"] = "enabled" if b else "disabled"
            elif key in ("kv_unified", "causal_attn"):
                if key == "kv_unified":
                    f["kv_unified"] = _to_bool(val)
            else:
                f[key] = int(val)
            known = True
        elif m := _RE_FA_AUTO.search(body) or _RE_FA_FUSED.match(body):
            f["flash_attn"] = m.group(1)
            known = True
        elif m := _RE_PRINT_INFO.match(body):
            key, val = m.group(1).strip(), m.group(2).strip()
            f["model_info"][key] = val
            if key == "n_ctx_train":
                with contextlib.suppress(ValueError):
                    f["n_ctx_train"] = int(val)
            known = True
        elif m := _RE_GRAPH_NODES.search(body):
            if m.group(1):
                f["graph_nodes"] = int(m.group(1))
            else:
                f["graph_nodes"], f["graph_splits"] = int(m.group(2)), int(m.group(3))
            known = True
        elif m := _RE_GRAPH_SPLITS.search(body):
            f["graph_splits"] = int(m.group(1))
            known = True
        elif body.startswith(("system_info:", "CPU :")) or " | " in body and "= 1 |" in body:
            f["system_info"] = body.split(":", 1)[1].strip() if body.startswith("system_info:") else body
            known = True
        elif m := _RE_BUILD.match(body):
            f["build"] = m.group(1).strip()
            known = True

        if _RE_FALLBACK.search(body) or _RE_FA_CPU.search(body):
            f["cpu_fallbacks"].append(body)
            known = True
        if _WARN_WORDS.search(body) and not body.startswith(("print_info:", "llama_model_loader: - kv",
                                                             "create_tensor:", "load: control token")):
            (f["errors"] if re.search(r"\b(error|failed)\b", body, re.I) else f["warnings"]).append(body)
            known = True
        if not known and not body.startswith(_NOISE_PREFIXES):
            f["unknown_lines"].append(body)

    for level, msg in records or ():
        msg = msg.strip()
        if not msg:
            continue
        if level == LOG_WARN and msg not in f["warnings"]:
            f["warnings"].append(msg)
        elif level == LOG_ERROR and msg not in f["errors"]:
            f["errors"].append(msg)

    return LoadFacts(
        offloaded_layers=f.get("offloaded_layers"), offloadable_layers=f.get("offloadable_layers"),
        repeating_layers_offloaded=f.get("repeating_layers_offloaded"),
        output_layer_offloaded=f.get("output_layer_offloaded"),
        layer_devices=tuple(sorted(f["layer_devices"].items())),
        kv_layer_devices=tuple(sorted(f["kv_layer_devices"].items())),
        buffers=tuple(f["buffers"]), kv_caches=tuple(f["kv_caches"]), recurrent=tuple(f["recurrent"]),
        flash_attn_requested=f.get("flash_attn_requested"), flash_attn=f.get("flash_attn"),
        n_ctx=f.get("n_ctx"), n_ctx_seq=f.get("n_ctx_seq"), n_batch=f.get("n_batch"), n_ubatch=f.get("n_ubatch"),
        n_seq_max=f.get("n_seq_max"), kv_unified=f.get("kv_unified"), n_ctx_train=f.get("n_ctx_train"),
        graph_nodes=f.get("graph_nodes"), graph_splits=f.get("graph_splits"),
        cpu_fallbacks=tuple(f["cpu_fallbacks"]), warnings=tuple(dict.fromkeys(f["warnings"])),
        errors=tuple(dict.fromkeys(f["errors"])), build=f.get("build"), system_info=f.get("system_info"),
        model_info=tuple(f["model_info"].items()), unknown_lines=tuple(f["unknown_lines"]))


# ------------------------------------------------------------------------------------------------
# capture
# ------------------------------------------------------------------------------------------------

@dataclass(eq=False)  # identity, not equality: nested captures remove themselves by identity
class LogCapture:
    """The text llama.cpp logged inside a :func:`capture_llama_log` block."""

    records: list[tuple[int, str]] = field(default_factory=list)   # (ggml_log_level, text)

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.records)

    def facts(self) -> LoadFacts:
        return parse_load_log(self.text, self._merged_records())

    def _merged_records(self) -> list[tuple[int, str]]:
        """Join CONT pieces onto their line, so levels apply to whole lines."""
        out: list[tuple[int, str]] = []
        for level, t in self.records:
            if level == LOG_CONT and out:
                out[-1] = (out[-1][0], out[-1][1] + t)
            else:
                out.append((level, t))
        return out


_lock = threading.RLock()
_active: list[LogCapture] = []
_callback_ref = None   # the ctypes callback must outlive every call llama.cpp makes through it
_echo_level: int | None = None
_tee = None            # a stream every captured line is also written to (the crash-isolation worker's log)


_tee_last = LOG_INFO   # the level a CONT piece continues


def _tee_write(level: int, msg: str) -> None:
    """Write one llama.cpp log piece to the tee: INFO and above (and their continuations), not DEBUG."""
    global _tee_last
    if level != LOG_CONT:
        _tee_last = level
    if _tee_last != LOG_DEBUG:
        _tee.write(msg)
        _tee.flush()


def set_tee(stream) -> None:
    """Also write every captured llama.cpp line to ``stream`` as it arrives (None: stop).

    The worker process (:mod:`v100lab.models.worker`) tees into its log file, so the last lines before a crash
    survive the process that captured them."""
    global _tee
    _tee = stream


def _make_callback():
    import llama_cpp  # heavy: loads the compiled llama.cpp library

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):  # runs on llama.cpp's threads: never raise
        try:
            msg = text.decode("utf-8", "replace") if text else ""
            with _lock:
                for cap in _active:
                    cap.records.append((int(level), msg))
                if _tee is not None:
                    _tee_write(int(level), msg)
        except Exception:  # pragma: no cover - a callback must not throw into C
            pass

    return _cb


def _restore_default() -> None:
    """Give llama.cpp back llama-cpp-python's own callback (llama_cpp/_logger.py)."""
    import llama_cpp  # heavy: loads the compiled llama.cpp library
    from llama_cpp import _logger  # heavy: loads the compiled llama.cpp library

    llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def load_and_capture(model_path, cfg=None) -> tuple[LoadFacts, str]:
    """Load ``model_path`` and create a context with ``cfg`` (a RunConfig) through llama.cpp's low-level
    API, capture the log, free both, and return (facts, raw log text).

    The low-level API is used because ``llama_cpp.Llama`` cannot set n_seq_max, kv_unified or
    flash-attention "auto". A load or context failure raises RunFailed with llama.cpp's last error line."""
    import llama_cpp  # heavy: loads the compiled llama.cpp library

    cfg = cfg or RunConfig()
    model = ctx = None
    with capture_llama_log() as cap:
        try:
            mparams = llama_cpp.llama_model_default_params()
            cfg.apply_to_model_params(mparams)
            model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
            if not model:
                raise RunFailed(f"llama.cpp could not load {model_path}: {_last_error(cap)}")
            cparams = llama_cpp.llama_context_default_params()
            cfg.apply_to_context_params(cparams)
            ctx = llama_cpp.llama_init_from_model(model, cparams)
            if not ctx:
                raise RunFailed(f"llama.cpp refused the context: {_last_error(cap)}")
        finally:
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
    return cap.facts(), cap.text


def _last_error(cap: LogCapture) -> str:
    for level, msg in reversed(cap._merged_records()):
        if level == LOG_ERROR and msg.strip():
            return msg.strip()
    lines = [line for line in split_lines(cap.text) if line.strip()]
    return lines[-1].strip() if lines else "no log output"


@contextlib.contextmanager
def capture_llama_log() -> Iterator[LogCapture]:
    """Collect everything llama.cpp logs inside the block (all levels, nothing echoed).

    Nested captures each see the lines logged while they are open. On exit llama-cpp-python's own
    callback is reinstalled, so its ``verbose`` setting works again afterwards."""
    global _callback_ref
    import llama_cpp  # heavy: loads the compiled llama.cpp library

    cap = LogCapture()
    with _lock:
        if _callback_ref is None:
            _callback_ref = _make_callback()
        if not _active:
            llama_cpp.llama_log_set(_callback_ref, ctypes.c_void_p(0))
        _active.append(cap)
    try:
        yield cap
    finally:
        with _lock:
            _active.remove(cap)
            if not _active:
                _restore_default()
