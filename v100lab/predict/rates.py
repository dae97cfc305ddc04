"""How fast each device is: the rates the speed model (:mod:`v100lab.predict.speed`) divides the work by.

* **CPUs.** A host calibrated with ``v100lab calibrate`` (:mod:`v100lab.measure.calibration`) has, per thread count,
  a decode cost per weight for each ggml type, an attention cost, per-layer and per-token overheads and the
  prompt costs; :func:`cpu_rates_from_calibration` reads them from the stored host profile (interpolated
  between calibrated thread counts). On a small CPU, decoding below 8 bits is bound by dequantisation, not
  by memory, so a bandwidth figure alone overpredicts. A CPU without a calibration gets stated assumptions
  (:data:`UNCALIBRATED_CPU_EFFICIENCY` of its bandwidth).
* **GPU classes.** Apple Silicon: efficiency (fraction of bandwidth reached in decode), per-layer overhead and
  prompt-processing efficiency per weight type (fraction of the GPU's FP16 ALU peak) are fitted on the
  published llama-bench rows in ``data/apple_silicon_llama7b.csv``. CUDA cards: a class of their own, fitted on
  the published CUDA llama-bench rows in ``data/cuda_llama7b.csv`` (:func:`fit_cuda_rows`; judged
  leave-one-card-out by ``benchmarks/bench_gpu_class.py``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.util
import io
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from v100lab.base import buildflags
from v100lab.predict import drift_scaling, memory
from v100lab.base.clock import age_text, parse_utc
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Assumption, Device, complete_gpu, get_device, host_fingerprint, read_host_profile
from v100lab.base.errors import ConfigError, V100labError
from v100lab.gguf.llama_context import causal_cells, nearest_type, resolve_flash_attn
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.predict.work import attn_missed_head_cells, single_device_work
from v100lab.base.safeio import short_repr

#: the host profile's key for the CPU calibration (written by :func:`v100lab.measure.calibration.calibrate`)
PROFILE_KEY = "speed_calibration"

# Uncalibrated CPUs (catalog rows, a host that was never calibrated): fraction of the bandwidth that
# decoding reaches. An assumption; `v100lab calibrate` replaces it for the host.
UNCALIBRATED_CPU_EFFICIENCY = 0.7
UNCALIBRATED_CPU_PP_GFLOPS_PER_THREAD = 20.0
UNCALIBRATED_CPU_OVERHEAD_S = 1e-3


@dataclass(frozen=True)
class DeviceRates:
    """The calibrated (or fitted, or assumed) speed of one device for one run configuration."""

    device_id: str
    kind: str
    bandwidth_gbs: float                      # peak (catalog) or measured (host, at this thread count)
    efficiency: float                         # fraction of bandwidth_gbs that streaming weights reaches
    tg_s_per_weight: Mapping[str, float]      # decode compute cost per weight, per ggml type (CPUs)
    attn_s_per_op: float                      # decode attention cost per multiply-add (0: memory only)
    pp_s_per_weight: Mapping[str, float]      # prompt cost per weight per token, per ggml type
    pp_default_s_per_weight: float            # for types without their own figure
    pp_attn_s_per_op: float
    overhead_token_s: float                   # once per decoded token (graph, sync, logits)
    overhead_layer_s: float                   # per layer on this device per token
    pp_overhead_s: float                      # per ubatch of prompt processing
    host_link_gbs: float | None
    source: str
    attn_tail_s_per_op: float = 0.0           # extra cost per multiply-add in a head's scalar tail (CPU)
    attn_split_layer_s: float = 0.0           # per layer per token on the CPU flash-attention split-KV path
    attn_s_per_head_cell: float = 0.0         # per query head × KV cell (CPU: the softmax step of ggml-cpu's flash
                                              # attention, whatever head_dim is), beside the cost per multiply-add
    pp_attn_s_per_head_cell: float = 0.0      # prompt attention per query head × KV cell computed (CPU: the tiled
                                              # flash attention's mask, scale and softmax per cell), beside per op
    tg_row_s: float = 0.0                     # decode cost per weight-matrix row per token (CPU: each row's dot
                                              # product's setup and horizontal sum, whatever the row's length)
    tg_row_s_by_type: Mapping[str, float] = field(default_factory=dict)   # the host after a drift check: the row's
                                              # cost per weight type (each type's rung moved by its own ratio)
    threads_note: str = ""                    # CPUs: why the rates are for fewer threads than -t asked
    profile_note: str = ""                    # the host: its profile's age and quality (describe_host_rates)
    profile_warnings: tuple[str, ...] = ()    # the host: the profile was made with another build or CPU
    efficiency_by_type: Mapping[str, float] = field(default_factory=dict)   # GPUs: decode efficiency per weight
                                              # type where its kernel family differs (CUDA: F16/BF16/F32)
    tg_add_s_per_weight: float = 0.0          # GPUs: decode time per weight added to the memory time (CUDA-core work)
    attn_cache_bytes: float = 0.0             # CPU: the effective cache a layer's KV cells must fit in for attention's
                                              # query heads to find them there (0: no such term; work.attn_missed_head_cells)
    attn_s_per_missed_head_cell: float = 0.0  # CPU: per query head × KV cell whose reads miss that cache
    attn_s_per_kv_byte: float = 0.0           # CPU: per byte of the KV cells attention reads (what makes its cost per
                                              # head × cell follow the GQA ratio: calibration's calib-mha)
    threads: int = 1                          # CPU: the threads sharing each matrix product (work.busiest_share)
    attn_nofa_ratio: float = 1.0              # CPU: attention's compute with -fa off over the flash-attention fit's
                                              # for the same cells (calibration's -fa off points; applied by rates_for)
    assumptions: tuple[Assumption, ...] = ()  # GPUs: fields the device file lacked and the values used instead

    @property
    def peak_bandwidth(self) -> float:
        """Bytes/s no decode can beat: the catalog peak, or for a calibrated host the larger of its
        STREAM-like figure and the best bandwidth llama.cpp itself reached in calibration."""
        return self.bandwidth_gbs * 1e9 * max(1.0, self.efficiency)

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth_gbs * 1e9 * self.efficiency

    def bandwidth_for(self, type_name: str) -> float:
        """Bytes/s that decode reaches on weights of ``type_name`` (its kernel family's efficiency)."""
        return self.bandwidth_gbs * 1e9 * self.efficiency_by_type.get(type_name, self.efficiency)

    def _tg_type(self, type_name: str) -> str | None:
        """The calibrated type whose decode costs ``type_name`` uses: its own, or the nearest by bits per weight."""
        if type_name in self.tg_s_per_weight:
            return type_name
        return nearest_type(type_name, self.tg_s_per_weight)

    def tg_cost(self, type_name: str) -> float | None:
        """Seconds per weight of ``type_name`` in decode, or None when the device has no compute term
        for it (GPUs)."""
        return self.tg_s_per_weight.get(self._tg_type(type_name)) if self.tg_s_per_weight else None

    def tg_compute_s(self, type_name: str, n_weights: float, n_rows: float) -> float:
        """Decode compute time of ``n_weights`` weights of ``type_name`` in ``n_rows`` matrix rows: weights × the
        type's cost + rows × the row's cost (0 where the device has no compute term: GPUs); a type without costs of
        its own borrows the nearest type's, its rows' too."""
        c = self.tg_cost(type_name)
        return n_weights * c + n_rows * self.tg_row_s_by_type.get(self._tg_type(type_name), self.tg_row_s) if c else 0.0

    def attn_compute_s(self, ops: float, tail_ops: float = 0.0, head_cells: float = 0.0, sweeps=(),
                       kv_bytes: float = 0.0) -> float:
        """Decode attention's compute time: ``ops`` multiply-adds (``tail_ops`` of them in a head's scalar tail)
        over ``head_cells`` query heads × KV cells (one softmax step each), the ``kv_bytes`` of the cells read, and
        the query heads × cells of its sweeps (:attr:`v100lab.predict.work.DeviceWork.attn_sweeps`) that miss the fitted
        cache."""
        t = ops * self.attn_s_per_op + tail_ops * self.attn_tail_s_per_op + head_cells * self.attn_s_per_head_cell
        t += kv_bytes * self.attn_s_per_kv_byte
        if self.attn_s_per_missed_head_cell and sweeps:
            t += attn_missed_head_cells(sweeps, self.attn_cache_bytes) * self.attn_s_per_missed_head_cell
        return t

    def pp_row_cost(self, type_name: str) -> float:
        """A CPU prompt's cost per matrix row and token for ``type_name`` through ggml-cpu's generic product (0 for
        llamafile's sgemm types and on GPUs): decode's row cost, the same vec_dot call per row."""
        if self.kind != "cpu" or type_name.upper() in SGEMM_TYPES:
            return 0.0
        return self.tg_row_s_by_type.get(self._tg_type(type_name), self.tg_row_s)

    def pp_cost(self, type_name: str) -> float:
        if type_name in self.pp_s_per_weight:
            return self.pp_s_per_weight[type_name]
        if self.pp_s_per_weight:
            near = nearest_type(type_name, self.pp_s_per_weight)
            if near:
                return self.pp_s_per_weight[near]
        return self.pp_default_s_per_weight

    def pp_attn_compute_s(self, ops: float, head_cells: float) -> float:
        """Prompt attention's compute time: ``ops`` multiply-adds over ``head_cells`` query heads × KV cells (the
        cells the tiled kernel computes: :func:`v100lab.gguf.llama_context.fa_prompt_cells`)."""
        return ops * self.pp_attn_s_per_op + head_cells * self.pp_attn_s_per_head_cell


def rates_for(device, cfg: RunConfig, profile: Mapping[str, Any] | None = None) -> DeviceRates:
    """How fast ``device`` is for ``cfg``: the host's calibration for a calibrated CPU, the fitted
    device-class parameters for GPUs and Apple chips, stated assumptions otherwise. A CUDA device file's missing
    fields are inferred from the catalog (:func:`v100lab.facts.devices.complete_gpu`) and named in ``assumptions``."""
    if device.kind == "cpu":
        cal = None
        if profile is not None:
            cal = profile.get(PROFILE_KEY)
        elif device.id == "host":
            cal = dict(device.extra).get(PROFILE_KEY)
        threads, note = effective_threads(cfg, device, profile)
        if cal:
            r = cpu_rates_from_calibration(device, cal, threads)
        else:
            r = _uncalibrated_cpu(device, threads)
        if not resolve_flash_attn(cfg) and r.attn_nofa_ratio != 1.0:
            r = without_flash_attn(r)
        if device.id == "host":
            hp = describe_host_rates(cal, device=device, stored=False)
            r = replace(r, profile_note=hp.line, profile_warnings=hp.warnings)
        return replace(r, source=f"{r.source}; {note}", threads_note=note) if note else r
    device, assumed = complete_gpu(device)      # a sparse device file: its missing fields inferred, and named
    r = gpu_rates(device, gpu_class_fit(device.kind), cfg)
    return replace(r, assumptions=assumed) if assumed else r


def without_flash_attn(r: DeviceRates) -> DeviceRates:
    """A CPU's rates for decode attention without flash attention: its compute costs (per multiply-add, tail op,
    head × cell, missed head × cell, KV byte) times the calibrated :attr:`DeviceRates.attn_nofa_ratio`; the split
    layers' syncs are the same on both paths (:func:`v100lab.gguf.llama_context.attn_sync_layer`)."""
    k = r.attn_nofa_ratio
    return replace(r, attn_s_per_op=r.attn_s_per_op * k, attn_tail_s_per_op=r.attn_tail_s_per_op * k,
                   attn_s_per_head_cell=r.attn_s_per_head_cell * k,
                   attn_s_per_missed_head_cell=r.attn_s_per_missed_head_cell * k,
                   attn_s_per_kv_byte=r.attn_s_per_kv_byte * k, attn_nofa_ratio=1.0,
                   source=f"{r.source}; attention -fa off at ×{k:.2f} of flash attention's (calibrated)")


def effective_threads(cfg: RunConfig, device, profile: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """The thread count a CPU prediction uses, and a note when it is not -t: threads beyond the host's cores
    (:func:`v100lab.predict.memory.host_cores`, or the profile's) share those cores — llama.cpp starts them, but they
    compute no faster (and spin while they wait) — so the rates are those of the cores, never extrapolated
    past them."""
    cores = memory.cores_of_profile(profile) or memory.host_cores([device])
    if cfg.threads > cores:
        return cores, f"-t {cfg.threads} is more threads than the {cores} cores: predicted at {cores}"
    return cfg.threads, ""


def _uncalibrated_cpu(device, threads: int) -> DeviceRates:
    pp = 1.0 / (UNCALIBRATED_CPU_PP_GFLOPS_PER_THREAD * 1e9 * threads / 2.0)
    return DeviceRates(
        device_id=device.id, kind="cpu", bandwidth_gbs=float(device.bandwidth_gbs),
        efficiency=UNCALIBRATED_CPU_EFFICIENCY, tg_s_per_weight=MappingProxyType({}), attn_s_per_op=0.0,
        pp_s_per_weight=MappingProxyType({}), pp_default_s_per_weight=pp, pp_attn_s_per_op=pp,
        overhead_token_s=UNCALIBRATED_CPU_OVERHEAD_S, overhead_layer_s=0.0, pp_overhead_s=0.0,
        host_link_gbs=None, threads=threads,
        source=f"uncalibrated CPU: {UNCALIBRATED_CPU_EFFICIENCY:.0%} of {device.bandwidth_gbs:g} GB/s (assumption); "
               "run `v100lab calibrate` on that machine")


# ------------------------------------------------------------------------------------------------
# CPUs: the host's stored calibration
# ------------------------------------------------------------------------------------------------

def stored_calibration() -> dict[str, Any] | None:
    """The CPU calibration stored in this host's profile, or None."""
    prof = read_host_profile() or {}
    return prof.get(PROFILE_KEY)


# a thread count's figures that every prediction reads: numbers, finite, and (the first) above zero
_CAL_POSITIVE = ("bandwidth_gbs", "efficiency")
_CAL_NUMBERS = ("overhead_token_s", "overhead_layer_s")


def calibration_problem(cal: Any, complete: bool = False) -> str | None:
    """What makes a stored CPU calibration unusable (None when it is fine): not an object, no thread
    counts, a thread count that is not a positive integer, or a figure that is not a finite number, or
    (bandwidth, efficiency, cost per weight) not above zero — a hand-edited or damaged profile. With
    ``complete`` every figure the summary prints must be there."""
    if not isinstance(cal, Mapping):
        return "not an object"
    threads = cal.get("threads")
    if not isinstance(threads, Mapping) or not threads:
        return "no thread counts"
    for th, p in threads.items():
        if not str(th).isdigit() or int(th) < 1:
            return f"thread count {short_repr(th)} is not a positive integer"
        if not isinstance(p, Mapping):
            return f"{th} thread(s): not an object"
        for name in _CAL_POSITIVE + _CAL_NUMBERS:
            v = p.get(name)
            if v is None and not complete:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or (name in _CAL_POSITIVE and v <= 0):
                return f"{th} thread(s): {name} is {short_repr(v)}"
        costs = p.get("tg_s_per_weight", {} if not complete else None)
        if not isinstance(costs, Mapping) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0
                for c in costs.values()):
            return f"{th} thread(s): tg_s_per_weight is not a map of positive costs"
    return None


# ------------------------------------------------------------------------------------------------
# the host profile's provenance and quality: what every host prediction says about its rates
# ------------------------------------------------------------------------------------------------

def ggml_cpu_digest() -> str | None:
    """The first 12 hex digits of the sha256 of llama-cpp-python's ``libggml-cpu`` (a rebuild with other
    flags changes it even when the version does not); found without importing ``llama_cpp``."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    libdir = Path(spec.origin).parent / "lib"
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        try:
            return hashlib.sha256((libdir / name).read_bytes()).hexdigest()[:12]
        except OSError:
            continue
    return None


@lru_cache(maxsize=1)
def current_build_facts() -> dict[str, Any]:
    """This machine's CPU and llama.cpp build, cheaply (no llama.cpp load): llama-cpp-python's version from its
    metadata, the build record ``scripts/setup.sh`` wrote (:func:`v100lab.base.buildflags.read_record`), a digest of
    ``libggml-cpu``, the CPU model and the flags llama.cpp's kernels use. Calibration stores the same keys
    (``build`` and ``cpu`` in the calibration), which is what :func:`describe_host_rates` compares."""
    try:
        lcp = version("llama-cpp-python")
    except PackageNotFoundError:
        lcp = None
    rec = buildflags.read_record()
    cpu = buildflags.host_cpu()
    fp = host_fingerprint()
    return {"build": {"llama_cpp_python": lcp, "build_flags": rec.get("cmake_args"),
                      "build_flags_source": rec.get("source"), "ggml_cpu_sha256": ggml_cpu_digest()},
            "cpu": {"model": cpu.model, "flags": " ".join(cpu.relevant_flags), "cpu_count": fp["cpu_count"],
                    "machine": fp["machine"], "hostname": fp["hostname"],
                    "llc_bytes": buildflags.last_level_cache_bytes()}}


def _abs_errs(values) -> list[float]:
    return [abs(float(e)) for e in (values or []) if e is not None and math.isfinite(float(e))]


#: tolerance on the thread-scaling bound: a decode rate may grow at most (n / m) x (1 + this) from m to n threads
SCALING_TOLERANCE = 0.15
#: the row length the thread-scaling check judges a weight's cost on: the calibration rungs' (calib-wide, n_embd 1024)
SCALING_ROW = 1024
#: matrix rows per weight of calibration's prompt model (calib-wide-pp: n_embd 1024, n_ff 2816, 16 heads, 4 KV heads
#: of 64; rows of 1024 and 2816 weights): the share of the row's own cost its prompt cost per weight holds
#: (tests/test_prompt_rows.py checks it against measure.calibration's spec)
PP_CALIB_ROWS_PER_WEIGHT = 9216 / 11_272_192
#: the types llamafile's sgemm multiplies on x86 (ggml/src/ggml-cpu/llamafile/sgemm.cpp, llamafile_sgemm: tiled, no
#: vec_dot per row and token)
SGEMM_TYPES = frozenset({"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"})


def superlinear_scaling(cal: Mapping[str, Any], tolerance: float = SCALING_TOLERANCE) -> list[str]:
    """Weight types whose calibrated decode rate grows faster than the thread count between two calibrated
    thread counts ("Q4_K 4.2x from 1 to 2 threads"). n threads on n cores give at most n times one thread's
    speed (less where they share a core's caches or a memory channel), so a faster growth says the two thread
    counts were measured in different phases of the machine — on a shared VM, one of them while a neighbour was
    quiet — and the profile's rates at one of them are not the machine's usual."""
    # a weight's cost on a row of SCALING_ROW weights, its share of the row's own cost included (tg_row_s: one figure
    # for all types, which may move between thread counts; the per-weight rates alone would then look superlinear)
    per = {int(k): {t: c + float(v.get("tg_row_s") or 0.0) / SCALING_ROW
                    for t, c in (v.get("tg_s_per_weight") or {}).items()}
           for k, v in (cal.get("threads") or {}).items()}
    out = []
    ks = sorted(per)
    for m, n in zip(ks, ks[1:]):
        for t in sorted(set(per[m]) & set(per[n])):
            if per[m][t] > 0 and per[n][t] > 0:
                gain = per[m][t] / per[n][t]
                if gain > (n / m) * (1 + tolerance):
                    out.append(f"{t} {gain:.1f}x from {m} to {n} threads")
    return out


#: the residual every calibration point should keep: a fit within 10 % of each of its own points
RESIDUAL_TARGET = 0.10
#: a point missed by more than this many standard errors of its own loads' median is a miss of the model; within
#: them, the point's loads disagree as much as the miss, and the machine's noise can account for it (the drift
#: check judges a rung's move the same way)
NOISE_Z = drift_scaling.NOISE_Z


#: a point whose loads leave their median uncertain by more than this (:func:`median_standard_error`) is uncertain:
#: calibration settles points to 3 % (calibration.SETTLE_SE) and refuses a machine with many past this
NOISY_MACHINE_SE = 0.05


def median_standard_error(tps, min_loads: int = 3) -> float | None:
    """The relative standard error of the median of a point's loads (``tg_pass_tps``: each load's tok/s):
    sqrt(pi/2) x the standard deviation of their logarithms / sqrt(n) — how far the median may lie from the
    machine's typical speed by chance alone. None under ``min_loads`` loads (at two, it is their gap: the
    settling rounds load a third when two disagree, :func:`v100lab.measure.calibration.to_settle`).

    Why the loads and not the repetitions: on a 2-core VM the repetitions of one load (about a second, back to
    back) agree within 1-3 %, while runs a few seconds apart move with a standard deviation of 4-10 %, as much as
    separate loads do: a load's cv sees one moment of the machine, its loads' spread sees the machine."""
    xs = [math.log(float(x)) for x in tps or () if isinstance(x, (int, float)) and x > 0]
    if len(xs) < max(2, min_loads):
        return None
    return math.sqrt(math.pi / 2) * statistics.stdev(xs) / math.sqrt(len(xs))


def point_misses(cal: Mapping[str, Any], target: float = RESIDUAL_TARGET, z: float = NOISE_Z) -> list[dict]:
    """The decode points a calibration's fit misses by more than ``target``: each with its residual, its loads'
    :func:`median_standard_error` and whether the miss exceeds ``z`` of them (``beyond_noise``; None when the
    point has too few loads to tell). The fit's residuals (``tg_fit_rel_err``) are in the order of the stored
    points with a decode figure at that thread count (:func:`v100lab.measure.calibration.calibrate`); a calibration whose
    counts do not match gives no rows for that thread count."""
    out = []
    for th, fit in sorted((cal.get("threads") or {}).items(), key=lambda kv: int(kv[0])):
        errs = fit.get("tg_fit_rel_err") or []
        pts = [pt for pt in cal.get("points") or [] if str(pt.get("threads")) == str(th) and pt.get("tg_tps")]
        names = fit.get("tg_fit_points")
        if names and all(names) and len(names) == len(errs):   # fits that name their points
            by_name = {pt.get("config"): pt for pt in pts}
            pts = [by_name.get(n, {"config": n}) for n in names]
        if len(pts) != len(errs):
            continue
        for pt, e in zip(pts, errs):
            if e is None or abs(float(e)) <= target:
                continue
            se = median_standard_error(pt.get("tg_pass_tps"))
            out.append({"config": pt.get("config"), "threads": int(th), "residual": round(float(e), 4),
                        "loads": len(pt.get("tg_pass_tps") or ()),
                        "standard_error": None if se is None else round(se, 4),
                        "beyond_noise": None if se is None else abs(float(e)) > z * se})
    return out


def stored_misses(cal: Mapping[str, Any]) -> list[dict]:
    """A calibration's :func:`point_misses`: from its quality record, or computed from its points for a profile
    stored without them in its quality record."""
    q = cal.get("quality") or {}
    return q["misses"] if "misses" in q else point_misses(cal)


def describe_misses(misses, z: float = NOISE_Z) -> str:
    """One clause on :func:`point_misses`: how many points the fit misses by more than the target, and of those
    how many by more than their own loads' noise allows, how many within it, how many with too few loads to tell
    ("" when it misses none)."""
    if not misses:
        return ""
    beyond = [m for m in misses if m.get("beyond_noise") is True]
    within = [m for m in misses if m.get("beyond_noise") is False]
    unknown = len(misses) - len(beyond) - len(within)
    said = []
    if beyond:
        said.append(f"{len(beyond)} by more than {z:g} standard errors of its own loads (" + ", ".join(
            f"{m['config']} at {m['threads']} t {100 * m['residual']:+.0f} %" for m in beyond[:3])
            + (", ..." if len(beyond) > 3 else "") + ")")
    if within:
        said.append(f"{len(within)} within them (the machine's noise can account for it)")
    if unknown:
        said.append(f"{unknown} with too few loads to tell")
    return f"{len(misses)} point(s) missed by > {100 * RESIDUAL_TARGET:.0f} %: " + ", ".join(said)


#: a calibration whose passes ran more than this apart (:func:`pass_drift`) was made while the machine's speed moved
#: under it: on a 2-vCPU Sapphire Rapids VM calibrations whose passes moved 2-6 % predicted the default model
#: within 10 % of llama-bench, two made while it slowed 12 and 14 % predicted it 19-25 % slow an hour later
MAX_PASS_DRIFT = 0.10
#: the passes of a calibration stored before it recorded their number (calibration.CALIB_PASSES then)
STORED_PASSES = 3


def pass_drift(cal: Mapping[str, Any]) -> dict[str, float]:
    """Per thread count, how far the machine's speed moved between a calibration's passes: for each pass the median,
    over the decode points, of the median of that pass's loads ÷ the point's median over all its loads; the largest
    of those ÷ the smallest − 1. A point's ``tg_pass_tps`` are its passes' loads in order (as many each) and then its
    settling loads, which are left out; a point whose count does not divide is skipped. Empty under two passes."""
    passes = int(cal.get("passes") or STORED_PASSES)
    per: dict[int, dict[int, list[float]]] = {}
    for pt in cal.get("points") or []:
        loads = [float(x) for x in pt.get("tg_pass_tps") or () if x]
        n = len(loads) - int(pt.get("settling_loads") or 0)
        if passes < 2 or not loads or n < passes or n % passes:
            continue
        k_loads, med = n // passes, statistics.median(loads)
        for k in range(passes):
            per.setdefault(int(pt["threads"]), {}).setdefault(k, []).append(
                statistics.median(loads[k * k_loads:(k + 1) * k_loads]) / med)
    out = {}
    for th, by_pass in sorted(per.items()):
        levels = [statistics.median(v) for v in by_pass.values()]
        out[str(th)] = round(max(levels) / min(levels) - 1.0, 4)
    return out


def calibration_quality(cal: Mapping[str, Any], noisy_cv: float = 0.10,
                        uncertain_se: float = NOISY_MACHINE_SE) -> dict[str, Any]:
    """How well a stored calibration describes its own points: per thread count the max and median
    |relative residual| of the decode (tg) and prompt (pp) fits, the noisy points (cv above ``noisy_cv``),
    the overall worst residual with the fit and thread count it came from, the types whose rate grows
    faster than the thread count (:func:`superlinear_scaling`), the misses judged against their loads
    (:func:`point_misses`), and the points whose loads leave their median uncertain by more than ``uncertain_se``
    (:func:`median_standard_error`; ``uncertain_points``, with the median standard error over all points and the
    loads calibration's settling added), and how far the machine's speed moved between the passes (:func:`pass_drift`;
    ``max_pass_drift``). From the calibration's own points, fits and rates, so older profiles get it
    too."""
    per: dict[str, Any] = {}
    worst = (0.0, None, None)
    for th, p in sorted((cal.get("threads") or {}).items(), key=lambda kv: int(kv[0])):
        q: dict[str, Any] = {}
        for kind in ("tg", "pp"):
            errs = _abs_errs(p.get(f"{kind}_fit_rel_err"))
            if errs:
                q[f"{kind}_max_residual"] = round(max(errs), 4)
                q[f"{kind}_median_residual"] = round(statistics.median(errs), 4)
                q[f"{kind}_points"] = len(errs)
                if p.get(f"{kind}_parameters") is not None:     # calibrations that store their parameters
                    q[f"{kind}_parameters"] = int(p[f"{kind}_parameters"])
                if max(errs) > worst[0]:
                    worst = (max(errs), kind, int(th))
        per[str(th)] = q
    measured = [pt for pt in cal.get("points") or [] if "tg_cv" in pt or "pp_cv" in pt]
    noisy = [pt for pt in measured if (pt.get("tg_cv") or 0) > noisy_cv or (pt.get("pp_cv") or 0) > noisy_cv]
    # several passes (calibration.CALIB_PASSES): a point whose median pass no other pass confirms within
    # noisy_cv was not repeatable — the machine's speed moved under it
    unsettled = [pt for pt in measured if _pass_gap(pt.get("tg_pass_tps")) > noisy_cv
                 or _pass_gap(pt.get("pp_pass_tps")) > noisy_cv]
    misses = point_misses(cal)
    # how well each point's loads pin its median (calibration settles them to 3 %)
    per_point = [[se for se in (median_standard_error(pt.get(f"{test}_pass_tps")) for test in ("tg", "pp"))
                  if se is not None] for pt in measured]
    ses = [se for point in per_point for se in point]
    uncertain = [point for point in per_point if any(se > uncertain_se for se in point)]
    drift_by_threads = pass_drift(cal)
    spread = {str(k): float(v) for k, v in (cal.get("reference_spread") or {}).items()}
    return {"plan": cal.get("plan") or "precise", "reference_spread": spread,
            "max_reference_spread": max(spread.values(), default=0.0), "threads": per, "max_residual": round(worst[0], 4), "max_residual_fit": worst[1],
            "max_residual_threads": worst[2], "noisy_points": len(noisy), "measured_points": len(measured),
            "noisy_cv": noisy_cv, "unsettled_points": len(unsettled), "superlinear": superlinear_scaling(cal),
            "misses": misses, "misses_beyond_noise": sum(1 for m in misses if m["beyond_noise"] is True),
            "uncertain_points": len(uncertain), "uncertain_se": uncertain_se,
            "median_standard_error": round(statistics.median(ses), 4) if ses else None,
            "settled_loads": sum((cal.get("settled") or {}).values()),
            "pass_drift": drift_by_threads, "max_pass_drift": max(drift_by_threads.values(), default=0.0)}


def _pass_gap(tps) -> float:
    """How far the median pass is from its nearest other pass (relative; 0 with fewer than two passes): the
    gap between the middle two for an even count, the smaller gap beside the median for an odd one."""
    v = sorted(float(x) for x in tps or () if x)
    if len(v) < 2 or v[0] <= 0:
        return 0.0
    mid = len(v) // 2
    if len(v) % 2 == 0:
        return v[mid] / v[mid - 1] - 1.0
    return min(v[mid] / v[mid - 1] - 1.0, v[mid + 1] / v[mid] - 1.0)


@dataclass(frozen=True)
class HostRatesDescription:
    """A short, honest description of the host's rates: where they come from, how old and how good."""

    calibrated: bool
    line: str
    warnings: tuple[str, ...] = ()
    measured_at: str | None = None
    age_s: float | None = None
    max_residual: float | None = None
    quality: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"calibrated": self.calibrated, "line": self.line, "warnings": list(self.warnings),
                "measured_at": self.measured_at, "age_s": self.age_s, "max_residual": self.max_residual,
                "quality": dict(self.quality)}


