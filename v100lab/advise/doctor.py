"""``doctor``: read a llama.cpp log and say, item by item, what went wrong — with the log's own numbers.

The seed's lesson is "first admit that 4 tok/s is abnormal, then check, item by item". Each check here is one
of its failure modes, and each :class:`Finding` carries the numbers it read, the log line that shows them
(with its line number) and a one-line fix:

=====================  ========================================================================================
code                   what the log shows
=====================  ========================================================================================
no-gpu-backend         a GPU was named (``--device``) but this llama.cpp has no GPU backend (a CPU-only build)
cpu-only-build         nvidia-smi on this machine lists a GPU, but the log shows no GPU backend (no GPU buffer,
                       ``offloaded 0/N layers``): llama.cpp built without CUDA, the commonest mistake
no-offload             ``offloaded 0/N layers to GPU``: everything runs on the CPU (old ``-ngl`` default 0)
partial-offload        ``offloaded k/N layers``: N - k layers run on the CPU from host memory
over-capacity          weights + KV + compute on a device exceed its memory, or an allocation failed
near-capacity          the same within 5 % of the memory (the next longer prompt or bigger batch fails)
quantized-v-no-fa      a quantized V cache with flash attention off (llama.cpp refuses the context)
cpu-fallback           tensors or ops that wanted a device and run on the CPU ("using CPU instead",
                       "Flash Attention tensor is assigned to device CPU", "... not supported, falling back")
debug-build            llama-bench's "debug build" / "asserts enabled" warnings
mmap-low-ram           mmap'ed weights that run on the CPU, with less free RAM than they need (page faults)
mlock-failed           ``--mlock`` asked for, and the kernel refused it
slot-split             llama-server splits ``-c`` over ``--parallel`` slots (``n_slots = 4, n_ctx_slot = 2048,
                       kv_unified = 'false'``): each request gets a quarter of the context asked for
quiet-log              a llama-server/llama-cli log without load lines (they are printed at verbosity 4,
                       ``-lv 4``): what the doctor cannot see, and the flag that shows it
above-ceiling          a decode tok/s above bandwidth / model size for the device: impossible, so the
                       measurement or the model size is wrong
far-below-ceiling      decode on a GPU under a quarter of that ceiling (the seed's 4 tok/s)
=====================  ========================================================================================

What the log says about loading is read by :func:`v100lab.facts.loadlog.parse_load_log` (one parser for those
lines); this module adds what the load log does not cover: speeds (llama-server's and llama_perf's
"eval time" lines, llama-bench's markdown table or its json/jsonl/csv output through
:mod:`v100lab.measure.llamabench`), the GPUs ggml-cuda reports, memory the tools say is free, allocation
failures and build warnings. llama-server's line prefixes (``0.00.123.456 I srv  ...``) are stripped first.

A log is read with bounded memory (:func:`v100lab.base.safeio.read_bounded`: at most ``MAX_LOG_BYTES`` actually
read, whatever ``st_size`` says; a FIFO or device never hangs it). Evidence lines are cut to
``MAX_EVIDENCE_CHARS`` and every string of the text report is printed with control characters escaped.

Verbosity (common/log.cpp ``common_log_get_verbosity``): llama.cpp's own messages at INFO level (the load
lines: ``load_tensors``, ``llama_context``, ``llama_kv_cache``, buffer sizes) are printed only from
verbosity 4 (``LOG_LEVEL_TRACE``: ``-lv 4`` or ``-v``); llama-server's default is 3, where a log shows
little more than ``n_slots``, the timings and warnings.

Every pattern mirrors a llama.cpp format string (the citations are beside the patterns).
"""

from __future__ import annotations

import csv
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from v100lab.base import cudabuild
from v100lab.facts import loadlog
from v100lab.measure.llamabench import parse_llama_bench
from v100lab.facts.devices import catalog, get_device
from v100lab.base.errors import V100labError
from v100lab.facts.loadlog import normalize_line  # re-exported: the doctor reads lines as loadlog does
from v100lab.predict.speed import ceiling_tps
from v100lab.base.safeio import json_safe, read_bounded, shorten, term_text
from v100lab.base.safeio import json_number

log = logging.getLogger(__name__)

SEVERITIES = ("error", "warning", "info")
NEAR_CAPACITY = 0.95        # a device filled beyond this fraction gets a near-capacity warning
FAR_BELOW = 0.25            # decode under this fraction of the ceiling on a GPU is "abnormal" (the seed's 4 of 62)
MMAP_RAM_FRACTION = 1.0     # mapped host weights above this fraction of free RAM: pages will be evicted
MAX_LOG_BYTES = 256 * 2**20
MAX_EVIDENCE_CHARS = 300    # an evidence line longer than this is cut (with "…")
MAX_TITLE_CHARS = 500
MAX_LINE_CHARS = 4000       # longer log lines are cut before parsing


class LogError(V100labError):
    """A log file that is missing, unreadable, or not a llama.cpp log."""


# ------------------------------------------------------------------------------------------------
# patterns (each mirrors a llama.cpp format string)
# ------------------------------------------------------------------------------------------------

# common/log.cpp (llama-server, llama-cli): "<t> <L> " prefix, then an optional module tag (srv, cmn, slot, ...)
# tools/server/server-context.cpp print_timing: "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token,
# %8.2f tokens per second)", "       eval time = ..."; src/llama-context.cpp llama_perf_context_print:
# "%s: prompt eval time = ... tokens (...)" and "%s:        eval time = %10.2f ms / %5d runs   (%8.2f ms per
# token, %8.2f tokens per second)"
_RE_EVAL = re.compile(r"(prompt eval|eval) time = +(\d+(?:\.\d+)?) ms / +(\d+) (?:tokens|runs) +\( *(\d+(?:\.\d+)?|inf|nan) ms "
                      r"per token, +(\d+(?:\.\d+)?|inf|nan) tokens per second\)")
