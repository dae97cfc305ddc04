"""llama-bench-grade measurements: tests, repetitions, statistics, result rows, sweeps.

Anchor: llama.cpp's tools/llama-bench (warmup, r repetitions with the KV cache cleared between them,
tokens/s per repetition, mean ± *sample* standard deviation, build and hardware recorded, a failed
configuration counted and the run continued). What it adds for the workbook:

* the same tests through other backends (:mod:`v100lab.measure.backends`): in-process llama-cpp-python (default),
  llama-server over HTTP, llama-cpp-python's own server, and llama-bench's own output imported;
* a noise flag: the coefficient of variation (sd / mean) of the per-repetition tokens/s above
  :data:`NOISY_CV` marks the row ``noisy`` (shared machines are noisy; compare within one run);
* llama.cpp's load facts (:mod:`v100lab.facts.loadlog`) and a machine monitor (:mod:`v100lab.measure.monitor`) per row;
* a durable results file (:mod:`v100lab.facts.store`): rows are fsync'ed one by one and a sweep resumes from it.

Row fields use llama-bench's names where llama-bench has one (``n_prompt``, ``n_gen``, ``n_depth``,
``avg_ts``, ``stddev_ts``, ``samples_ts``, ``samples_ns``, ``n_gpu_layers``, ``type_k``, ``flash_attn``, ...);
values are v100lab's (``flash_attn`` is "on"/"off"/"auto" as in RunConfig; :mod:`v100lab.measure.llamabench`
converts to and from llama-bench's own encodings).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import platform
import statistics
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from v100lab.base import buildflags
from v100lab.models import zoo
from v100lab.measure.backends import Backend, BenchTest, MeasureFailed, Measurement, get_backend
from v100lab.measure.backends.isolated import llama_build
from v100lab.facts.config import RunConfig, MAX_POSITIONS
from v100lab.base.errors import ConfigError, V100labError
from v100lab.gguf.header import read_spec
from v100lab.measure.monitor import Monitor
from v100lab.facts.results import TPS, Observation
from v100lab.facts.store import ResultsStore, row_key
from v100lab.models.worker import WorkerCrashed
from v100lab.base.safeio import short_repr

log = logging.getLogger(__name__)

DEFAULT_TESTS = ("pp512", "tg128")     # llama-bench's defaults (-p 512 -n 128)
DEFAULT_REPETITIONS = 5                # llama-bench's -r default
NOISY_CV = 0.05                        # cv above this flags the row as noisy (the ±5 % agreement band)

# Sweep levers that are not RunConfig fields
SPECIAL_LEVERS = ("n_depth", "model", "cache_type")


# --------------------------------------------------------------------------------------------
# tests and statistics
# --------------------------------------------------------------------------------------------

def parse_test(spec: str) -> BenchTest:
    """``pp512`` / ``tg128`` / ``pp512+tg128`` (optionally ``@d1024`` or `` @ d1024``) → BenchTest."""
    text = spec.replace(" ", "").lower()
    body, _, depth = text.partition("@")
    n_prompt = n_gen = 0
    try:
        for part in body.split("+"):
            if part.startswith("pp"):
                n_prompt = int(part[2:])
            elif part.startswith("tg"):
                n_gen = int(part[2:])
            else:
                raise ValueError(part)
        n_depth = int(depth.removeprefix("d")) if depth else 0
    except ValueError:
        raise ConfigError(f"bad test '{spec}': use ppN, tgN or ppN+tgN, e.g. pp512,tg128") from None
    return BenchTest(n_prompt, n_gen, n_depth)


def make_tests(tests: str | Iterable[str | BenchTest] = DEFAULT_TESTS,
               depths: Iterable[int] | str = (0,)) -> list[BenchTest]:
    """Every test at every depth (llama-bench's order: depth varies fastest within a test)."""
    if isinstance(tests, str):
        tests = [t for t in tests.split(",") if t.strip()]
    if isinstance(depths, str):
        try:
            depths = [int(d) for d in depths.split(",") if d.strip()]
        except ValueError:
            raise ConfigError(f"bad depth list {short_repr(depths)}: use integers, e.g. 0,1024") from None
    depths = list(depths) or [0]
    if any(d < 0 for d in depths):
        raise ConfigError(f"depths must be >= 0, got {short_repr(depths)}")
    if any(d > MAX_POSITIONS for d in depths):
        raise ConfigError(f"depth {max(depths)} is beyond any context: llama.cpp holds at most "
                          f"{MAX_POSITIONS:,} positions (llama_pos is 32-bit)")
    out = []
    for t in tests:
        base = t if isinstance(t, BenchTest) else parse_test(t)
        for d in depths:
            out.append(BenchTest(base.n_prompt, base.n_gen, d if d else base.n_depth))
    if not out:
        raise ConfigError("no tests given")
    return out


def summarize(samples_ns: Sequence[int], n_tokens: int, noisy_cv: float = NOISY_CV) -> dict[str, Any]:
    """llama-bench's statistics of one test (tools/llama-bench/llama-bench.cpp, ``test::get_ts``/``stdev``):
    tokens/s per repetition = 1e9 · n_tokens / ns; mean and *sample* standard deviation (n − 1; 0 for a
    single repetition) of those, and of the nanoseconds; plus the coefficient of variation and noise flag."""
    ts = [1e9 * n_tokens / ns for ns in samples_ns if ns > 0]
    avg_ts = statistics.fmean(ts) if ts else None
    sd_ts = statistics.stdev(ts) if len(ts) > 1 else 0.0
    cv = (sd_ts / avg_ts) if avg_ts else None
    return {
        "samples_ns": [int(x) for x in samples_ns],
        "samples_ts": ts,
        "avg_ns": int(statistics.fmean(samples_ns)) if samples_ns else None,
        "stddev_ns": int(statistics.stdev(samples_ns)) if len(samples_ns) > 1 else 0,
        "avg_ts": avg_ts,
        "stddev_ts": sd_ts if ts else None,
        "cv": cv,
        "noisy": bool(cv is not None and cv > noisy_cv),
    }


# --------------------------------------------------------------------------------------------
# model and environment facts
# --------------------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def _model_facts_cached(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    facts: dict[str, Any] = {"model_filename": path, "model_file_size": size}
    try:
        spec = read_spec(path)
    except V100labError as exc:
        log.warning("cannot read the GGUF header of %s: %s", path, exc)
        return facts
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(spec.header_bytes))
    facts.update(model_header_sha256=h.hexdigest(), model_file_type=spec.file_type,
                 model_arch=spec.architecture, model_name=spec.name)
    return facts


