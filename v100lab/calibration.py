"""Calibration of the speed model: this host measured, GPU classes fitted on published tables.

**The host** (``v100lab calibrate``, about a minute). On a small CPU, decoding below 8 bits is bound by
dequantisation, not by memory (DESIGN.md, "What this machine shows"), so a bandwidth figure alone
overpredicts. Calibration measures, with real llama.cpp (the in-process backend of :mod:`v100lab.bench`):

* memory read bandwidth per thread count — :func:`v100lab.devices.measure_memory_bandwidth`, the same
  STREAM-like kernel the host profile uses;
* decode and prompt time per token of *calibration models only*: a synthetic llama (8 layers, n_embd 1024)
  quantized to every type of the ladder, and a deep, narrow one (24 layers, n_embd 256) at depths 0, 1024
  and 2048 — the first gives each weight type its cost, the second the per-layer overhead and the cost of
  attention over the KV cache;
* a non-negative least-squares fit, per thread count, of
  ``t_token = overhead_token + overhead_layer × layers + Σ_type weights_type × cost_type + attention_ops × cost_attention``
  (weighted by 1/t, i.e. relative error), and the same for prompt processing per token.

The result is stored in the host profile (``host-profile.json`` in the cache directory, key
``speed_calibration``), which ``--device host`` then uses. The models the benchmark judges the speed model on
(the synth-750m ladder, the default model, gemma3-270m) are never among the calibration models.

**GPU classes.** Apple Silicon: efficiency (fraction of bandwidth reached in decode), per-layer overhead and
prompt-processing efficiency per weight type (fraction of the GPU's FP16 ALU peak) are fitted on the published
llama-bench rows in ``data/apple_silicon_llama7b.csv``; :func:`apple_rows` returns predicted vs published rows
with each chip predicted by a fit on the *other* chips (leave-one-chip-out). CUDA cards borrow Apple's
bandwidth efficiency; their per-layer overhead and prompt efficiency come from two published V100 rows
(``data/seed_claims.yaml``, ``anchors``), which therefore cannot validate anything.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from v100lab import zoo
from v100lab.config import RunConfig
from v100lab.errors import ConfigError, RunFailed, V100labError
from v100lab.llama_context import CTX_PAD, causal_cells, pad, type_sizef
from v100lab.speed import DeviceRates, Placed, decode_work, predict

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 1
PROFILE_KEY = "speed_calibration"

# ------------------------------------------------------------------------------------------------
# what calibration measures (and the benchmark must never judge on)
# ------------------------------------------------------------------------------------------------

# Weight types: 8 layers of n_embd 1024 (90 M weights in the layers, 50 M in the output matrix): large
# enough to stream from DRAM (L3 here: 32 MiB), small enough to measure in a second. Each rung is *pure*
# (every matrix, the output included, of one type) so that one measurement gives one type's cost.
CALIB_WIDE = zoo.SynthSpec(n_layer=8, n_embd=1024, n_ff=2816, n_head=16, n_head_kv=4, n_ctx_train=4096, seed=5)
# Per-layer overhead and attention: many thin layers (24 × n_embd 256, head_dim 64, 4 query / 2 KV heads),
# and the same with head_dim 96 (n_embd 384): the CPU's f16 kernels run a scalar tail past each multiple of
# 64 elements (v100lab.speed.F16_SIMD_STEP), which makes such heads several times dearer per element.
CALIB_DEEP = zoo.SynthSpec(n_layer=24, n_embd=256, n_ff=768, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5)
CALIB_DEEP96 = zoo.SynthSpec(n_layer=24, n_embd=384, n_ff=768, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5)
# ggml type → the llama.cpp file type whose default type it is (quantized with params.pure)
CALIB_TYPES = {"F16": "F16", "Q8_0": "Q8_0", "Q6_K": "Q6_K", "Q5_K": "Q5_K_M", "Q4_K": "Q4_K_M", "Q4_0": "Q4_0",
               "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q3_K": "Q3_K_M", "Q2_K": "Q2_K"}
CALIB_DEPTHS = (1024, 2048)
CALIB_N_GEN = 16
CALIB_N_PROMPT = 512        # llama-bench's pp512: per-token prompt cost falls with the batch size
NOISY_CV = 0.10


@dataclass(frozen=True)
class CalPoint:
    """One configuration calibration measures."""

    label: str
    synth: zoo.SynthSpec
    type_name: str
    depth: int = 0
    prompt: bool = True

    @property
    def name(self) -> str:
        return f"{self.label}:{self.type_name}" + (f"@d{self.depth}" if self.depth else "")


def calibration_points() -> list[CalPoint]:
    pts = [CalPoint("calib-wide", CALIB_WIDE, t) for t in CALIB_TYPES]
    pts += [CalPoint("calib-deep", CALIB_DEEP, "F16"), CalPoint("calib-deep", CALIB_DEEP, "Q4_0")]
    pts += [CalPoint("calib-deep", CALIB_DEEP, "F16", depth=d, prompt=False) for d in CALIB_DEPTHS]
    pts += [CalPoint("calib-deep96", CALIB_DEEP96, "F16", depth=d, prompt=False) for d in (0,) + CALIB_DEPTHS]
    return pts


def pure_quantized_path(src, type_name: str):
    """``src`` (an F16 synthetic model) with every matrix — output and embeddings included — in
    ``type_name``: llama.cpp's quantizer with ``pure`` and explicit output/embedding types. Cached."""
    import gguf

    if type_name == "F16":
        return src
    ftype = CALIB_TYPES.get(type_name)
    if ftype is None:
        raise ConfigError(f"no calibration rung for type '{type_name}' (known: {', '.join(CALIB_TYPES)})")
    stem = src.name.removesuffix(".gguf").removesuffix("-F16")
    path = zoo.cache_dir() / f"{stem}-pure-{type_name}.gguf"
    tid = int(gguf.GGMLQuantizationType[type_name])
    recipe = {"kind": "pure-quantized", "type": type_name, "ftype": ftype, "llama_cpp_python": zoo.llama_cpp_python_version(),
              "source": src.name, "source_size": src.stat().st_size}

    def write(tmp):
        zoo.quantize(src, tmp, ftype, pure_type=tid)

    return zoo.build_atomically(path, recipe, write)