# tools/llama-bench/llama-bench.cpp (markdown_printer): "| model | size | params | backend | ngl | test | t/s |"
_RE_MD_ROW = re.compile(r"^\|(.+)\|\s*$")
_RE_TS = re.compile(r"(\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")
_RE_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB|B)\b")
# tools/llama-bench/llama-bench.cpp main(): build warnings
_RE_DEBUG = re.compile(r"warning: (debug build|asserts enabled|sanitizer enabled), performance may be affected")
# ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_init: "ggml_cuda_init: found %d CUDA devices:" and
# "  Device %d: %s, compute capability %d.%d, VMM: %s[, VRAM: %zu MiB]"
_RE_CUDA_DEV = re.compile(r"Device (\d+): (.+?), compute capability (\d+)\.(\d+), VMM: \w+(?:, VRAM: (\d+) MiB)?")
# src/llama.cpp llama_model_load_from_file_impl: "%s: using device %s (%s) (%s) - %zu MiB free"
# (older: "%s: using device %s (%s) - %zu MiB free")
_RE_USING_DEV = re.compile(r"using device (\S+) \((.+?)\)(?: \((.*?)\))? - (\d+) MiB free")
# common/common.cpp device info (llama-server -lv 4): "  - %-8s: %s (%zu MiB, %zu MiB free)"
_RE_DEV_INFO = re.compile(r"(?:^|: +)- (\S+) *: (.*) \((\d+) MiB, (\d+) MiB free\)")
# common/fit.cpp common_params_fit_impl: "projected to use %ld MiB of host memory vs. %ld MiB of total host memory"
_RE_FIT_HOST = re.compile(r"projected to use (\d+) MiB of host memory vs\. (\d+) MiB of total host memory")
# ggml/src/ggml-cuda/ggml-cuda.cu ggml_backend_cuda_buffer_type_alloc_buffer:
# "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s"
_RE_CUDA_OOM = re.compile(r"allocating (\d+(?:\.\d+)?) MiB on device (\d+): cudaMalloc failed: (.+)$")
# ggml/src/ggml-alloc.c (alloc_tensor_range, ggml_gallocr_reserve_n): "%s: failed to allocate %s buffer of size %zu"
_RE_ALLOC_FAIL = re.compile(r"failed to allocate (\S+) buffer of size (\d+)")
# src/llama-context.cpp llama_init_from_model / llama_context: the refusal, in its spellings over time
_RE_QV_NOFA = re.compile(r"quantized V cache requires flash_attn|V cache quantization requires flash_attn|"
                         r"quantized V cache was requested, but this requires Flash Attention")
# ggml backends, generic: "... not supported ... falling back ..." / "... fallback to CPU"
_RE_GENERIC_FALLBACK = re.compile(r"not supported.*(?:fall(?:ing)? ?back|using CPU)|fall(?:ing)? ?back to (?:the )?CPU",
                                  re.I)
# src/llama-mmap.cpp llama_mlock::raw_lock: "warning: failed to mlock %zu-byte buffer (after previously locking
# %zu bytes): %s"
_RE_MLOCK = re.compile(r"failed to mlock (\d+)-byte buffer")
# src/llama-model-loader.cpp print_info: "%s: file size   = %.2f GiB (%.2f BPW) " (MiB below 1 GiB)
_RE_FILE_SIZE = re.compile(r"(\d+(?:\.\d+)?) (GiB|MiB) \((\d+(?:\.\d+)?) BPW\)")
_RE_LOAD_START = re.compile(r"^llama_model_loader: loaded meta data")
# tools/server/server-context.cpp server_context::load_model (SRV_INF, printed at the default verbosity):
# "initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'"
_RE_SLOTS = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(true|false)'")
# common/common.cpp common_params_print_info (COM_INF): "%s: verbosity = %d (adjust with the `-lv N` CLI arg)"
_RE_VERBOSITY = re.compile(r"verbosity = (-?\d+) \(adjust with the `-lv N` CLI arg\)")
# common/arg.cpp (-ngl, -ts, -sm, -mg on a build without GPU offload; fprintf to stderr, any verbosity):
# "warning: no usable GPU found, --gpu-layers option will be ignored",
# "warning: llama.cpp was compiled without support for GPU offload. Setting %s has no effect."
_RE_NO_GPU = re.compile(r"warning: no usable GPU found, --gpu-layers option will be ignored|"
                        r"warning: llama\.cpp was compiled without support for GPU offload")
# llama-server lines printed at the default verbosity (tools/server/server.cpp main / llama_server):
# "initializing ...", "model loaded", "listening on %s"
_RE_SERVER_LINE = re.compile(r"^(?:main|llama_server): (?:initializing \.\.\.|model loaded|listening on )|"
                             r"^load_model: (?:loading model '|initializing, n_slots = )")