def describe_host_rates(cal: Mapping[str, Any] | None = None, *, device=None,
                        now: _dt.datetime | None = None, current: Mapping[str, Any] | None = None,
                        stored: bool = True) -> HostRatesDescription:
    """One line on the host's rates — "host calibration of 2026-12-01 01:20 UTC (3 h old), max residual 12 %
    (tg, 2 threads; median 4 %), 0 of 17 points noisy, llama.cpp b6a1c2d, safe build (llama-cpp-python 0.3.36)"
    or "uncalibrated host: assumed …" — and a warning for each way the profile's llama.cpp build or CPU
    differs from the ones in use (``current``, default :func:`current_build_facts`; nothing is loaded).

    ``cal``: a calibration (default: the stored one, when ``stored``)."""
    if cal is None and stored:
        cal = stored_calibration()
        device = device or get_device("host")
    if not cal:
        bw = f"{device.bandwidth_gbs:g} GB/s" if device is not None else "its bandwidth"
        measured = device is None or dict(device.extra).get("measured", True)
        return HostRatesDescription(
            calibrated=False,
            line=f"uncalibrated host: assumed {UNCALIBRATED_CPU_EFFICIENCY:.0%} of {bw}"
                 + ("" if measured else " (an assumed bandwidth, not measured)")
                 + " reached in decode, no per-type compute cost; run `v100lab calibrate`")
    now = now or _dt.datetime.now(_dt.timezone.utc)
    current = current if current is not None else current_build_facts()
    when = parse_utc(cal.get("measured_at"))
    q = cal.get("quality") or calibration_quality(cal)
    parts = []
    if when is not None:
        age = (now - when).total_seconds()
        parts.append(f"host calibration of {when.astimezone(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC ({age_text(age)})")
    else:
        age = None
        parts.append("host calibration of unknown date")
    if (cal.get("plan") or "precise") == "quick":
        # a quick profile's residuals leave few degrees of freedom: its spread is the reference rung's two loads
        spread = q.get("max_reference_spread")
        if spread is None:
            spread = max((float(v) for v in (cal.get("reference_spread") or {}).values()), default=0.0)
        parts.append(f"quick calibration (one load a point; its reference rung moved {100 * spread:.0f} % between "
                     "its first and last load; `v100lab calibrate --precise` for the full procedure)")
    if q.get("max_residual_fit"):
        med = (q.get("threads", {}).get(str(q.get("max_residual_threads")), {})
               .get(f"{q['max_residual_fit']}_median_residual"))
        parts.append(f"max residual {100 * q['max_residual']:.0f} % ({q['max_residual_fit']}, "
                     f"{q.get('max_residual_threads')} thread(s)"
                     + (f"; median {100 * med:.0f} %" if med is not None else "") + ")")
    else:
        parts.append("fit residuals not recorded")
    missed = describe_misses(stored_misses(cal))
    if missed:
        parts.append(missed)
    if q.get("measured_points"):
        parts.append(f"{q.get('noisy_points', 0)} of {q['measured_points']} points noisy"
                     + (f", {q['unsettled_points']} whose passes differ by > {100 * q.get('noisy_cv', 0.1):.0f} %"
                        if q.get("unsettled_points") else ""))
    warnings = []
    checked, drift_warnings = drift_scaling.describe(cal.get(drift_scaling.DRIFT_KEY), now=now)
    if checked:
        parts.append(checked)
    warnings += drift_warnings
    moved = q["max_pass_drift"] if "max_pass_drift" in q else max(pass_drift(cal).values(), default=0.0)
    spread = max((float(v) for v in (cal.get("reference_spread") or {}).values()), default=0.0)
    if spread > MAX_PASS_DRIFT:
        warnings.append(f"the machine's speed moved by {100 * spread:.0f} % under the quick calibration (its reference "
                        "rung, first and last load): predictions from it may be off by as much — calibrate again on a "
                        "quiet machine (`v100lab calibrate`, or `--precise`), or bring it up to now "
                        "(`v100lab calibrate --check`)")
    if moved > MAX_PASS_DRIFT:
        warnings.append(f"the machine's speed moved by {100 * moved:.0f} % between the calibration's passes: its rates "
                        "are of no one moment, and predictions from them may be off by as much — recalibrate on a "
                        "quiet machine (`v100lab calibrate`), or bring it up to now (`v100lab calibrate --check`)")
    # a profile stored before the check has a quality record without it: computed from its rates
    superlinear = q["superlinear"] if "superlinear" in q else superlinear_scaling(cal)
    if superlinear:
        warnings.append("the profile's thread counts disagree: decode rates grow faster than the thread count ("
                        + ", ".join(superlinear[:3]) + (", ..." if len(superlinear) > 3 else "")
                        + "), so the machine's speed moved between them; predictions at one of them are off — "
                          "run `v100lab calibrate` again when the machine is quiet")
    build = cal.get("build") or {}
    commit = build.get("build_commit") or cal.get("build_commit")
    lcp = build.get("llama_cpp_python") or cal.get("llama_cpp_python")
    src = build.get("build_flags_source")
    desc = f"llama.cpp {commit or '(commit not recorded)'}" + (f", {src} build" if src else "")
    if lcp:
        desc += f" (llama-cpp-python {lcp})"
    parts.append(desc)
    if cal.get("forced"):
        parts.append("stored with --force despite failing the quality bounds")
    cur_b, cur_c = current.get("build") or {}, current.get("cpu") or {}
    diff = []
    for key, what in (("llama_cpp_python", "llama-cpp-python"), ("build_commit", "llama.cpp commit"),
                      ("build_flags", "build flags"), ("ggml_cpu_sha256", "libggml-cpu")):
        old = lcp if key == "llama_cpp_python" else commit if key == "build_commit" else build.get(key)
        new = cur_b.get(key)
        if old and new and old != new:
            diff.append(f"{what} {old} → {new}" if key in ("llama_cpp_python", "build_commit")
                        else f"{what} differ" if key == "build_flags" else f"{what} {old} → {new} (rebuilt)")
    if diff:
        warnings.append(f"the host profile was made with another llama.cpp build ({'; '.join(diff)}): its rates "
                        "may not hold; run `v100lab calibrate` again")
    cpu = cal.get("cpu") or {}
    diff = []
    for key, what in (("model", "CPU model"), ("cpu_count", "cores"), ("hostname", "host")):
        old, new = cpu.get(key), cur_c.get(key)
        if old and new and old != new:
            diff.append(f"{what} '{old}' → '{new}'")
    old, new = cpu.get("llc_bytes"), cur_c.get("llc_bytes")
    if old and new and old != new:   # same model string, another host under the VM: other cache, other speeds
        diff.append(f"last-level cache {old / 2**20:g} MiB → {new / 2**20:g} MiB")
    old_f, new_f = set(str(cpu.get("flags") or "").split()), set(str(cur_c.get("flags") or "").split())
    if old_f and new_f and old_f != new_f:
        gone, added = sorted(old_f - new_f), sorted(new_f - old_f)
        diff.append("CPU flags " + ", ".join(x for x in (f"without {' '.join(gone)}" if gone else "",
                                                          f"with {' '.join(added)}" if added else "") if x) + " now")
    if diff:
        warnings.append(f"the host profile was made on another CPU ({'; '.join(diff)}): run `v100lab calibrate` "
                        "on this machine")
    return HostRatesDescription(calibrated=True, line=", ".join(parts), warnings=tuple(warnings),
                                measured_at=cal.get("measured_at"), age_s=age, max_residual=q.get("max_residual"),
                                quality=q)