def calibration_model_paths(progress: Callable[[str], None] | None = None) -> dict[tuple[str, str], Any]:
    """Build (once; cached) every calibration model: (label, type) → path."""
    out = {}
    for label, synth, types in (("calib-wide", CALIB_WIDE, tuple(CALIB_TYPES)), ("calib-deep", CALIB_DEEP, ("F16", "Q4_0")),
                                ("calib-deep96", CALIB_DEEP96, ("F16",))):
        f16 = zoo.synthetic_path(synth)
        for t in types:
            if progress:
                progress(f"{label}:{t}")
            out[(label, t)] = pure_quantized_path(f16, t)
    return out


def calibration_stems() -> set[str]:
    """File stems of the calibration models (the benchmark checks it never judges on them)."""
    return {CALIB_WIDE.stem, CALIB_DEEP.stem, CALIB_DEEP96.stem}


# ------------------------------------------------------------------------------------------------
# measuring (real llama.cpp through the harness's in-process backend)
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """Seconds per token of one test: best of the repetitions, with the coefficient of variation."""

    s_per_token: float
    cv: float
    samples: tuple[float, ...]
    busy: float = 0.0          # share of all CPUs other processes used just before the test


def wait_for_quiet(max_wait_s: float = 30.0, busy_frac: float = 0.25) -> float:
    """Wait (up to ``max_wait_s``) until other processes use less than ``busy_frac`` of the CPUs; returns
    the share last seen. llama.cpp's threads spin while they wait, so on a 2-core machine any other busy
    process collapses a 2-thread measurement (DESIGN.md) — better to wait, and to record it when waiting
    did not help."""
    import os

    import psutil

    me = psutil.Process()
    ncpu = os.cpu_count() or 1
    deadline = time.monotonic() + max_wait_s
    while True:
        me.cpu_percent(None)
        psutil.cpu_percent(None)
        time.sleep(0.5)
        total, own = psutil.cpu_percent(None), me.cpu_percent(None) / ncpu
        busy = max(total - own, 0.0) / 100.0
        if busy < busy_frac or time.monotonic() > deadline:
            return busy
        time.sleep(1.0)


def _timing(samples_ns: Sequence[int], n_tokens: int, busy: float = 0.0) -> Timing:
    """Best of the repetitions: on a shared machine another process only ever slows a repetition down,
    so the fastest is the best estimate of the machine's own speed (the CV says how noisy it was)."""
    per = [ns / 1e9 / n_tokens for ns in samples_ns]
    med = min(per)
    tps = [1.0 / p for p in per]
    cv = statistics.stdev(tps) / statistics.fmean(tps) if len(tps) > 1 else 0.0
    return Timing(med, cv, tuple(per), busy)