_GPU_BUFFER = re.compile(r"^(CUDA|ROCm|Vulkan|MTL|Metal|SYCL|CANN|MUSA|OpenCL|RPC)", re.I)
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One problem the log shows: its numbers, the line that shows it, and a one-line fix."""

    code: str
    severity: str             # error | warning | info
    title: str                # one line, with the numbers
    evidence: str             # the log line (prefix stripped)
    line_no: int              # 1-based line number in the log (0: derived from several lines)
    fix: str                  # one line
    numbers: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        # a log line can be 20,000 characters: evidence points at it, it does not reprint it
        object.__setattr__(self, "evidence", shorten(self.evidence, MAX_EVIDENCE_CHARS))
        object.__setattr__(self, "title", shorten(self.title, MAX_TITLE_CHARS))
        if not isinstance(self.numbers, MappingProxyType):
            object.__setattr__(self, "numbers", MappingProxyType(dict(self.numbers)))

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "title": self.title, "evidence": self.evidence,
                "line": self.line_no, "fix": self.fix, "numbers": dict(self.numbers)}


@dataclass(frozen=True)
class SpeedFact:
    """A tokens/s figure the log reports."""

    phase: str               # tg (decode) | pp (prompt) | pg (both, llama-bench pp+tg)
    tps: float
    n_tokens: int | None
    origin: str              # llama-server | llama-perf | llama-bench
    line_no: int
    line: str
    model_bytes: int | None = None   # llama-bench's size column, when the row carries one
    test: str = ""
    backend: str = ""                # llama-bench's backend column / backends field ("CUDA", "CPU", ...)


@dataclass(frozen=True)
class GpuFact:
    """A GPU the log names (ggml_cuda_init, "using device", device info)."""

    name: str                        # backend device name: CUDA0, ROCm0, Vulkan0 ...
    description: str                 # "Tesla V100-PCIE-16GB"
    compute_capability: str | None = None
    total_mib: int | None = None
    free_mib: int | None = None
    line_no: int = 0


@dataclass(frozen=True)
class Diagnosis:
    """Everything the doctor read from one log, and its findings (most severe first)."""

    source: str
    kind: str                                  # llama-server | llama-bench | llama-cli | load-log
    findings: tuple[Finding, ...]
    facts: loadlog.LoadFacts
    speeds: tuple[SpeedFact, ...] = ()
    gpus: tuple[GpuFact, ...] = ()
    model_bytes: int | None = None
    device: str | None = None                  # catalog id used for capacity and ceiling
    device_guessed: bool = False
    weights_ceiling_tg_tps: float | None = None
    host_free_bytes: int | None = None
    n_loads: int = 0
    notes: tuple[str, ...] = ()

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(f.code for f in self.findings)

    def finding(self, code: str) -> Finding | None:
        return next((f for f in self.findings if f.code == code), None)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (a contract); a NaN or infinity a log may hold becomes null."""
        return json_safe({
            "source": self.source, "kind": self.kind, "device": self.device, "device_guessed": self.device_guessed,
            "model_bytes": self.model_bytes, "weights_ceiling_tg_tps": json_number(self.weights_ceiling_tg_tps),
            "host_free_bytes": self.host_free_bytes, "n_loads": self.n_loads,
            "findings": [f.as_dict() for f in self.findings],
            "speeds": [{"phase": s.phase, "tok_s": s.tps, "n_tokens": s.n_tokens, "origin": s.origin,
                        "line": s.line_no, "test": s.test, "model_bytes": s.model_bytes} for s in self.speeds],
            "gpus": [{"name": g.name, "description": g.description, "compute_capability": g.compute_capability,
                      "total_mib": g.total_mib, "free_mib": g.free_mib} for g in self.gpus],
            "offloaded_layers": self.facts.offloaded_layers, "offloadable_layers": self.facts.offloadable_layers,
            "flash_attn": self.facts.flash_attn, "buffers_mib": self.facts.by_device(),
            "notes": list(self.notes),
        })

    def format_text(self) -> str:
        """The human report: one block per finding (severity, title, evidence with line number, fix).

        Every string is printed through :func:`~v100lab.base.safeio.term_text`: a log line or a GPU name
        holding terminal escape sequences is shown escaped, never executed by the terminal."""
        t = term_text
        head = f"{t(self.source)}: {self.kind} log"
        if self.device:
            head += f", device {t(self.device)}" + (" (from the log)" if self.device_guessed else "")
        if self.model_bytes:
            head += f", model {self.model_bytes / 1e9:.2f} GB"
        if self.weights_ceiling_tg_tps:
            head += f", decode ceiling {self.weights_ceiling_tg_tps:.1f} tok/s"
        lines = [head]
        if not self.findings:
            lines.append("  no problems found")
        for f in self.findings:
            lines.append(f"  [{f.severity}] {f.code}: {t(f.title)}")
            if f.evidence:
                ev = t(f.evidence, limit=MAX_EVIDENCE_CHARS)
                lines.append(f"      line {f.line_no}: {ev}" if f.line_no else f"      {ev}")
            lines.append(f"      fix: {t(f.fix)}")
        for n in self.notes:
            lines.append(f"  note: {t(n)}")
        return "\n".join(lines)



# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------

def read_log(path: str | os.PathLike) -> str:
    """The text of a log file; LogError (one line) when it is missing, unreadable, binary or larger than
    ``MAX_LOG_BYTES`` (counted as read: ``/dev/zero`` or a FIFO cannot make it read without end)."""
    p = Path(path)
    try:
        data = read_bounded(p, MAX_LOG_BYTES, what="log", error=LogError, refuse_binary=True)
    except LogError as exc:
        msg = str(exc)
        if "binary data" in msg:
            raise LogError(f"{term_text(p)}: not a llama.cpp log (binary data)") from None
        if "larger than" in msg:
            raise LogError(f"{msg}; cut the part with the run you want diagnosed") from None
        raise
    return data.decode("utf-8", errors="replace")


def _lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, normalized text) for every non-empty line; ``# `` comment lines are skipped.

    A line is cut at ``MAX_LINE_CHARS``: llama.cpp's lines the checks read are short, and a hostile one
    (thousands of digits, which ``int()`` refuses past 4300) must not reach the number parsers."""
    out = []
    for i, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("# "):
            continue
        line = normalize_line(raw[:MAX_LINE_CHARS])
        if line:
            out.append((i, line))
    return out


def _segments(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """Split at each model load (``llama_model_loader: loaded meta data``); lines before the first load
    (device discovery, build warnings) belong to the first segment."""
    starts = [k for k, (_, text) in enumerate(lines) if _RE_LOAD_START.match(text)]
    if len(starts) <= 1:
        return [lines]
    cuts = [0] + starts[1:] + [len(lines)]
    return [lines[a:b] for a, b in zip(cuts, cuts[1:])]


def _find(lines: Sequence[tuple[int, str]], pattern: re.Pattern | str, last: bool = False) -> tuple[int, str] | None:
    seq = reversed(lines) if last else lines
    for no, text in seq:
        if (pattern.search(text) if isinstance(pattern, re.Pattern) else pattern in text):
            return no, text
    return None


def _size_bytes(text: str) -> int | None:
    m = _RE_SIZE.search(text)
    return int(round(float(m.group(1)) * _UNITS[m.group(2)])) if m else None


# ------------------------------------------------------------------------------------------------
# what the load log does not cover: speeds, GPUs, free memory
# ------------------------------------------------------------------------------------------------

def parse_speeds(lines: Sequence[tuple[int, str]], text: str = "") -> list[SpeedFact]:
    """Every tok/s figure: llama-server / llama_perf "eval time" lines and llama-bench results."""
    out: list[SpeedFact] = []
    for no, line in lines:
        m = _RE_EVAL.search(line)
        if m:
            ms, n, tps = float(m.group(2)), int(m.group(3)), m.group(5)
            if ms <= 0 or n < 1 or tps in ("inf", "nan"):
                continue   # llama_perf prints zeros for work done outside its counters (llama-bench -v)
            origin = "llama-perf" if "runs" in line or line.startswith("llama_perf") else "llama-server"
            out.append(SpeedFact(phase="pp" if m.group(1) == "prompt eval" else "tg", tps=float(tps), n_tokens=n,
                                 origin=origin, line_no=no, line=line))
    out += _bench_markdown(lines)
    body = text.lstrip()
    if not out and (body[:1] in ("[", "{") or body.startswith(("build_commit,", '"build_commit"'))):
        out += _bench_records(text)   # llama-bench -o json | jsonl | csv
    return out


def _bench_markdown(lines: Sequence[tuple[int, str]]) -> list[SpeedFact]:
    """llama-bench's default (markdown) table: columns found by their header names."""
    out: list[SpeedFact] = []
    header: list[str] | None = None
    for no, line in lines:
        m = _RE_MD_ROW.match(line)
        if not m:
            header = None
            continue
        cells = [c.strip() for c in m.group(1).split("|")]
        if "test" in cells and "t/s" in cells:
            header = cells
            continue
        if header is None or set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(header, cells))
        test, ts = row.get("test", ""), _RE_TS.search(row.get("t/s", ""))
        if not ts:
            continue
        t = test.split("@")[0].strip()
        phase = "pg" if "+" in t else "tg" if t.startswith("tg") else "pp" if t.startswith("pp") else ""
        if not phase:
            continue
        n = re.findall(r"\d+", t)
        out.append(SpeedFact(phase=phase, tps=float(ts.group(1)), n_tokens=int(n[-1]) if n else None,
                             origin="llama-bench", line_no=no, line=line,
                             model_bytes=_size_bytes(row.get("size", "")), test=test,
                             backend=row.get("backend", "")))
    return out