def cpu_rates_from_calibration(device, cal: Mapping[str, Any], threads: int) -> DeviceRates:
    """The host's DeviceRates at ``threads``: a calibrated thread count as measured; in between,
    per-weight rates interpolated linearly; beyond the largest, compute rates scaled by the thread
    ratio while the bandwidth stays at the largest measured (a stated extrapolation)."""
    problem = calibration_problem(cal)
    if problem:
        raise V100labError(f"the host calibration is unusable ({problem}); run `v100lab calibrate` again")
    check = cal.get(drift_scaling.DRIFT_KEY) if (cal.get(drift_scaling.DRIFT_KEY) or {}).get("applied") else None
    # an applied drift check (v100lab calibrate --check) brings each thread count's costs up to the phase it measured
    per = {int(k): drift_scaling.scaled_fit(v, check, int(k)) if check else v for k, v in (cal.get("threads") or {}).items()}
    if not per:
        raise V100labError("host calibration has no thread counts; run `v100lab calibrate` again")
    ks = sorted(per)
    scaled = [k for k in ks if check and drift_scaling.ratios(check, k)["moved"]]
    src = f"host calibration ({', '.join(map(str, ks))} threads)" + (
        f"; rates at {', '.join(map(str, scaled))} thread(s) scaled by the drift check of {check.get('measured_at')}"
        if scaled else "")
    if threads in per:
        p = per[threads]
        return _rates_from(device, p, 1.0, src, threads)
    lo = max([k for k in ks if k < threads], default=None)
    hi = min([k for k in ks if k > threads], default=None)
    if lo is None:
        return _rates_from(device, per[hi], threads / hi, src + f"; {threads} thread(s) scaled from {hi}", threads)
    if hi is None:
        return _rates_from(device, per[lo], threads / lo, src + f"; {threads} threads extrapolated from {lo}", threads)
    f = (threads - lo) / (hi - lo)
    a, b = per[lo], per[hi]
    mixed = dict(b)
    for key in ("tg_s_per_weight", "pp_s_per_weight", "tg_row_s_by_type"):
        mixed[key] = {t: 1.0 / ((1 - f) / a[key][t] + f / b[key][t])
                      for t in set(a.get(key) or {}) & set(b.get(key) or {}) if a[key][t] and b[key][t]}
    for key in ("attn_s_per_op", "pp_attn_s_per_op", "attn_tail_s_per_op", "attn_s_per_head_cell",
                "pp_attn_s_per_head_cell", "tg_row_s", "attn_s_per_missed_head_cell", "attn_s_per_kv_byte"):
        if a.get(key) and b.get(key):
            mixed[key] = 1.0 / ((1 - f) / a[key] + f / b[key])
    for key in ("overhead_token_s", "overhead_layer_s", "attn_split_layer_s", "pp_overhead_s", "bandwidth_gbs",
                "efficiency", "attn_cache_bytes", "attn_nofa_ratio"):
        if key in a and key in b:
            mixed[key] = (1 - f) * a[key] + f * b[key]
    return _rates_from(device, mixed, 1.0, src + f"; {threads} threads interpolated", threads)