def measure(path, threads: int, depth: int = 0, n_gen: int = CALIB_N_GEN, n_prompt: int = 0,
            repetitions: int = 3, flash_attn: str = "auto", retry_noisy: bool = True,
            n_ctx: int | None = None, pp_repetitions: int | None = None) -> dict[str, Timing]:
    """Decode (tg ``n_gen`` at ``depth``) and prompt (pp ``n_prompt``) time per token, llama-bench's way.

    A test whose coefficient of variation exceeds 10 % is run once more and the quieter run is kept."""
    from v100lab.backends import BenchTest
    from v100lab.backends.isolated import IsolatedBackend

    need = depth + max(n_gen, n_prompt) + 1
    cfg = RunConfig(n_ctx=n_ctx or max(512, pad(need, CTX_PAD)), n_threads=threads,
                    flash_attn=flash_attn, n_gpu_layers=0)
    out: dict[str, Timing] = {}
    with IsolatedBackend().open(path, cfg) as session:
        tests = []
        if n_gen:
            tests.append(("tg", BenchTest(n_gen=n_gen, n_depth=depth)))
        if n_prompt:
            tests.append(("pp", BenchTest(n_prompt=n_prompt, n_depth=depth)))
        for key, test in tests:
            reps = pp_repetitions if (key == "pp" and pp_repetitions) else repetitions
            busy = wait_for_quiet()
            m = session.run(test, reps, warmup=True)
            t = _timing(m.samples_ns, test.n_tokens, busy)
            if retry_noisy and t.cv > NOISY_CV:
                busy = wait_for_quiet()
                m2 = session.run(test, reps, warmup=False)
                t2 = _timing(m2.samples_ns, test.n_tokens, busy)
                log.info("noisy %s (cv %.1f%%): rerun cv %.1f%%", key, 100 * t.cv, 100 * t2.cv)
                if t2.cv < t.cv:
                    t = t2
            out[key] = t
    return out


# ------------------------------------------------------------------------------------------------
# the fit
# ------------------------------------------------------------------------------------------------

def nnls(A, b, iters: int = 5000):
    """Non-negative least squares (Lawson–Hanson active set), small problems only; numpy, no scipy."""
    import numpy as np

    A = np.asarray(A, float)
    b = np.asarray(b, float)
    m, n = A.shape
    P = np.zeros(n, bool)
    x = np.zeros(n)
    w = A.T @ (b - A @ x)
    tol = 1e-12 * max(1.0, float(np.abs(A).max()) * float(np.abs(b).max()))
    it = 0
    while (~P).any() and w[~P].max() > tol and it < iters:
        it += 1
        j = np.where(~P)[0][np.argmax(w[~P])]
        P[j] = True
        while True:
            z = np.zeros(n)
            z[P] = np.linalg.lstsq(A[:, P], b, rcond=None)[0]
            if (z[P] > 0).all():
                x = z
                break
            neg = P & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            P &= x > 1e-18
            x[~P] = 0.0
            if not P.any():
                break
        w = A.T @ (b - A @ x)
    return x


def _single_device_work(spec, cfg: RunConfig, depth: int):
    from v100lab.devices import Device

    dev = Device(id="host", name="host", kind="cpu", memory_gib=1, bandwidth_gbs=1)
    placed = {"host": Placed(dev, tuple(range(spec.n_layer)), True)}
    return decode_work(spec, placed, cfg, depth)["host"]