def _bench_records(text: str) -> list[SpeedFact]:
    """llama-bench ``-o json|jsonl|csv`` output, read by :func:`v100lab.measure.llamabench.parse_llama_bench`."""
    try:
        recs = parse_llama_bench(text)
    except (V100labError, ValueError, TypeError, RecursionError, csv.Error):
        return []
    out = []
    for i, r in enumerate(recs if isinstance(recs, list) else [], 1):
        if not isinstance(r, Mapping) or not _finite_number(r.get("avg_ts")):
            continue
        n_p, n_g = r.get("n_prompt") or 0, r.get("n_gen") or 0
        if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in (n_p, n_g)):
            continue
        phase = "pg" if n_p and n_g else "tg" if n_g else "pp"
        test = f"pp{n_p}+tg{n_g}" if phase == "pg" else f"tg{n_g}" if phase == "tg" else f"pp{n_p}"
        out.append(SpeedFact(phase=phase, tps=float(r["avg_ts"]), n_tokens=n_g or n_p, origin="llama-bench",
                             line_no=0, line=f"record {i}: {test} avg_ts {r['avg_ts']}",
                             model_bytes=r.get("model_size") if isinstance(r.get("model_size"), int) else None,
                             test=test, backend=str(r.get("backends") or "")))
    return out


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_gpus(lines: Sequence[tuple[int, str]]) -> list[GpuFact]:
    """GPUs from ggml_cuda_init's device list, "using device" lines and llama-server's device info."""
    gpus: dict[str, GpuFact] = {}
    for no, line in lines:
        if m := _RE_CUDA_DEV.search(line):
            name = f"CUDA{m.group(1)}"
            old = gpus.get(name)
            gpus[name] = GpuFact(name=name, description=m.group(2).strip(), compute_capability=f"{m.group(3)}.{m.group(4)}",
                                 total_mib=int(m.group(5)) if m.group(5) else (old.total_mib if old else None),
                                 free_mib=old.free_mib if old else None, line_no=no)
        elif m := _RE_USING_DEV.search(line):
            name, desc, free = m.group(1), m.group(2), int(m.group(4))
            old = gpus.get(name)
            gpus[name] = GpuFact(name=name, description=old.description if old else desc,
                                 compute_capability=old.compute_capability if old else None,
                                 total_mib=old.total_mib if old else None, free_mib=free,
                                 line_no=old.line_no if old else no)
        elif (m := _RE_DEV_INFO.search(line)) and not m.group(1).upper().startswith("CPU"):
            name = m.group(1)
            old = gpus.get(name)
            gpus[name] = GpuFact(name=name, description=old.description if old else m.group(2).strip(),
                                 compute_capability=old.compute_capability if old else None,
                                 total_mib=int(m.group(3)), free_mib=int(m.group(4)), line_no=old.line_no if old else no)
    return list(gpus.values())


def host_free_bytes(lines: Sequence[tuple[int, str]]) -> tuple[int | None, int | None, int]:
    """(free host RAM, total host RAM, line) as llama-server reports them (device info, or --fit's projection)."""
    for no, line in lines:
        m = _RE_DEV_INFO.search(line)
        if m and m.group(1).upper().startswith("CPU"):
            return int(m.group(4)) * 2**20, int(m.group(3)) * 2**20, no
    for no, line in lines:
        m = _RE_FIT_HOST.search(line)
        if m:
            return None, int(m.group(2)) * 2**20, no
    return None, None, 0


def guess_device(gpus: Sequence[GpuFact]):
    """The catalog device a log's first GPU is, when its name says so unambiguously (else None).

    "Tesla V100-PCIE-16GB" → v100-16gb: every word of the catalog name except the vendor's must be in the
    GPU's name (its memory size from the name, or from the total the log reports)."""
    if not gpus:
        return None
    g = gpus[0]
    words = set(re.findall(r"[a-z0-9]+", g.description.lower()))
    mib = g.total_mib or None
    if mib:
        words.add(f"{round(mib / 1024)}gb")
    vendor = {"tesla", "nvidia", "geforce", "amd", "radeon", "intel"}
    best, best_n, tie = None, 0, False
    for dev in catalog().values():
        need = set(re.findall(r"[a-z0-9]+", dev.name.lower())) - vendor
        if need and need <= words:
            if len(need) > best_n:
                best, best_n, tie = dev, len(need), False
            elif len(need) == best_n:
                tie = True
    return None if tie else best


# ------------------------------------------------------------------------------------------------
# the checks
# ------------------------------------------------------------------------------------------------

def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def _gpu_names(facts: loadlog.LoadFacts, gpus: Sequence[GpuFact]) -> list[str]:
    names = [d for d in facts.devices if d != loadlog.HOST and _GPU_BUFFER.match(d)]
    for g in gpus:
        if g.name not in names:
            names.append(g.name)
    return names


def _check_build(lines, device, has_gpu: bool) -> list[Finding]:
    out = []
    for no, line in lines:
        m = _RE_DEBUG.search(line)
        if m:
            what = m.group(1)
            out.append(Finding(
                "debug-build", "error" if what == "debug build" else "warning",
                ("llama.cpp was built without optimisation (a debug build): every kernel runs slowly"
                 if what == "debug build" else f"llama.cpp was built with {what}: slower than a release build"),
                line, no,
                "rebuild: cmake -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --config Release",
                {"warning": what}))
    if device is not None and device.kind == "gpu" and not has_gpu:
        arch = (device.compute_capability or "").replace(".", "")
        hit = _find(lines, "system_info") or _find(lines, "CPU_Mapped model buffer") or (0, "")
        out.append(Finding(
            "no-gpu-backend", "error",
            f"--device {device.id} is a GPU, but this llama.cpp reports no GPU (no CUDA device, no GPU buffer): "
            "every layer runs on the CPU", hit[1], hit[0],
            "rebuild with -DGGML_CUDA=ON" + (f" -DCMAKE_CUDA_ARCHITECTURES={arch}" if arch else "")
            + " -DCMAKE_BUILD_TYPE=Release", {"device": device.id}))
    return out