def _rates_from(device, p: Mapping[str, Any], speedup: float, source: str, threads: int = 1) -> DeviceRates:
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
        attn_tail_s_per_op=float(p.get("attn_tail_s_per_op", 0.0)) / speedup,
        attn_split_layer_s=float(p.get("attn_split_layer_s", 0.0)),
        attn_s_per_head_cell=float(p.get("attn_s_per_head_cell", 0.0)) / speedup,
        pp_attn_s_per_head_cell=float(p.get("pp_attn_s_per_head_cell", 0.0)) / speedup,
        tg_row_s=float(p.get("tg_row_s", 0.0)) / speedup,
        attn_cache_bytes=float(p.get("attn_cache_bytes", 0.0)),
        attn_s_per_missed_head_cell=float(p.get("attn_s_per_missed_head_cell", 0.0)) / speedup,
        attn_s_per_kv_byte=float(p.get("attn_s_per_kv_byte", 0.0)) / speedup, threads=max(1, int(threads)),
        attn_nofa_ratio=float(p.get("attn_nofa_ratio", 1.0)),
        tg_row_s_by_type=MappingProxyType({t: c / speedup for t, c in (p.get("tg_row_s_by_type") or {}).items()}))


# ------------------------------------------------------------------------------------------------
# GPU classes: the Apple Silicon table
# ------------------------------------------------------------------------------------------------