def fit_cpu(points: Sequence[Mapping[str, Any]], bandwidth_gbs: float) -> dict[str, Any]:
    """Fit one thread count's decode and prompt costs from measured points.

    Each point: ``spec`` (ModelSpec), ``depth``, ``tg`` (s/token at that depth, the middle of the
    generated tokens), optionally ``pp`` (s/token for ``n_prompt`` tokens). Returns the JSON-able
    parameters stored in the host profile."""
    import numpy as np

    cfg = RunConfig(flash_attn="auto")
    types = sorted({t for p in points for t in _single_device_work(p["spec"], cfg, p["depth"]).weights})
    # decode: t = o_layer (L + 1) + Σ n_T c_T + attn c_attn + (other bytes) / bandwidth. A separate
    # per-token constant is not identifiable from two model shapes; graph and sync costs grow with the
    # number of layers, so the overhead is per layer (the output layer counting as one).
    rows, y, wts = [], [], []
    for p in points:
        w = _single_device_work(p["spec"], cfg, p["depth"])
        known = (w.other_bytes + w.state_bytes) / (bandwidth_gbs * 1e9)
        rows.append([p["spec"].n_layer + 1.0] + [w.weights[t].n_weights if t in w.weights else 0.0 for t in types]
                    + [w.attn_ops, w.attn_tail_ops])
        y.append(p["tg"] - known)
        wts.append(1.0 / p["tg"])
    A = np.array(rows) * np.array(wts)[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    x = nnls(A / scale, np.array(y) * np.array(wts)) / scale
    o_tok, o_layer, costs, c_attn, c_tail = 0.0, x[0], dict(zip(types, x[1:-2])), x[-2], x[-1]
    pred = np.array(rows) @ x + (np.array([p["tg"] for p in points]) - np.array(y))
    rel = pred / np.array([p["tg"] for p in points]) - 1
    # efficiency: the best bandwidth any weight type reached, relative to the STREAM figure (>= 1 keeps the
    # bandwidth term from ever exceeding a calibrated cost at this thread count)
    achieved = []
    for t, c in costs.items():
        if c > 0:
            achieved.append(type_sizef(t) / c / 1e9)
    eff = max([1.0] + [a / bandwidth_gbs for a in achieved])
    out: dict[str, Any] = {
        "bandwidth_gbs": bandwidth_gbs, "efficiency": round(eff, 4),
        "tg_s_per_weight": {t: float(c) for t, c in costs.items() if c > 0},
        "attn_s_per_op": float(c_attn), "attn_tail_s_per_op": float(c_tail), "overhead_token_s": float(o_tok), "overhead_layer_s": float(o_layer),
        "tg_fit_rel_err": [round(float(r), 4) for r in rel],
    }
    # prompt: t_pp(per token) = Σ n_T p_T + attention_pp(per token) c_attn + o_pp / n_prompt
    pp_pts = [p for p in points if p.get("pp")]
    if pp_pts:
        ptypes = sorted({t.type_name for p in pp_pts for t in p["spec"].tensors
                         if t.layer is not None and len(t.shape) >= 2 and t.shape[1] > 1})
        rows, y, wts = [], [], []
        for p in pp_pts:
            spec, n = p["spec"], p["n_prompt"]
            per_type = {t: 0.0 for t in ptypes}
            for t in spec.tensors:
                if t.layer is not None and len(t.shape) >= 2 and t.shape[1] > 1:
                    per_type[t.type_name] += t.n_elements
            # prompt attention is fitted on its own: llama.cpp's CPU flash attention over a batch of
            # queries costs far less per multiply-add than one query at a time
            ops = sum(causal_cells(p["depth"], n) * spec.n_head_at(il) * (spec.head_dim_k + spec.head_dim_v)
                      for il in range(spec.n_layer) if spec.has_kv(il)) / n
            rows.append([1.0 / n, ops] + [per_type[t] for t in ptypes])
            y.append(p["pp"])
            wts.append(1.0 / p["pp"])
        A = np.array(rows) * np.array(wts)[:, None]
        scale = np.abs(A).max(axis=0)
        scale[scale == 0] = 1.0
        xp = nnls(A / scale, np.array(y) * np.array(wts)) / scale
        predp = np.array(rows) @ xp + (np.array([p["pp"] for p in pp_pts]) - np.array(y))
        out.update({"pp_overhead_s": float(xp[0]), "pp_attn_s_per_op": float(xp[1]),
                    "pp_s_per_weight": {t: float(c) for t, c in zip(ptypes, xp[2:]) if c > 0},
                    "pp_fit_rel_err": [round(float(r), 4) for r in predp / np.array([p["pp"] for p in pp_pts]) - 1]})
    return out


#: the share of calibration points that must measure for a fit (the rest crashed, hung or were refused)
MIN_POINT_SHARE = 0.8


def _enough_points(measured: int, planned: int, threads: int) -> None:
    """Refuse to fit on too few points: a crash that removed many would leave rates unconstrained."""
    if measured < max(3, math.ceil(MIN_POINT_SHARE * planned)):
        raise RunFailed(f"calibration at {threads} thread(s): only {measured} of {planned} points measured "
                        f"(the rest crashed or failed; see `v100lab selftest`): not enough to fit, nothing stored")


def calibrate(threads: Sequence[int] | None = None, repetitions: int = 3,
              progress: Callable[[str], None] | None = None, store: bool = True) -> dict[str, Any]:
    """Measure this host and fit the CPU speed model; store it in the host profile unless ``store`` is false.

    ``threads``: thread counts to calibrate (default 1 and all cores). Returns the calibration dict."""
    import os

    from v100lab import devices
    from v100lab.header import read_spec

    t0 = time.perf_counter()
    ncpu = os.cpu_count() or 1
    threads = sorted(set(threads or (1, ncpu)))
    if any(t < 1 for t in threads):
        raise ConfigError(f"calibrate: thread counts must be >= 1, got {list(threads)}")
    say = progress or (lambda s: None)
    say("building calibration models (cached after the first run)")
    paths = calibration_model_paths()
    specs = {k: read_spec(p) for k, p in paths.items()}
    result: dict[str, Any] = {"version": CALIBRATION_VERSION, "threads": {}, "points": [],
                              "models": sorted(str(p.name) for p in paths.values())}
    try:
        from v100lab.backends.inprocess import build_info

        info = build_info()
        result["llama_cpp_python"] = info.get("llama_cpp_python")
        result["build_commit"] = info.get("build_commit")
    except Exception as exc:  # build info is a nicety, never a reason to fail
        log.debug("build info unavailable: %s", exc)
    first: dict[str, float] = {}
    for th in threads:
        say(f"memory bandwidth, {th} thread(s)")
        wait_for_quiet()
        bw = devices.measure_memory_bandwidth(threads=th)
        pts = []
        planned = calibration_points()
        for cp in planned:
            say(f"{cp.name}, {th} thread(s)")
            for attempt in range(3):
                try:
                    tm = measure(paths[(cp.label, cp.type_name)], th, depth=cp.depth, n_gen=CALIB_N_GEN,
                                 n_prompt=CALIB_N_PROMPT if cp.prompt else 0, repetitions=repetitions,
                                 pp_repetitions=max(1, repetitions - 1))
                except RunFailed as exc:   # llama.cpp crashed, hung or refused: record the point, skip it
                    tm = None
                    status = getattr(exc, "status", "failed")
                    say(f"{cp.name}, {th} thread(s): {status} ({exc}); skipped")
                    result["points"].append({"config": cp.name, "threads": th, "status": status, "reason": str(exc)})
                    break
                # more threads slower than fewer: another process took the cores (llama.cpp's threads
                # spin and collapse); measure again after waiting for quiet
                base = first.get(cp.name)
                if base is None or tm["tg"].s_per_token < 1.5 * base:
                    break
                say(f"{cp.name}: {th} threads slower than {threads[0]} (contended?); measuring again")
                time.sleep(2.0)
            if tm is None:
                continue
            first.setdefault(cp.name, tm["tg"].s_per_token)
            pts.append({"spec": specs[(cp.label, cp.type_name)], "depth": cp.depth + CALIB_N_GEN // 2,
                        "tg": tm["tg"].s_per_token, "pp": tm["pp"].s_per_token if "pp" in tm else None,
                        "n_prompt": CALIB_N_PROMPT})
            result["points"].append({"config": cp.name, "threads": th, "tg_tps": round(1 / tm["tg"].s_per_token, 2),
                                     "tg_cv": round(tm["tg"].cv, 4), "busy": round(tm["tg"].busy, 3),
                                     **({"pp_tps": round(1 / tm["pp"].s_per_token, 2), "pp_cv": round(tm["pp"].cv, 4)}
                                        if "pp" in tm else {})})
        _enough_points(len(pts), len(planned), th)
        fit = fit_cpu(pts, bw["bandwidth_gbs"])
        fit["bandwidth_cv"] = bw["cv"]
        result["threads"][str(th)] = fit
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if store:
        devices.host_device()        # make sure the profile (RAM, bandwidth, fingerprint) exists
        devices.write_host_profile({PROFILE_KEY: result})
    return result


def stored_calibration() -> dict[str, Any] | None:
    from v100lab.devices import read_host_profile

    prof = read_host_profile() or {}
    return prof.get(PROFILE_KEY)


def cpu_rates_from_calibration(device, cal: Mapping[str, Any], threads: int) -> DeviceRates:
    """The host's DeviceRates at ``threads``: a calibrated thread count as measured; in between,
    per-weight rates interpolated linearly; beyond the largest, compute rates scaled by the thread
    ratio while the bandwidth stays at the largest measured (a stated extrapolation)."""
    per = {int(k): v for k, v in (cal.get("threads") or {}).items()}
    if not per:
        raise V100labError("host calibration has no thread counts; run `v100lab calibrate` again")
    ks = sorted(per)
    src = f"host calibration ({', '.join(map(str, ks))} threads)"
    if threads in per:
        p = per[threads]
        return _rates_from(device, p, 1.0, src)
    lo = max([k for k in ks if k < threads], default=None)
    hi = min([k for k in ks if k > threads], default=None)
    if lo is None:
        return _rates_from(device, per[hi], threads / hi, src + f"; {threads} thread(s) scaled from {hi}")
    if hi is None:
        return _rates_from(device, per[lo], threads / lo, src + f"; {threads} threads extrapolated from {lo}")
    f = (threads - lo) / (hi - lo)
    a, b = per[lo], per[hi]
    mixed = dict(b)
    for key in ("tg_s_per_weight", "pp_s_per_weight"):
        mixed[key] = {t: 1.0 / ((1 - f) / a[key][t] + f / b[key][t])
                      for t in set(a.get(key, {})) & set(b.get(key, {}))}
    for key in ("attn_s_per_op", "pp_attn_s_per_op", "attn_tail_s_per_op"):
        if a.get(key) and b.get(key):
            mixed[key] = 1.0 / ((1 - f) / a[key] + f / b[key])
    for key in ("overhead_token_s", "overhead_layer_s", "pp_overhead_s", "bandwidth_gbs", "efficiency"):
        if key in a and key in b:
            mixed[key] = (1 - f) * a[key] + f * b[key]
    return _rates_from(device, mixed, 1.0, src + f"; {threads} threads interpolated")


def _rates_from(device, p: Mapping[str, Any], speedup: float, source: str) -> DeviceRates:
    tg = {t: c / speedup for t, c in (p.get("tg_s_per_weight") or {}).items()}
    pp = {t: c / speedup for t, c in (p.get("pp_s_per_weight") or {}).items()}
    default_pp = statistics.median(pp.values()) if pp else 1e-9
    return DeviceRates(
        device_id=device.id, kind="cpu", bandwidth_gbs=float(p.get("bandwidth_gbs") or device.bandwidth_gbs),
        efficiency=float(p.get("efficiency", 1.0)), tg_s_per_weight=MappingProxyType(tg),
        attn_s_per_op=float(p.get("attn_s_per_op", 0.0)) / speedup, pp_s_per_weight=MappingProxyType(pp),
        pp_default_s_per_weight=default_pp, pp_attn_s_per_op=float(p.get("pp_attn_s_per_op", 0.0)) / speedup,
        overhead_token_s=float(p.get("overhead_token_s", 0.0)), overhead_layer_s=float(p.get("overhead_layer_s", 0.0)),
        pp_overhead_s=float(p.get("pp_overhead_s", 0.0)), host_link_gbs=None, source=source,
        attn_tail_s_per_op=float(p.get("attn_tail_s_per_op", 0.0)) / speedup)


# ------------------------------------------------------------------------------------------------
# GPU classes: the Apple Silicon table and the CUDA anchors
# ------------------------------------------------------------------------------------------------

APPLE_CSV = "apple_silicon_llama7b.csv"
APPLE_BUILD = "8e672ef"       # the comparable rows; "newer build" rows are judged apart
ALUS_PER_GPU_CORE = 128       # FP32 ALUs per Apple GPU core (16 EUs × 8 ALUs), FP16 at the same rate
# GPU clock per generation (GHz). M1: 1.278 (1.296 on Pro/Max/Ultra), M2: 1.398 — macrumors "Apple Silicon
# Mac chips" thread (https://spy.macrumors.com/threads/apple-silicon-mac-chips.2471322); M3: 1.398,
# M4: 1.470 — hmc-tech.com GPU pages (https://hmc-tech.com/gpu/apple-9-core-m3-fl-vs-apple-8-core-m4-fl).
APPLE_GPU_CLOCK_GHZ = {"M1": 1.278, "M2": 1.398, "M3": 1.398, "M4": 1.470, "M5": 1.470}
APPLE_TG_DEPTH = 64           # tg128: the 128 generated tokens sit at depths 0..127, mean 64


def _data_text(name: str) -> str:
    from importlib import resources

    return resources.files("v100lab").joinpath("data", name).read_text()


def load_apple_table():
    """The published Apple Silicon llama-bench rows (header comment lines skipped) as a DataFrame."""
    import io

    import pandas as pd

    text = "".join(line + "\n" for line in _data_text(APPLE_CSV).splitlines() if not line.startswith("#"))
    df = pd.read_csv(io.StringIO(text))
    df["comparable"] = df["build"].astype(str).str.startswith(APPLE_BUILD)
    df["generation"] = df["chip"].str.split().str[0]
    return df


def apple_device(row):
    """A Device for one table row: its bandwidth and GPU-core count; FP16 peak = cores × 128 ALUs × 2 × clock."""
    from v100lab.devices import Device

    gen = str(row["chip"]).split()[0]
    tflops = float(row["gpu_cores"]) * ALUS_PER_GPU_CORE * 2 * APPLE_GPU_CLOCK_GHZ[gen] / 1e3
    return Device(id=f"apple-{str(row['chip']).lower().replace(' ', '-')}-{int(row['gpu_cores'])}c",
                  name=f"Apple {row['chip']} ({int(row['gpu_cores'])}-core GPU)", kind="apple",
                  memory_gib=64, bandwidth_gbs=float(row["bandwidth_gbs"]), fp16_tflops=tflops,
                  source_url="https://github.com/ggml-org/llama.cpp/discussions/4167")


def _arch_spec(arch, quant: str):
    """A skeleton ModelSpec (v100lab.skeleton) for a shipped architecture name or an inline mapping."""
    import json

    if isinstance(arch, Mapping):
        return _arch_spec_cached(json.dumps(dict(arch), sort_keys=True), quant)
    return _arch_spec_cached(str(arch), quant)


@lru_cache(maxsize=None)
def _arch_spec_cached(arch: str, quant: str):
    import json

    from v100lab.skeleton import skeleton_spec

    return skeleton_spec(json.loads(arch) if arch.startswith("{") else arch, quant)


@dataclass(frozen=True)
class GpuFit:
    """Parameters of one GPU device class."""

    kind: str
    efficiency: float                        # decode: fraction of peak bandwidth reached
    overhead_layer_s: float                  # decode: per layer (repeating + output) per token
    pp_efficiency: Mapping[str, float]       # prompt: fraction of the FP16 peak, per weight type
    pp_default_efficiency: float
    overhead_token_s: float = 0.0
    pp_overhead_s: float = 0.0
    n_rows: int = 0
    source: str = ""


_APPLE_CFG = RunConfig(flash_attn="on", n_ctx=4096)   # FA: cells read = cells used (the 2023 build padded n_kv to 32)


def _apple_work(quant: str):
    spec = _arch_spec("llama2-7b", quant)
    from v100lab.devices import Device

    dev = Device(id="x", name="x", kind="apple", memory_gib=64, bandwidth_gbs=1)
    placed = {"x": Placed(dev, tuple(range(spec.n_layer)), True)}
    return spec, decode_work(spec, placed, _APPLE_CFG, APPLE_TG_DEPTH)["x"]


def _pp_ideal_seconds(spec, n_prompt: int = 512) -> float:
    """FLOPs of a pp512 (layers for every token, output for the last one, causal attention) in
    FP16-peak seconds per TFLOP/s: divide by the device's TFLOP/s × 1e12."""
    flops = 0.0
    for t in spec.tensors:
        if t.layer is not None and len(t.shape) >= 2 and t.shape[1] > 1:
            flops += 2.0 * t.n_elements * n_prompt
    out = spec.tensor("output.weight") or spec.tensor("token_embd.weight")
    flops += 2.0 * out.n_elements
    flops += sum(2.0 * causal_cells(0, n_prompt) * spec.n_head_at(il) * (spec.head_dim_k + spec.head_dim_v)
                 for il in range(spec.n_layer) if spec.has_kv(il))
    return flops


def fit_gpu_rows(df, kind: str = "apple") -> GpuFit:
    """Fit decode efficiency + per-layer overhead (weighted least squares on 1/tg) and prompt efficiency
    per weight type (geometric mean of ideal/measured time) on published rows."""
    import numpy as np

    X, y = [], []
    pp_e: dict[str, list[float]] = {}
    for _, row in df.iterrows():
        spec, w = _apple_work(str(row["quant"]))
        dev = apple_device(row)
        X.append([w.bytes_read / (dev.bandwidth_gbs * 1e9), spec.n_layer + 1.0])
        y.append(1.0 / float(row["tg128"]))
        ideal = _pp_ideal_seconds(spec) / (dev.fp16_tflops * 1e12)
        pp_e.setdefault(str(row["quant"]), []).append(ideal / (512.0 / float(row["pp512"])))
    X, y = np.array(X), np.array(y)
    wts = 1.0 / y
    coef, *_ = np.linalg.lstsq(X * wts[:, None], y * wts, rcond=None)
    inv_eff, o_layer = float(coef[0]), max(float(coef[1]), 0.0)
    pp = {q: float(math.exp(statistics.fmean(math.log(v) for v in vals))) for q, vals in pp_e.items()}
    # a quant's own weight type: F16 → F16, Q8_0 → Q8_0, Q4_0 → Q4_0 (the table has only these three)
    quantized = [v for q, v in pp.items() if q != "F16"]
    default = float(math.exp(statistics.fmean(math.log(v) for v in quantized))) if quantized else min(pp.values())
    return GpuFit(kind=kind, efficiency=1.0 / inv_eff, overhead_layer_s=o_layer, pp_efficiency=MappingProxyType(pp),
                  pp_default_efficiency=default, n_rows=len(df),
                  source=f"{kind} class fitted on {len(df)} published llama-bench rows (llama.cpp discussion #4167)")


def load_seed_claims(path=None) -> dict[str, Any]:
    """``data/seed_claims.yaml``: the seed's staircase, its ceiling table, and independent anchors."""
    import yaml

    if path is None:
        return yaml.safe_load(_data_text("seed_claims.yaml"))
    with open(path) as f:
        return yaml.safe_load(f)


@lru_cache(maxsize=None)
def gpu_class_fit(kind: str) -> GpuFit:
    """Parameters of a device class. ``apple``: fitted on every comparable Apple row. ``gpu`` (CUDA):
    Apple's decode efficiency; per-layer overhead and prompt efficiency set from the two V100 anchor rows
    of ``seed_claims.yaml`` (so those rows validate nothing)."""
    df = load_apple_table()
    apple = fit_gpu_rows(df[df["comparable"]], "apple")
    if kind == "apple":
        return apple
    if kind != "gpu":
        raise ConfigError(f"no GPU class parameters for device kind '{kind}'")
    anchors = {a["id"]: a for a in load_seed_claims().get("anchors", [])}
    tg_a, pp_a = anchors.get("v100-llama2-7b-q4_0-tg128"), anchors.get("v100-llama8b-q5_0-pp512")
    from v100lab.devices import get_device

    o_layer = apple.overhead_layer_s
    pp_eff = dict(apple.pp_efficiency)
    default = apple.pp_default_efficiency
    notes = []
    if tg_a:
        dev = get_device(tg_a["device"])
        spec = _arch_spec(tg_a["arch"], tg_a["quant"])
        w = decode_work(spec, {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)},
                        RunConfig(flash_attn=tg_a.get("flash_attn", "off"), n_ctx=4096), APPLE_TG_DEPTH)[dev.id]
        t_mem = w.bytes_read / (apple.efficiency * dev.bandwidth_gbs * 1e9)
        o_layer = max((1.0 / float(tg_a["tps"]) - t_mem) / (spec.n_layer + 1), 0.0)
        notes.append(f"overhead from {tg_a['id']}")
    if pp_a:
        dev = get_device(pp_a["device"])
        spec = _arch_spec(pp_a["arch"], pp_a["quant"])
        flops_s = _pp_ideal_seconds(spec) / (dev.fp16_tflops * 1e12)
        # one figure for every type: the anchor is a single row
        pp_eff = {}
        default = flops_s / (512.0 / float(pp_a["tps"]))
        notes.append(f"prompt efficiency from {pp_a['id']}")
    return GpuFit(kind="gpu", efficiency=apple.efficiency, overhead_layer_s=o_layer,
                  pp_efficiency=MappingProxyType(pp_eff), pp_default_efficiency=default, n_rows=apple.n_rows,
                  source="CUDA class: bandwidth efficiency from the Apple fit; " + ", ".join(notes)
                         + " (V100 anchors in seed_claims.yaml)")