def _check_no_gpu_warning(lines, device) -> list[Finding]:
    """llama.cpp's own word that it has no GPU (common/arg.cpp, printed at any verbosity when -ngl, -ts,
    -sm or -mg is given to a build without GPU offload)."""
    hit = _find(lines, _RE_NO_GPU)
    if not hit:
        return []
    arch = (device.compute_capability or "").replace(".", "") if device is not None else ""
    return [Finding(
        "no-gpu-backend", "error",
        "this llama.cpp has no usable GPU backend: --gpu-layers is ignored and every layer runs on the CPU "
        "(a CPU-only build, or the GPU is not visible to it)", hit[1], hit[0],
        "use a GPU build: cmake -B build -DGGML_CUDA=ON" + (f" -DCMAKE_CUDA_ARCHITECTURES={arch}" if arch else "")
        + " -DCMAKE_BUILD_TYPE=Release (or the CUDA wheel of your package); check that nvidia-smi sees the card",
        {"device": device.id} if device is not None else {})]


def _check_cpu_only_build(lines, seg_facts, host_gpus, has_gpu: bool, knows_backend: bool) -> list[Finding]:
    """A GPU in this machine (``host_gpus``: nvidia-smi's cards) but a log without a GPU backend: llama.cpp was
    built without CUDA (ggml-org/llama.cpp "does not use my GPU", the commonest support question)."""
    if not host_gpus or has_gpu or not knows_backend:
        return []
    cards = ", ".join(dict.fromkeys(f"{g.name} (sm_{g.sm})" for g in host_gpus))
    archs = ";".join(str(a) for a in sorted({g.sm for g in host_gpus}))
    f = next((f for f in reversed(seg_facts) if f.offloadable_layers is not None), None)
    shown = (f"offloaded {f.offloaded_layers}/{f.offloadable_layers} layers" if f is not None
             else "no GPU buffer")
    hit = (_find(lines, re.compile(r"offloaded \d+/\d+ layers to GPU")) or _find(lines, "CPU_Mapped model buffer")
           or _find(lines, "system_info") or (0, ""))
    return [Finding(
        "cpu-only-build", "error",
        f"this llama.cpp was built without CUDA: nvidia-smi lists {cards}, but the log shows no GPU backend "
        f"({shown}, every buffer in host memory)", hit[1], hit[0],
        f"rebuild for the card: scripts/setup.sh (it detects the GPU; V100LAB_GPU=1 after a CPU fallback), or "
        f"CMAKE_ARGS=\"-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES={archs}\" pip install --force-reinstall "
        "--no-cache-dir --no-deps llama-cpp-python",
        {"host_gpus": [g.name for g in host_gpus], "cuda_architectures": archs,
         "offloaded_layers": f.offloaded_layers if f is not None else None,
         "offloadable_layers": f.offloadable_layers if f is not None else None})]


def _check_slots(seg, facts: loadlog.LoadFacts) -> list[Finding]:
    """llama-server's slot split: with --parallel N and no unified KV cache, each slot holds n_ctx / N cells.

    tools/server/server-context.cpp load_model logs ``n_slots``, ``n_ctx_slot`` (llama_n_ctx_seq, capped by
    the training context) and ``kv_unified``; src/llama-context.cpp sets ``n_ctx_seq = GGML_PAD(n_ctx /
    n_seq_max, 256)`` unless kv_unified. The -c asked for is ``llama_context: n_ctx`` at verbosity 4; at the
    default verbosity it is inferred as n_slots × n_ctx_slot."""
    hit = _find(seg, _RE_SLOTS, last=True)
    if hit:
        m = _RE_SLOTS.search(hit[1])
        n_slots, per_slot, unified = int(m.group(1)), int(m.group(2)), m.group(3) == "true"
    elif facts.n_seq_max and facts.n_ctx_seq and facts.kv_unified is not None:
        n_slots, per_slot, unified = facts.n_seq_max, facts.n_ctx_seq, facts.kv_unified
        hit = _find(seg, re.compile(r"^llama_context: n_ctx_seq +=")) or (0, "")
    else:
        return []
    if n_slots < 2 or unified:
        return []
    asked, inferred = facts.n_ctx, facts.n_ctx is None
    if inferred:
        asked = n_slots * per_slot
    if per_slot >= asked:
        return []
    need = f"-c {n_slots * asked}" if not inferred else f"-c {n_slots} × the tokens one request needs"
    return [Finding(
        "slot-split", "warning",
        f"each of the {n_slots} server slots holds {per_slot} tokens, not the {asked} of -c"
        + (" (inferred: n_slots × n_ctx_slot)" if inferred else "")
        + f": the KV cache is split over --parallel {n_slots}, so a request longer than {per_slot} tokens "
        "is cut or refused", hit[1], hit[0],
        f"give every slot the context a request needs ({need}), or --kv-unified (the slots share all {asked} "
        f"cells), or fewer slots (--parallel 1 when requests do not overlap)",
        {"n_slots": n_slots, "n_ctx_slot": per_slot, "n_ctx": asked, "n_ctx_inferred": inferred,
         "kv_unified": unified})]


def _has_load_lines(facts: loadlog.LoadFacts) -> bool:
    return bool(facts.buffers or facts.kv_caches or facts.recurrent or facts.model_info
                or facts.offloaded_layers is not None or facts.n_ctx is not None)


def _check_quiet(lines, kind: str, seg_facts: Sequence[loadlog.LoadFacts]) -> list[Finding]:
    """A llama-server or llama-cli log without load lines: say what cannot be checked and how to see it.

    common/log.cpp ``common_log_get_verbosity`` maps llama.cpp's INFO messages (every load line) to
    LOG_LEVEL_TRACE (4); llama-server's default verbosity is 3 (common/common.h), so they are dropped."""
    if kind not in ("llama-server", "llama-cli") or any(_has_load_lines(f) for f in seg_facts):
        return []
    hit = _find(lines, _RE_VERBOSITY)
    level = int(_RE_VERBOSITY.search(hit[1]).group(1)) if hit else None
    at = f" (it ran at verbosity {level}; llama.cpp prints them from 4)" if level is not None else ""
    return [Finding(
        "quiet-log", "warning",
        f"the log has no load lines{at}: where the layers went (GPU or CPU), the memory per device, the KV "
        "cache and flash attention cannot be checked, so no finding here means nothing about them",
        hit[1] if hit else "", hit[0] if hit else 0,
        f"run {kind} again with -lv 4 (or -v) and keep stdout and stderr together "
        f"({kind} ... -lv 4 > {kind}.log 2>&1), then diagnose that log",
        {"verbosity": level} if level is not None else {})]