APPLE_CSV = "apple_silicon_llama7b.csv"
APPLE_BUILD = "8e672ef"       # the comparable rows; "newer build" rows are judged apart
ALUS_PER_GPU_CORE = 128       # FP32 ALUs per Apple GPU core (16 EUs × 8 ALUs), FP16 at the same rate
# GPU clock per generation (GHz). M1: 1.278 (1.296 on Pro/Max/Ultra), M2: 1.398 — macrumors "Apple Silicon
# Mac chips" thread (https://spy.macrumors.com/threads/apple-silicon-mac-chips.2471322); M3: 1.398,
# M4: 1.470 — hmc-tech.com GPU pages (https://hmc-tech.com/gpu/apple-9-core-m3-fl-vs-apple-8-core-m4-fl).
APPLE_GPU_CLOCK_GHZ = {"M1": 1.278, "M2": 1.398, "M3": 1.398, "M4": 1.470, "M5": 1.470}
APPLE_TG_DEPTH = 64           # tg128: the 128 generated tokens sit at depths 0..127, mean 64


def data_text(name: str) -> str:
    """A file shipped in ``v100lab/data``, as text."""
    return resources.files("v100lab").joinpath("data", name).read_text()


def load_apple_table():
    """The published Apple Silicon llama-bench rows (header comment lines skipped) as a DataFrame."""

    import pandas as pd  # heavy, optional until a table is asked for

    text = "".join(line + "\n" for line in data_text(APPLE_CSV).splitlines() if not line.startswith("#"))
    df = pd.read_csv(io.StringIO(text))
    df["comparable"] = df["build"].astype(str).str.startswith(APPLE_BUILD)
    df["generation"] = df["chip"].str.split().str[0]
    return df