def gpu_rates(device, fit: GpuFit) -> DeviceRates:
    """DeviceRates of a GPU/Apple device under an explicit fit (leave-one-chip-out uses this)."""
    flops = (device.fp16_tflops or device.fp32_tflops) * 1e12
    pp = {t: 2.0 / (e * flops) for t, e in fit.pp_efficiency.items()}
    default = 2.0 / (fit.pp_default_efficiency * flops)
    return DeviceRates(device_id=device.id, kind=device.kind, bandwidth_gbs=float(device.bandwidth_gbs),
                       efficiency=fit.efficiency, tg_s_per_weight=MappingProxyType({}), attn_s_per_op=0.0,
                       pp_s_per_weight=MappingProxyType(pp), pp_default_s_per_weight=default,
                       pp_attn_s_per_op=pp.get("F16", default), overhead_token_s=fit.overhead_token_s,
                       overhead_layer_s=fit.overhead_layer_s, pp_overhead_s=fit.pp_overhead_s,
                       host_link_gbs=device.host_link_gbs, source=fit.source)


def apple_rows(split: str = "leave-one-chip-out"):
    """Predicted vs published Apple rows, one row per (chip variant, quant, test).

    ``split="leave-one-chip-out"``: each chip (all its GPU-core variants) is predicted by a fit on the
    other chips' comparable rows — the honest figure. ``split="none"``: one fit on every comparable row
    (in-sample; shown only to size the optimism). Newer-build rows are predicted with the fit on all
    comparable rows and marked ``comparable=False``: they are not judged."""
    import pandas as pd

    if split not in ("leave-one-chip-out", "none"):
        raise ConfigError(f"apple_rows: split must be 'leave-one-chip-out' or 'none', got '{split}'")
    df = load_apple_table()
    comp = df[df["comparable"]]
    full = fit_gpu_rows(comp)
    fits = {}
    out = []
    for _, row in df.iterrows():
        chip = row["chip"]
        if split == "leave-one-chip-out" and row["comparable"]:
            if chip not in fits:
                fits[chip] = fit_gpu_rows(comp[comp["chip"] != chip])
            fit, fit_on = fits[chip], f"all chips but {chip}"
        else:
            fit, fit_on = full, "all comparable rows"
        dev = apple_device(row)
        spec = _arch_spec("llama2-7b", str(row["quant"]))
        placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
        rates = {dev.id: gpu_rates(dev, fit)}
        p_tg = predict(spec, [dev], _APPLE_CFG, depth=APPLE_TG_DEPTH, n_prompt=512, placement=placed, rates=rates)
        p_pp = predict(spec, [dev], _APPLE_CFG, depth=0, n_prompt=512, placement=placed, rates=rates)
        for metric, pub, pr in (("tg128", row["tg128"], p_tg.tg_tps), ("pp512", row["pp512"], p_pp.pp_tps)):
            out.append({"chip": chip, "gpu_cores": int(row["gpu_cores"]), "bandwidth_gbs": float(row["bandwidth_gbs"]),
                        "quant": row["quant"], "test": metric, "published": float(pub), "predicted": float(pr),
                        "error": float(pr) / float(pub) - 1.0, "ceiling_tg_tps": p_tg.ceiling_tg_tps,
                        "above_ceiling": bool(metric == "tg128" and float(pub) > p_tg.strict_ceiling_tg_tps),
                        "comparable": bool(row["comparable"]), "fit_on": fit_on, "build": row["build"],
                        "source": row["source"]})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------------
# the seed's staircase
# ------------------------------------------------------------------------------------------------

def seed_host_device(claims: Mapping[str, Any]):
    from v100lab.devices import device_from_mapping

    return device_from_mapping(claims["host"], "seed_claims.yaml host")


def seed_stage_prediction(stage: Mapping[str, Any], claims: Mapping[str, Any], device: str, arch: str):
    """Predict one stage: the stage's quant and flags on ``device`` plus the seed's (assumed) host CPU.
    A configuration that does not fit is predicted with the most GPU layers that do (what llama.cpp's
    ``--fit`` does; older builds refuse to load) and says so."""
    from v100lab import memory
    from v100lab.devices import get_device

    spec = _arch_spec(arch, stage["quant"])
    cfg = RunConfig.from_mapping(stage.get("config") or {})
    gpu = get_device(device)
    host = seed_host_device(claims)
    devs = [gpu, host]
    cfg, note = memory.fit_gpu_layers(spec, devs, cfg)
    pred = predict(spec, devs, cfg, depth=int(stage.get("depth", 0)), n_prompt=512)
    return pred, spec, note