def _check_offload(seg, facts: loadlog.LoadFacts, gpu_present: bool) -> list[Finding]:
    n, m = facts.offloaded_layers, facts.offloadable_layers
    if n is None or m is None or not gpu_present:
        return []
    hit = _find(seg, f"offloaded {n}/{m} layers to GPU") or (0, f"offloaded {n}/{m} layers to GPU")
    host_mib = facts.buffer_mib("model", loadlog.HOST)
    nums = {"offloaded_layers": n, "offloadable_layers": m, "host_model_mib": round(host_mib, 2)}
    if n == 0:
        return [Finding("no-offload", "error",
                        f"0/{m} layers on the GPU: all {m} run on the CPU from host memory "
                        f"({host_mib / 1024:.2f} GiB of weights in RAM)", hit[1], hit[0],
                        "add --gpu-layers 999 (older llama.cpp defaulted -ngl to 0)", nums)]
    if n < m:
        return [Finding("partial-offload", "warning",
                        f"{n}/{m} layers on the GPU: {m - n} run on the CPU, and every token waits for host memory "
                        f"({host_mib / 1024:.2f} GiB of weights in RAM)", hit[1], hit[0],
                        "free GPU memory (smaller --ctx-size, -ctk/-ctv q8_0 with --flash-attn on, or a smaller "
                        "quant) until v100lab plan shows every layer fits, then --gpu-layers 999", nums)]
    return []