def apple_device(row):
    """A Device for one table row: its bandwidth and GPU-core count; FP16 peak = cores × 128 ALUs × 2 × clock."""
    gen = str(row["chip"]).split()[0]
    tflops = float(row["gpu_cores"]) * ALUS_PER_GPU_CORE * 2 * APPLE_GPU_CLOCK_GHZ[gen] / 1e3
    return Device(id=f"apple-{str(row['chip']).lower().replace(' ', '-')}-{int(row['gpu_cores'])}c",
                  name=f"Apple {row['chip']} ({int(row['gpu_cores'])}-core GPU)", kind="apple",
                  memory_gib=64, bandwidth_gbs=float(row["bandwidth_gbs"]), fp16_tflops=tflops,
                  source_url="https://github.com/ggml-org/llama.cpp/discussions/4167")


def arch_spec(arch, quant: str):
    """A skeleton ModelSpec (v100lab.gguf.skeleton) for a shipped architecture name or an inline mapping."""
    if isinstance(arch, Mapping):
        return _arch_spec_cached(json.dumps(dict(arch), sort_keys=True), quant)
    return _arch_spec_cached(str(arch), quant)


@lru_cache(maxsize=None)
def _arch_spec_cached(arch: str, quant: str):
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
    # CUDA class only (the Apple class leaves these at their defaults):
    efficiency_f16: float | None = None      # decode efficiency of F16/BF16/F32 weights (cuBLAS/MMV, not MMVQ)
    tg_fp32_flop_per_weight: float = 0.0     # decode CUDA-core work per weight, in FP32-FLOP equivalents
    overhead_layer_fa_s: float = 0.0         # added per layer per token when flash attention is on (< 0: saves)
    pp_quant_peak: str = "fp16"              # quantized types' prompt efficiency is of this peak: fp16 | fp32
    pp_cublas_quant_efficiency: float | None = None   # Volta: quantized prompts through cuBLAS, of the FP16 peak
    pp_power_knee_w_per_tflop: float = 0.0   # MMQ prompts: board W per FP32 TFLOP/s below which the power limit binds
    pp_dp4a_factor: float | None = None      # Pascal's dp4a MMQ relative to Turing+'s int8-mma MMQ (None: no Pascal row)


APPLE_CFG = RunConfig(flash_attn="on", n_ctx=4096)   # FA: cells read = cells used (the 2023 build padded n_kv to 32)


def _apple_work(quant: str):
    spec = arch_spec("llama2-7b", quant)
    dev = Device(id="x", name="x", kind="apple", memory_gib=64, bandwidth_gbs=1)
    return spec, single_device_work(spec, APPLE_CFG, APPLE_TG_DEPTH, dev)


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
    import numpy as np  # heavy: only the fits need it

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



# ------------------------------------------------------------------------------------------------
# the CUDA class: fitted on published CUDA llama-bench rows (data/cuda_llama7b.csv)
# ------------------------------------------------------------------------------------------------

CUDA_CSV = "cuda_llama7b.csv"
CUBLAS_QUANT_KEY = "quantized via cuBLAS"     # fit_cuda_rows' key for Volta's quantized prompt rows
# weight types whose decode matmul is not llama.cpp's MMVQ (quantized x q8_1 dot products) but the float path
# (ggml/src/ggml-cuda/ggml-cuda.cu, ggml_cuda_mul_mat: mmvf / cuBLAS for F16, BF16, F32 weights)
CUDA_FLOAT_TYPES = ("F16", "BF16", "F32")


def _cc(device) -> float | None:
    try:
        return float(device.compute_capability) if device.compute_capability else None
    except ValueError:
        return None