def model_facts(path: str | os.PathLike) -> dict[str, Any]:
    """Path, size, file type and a sha256 of the GGUF header bytes (metadata + tensor infos).

    The header hash identifies *which* model was measured without hashing gigabytes of weights; a missing
    file gives just the path (its rows fail with "model file not found")."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return {"model_filename": str(p), "model_file_size": None}
    return dict(_model_facts_cached(str(p), st.st_size, st.st_mtime_ns))


@lru_cache(maxsize=1)
def _static_env() -> dict[str, Any]:
    b = llama_build()          # read in a worker: a build that cannot load costs a log line here
    cpu = buildflags.host_cpu()
    flags = buildflags.read_record()
    return {"llama_cpp_python": b.get("llama_cpp_python"), "llama_cpp_build": b.get("build_commit"),
            "ggml_version": b.get("ggml_version"), "system_info": b.get("system_info"), "cpu_model": cpu.model,
            "cpu_flags": " ".join(cpu.relevant_flags), "build_flags": flags.get("cmake_args"),
            "build_flags_source": flags.get("source"), "cpu_count": os.cpu_count(), "gpu": b.get("gpu_info") or None,
            "os": platform.platform(), "python": platform.python_version()}


def environment(cfg: RunConfig | None = None) -> dict[str, Any]:
    """Where the harness ran: llama-cpp-python version and llama.cpp build, CPU, threads, GPU, OS."""
    env = dict(_static_env())
    if cfg is not None:
        env["threads"] = cfg.threads
    return env


# --------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------

def _now() -> tuple[str, str]:
    t = _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ"), t.isoformat(timespec="milliseconds")


def _base_row(model: Mapping[str, Any], cfg: RunConfig, test: BenchTest, backend: str, repetitions: int,
              lever: str | None, value: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        **model,
        "n_prompt": test.n_prompt, "n_gen": test.n_gen, "n_depth": test.n_depth,
        "n_batch": cfg.n_batch, "n_ubatch": cfg.n_ubatch, "n_threads": cfg.threads,
        "type_k": cfg.cache_type_k, "type_v": cfg.cache_type_v, "n_gpu_layers": cfg.n_gpu_layers,
        "flash_attn": cfg.flash_attn, "test": test.name, "backend": backend, "repetitions": repetitions,
        "config": cfg.as_dict(), "lever": lever, "value": None if value is None else str(value),
    }
    row["key"] = row_key(row)
    return row


def _finish_row(row: dict[str, Any], *, status: str, reason: str | None = None,
                measurement: Measurement | None = None, info: Mapping[str, Any] | None = None,
                load: dict | None = None, raw_log: str | None = None, load_id: str | None = None,
                monitor=None, cfg: RunConfig | None = None, warmup: bool = True,
                crash: dict | None = None) -> dict[str, Any]:
    test_time, stamp = _now()
    info = dict(info or {})
    row.update({
        "build_commit": info.get("build_commit"), "build_number": info.get("build_number"),
        "cpu_info": info.get("cpu_info"), "gpu_info": info.get("gpu_info"),
        "model_type": info.get("model_type"), "model_size": info.get("model_size"),
        "model_n_params": info.get("model_n_params"),
        "status": status, "reason": reason, "warmup": warmup, "test_time": test_time, "timestamp": stamp,
        "run_id": uuid.uuid4().hex[:16], "load_id": load_id, "load": load,
        "env": environment(cfg), "server": info.get("server"),
    })
    if measurement is not None:
        row.update(summarize(measurement.samples_ns, measurement.n_tokens))
        row["timing"] = measurement.timing
        if measurement.extra:
            row["extra"] = measurement.extra
    else:
        row.update({"samples_ns": [], "samples_ts": [], "avg_ns": None, "stddev_ns": None, "avg_ts": None,
                    "stddev_ts": None, "cv": None, "noisy": None, "timing": None})
    if monitor is not None:
        row["monitor"] = monitor.summary()
        row["monitor_series"] = monitor.series
    if raw_log is not None:
        row["raw_log"] = raw_log
    if crash is not None:
        row["crash"] = crash
    return row


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------

def _resolve_model(model: str | os.PathLike) -> Path:
    text = os.fspath(model)
    if zoo.is_alias(text):
        return zoo.model_path(text)
    return Path(text)


def run_tests(model: str | os.PathLike, cfg: RunConfig | None = None,
              tests: str | Iterable[str | BenchTest] = DEFAULT_TESTS, depths: Iterable[int] | str = (0,),
              repetitions: int = DEFAULT_REPETITIONS, *, warmup: bool = True,
              backend: "str | Backend | None" = None, results: "str | os.PathLike | ResultsStore | None" = None,
              monitor: bool = True, lever: str | None = None, value: Any = None, resume: bool = True,
              on_row=None) -> list[dict[str, Any]]:
    """Run llama-bench tests for one model and one run configuration (one model load).

    Returns one row per test, status "ok", "failed", "crashed" or "timeout"; a failure never raises — a model
    that does not load, a configuration llama.cpp refuses, a server that dies: each becomes a failed row with
    the reason; llama.cpp crashing (a signal) or hanging in the worker becomes a "crashed"/"timeout" row with
    the signal and llama.cpp's last log lines (``crash``), and the next test runs in a fresh worker.
    Rows are appended to ``results`` (a JSONL path or store) as they are produced; with ``resume`` (default),
    tests already recorded there with status "ok" are not run again and their stored rows are returned in
    their place. ``on_row(row)`` is called after each row, stored or new (progress bars).
    Bad input (unknown test spelling, bad config, unknown backend) raises :class:`ConfigError`.
    """
    cfg = cfg or RunConfig()
    if repetitions < 1:
        raise ConfigError(f"repetitions must be >= 1, got {repetitions}")
    be = get_backend(backend)
    store = results if isinstance(results, ResultsStore) or results is None else ResultsStore(results)
    if store is not None:
        store.check_writable()          # before anything is measured: a row that cannot be stored is lost
    path = _resolve_model(model)
    facts = model_facts(path)
    planned = [(t, _base_row(facts, cfg, t, be.name, repetitions, lever, value)) for t in make_tests(tests, depths)]
    rows: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    if store is not None and resume:
        done = {r["key"]: r for r in store.rows() if r.get("status") == "ok" and "key" in r}
    todo = []
    for t, r in planned:
        if r["key"] in done:
            rows.append(done[r["key"]])
            if on_row:
                on_row(done[r["key"]])
        else:
            todo.append((t, r))

    def emit(row):
        # with a store, the returned row is the stored one (raw log and monitor series in sidecar files)
        rows.append(store.append(row) if store is not None else row)
        if on_row:
            on_row(row)

    if not todo:
        return rows
    load_id = uuid.uuid4().hex[:16]
    session = None

    def crashed(base, exc: WorkerCrashed):
        return _finish_row(base, status=exc.status, reason=exc.detail, raw_log=exc.log_tail,
                           info=session.info if session is not None else None,
                           load=session.load if session is not None else None, load_id=load_id, cfg=cfg,
                           warmup=warmup, crash={"signal": exc.signal_name, "returncode": exc.returncode,
                                                 "log_tail": exc.log_tail})

    try:
        for i, (t, base) in enumerate(todo):
            if session is None:     # the first test, or the one after a crash: (re)load in a new worker
                try:
                    session = be.open(path, cfg)
                except MeasureFailed as exc:
                    for _, b in todo[i:]:
                        emit(_finish_row(b, status="failed", reason=exc.reason, load=exc.load, raw_log=exc.raw_log,
                                         load_id=load_id, cfg=cfg, warmup=warmup))
                    return rows
                except WorkerCrashed as exc:   # loading itself crashes: so would every other test
                    for _, b in todo[i:]:
                        emit(crashed(b, exc))
                    return rows
            mon = None
            if monitor:
                try:
                    mon = Monitor(pid=session.monitor_pid)
                except Exception as exc:  # the watched process is already gone
                    log.debug("monitor unavailable: %s", exc)
            try:
                if mon:
                    mon.start()
                try:
                    m = session.run(t, repetitions, warmup=warmup)
                finally:
                    if mon:
                        mon.stop()
            except WorkerCrashed as exc:
                log.info("%s: %s", t.name, exc.detail)
                emit(crashed(base, exc))
                session.close()
                session = None
                continue
            except MeasureFailed as exc:
                emit(_finish_row(base, status="failed", reason=exc.reason, info=session.info, load=session.load,
                                 raw_log=session.raw_log, load_id=load_id, monitor=mon, cfg=cfg, warmup=warmup))
                continue
            emit(_finish_row(base, status="ok", measurement=m, info=session.info, load=session.load,
                             raw_log=session.raw_log, load_id=load_id, monitor=mon, cfg=cfg, warmup=warmup))
    finally:
        if session is not None:
            session.close()
    return rows


def _apply_lever(cfg: RunConfig, lever: str, value: Any) -> RunConfig:
    if lever == "cache_type":
        return cfg.with_(cache_type_k=value, cache_type_v=value)
    return cfg.with_(**{lever: value})


def sweep(model: str | os.PathLike, base_cfg: RunConfig | None, lever: str, values: Iterable[Any],
          tests: str | Iterable[str | BenchTest] = DEFAULT_TESTS, depths: Iterable[int] | str = (0,),
          repetitions: int = DEFAULT_REPETITIONS, backend: "str | Backend | None" = None,
          results: "str | os.PathLike | None" = None, progress: bool = True, *, warmup: bool = True,
          monitor: bool = True) -> list[dict[str, Any]]:
    """One lever, several values → rows (one model load per value), resumable.

    ``lever`` is a RunConfig field (``n_gpu_layers``, ``n_ctx``, ``flash_attn``, ``cache_type_v``, ...), or
    ``cache_type`` (K and V together), ``n_depth`` (values are depths) or ``model`` (values are models).
    With ``results``, configurations already recorded there with status "ok" are skipped and their stored
    rows returned (so a sweep killed halfway resumes where it stopped, with nothing measured twice); failed
    ones are tried again. ``progress`` shows a tqdm bar (turn it off in scripts).
    """
    base_cfg = base_cfg or RunConfig()
    values = list(values)
    be = get_backend(backend)
    if lever not in SPECIAL_LEVERS and lever not in base_cfg.as_dict():
        raise ConfigError(f"unknown lever '{lever}' (a RunConfig field, or one of {', '.join(SPECIAL_LEVERS)})")
    store = ResultsStore(results) if results is not None else None
    if store is not None:
        store.check_writable()
    plans = []
    for v in values:
        m, cfg, d = model, base_cfg, depths
        if lever == "model":
            m = v
        elif lever == "n_depth":
            d = [int(v)]
        else:
            cfg = _apply_lever(base_cfg, lever, v)
        plans.append((v, m, cfg, make_tests(tests, d)))
    total = sum(len(p[3]) for p in plans)
    bar = None
    if progress:
        bar = tqdm(total=total, desc=f"sweep {lever}", unit="test", leave=True)
    rows: list[dict[str, Any]] = []
    try:
        for v, m, cfg, tlist in plans:
            if bar is not None:
                bar.set_postfix_str(f"{lever}={v}")
            rows.extend(run_tests(m, cfg, tlist, (0,), repetitions, warmup=warmup, backend=be, results=store,
                                  monitor=monitor, lever=lever, value=v,
                                  on_row=(lambda r: bar.update(1)) if bar is not None else None))
    finally:
        if bar is not None:
            bar.close()
    return rows


# --------------------------------------------------------------------------------------------
# views
# --------------------------------------------------------------------------------------------

def metric_of(row: Mapping[str, Any]) -> str:
    """tidy-table metric of a row: "pp_tps" (prompt only), "tg_tps" (generation only), "pg_tps" (both)."""
    if not row.get("n_gen"):
        return "pp_tps"
    if not row.get("n_prompt"):
        return "tg_tps"
    return "pg_tps"


def rows_to_observations(rows: Iterable[Mapping[str, Any]], model_label: str, device: str = "host"):
    """Measured rows → :class:`v100lab.facts.results.Observation` (failed rows are left out).

    lever/value come from the sweep that produced the row (else lever "n_depth"); the note carries the
    backend, how it was timed, ± sd over r repetitions, and a noise flag when cv > NOISY_CV."""
    out = []
    for r in rows:
        if r.get("status") != "ok" or r.get("avg_ts") is None:
            continue
        notes = [f"{r.get('test')}", f"±{r.get('stddev_ts') or 0:.2f} (r={r.get('repetitions')})",
                 f"backend {r.get('backend')}"]
        if r.get("timing") == "client":
            notes.append("timed client-side")
        if r.get("noisy"):
            notes.append(f"noisy: cv {100 * (r.get('cv') or 0):.0f}%")
        lever = r.get("lever") or "n_depth"
        value = r.get("value") if r.get("lever") else str(r.get("n_depth", 0))
        out.append(Observation(model=model_label, quant=r.get("model_file_type") or "unknown", device=device,
                               lever=lever, value=str(value), metric=metric_of(r), result=float(r["avg_ts"]),
                               unit=TPS, source="measured", note="; ".join(notes),
                               sd=float(r.get("stddev_ts") or 0.0), repetitions=max(1, int(r.get("repetitions") or 1)),
                               setup=setup_of(r)))
    return out


def setup_of(row: Mapping[str, Any]) -> str:
    """What a bench row ran, in one line: the model file, the test, the depth and the flags that change a speed
    (``-c``, ``-t``, ``-fa``, the KV types, ``-ngl``, ``-b``/``-ub``, ``-np``) and the backend. Rows of two
    notebooks with the same setup measured the same configuration."""
    cfg = row.get("config") or {}
    return " · ".join([
        Path(str(row.get("model_filename") or "?")).name, str(row.get("test")).partition("@")[0].strip(),
        f"depth {row.get('n_depth', 0)}",
        f"-c {cfg.get('n_ctx', '?')}", f"-t {row.get('n_threads')}", f"-fa {row.get('flash_attn')}",
        f"-ctk {row.get('type_k')} -ctv {row.get('type_v')}", f"-ngl {row.get('n_gpu_layers')}",
        f"-b {row.get('n_batch')} -ub {row.get('n_ubatch')}", f"-np {cfg.get('n_parallel', 1)}",
        str(row.get("backend"))])


def _fmt_size(n: int | None, gib: float = 2**30) -> str:
    if not n:
        return "-"
    return f"{n / 2**20:.2f} MiB" if n < gib else f"{n / gib:.2f} GiB"


def format_markdown(rows: Iterable[Mapping[str, Any]]) -> str:
    """A llama-bench-style markdown table (model, size, params, backend, threads, test, t/s)."""
    lines = ["| model | size | params | backend | threads | ngl | fa | type_k/v | test | t/s |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in rows:
        params = r.get("model_n_params")
        p = "-" if not params else (f"{params / 1e6:.2f} M" if params < 1e9 else f"{params / 1e9:.2f} B")
        if r.get("status") == "ok":
            ts = f"{r['avg_ts']:.2f} ± {r.get('stddev_ts') or 0:.2f}" + (" (noisy)" if r.get("noisy") else "")
        else:
            ts = f"{r.get('status')}: {r.get('reason')}"
        lines.append(f"| {r.get('model_type') or Path(str(r.get('model_filename'))).name} | "
                     f"{_fmt_size(r.get('model_size'))} | {p} | {r.get('backend')} | {r.get('n_threads')} | "
                     f"{r.get('n_gpu_layers')} | {r.get('flash_attn')} | {r.get('type_k')}/{r.get('type_v')} | "
                     f"{r.get('test')} | {ts} |")
    builds = sorted({str(r.get("build_commit")) for r in rows if r.get("build_commit")})
    if builds:
        lines.append("")
        lines.append(f"build: {', '.join(builds)}")
    return "\n".join(lines)