def _check_capacity(seg, facts: loadlog.LoadFacts, gpus: Sequence[GpuFact], device) -> list[Finding]:
    out = []
    by = facts.by_device()
    gpu_info = {g.name: g for g in gpus}
    # allocation failures (the buffer that did not fit is not in the "buffer size" lines)
    failed: dict[str, tuple[float, int, str]] = {}
    for no, line in seg:
        if m := _RE_CUDA_OOM.search(line):
            failed.setdefault(f"CUDA{m.group(2)}", (float(m.group(1)), no, line))
        elif (m := _RE_ALLOC_FAIL.search(line)) and _GPU_BUFFER.match(m.group(1)):
            name = loadlog.buffer_device(m.group(1))
            failed.setdefault(name, (int(m.group(2)) / 2**20, no, line))
    names = [d for d in by if d != loadlog.HOST] + [d for d in failed if d not in by]
    for dev_name in names:
        kinds = by.get(dev_name, {})
        used_mib = sum(kinds.values())
        fail = failed.get(dev_name)
        cap_mib, cap_src = None, ""
        if device is not None and device.kind != "cpu":
            cap_mib = (device.capacity_bytes - device.overhead_bytes) / 2**20
            cap_src = f"{device.name}: {device.memory_gib:g} GiB less {device.runtime_overhead_mib:g} MiB runtime overhead"
        elif dev_name in gpu_info and gpu_info[dev_name].free_mib:
            cap_mib = float(gpu_info[dev_name].free_mib)
            cap_src = f"{gpu_info[dev_name].free_mib} MiB free when llama.cpp started"
        parts = ", ".join(f"{k} {v:.0f} MiB" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        nums = {"device": dev_name, "used_mib": round(used_mib, 2), **{f"{k}_mib": round(v, 2) for k, v in kinds.items()}}
        if fail is not None:
            need = used_mib + fail[0]
            nums.update(failed_alloc_mib=round(fail[0], 2), needed_mib=round(need, 2))
            if cap_mib:
                nums["capacity_mib"] = round(cap_mib, 2)
            if cap_mib and need > cap_mib:
                over = f", {need - cap_mib:.0f} MiB over ({cap_src})"
            elif cap_mib:
                over = (f", within {cap_mib:.0f} MiB ({cap_src}): something else holds that GPU's memory, "
                        "or it is not this device")
            else:
                over = ""
            out.append(Finding("over-capacity", "error",
                               f"{dev_name}: an allocation of {fail[0]:.0f} MiB failed"
                               + (f" on top of {parts}" if parts else "") + f": {need:.0f} MiB needed{over}",
                               fail[2], fail[1],
                               "lower the memory: a smaller quant, --ctx-size, -ctk/-ctv q8_0 with --flash-attn on, "
                               "or fewer --gpu-layers (v100lab tune finds the fastest that fits)", nums))
            continue
        if not cap_mib or not used_mib:
            continue
        nums["capacity_mib"] = round(cap_mib, 2)
        biggest = max(kinds, key=kinds.get)
        hit = _find(seg, re.compile(rf"\b{re.escape(dev_name)}(?:_\w+)? +{re.escape(biggest)} buffer size")) or (0, "")
        if used_mib > cap_mib:
            out.append(Finding("over-capacity", "error",
                               f"{dev_name}: weights + KV + compute = {used_mib:.0f} MiB ({parts}) exceed "
                               f"{cap_mib:.0f} MiB ({cap_src}) by {used_mib - cap_mib:.0f} MiB",
                               hit[1], hit[0],
                               "lower the memory: a smaller quant, --ctx-size, -ctk/-ctv q8_0 with --flash-attn on, "
                               "or fewer --gpu-layers (v100lab tune finds the fastest that fits)", nums))
        elif used_mib > NEAR_CAPACITY * cap_mib:
            out.append(Finding("near-capacity", "warning",
                               f"{dev_name}: {used_mib:.0f} MiB ({parts}) fill {100 * used_mib / cap_mib:.0f} % of "
                               f"{cap_mib:.0f} MiB ({cap_src}): {cap_mib - used_mib:.0f} MiB to spare",
                               hit[1], hit[0],
                               "leave a margin: a shorter --ctx-size or -ctk/-ctv q8_0 with --flash-attn on", nums))
    return out


def _check_quantized_v(seg, facts: loadlog.LoadFacts) -> list[Finding]:
    hit = _find(seg, _RE_QV_NOFA)
    type_v = next((k.type_v for k in facts.kv_caches), None)
    if hit:
        return [Finding("quantized-v-no-fa", "error",
                        "a quantized V cache with flash attention off: llama.cpp refuses to create the context",
                        hit[1], hit[0],
                        "add --flash-attn on (a quantized V cache needs it), or use --cache-type-v f16",
                        {"type_v": type_v} if type_v else {})]
    quant_v = [k for k in facts.kv_caches if k.type_v.lower() not in ("f16", "f32", "bf16")]
    if quant_v and facts.flash_attn == "disabled":
        kv = quant_v[0]
        hit = _find(seg, f"V ({kv.type_v})") or (0, "")
        return [Finding("quantized-v-no-fa", "error",
                        f"V cache is {kv.type_v} ({kv.v_mib:.2f} MiB) while flash attention is disabled",
                        hit[1], hit[0], "add --flash-attn on, or use --cache-type-v f16",
                        {"type_v": kv.type_v, "v_mib": kv.v_mib})]
    return []


def _check_fallbacks(seg, facts: loadlog.LoadFacts, gpu_present: bool) -> list[Finding]:
    out = []
    fa_cpu = [fb for fb in facts.cpu_fallbacks if "Flash Attention tensor" in fb]
    moved = []
    for fb in facts.cpu_fallbacks:
        types = loadlog.buffer_fallback(fb)
        # CPU_REPACK → CPU only means "no faster CPU layout for this type": not a device fallback
        if types and not types[0].upper().startswith("CPU"):
            moved.append((fb, *types))
    if fa_cpu and gpu_present:
        hit = _find(seg, fa_cpu[0]) or (0, fa_cpu[0])
        fa_auto = _find(seg, "Flash Attention was auto, set to disabled")
        out.append(Finding("cpu-fallback", "warning",
                           f"flash attention of {len(fa_cpu)} layer(s) is assigned to the CPU (no kernel for this "
                           "GPU/head size)" + ("; llama.cpp turned flash attention off" if fa_auto else ""),
                           hit[1], hit[0],
                           "run with --flash-attn off on this GPU (then the V cache must be f16), or build llama.cpp "
                           "with kernels for its architecture (-DCMAKE_CUDA_ARCHITECTURES)", {"layers": len(fa_cpu)}))
    if moved:
        fb, want, got = moved[0]
        hit = _find(seg, fb) or (0, fb)
        out.append(Finding("cpu-fallback", "warning",
                           f"{len(moved)} tensor group(s) could not use buffer type {want} and went to {got}",
                           hit[1], hit[0],
                           "use a weight type this backend supports (e.g. Q4_0/Q4_K_M/Q8_0 on CUDA) or a newer build",
                           {"count": len(moved), "wanted": want, "got": got}))
    for no, line in seg:
        if _RE_GENERIC_FALLBACK.search(line) and not loadlog.buffer_fallback(line) \
                and "Falling back to buffered I" not in line:
            out.append(Finding("cpu-fallback", "warning", "an operation is not supported on the device and falls back",
                               line, no, "use a build (and CUDA architecture) that supports it, or change the flag that "
                               "asks for it", {}))
            break
    n_gpus = len([d for d in facts.devices if d != loadlog.HOST])
    splits = facts.graph_splits
    full = facts.offloaded_layers is not None and facts.offloaded_layers == facts.offloadable_layers
    if gpu_present and full and splits is not None and splits > n_gpus + 2:
        hit = _find(seg, f"splits = {splits}") or _find(seg, f"graph splits = {splits}") or (0, "")
        out.append(Finding("cpu-fallback", "warning",
                           f"all layers are on the GPU, yet the graph has {splits} splits: ops bounce between GPU and "
                           "CPU every token", hit[1], hit[0],
                           "look for ops the GPU backend does not support (GGML_SCHED_DEBUG=2 lists them); try a newer "
                           "build or --flash-attn off", {"graph_splits": splits}))
    return out


def _check_mmap(seg, facts: loadlog.LoadFacts, free_ram: int | None, total_ram: int | None, ram_line: int,
                gpu_present: bool) -> list[Finding]:
    out = []
    for no, line in seg:
        if m := _RE_MLOCK.search(line):
            out.append(Finding("mlock-failed", "warning",
                               f"--mlock could not lock {int(m.group(1)) / 2**30:.2f} GiB: the weights stay evictable",
                               line, no, "raise the limit (ulimit -l unlimited, or LimitMEMLOCK=infinity for a service) "
                               "or stop mapping the file (--no-mmap; current builds: --load-mode none)",
                               {"bytes": int(m.group(1))}))
            break
    mapped_mib = sum(b.mib for b in facts.buffers if b.kind == "model" and b.buffer.upper().endswith("_MAPPED")
                     and b.device == loadlog.HOST)
    layers_on_host = (not gpu_present) or (facts.offloaded_layers is not None
                                           and facts.offloaded_layers < (facts.offloadable_layers or 0))
    if not mapped_mib or not layers_on_host:
        return out
    mapped = mapped_mib * 2**20
    avail = free_ram if free_ram is not None else None
    if avail is None:
        return out
    if mapped > MMAP_RAM_FRACTION * avail:
        hit = _find(seg, re.compile(r"CPU_Mapped model buffer size")) or (ram_line, "")
        out.append(Finding("mmap-low-ram", "warning",
                           f"{_gib(mapped)} of weights are mmap'ed and run on the CPU, but only {_gib(avail)} of RAM "
                           f"is free{f' (of {_gib(total_ram)})' if total_ram else ''}: pages are evicted and re-read "
                           "from disk", hit[1], hit[0],
                           "lock the weights in RAM (--mlock, or --no-mmap; current builds: --load-mode mmap+mlock "
                           "or none) and free RAM, or offload more layers so fewer weights live in RAM",
                           {"mapped_bytes": int(mapped), "free_ram_bytes": int(avail)}))
    return out


def _check_speed(speeds: Sequence[SpeedFact], model_bytes: int | None, device, gpu_present: bool,
                 notes: list[str]) -> tuple[list[Finding], float | None]:
    tg = [s for s in speeds if s.phase == "tg"]
    if not tg:
        return [], None
    if device is None:
        notes.append("tok/s found but no device: give --device to compare it with the bandwidth ceiling")
        return [], None
    size = model_bytes or next((s.model_bytes for s in tg if s.model_bytes), None)
    if not size:
        notes.append("tok/s found but no model size in the log (print_info: file size, or llama-bench's size "
                     "column): no ceiling")
        return [], None
    ceiling = ceiling_tps(size, device.bandwidth_gbs)
    out = []
    best = max(tg, key=lambda s: s.tps)
    nums = {"tok_s": best.tps, "ceiling_tok_s": round(ceiling, 3), "model_bytes": size,
            "bandwidth_gbs": device.bandwidth_gbs}
    if best.tps > ceiling:
        out.append(Finding("above-ceiling", "error",
                           f"decode {best.tps:.1f} tok/s is above the ceiling {ceiling:.1f} tok/s "
                           f"({device.bandwidth_gbs:g} GB/s / {size / 1e9:.2f} GB of weights on {device.id}): "
                           "physically impossible", best.line, best.line_no,
                           "the measurement or the model size is wrong: re-measure (llama-bench -n 128 -r 5) and "
                           "check which file and device were used", nums))
    slow = min(tg, key=lambda s: s.tps)
    if device.kind == "gpu" and gpu_present and slow.tps < FAR_BELOW * ceiling:
        out.append(Finding("far-below-ceiling", "warning",
                           f"decode {slow.tps:.1f} tok/s is {100 * slow.tps / ceiling:.0f} % of the ceiling "
                           f"{ceiling:.1f} tok/s on {device.id}: the weights are not being read from GPU memory",
                           slow.line, slow.line_no,
                           "check the findings above: layers on the CPU, CPU fallbacks, or a debug build",
                           {**nums, "tok_s": slow.tps}))
    return out, ceiling


# ------------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------------

def _kind(lines, speeds) -> str:
    origins = {s.origin for s in speeds}
    if "llama-bench" in origins or _find(lines, "performance may be affected"):
        return "llama-bench"
    if "llama-server" in origins or _find(lines, re.compile(r"llama_server|load_model:|listening on http")):
        return "llama-server"
    if _find(lines, re.compile(r"llama_perf_context_print|main: |llama-cli")):
        return "llama-cli"
    return "load-log"


def _is_llama_log(facts: loadlog.LoadFacts, lines, speeds, gpus) -> bool:
    return bool(facts.buffers or facts.model_info or facts.kv_caches or facts.offloaded_layers is not None
                or facts.n_ctx is not None or speeds or gpus or facts.system_info
                or _find(lines, re.compile(r"^(llama_model_load|llama_model_loader|llama_init_from_model|load_tensors|"
                                           r"llama_context|ggml_cuda_init|common_init_)"))
                or _find(lines, _RE_DEBUG) or _find(lines, _RE_SERVER_LINE) or _find(lines, _RE_SLOTS)
                or _find(lines, _RE_VERBOSITY) or _find(lines, _RE_NO_GPU))


def _model_bytes(facts: loadlog.LoadFacts) -> int | None:
    fs = facts.model_meta.get("file size")
    m = _RE_FILE_SIZE.search(fs) if fs else None
    return _size_bytes(m.group(0)) if m else None


_ORDER = {"error": 0, "warning": 1, "info": 2}


def diagnose(text: str, device=None, *, source: str = "<log>", free_ram_bytes: int | None = None,
             host_gpus: Sequence[cudabuild.Gpu] = ()) -> Diagnosis:
    """Diagnose the text of a llama.cpp log.

    ``device``: a catalog id, device file or Device — the memory and bandwidth to judge by; without it the
    GPU the log names is looked up in the catalog (and free memory the log reports is used for capacity).
    ``free_ram_bytes``: free host RAM when the log does not say (llama-server -lv 4 does).
    ``host_gpus``: the cards of the machine that made the log (:func:`v100lab.base.cudabuild.detect_gpus`).
    Raises LogError when the text is not a llama.cpp log."""
    dev = get_device(device) if device is not None else None
    lines = _lines(text)
    speeds = parse_speeds(lines, text)
    gpus = parse_gpus(lines)
    segments = _segments(lines)
    seg_facts = [loadlog.parse_load_log("\n".join(t for _, t in seg)) for seg in segments]
    facts = seg_facts[-1]
    if not _is_llama_log(facts, lines, speeds, gpus) and not any(_is_llama_log(f, [], [], []) for f in seg_facts):
        raise LogError(f"{source}: not a llama.cpp log (no load, buffer, timing or llama-bench lines)")
    guessed = False
    if dev is None:
        dev = guess_device(gpus)
        guessed = dev is not None
    notes: list[str] = []
    free_ram, total_ram, ram_line = host_free_bytes(lines)
    if free_ram_bytes is not None:
        free_ram = free_ram_bytes
    has_gpu = (bool(gpus) or any(_gpu_names(f, ()) for f in seg_facts)
               or any(_GPU_BUFFER.match(s.backend) for s in speeds if s.backend))
    # "no GPU backend" needs proof that the log covers a load (buffers, or llama-bench's backend column)
    knows_backend = any(f.buffers for f in seg_facts) or any(s.backend for s in speeds)
    no_gpu = _check_no_gpu_warning(lines, dev)
    cpu_only = _check_cpu_only_build(lines, seg_facts, host_gpus, has_gpu, knows_backend or bool(no_gpu))
    findings: list[Finding] = no_gpu + cpu_only + _check_build(
        lines, dev, has_gpu or not knows_backend or bool(no_gpu) or bool(cpu_only))
    kind = _kind(lines, speeds)
    findings += _check_quiet(lines, kind, seg_facts)
    for seg, f in zip(segments, seg_facts):
        gpu_present = has_gpu or bool(_gpu_names(f, gpus))
        findings += _check_slots(seg, f)
        findings += _check_offload(seg, f, gpu_present)
        findings += _check_capacity(seg, f, gpus, dev)
        findings += _check_quantized_v(seg, f)
        findings += _check_fallbacks(seg, f, gpu_present)
        findings += _check_mmap(seg, f, free_ram, total_ram, ram_line, gpu_present)
    model_bytes = next((b for b in (_model_bytes(f) for f in reversed(seg_facts)) if b), None)
    speed_findings, ceiling = _check_speed(speeds, model_bytes, dev, has_gpu, notes)
    findings += speed_findings
    if len(segments) > 1:
        notes.append(f"the log holds {len(segments)} model loads; each was checked")
    # one finding per (code, evidence line): a log with several loads repeats itself
    seen, unique = set(), []
    for f in findings:
        key = (f.code, f.evidence or f.title)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    unique.sort(key=lambda f: (_ORDER[f.severity], f.line_no or 10**9))
    return Diagnosis(source=source, kind=kind, findings=tuple(unique), facts=facts,
                     speeds=tuple(speeds), gpus=tuple(gpus), model_bytes=model_bytes or next(
                         (s.model_bytes for s in speeds if s.model_bytes), None),
                     device=dev.id if dev is not None else None, device_guessed=guessed, weights_ceiling_tg_tps=ceiling,
                     host_free_bytes=free_ram, n_loads=sum(1 for _, t in lines if _RE_LOAD_START.match(t)),
                     notes=tuple(notes))


def diagnose_file(path: str | os.PathLike, device=None, free_ram_bytes: int | None = None,
                  host_gpus: Sequence[cudabuild.Gpu] = ()) -> Diagnosis:
    """:func:`diagnose` on a file (LogError when it is missing, unreadable or not a llama.cpp log)."""
    return diagnose(read_log(path), device, source=str(path), free_ram_bytes=free_ram_bytes, host_gpus=host_gpus)