def cuda_prompt_cublas_for_quantized(device) -> bool:
    """Whether llama.cpp multiplies a prompt's quantized weights with cuBLAS (dequantised to F16, tensor-core GEMM)
    instead of MMQ: ggml/src/ggml-cuda/mmq.cu, ggml_cuda_should_use_mmq — an NVIDIA card with FP16 tensor cores but
    without Turing's int8 mma (Volta, compute capability 7.0/7.2) uses MMQ only for batches below
    MMQ_DP4A_MAX_BATCH_SIZE (64, mmq.cuh); a pp512 ubatch is larger. Cards below Pascal's dp4a (compute
    capability < 6.1, e.g. the P100) use cuBLAS for dense models too."""
    cc = _cc(device)
    return cc is not None and (cc < 6.1 or 7.0 <= cc < 7.5)


def cuda_prompt_dp4a(device) -> bool:
    """Whether the card's MMQ kernels are the dp4a family (Pascal, compute capability 6.1-6.x: no int8 mma) rather
    than the int8 mma family of Turing and later (mmq.cu, ggml_cuda_should_use_mmq: turing_mma_available)."""
    cc = _cc(device)
    return cc is not None and 6.1 <= cc < 7.0


def prompt_power_factor(device, knee_w_per_tflop: float) -> float:
    """The fraction of its boost-clock FP32 rate a card sustains in MMQ prompt processing under its power limit.

    Energy, not clocks: at the limit the rate is board power / energy per operation (throughput proportional to
    watts), so a card whose board power per FP32 TFLOP/s lies below the knee runs at ``W / (FP32 x knee)`` of its
    boost rate; above the knee the boost clock holds (factor 1). The knee is fitted on published rows
    (:func:`fit_cuda_rows`); a card without ``board_power_w`` in its catalog row is taken as unconstrained."""
    watts, fp32 = getattr(device, "board_power_w", None), device.fp32_tflops
    if not knee_w_per_tflop or not watts or not fp32:
        return 1.0
    return min(1.0, float(watts) / (float(fp32) * knee_w_per_tflop))


def load_cuda_table():
    """The published CUDA llama-bench rows (``data/cuda_llama7b.csv``, header comment lines skipped) as a DataFrame."""

    import pandas as pd  # heavy, optional until a table is asked for

    text = "".join(line + "\n" for line in data_text(CUDA_CSV).splitlines() if not line.startswith("#"))
    df = pd.read_csv(io.StringIO(text), dtype={"build": str})
    df["fa"] = df["fa"].astype(int)
    return df


def cuda_bench_config(test: str, fa: int) -> tuple[RunConfig, int, int]:
    """llama-bench's context for one test: (RunConfig, depth the decode is predicted at, n_prompt).
    tools/llama-bench/llama-bench.cpp sizes the context to the test (n_ctx = n_prompt + n_gen; here at least 256,
    the KV padding, which changes no cell read); tg128's tokens sit at depths 0..127, so decode is predicted at the
    mean depth, 64."""
    n_prompt, n_gen = (512, 0) if test == "pp512" else (0, 128)
    if test not in ("pp512", "tg128"):
        raise ConfigError(f"CUDA table: test must be pp512 or tg128, got '{test}'")
    cfg = RunConfig(flash_attn="on" if int(fa) else "off", n_ctx=max(256, n_prompt + n_gen))
    return cfg, (APPLE_TG_DEPTH if n_gen else 0), (n_prompt or 512)


def _tensor_tflops(device) -> float:
    """The FP16 matmul peak (tensor cores where the card has them), or FP32 where FP16 is slower (Pascal)."""
    t16, t32 = device.fp16_tflops or 0.0, device.fp32_tflops or 0.0
    peak = max(t16, t32)
    if not peak:
        raise ConfigError(f"device '{device.id}': no fp16_tflops/fp32_tflops, cannot predict prompt speed")
    return peak


def _fp32_tflops(device) -> float:
    return float(device.fp32_tflops or _tensor_tflops(device))


def _cuda_decode_features(spec, cfg, depth, device, float_family: bool) -> list[float]:
    """One row of the decode design matrix (seconds per unit of each parameter):
    [MMVQ bytes / bandwidth, float-kernel bytes / bandwidth, weights / FP32 FLOP/s, layers + 1, (layers + 1) x FA]."""
    w = single_device_work(spec, cfg, depth, device)
    bw = device.bandwidth_gbs * 1e9
    fbytes = sum(tw.n_bytes for t, tw in w.weights.items() if t in CUDA_FLOAT_TYPES) if float_family else 0.0
    n_w = sum(tw.n_weights for tw in w.weights.values())
    layers = spec.n_layer - (spec.nextn_layers or 0) + 1.0
    return [(w.bytes_read - fbytes) / bw, fbytes / bw, n_w / (_fp32_tflops(device) * 1e12), layers,
            layers * (1.0 if resolve_flash_attn(cfg) else 0.0)]


POWER_KNEE_GRID_W_PER_TFLOP = (1.0, 50.0, 400)   # log-spaced candidates for the knee: lowest, highest, count
MIN_POWER_KNEE_CARDS = 4                          # fewer int8-mma cards with a board power: no power term


def _fit_power_knee(rows) -> float:
    """The power knee (W per FP32 TFLOP/s, :func:`prompt_power_factor`) that makes the MMQ prompt efficiency of
    each weight type most nearly one constant across cards: least squares on log(efficiency) over a log-spaced
    grid, 0 (no power limit) among the candidates. ``rows``: (weight type, ideal/measured at boost, device)."""
    import numpy as np  # heavy: only the fits need it

    if len({d.id for _, _, d in rows if getattr(d, "board_power_w", None)}) < MIN_POWER_KNEE_CARDS:
        return 0.0
    lo, hi, n = POWER_KNEE_GRID_W_PER_TFLOP
    keys = sorted({k for k, _, _ in rows})
    log_e = np.array([math.log(e) for _, e, _ in rows])
    best_knee, best_sse = 0.0, math.inf
    for knee in [0.0, *np.exp(np.linspace(math.log(lo), math.log(hi), n))]:
        r = log_e - np.log([prompt_power_factor(d, float(knee)) for _, _, d in rows])
        sse = 0.0
        for key in keys:
            sel = np.array([k == key for k, _, _ in rows])
            sse += float(((r[sel] - r[sel].mean()) ** 2).sum())
        if sse < best_sse - 1e-12:
            best_knee, best_sse = float(knee), sse
    return best_knee


def fit_cuda_rows(df) -> GpuFit:
    """Fit the CUDA class on published llama-bench rows (``load_cuda_table()`` or a subset: leave-one-card-out
    passes all cards but one). Decode, one weighted least-squares fit on 1/tg (relative error)::

        t_token = bytes_MMVQ / (eff_q x BW) + bytes_F16 / (eff_f16 x BW) + k x weights / FP32_rate
                + (layers + 1) x (o_layer + FA x o_fa)

    eff_q/eff_f16: the bandwidth efficiency of the two kernel families (quantized MMVQ, float cuBLAS/MMV), so the
    efficiency a card reaches depends on how its bytes per token split between them; k: CUDA-core work per weight
    (dequantisation, q8_1 quantisation of activations), which makes small-SM cards slower than their bandwidth
    says; o_layer: launch overhead per layer per token (every published row is a 32-layer model, so a constant per
    token and a per-layer term cannot be told apart: it is charged per layer, as llama.cpp launches a fixed set of
    kernels per layer); o_fa: the change per layer with flash attention on (one fused kernel instead of KQ, softmax
    and KQV). Without F16 rows eff_f16 = eff_q; without FA-on rows o_fa = 0.

    Prompt, per weight type: eff_pp = ideal / measured time of a pp512, the ideal being the FLOPs (layers x 512,
    output once, causal attention) at a peak chosen by kernel family: quantized types (MMQ: int8 mma on Turing+,
    dp4a before) scale with the FP32 (CUDA-core) rate the card sustains under its board power
    (:func:`prompt_power_factor`; the knee is fitted on the int8-mma rows), float types (cuBLAS) with the FP16
    tensor peak. Pascal's dp4a MMQ gets one factor relative to int8 mma (:func:`cuda_prompt_dp4a`; 1 without a
    Pascal row). Volta runs quantized prompts through cuBLAS (:func:`cuda_prompt_cublas_for_quantized`): one
    efficiency of the FP16 peak for those rows; with no Volta row in ``df`` Volta falls back to the MMQ rule."""
    import numpy as np  # heavy: only the fits need it

    float_family = bool((df["quant"].isin(CUDA_FLOAT_TYPES) & (df["test"] == "tg128")).any())
    X, y = [], []
    pp_e: dict[str, list[float]] = {}
    pp_rows: list[tuple[str, str, float, Any]] = []   # (kernel family, efficiency key, ideal/measured, device)
    for _, row in df.iterrows():
        dev = get_device(str(row["device"]))
        spec = arch_spec(str(row["arch"]), str(row["quant"]))
        cfg, depth, n_prompt = cuda_bench_config(str(row["test"]), int(row["fa"]))
        if row["test"] == "tg128":
            X.append(_cuda_decode_features(spec, cfg, depth, dev, float_family))
            y.append(1.0 / float(row["tps"]))
        else:
            quant = str(row["quant"])
            if quant in CUDA_FLOAT_TYPES:
                family, key, peak = "float", quant, _tensor_tflops(dev)
            elif cuda_prompt_cublas_for_quantized(dev):
                family, key, peak = "cublas", CUBLAS_QUANT_KEY, _tensor_tflops(dev)
            else:
                family, key, peak = ("dp4a" if cuda_prompt_dp4a(dev) else "mma"), quant, _fp32_tflops(dev)
            ideal = _pp_ideal_seconds(spec, n_prompt) / (peak * 1e12)
            pp_rows.append((family, key, ideal / (n_prompt / float(row["tps"])), dev))
    # MMQ's efficiency is of the FP32 rate the card sustains under its power limit; the knee is fitted on the
    # int8-mma rows (the family with many cards), then every MMQ row's efficiency is taken at that sustained rate
    knee = _fit_power_knee([(k, e, d) for fam, k, e, d in pp_rows if fam == "mma"])
    for fam, k, e, d in pp_rows:
        if fam != "dp4a":
            pp_e.setdefault(k, []).append(e / prompt_power_factor(d, knee) if fam == "mma" else e)
    X, y = np.array(X), np.array(y)
    used = np.abs(X).sum(axis=0) > 0
    coef = np.zeros(X.shape[1])
    wts = 1.0 / y
    coef[used], *_ = np.linalg.lstsq(X[:, used] * wts[:, None], y * wts, rcond=None)
    inv_q, inv_f, k, o_layer, o_fa = (float(c) for c in coef)
    pp = {q: float(math.exp(statistics.fmean(math.log(v) for v in vals))) for q, vals in pp_e.items()}
    cublas_q = pp.pop(CUBLAS_QUANT_KEY, None)
    dp4a = [e / prompt_power_factor(d, knee) / pp[k] for fam, k, e, d in pp_rows if fam == "dp4a" and k in pp]
    dp4a_factor = float(math.exp(statistics.fmean(math.log(v) for v in dp4a))) if dp4a else None
    quantized = [v for q, v in pp.items() if q not in CUDA_FLOAT_TYPES]
    default = float(math.exp(statistics.fmean(math.log(v) for v in quantized))) if quantized else min(pp.values())
    cards = df["device"].nunique()
    return GpuFit(kind="gpu", efficiency=1.0 / inv_q, overhead_layer_s=max(o_layer, 0.0),
                  pp_efficiency=MappingProxyType(pp), pp_default_efficiency=default, n_rows=len(df),
                  efficiency_f16=(1.0 / inv_f) if inv_f > 0 else None, tg_fp32_flop_per_weight=max(k, 0.0),
                  overhead_layer_fa_s=o_fa, pp_quant_peak="fp32", pp_cublas_quant_efficiency=cublas_q,
                  pp_power_knee_w_per_tflop=knee, pp_dp4a_factor=dp4a_factor,
                  source=f"CUDA class fitted on {len(df)} published llama-bench rows of {cards} cards "
                         "(data/cuda_llama7b.csv: llama.cpp CUDA scoreboard, discussion #15013, and PR #4766)")


@lru_cache(maxsize=None)
def gpu_class_fit(kind: str) -> GpuFit:
    """Parameters of a device class. ``apple``: fitted on every comparable Apple row. ``gpu`` (CUDA): fitted on
    every published CUDA row (:func:`fit_cuda_rows`); the V100 scoreboard rows are among them, so the V100 row
    of ``seed_claims.yaml`` (the same figure) is reproduced, not validated."""
    if kind == "apple":
        df = load_apple_table()
        return fit_gpu_rows(df[df["comparable"]], "apple")
    if kind != "gpu":
        raise ConfigError(f"no GPU class parameters for device kind '{kind}'")
    return fit_cuda_rows(load_cuda_table())


def gpu_rates(device, fit: GpuFit, cfg: RunConfig | None = None) -> DeviceRates:
    """DeviceRates of a GPU/Apple device under a class fit (:func:`gpu_class_fit`, or an explicit one:
    leave-one-out passes its own). Prompt speed scales with the FP16 peak, or the FP32 one where FP16
    is slower (Pascal: llama.cpp avoids the crippled FP16 path); the CUDA class rates quantized types on the
    FP32 rate (``pp_quant_peak``). ``cfg``: flash attention on or off (the CUDA class's per-layer change)."""
    tflops = device.fp16_tflops or device.fp32_tflops
    if device.fp32_tflops and device.fp16_tflops and device.fp16_tflops < device.fp32_tflops:
        tflops = device.fp32_tflops
    if not tflops:
        raise ConfigError(f"device '{device.id}': no fp16_tflops/fp32_tflops, cannot predict prompt speed")
    flops = tflops * 1e12
    qflops = flops
    if fit.pp_quant_peak == "fp32":
        # MMQ at the FP32 rate the card sustains under its power limit; Pascal's dp4a kernels relative to int8 mma
        qflops = _fp32_tflops(device) * 1e12 * prompt_power_factor(device, fit.pp_power_knee_w_per_tflop)
        if fit.pp_dp4a_factor and cuda_prompt_dp4a(device):
            qflops *= fit.pp_dp4a_factor
    pp = {t: 2.0 / (e * (flops if t in CUDA_FLOAT_TYPES else qflops)) for t, e in fit.pp_efficiency.items()}
    default = 2.0 / (fit.pp_default_efficiency * qflops)
    if fit.pp_cublas_quant_efficiency and cuda_prompt_cublas_for_quantized(device):
        # Volta: every quantized type's prompt matmuls are cuBLAS GEMMs on the FP16 tensor peak
        default = 2.0 / (fit.pp_cublas_quant_efficiency * flops)
        pp = {t: (c if t in CUDA_FLOAT_TYPES else default) for t, c in pp.items()}
    by_type = {t: fit.efficiency_f16 for t in CUDA_FLOAT_TYPES} if fit.efficiency_f16 else {}
    o_layer = fit.overhead_layer_s
    if fit.overhead_layer_fa_s and cfg is not None and resolve_flash_attn(cfg):
        o_layer = max(o_layer + fit.overhead_layer_fa_s, 0.0)
    tg_add = fit.tg_fp32_flop_per_weight / (_fp32_tflops(device) * 1e12) if fit.tg_fp32_flop_per_weight else 0.0
    attn = pp.get("F16", default) if fit.pp_quant_peak == "fp16" else default
    return DeviceRates(device_id=device.id, kind=device.kind, bandwidth_gbs=float(device.bandwidth_gbs),
                       efficiency=fit.efficiency, tg_s_per_weight=MappingProxyType({}), attn_s_per_op=0.0,
                       pp_s_per_weight=MappingProxyType(pp), pp_default_s_per_weight=default,
                       pp_attn_s_per_op=attn, overhead_token_s=fit.overhead_token_s,
                       overhead_layer_s=o_layer, pp_overhead_s=fit.pp_overhead_s,
                       host_link_gbs=device.host_link_gbs, source=fit.source,
                       efficiency_by_type=MappingProxyType(by_type), tg_add_s_per_weight=tg_add)
