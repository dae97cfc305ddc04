"""The speed model: a roofline per device, with the seed's plain bandwidth ceiling beside it.

Decoding one token reads every weight that the token passes through once, plus the KV cache up to the
current depth, plus (for recurrent layers) the state; the seed's argument is that tok/s can therefore not
exceed ``bandwidth / bytes``. That ceiling is right for a GPU and wrong as a *prediction* on a small CPU,
where dequantising 2–6-bit weights costs more time than reading them (see DESIGN.md, "What this machine
shows"). So each device gets two terms per weight type, and the larger one wins::

    t_device = Σ_type max(bytes_type / (efficiency × bandwidth), weights_type × cost_type)
             + max(kv_bytes / (efficiency × bandwidth), attention_ops × cost_attention)
             + state_bytes / (efficiency × bandwidth)
             + overhead_layer × layers_on_device
    t_token  = Σ_device t_device + overhead_token + host-link transfers

``cost_type`` (seconds per weight, per thread count) and the overheads come from ``v100lab calibrate`` for
the host (:mod:`v100lab.calibration`); GPUs have no per-type decode cost (they are bandwidth-bound), and
their efficiency and per-layer overhead are fitted per device class on published llama-bench tables.
Prompt processing is compute-bound: ``weights × n_prompt × cost_pp_type`` at the device's matmul rate for
the type, plus attention, plus the host link when layers kept on the CPU have their matmuls offloaded
to the GPU (llama.cpp does that for batches of 32 tokens or more).

Every figure here is a prediction; the benchmark ``benchmarks/bench_speed.py`` says how good it is.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from v100lab.config import RunConfig
from v100lab.errors import ConfigError, V100labError
from v100lab.spec import ModelSpec, TensorInfo

log = logging.getLogger(__name__)

BOUNDS = ("memory", "compute", "overhead", "host-link")
GPU_KINDS = ("gpu", "apple")
# src/llama-kv-cache.cpp, llama_kv_cache::get_n_kv: n_kv is the used cells padded to 256 (at least 256,
# at most the cache size); the cache itself is n_ctx padded to 256.
KV_PAD = 256
# ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_device_offload_op: matmuls of weights kept in host
# memory run on the GPU (weights copied over PCIe) when the batch has at least 32 tokens.
OP_OFFLOAD_MIN_BATCH = 32
# Latency of one small host<->device copy (activations between devices, logits back). An assumption of
# the order of a PCIe round trip plus a copy launch, not a measurement.
LINK_LATENCY_S = 10e-6
# Uncalibrated CPUs (catalog rows, a host that was never calibrated): fraction of the bandwidth that
# decoding reaches. An assumption; `v100lab calibrate` replaces it for the host.
UNCALIBRATED_CPU_EFFICIENCY = 0.7
UNCALIBRATED_CPU_PP_GFLOPS_PER_THREAD = 20.0
UNCALIBRATED_CPU_OVERHEAD_S = 1e-3
# ggml-cpu simd-mappings.h, AVX512: GGML_F16_STEP 64. ggml_vec_dot_f16 / ggml_vec_mad_f16 (used by the CPU
# flash-attention kernel per KV cell) run SIMD over the largest multiple of the step and a scalar loop over
# the rest, so a head_dim of 96 costs far more per element than 64 or 256. (AVX2 builds: step 32.)
F16_SIMD_STEP = 64


# ------------------------------------------------------------------------------------------------
# the seed's ceiling
# ------------------------------------------------------------------------------------------------

def ceiling_tps(weight_bytes: float, bandwidth_gbs: float) -> float:
    """The seed's plain ceiling: tok/s ≤ bandwidth / bytes read per token (GB/s = 10^9 bytes/s).

    900 GB/s over a 14.5 GB file gives 62 tok/s, the seed's own figure for Q4_0."""
    if not (weight_bytes and weight_bytes > 0):
        raise V100labError(f"ceiling: weight bytes must be positive, got {weight_bytes!r}")
    if not (bandwidth_gbs and bandwidth_gbs > 0):
        raise V100labError(f"ceiling: bandwidth must be positive, got {bandwidth_gbs!r}")
    return float(bandwidth_gbs) * 1e9 / float(weight_bytes)


# ------------------------------------------------------------------------------------------------
# bytes and operations per token
# ------------------------------------------------------------------------------------------------

def row_bytes(type_name: str, n: int) -> float:
    """Bytes of ``n`` elements of a ggml type (ggml_row_size), from gguf.GGML_QUANT_SIZES."""
    import gguf

    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        raise ConfigError(f"unknown ggml type '{type_name}'") from None
    return n / block * size


def kv_cache_cells(cfg: RunConfig, spec: ModelSpec) -> int:
    """Cells of one sequence's KV cache: n_ctx (0 = training context) per sequence, padded to 256."""
    n_ctx = cfg.n_ctx or spec.n_ctx_train
    if cfg.n_parallel > 1 and not cfg.kv_unified:
        n_ctx = max(1, n_ctx // cfg.n_parallel)
    return int(math.ceil(n_ctx / KV_PAD) * KV_PAD)


def n_kv_cells(used: int, cache_cells: int, pad: int = KV_PAD) -> int:
    """llama_kv_cache::get_n_kv (src/llama-kv-cache.cpp): min(size, max(pad, GGML_PAD(used, pad)))."""
    return int(min(cache_cells, max(pad, math.ceil(used / pad) * pad)))


def flash_attn_effective(cfg: RunConfig) -> bool:
    """``auto`` resolves to on wherever the backend supports flash attention (CPU, CUDA, Metal do) —
    src/llama-context.cpp resolves LLAMA_FLASH_ATTN_TYPE_AUTO by checking the device of each layer."""
    return cfg.flash_attn in ("on", "auto")


def kv_cells_read(spec: ModelSpec, il: int, cfg: RunConfig, used: int) -> int:
    """KV cells the attention of layer ``il`` touches when ``used`` cells are occupied.

    Without flash attention, KQ is a matmul over all n_kv cells (padded to 256). The flash-attention
    kernels skip masked cells (ggml-cpu ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk:
    ``if (mv == -INFINITY) continue``; CUDA stops at the last unmasked KV tile), so they read only the
    cells in use. Sliding-window layers see at most n_swa of them (unless --swa-full keeps a full cache,
    in which case the mask still hides cells outside the window).
    """
    cache = kv_cache_cells(cfg, spec)
    if spec.is_swa(il) and spec.sliding_window:
        window = min(used, spec.sliding_window)
        if not cfg.swa_full:
            # llama_kv_cache_iswa: the SWA cache holds n_swa * n_seq + n_ubatch cells, padded
            swa_cells = min(cache, int(math.ceil((spec.sliding_window * cfg.n_parallel + cfg.n_ubatch) / KV_PAD) * KV_PAD))
            cache = swa_cells
        if flash_attn_effective(cfg):
            return window
        return n_kv_cells(used, cache)
    if flash_attn_effective(cfg):
        return min(used, cache)
    return n_kv_cells(used, cache)


def recurrent_state_elements(spec: ModelSpec) -> int:
    """f32 elements of one recurrent layer's state for one sequence: n_embd_r() + n_embd_s()
    (src/llama-hparams.cpp: conv state (d_conv - 1) × (d_inner + 2 n_group d_state); SSM state
    d_state × d_inner). Qwen3.5 (gated delta net): 3 × 10240 + 128 × 6144 per layer."""
    d_conv = spec.ssm_conv_kernel or 0
    d_inner = spec.ssm_inner_size or 0
    d_state = spec.ssm_state_size or 0
    n_group = spec.ssm_group_count or 0
    n_r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    n_s = d_state * d_inner
    return n_r + n_s


@dataclass(frozen=True)
class TypeWork:
    """Per token, for one ggml type on one device: weights multiplied and bytes read."""

    n_weights: float
    n_bytes: float


@dataclass(frozen=True)
class DeviceWork:
    """What one decoded token costs one device, before any rate is applied."""

    device_id: str
    layers: tuple[int, ...]
    has_output: bool
    weights: Mapping[str, TypeWork]   # ggml type → weights multiplied and bytes read (matrices only)
    other_bytes: float                # 1-D tensors (norms, biases) and embedding rows: bytes only
    kv_bytes: float                   # KV cache bytes read at this depth
    attn_ops: float                   # attention multiply-adds: Σ query heads × cells × (head_dim_k + head_dim_v)
    state_bytes: float                # recurrent state read + written (f32)
    placed_weight_bytes: float        # the device's share of the file's weight bytes (the seed's ceiling uses these)
    attn_tail_ops: float = 0.0        # the part of attn_ops in each head's scalar tail (head_dim mod F16_SIMD_STEP)

    @property
    def weight_bytes_read(self) -> float:
        return sum(w.n_bytes for w in self.weights.values()) + self.other_bytes

    @property
    def bytes_read(self) -> float:
        return self.weight_bytes_read + self.kv_bytes + self.state_bytes

    @property
    def n_weights(self) -> float:
        return sum(w.n_weights for w in self.weights.values())

    @property
    def flops(self) -> float:
        """2 FLOPs per weight multiplied (one multiply-add) plus 2 per attention multiply-add."""
        return 2.0 * self.n_weights + 2.0 * self.attn_ops


@dataclass(frozen=True)
class Placed:
    """Which repeating layers (and whether the output layer) a device holds."""

    device: Any                       # v100lab.devices.Device
    layers: tuple[int, ...]
    has_output: bool


def _is_expert(t: TensorInfo) -> bool:
    return "_exps" in t.name


def _is_output(t: TensorInfo) -> bool:
    return t.layer is None and (t.name.startswith("output") or t.name.startswith("cls"))


def decode_work(spec: ModelSpec, placement: Mapping[str, Placed], cfg: RunConfig, depth: int = 0) -> dict[str, DeviceWork]:
    """Bytes and operations of one decoded token at ``depth`` tokens of context, per device.

    * matrices of the layers a device holds are read once (MoE experts: the fraction used per token);
    * the output matrix (or, with tied embeddings, ``token_embd``) is read on the device holding the
      output layer; otherwise ``token_embd`` is a row lookup (get_rows), one row per token;
    * MTP/nextn layers at the end are not run by plain decoding;
    * KV: the cells :func:`kv_cells_read` says, at the cache types' row sizes;
    * recurrent layers: their state is read and written once.
    """
    if depth < 0:
        raise ConfigError(f"depth must be >= 0, got {depth}")
    used = depth + 1
    tied = spec.tensor("output.weight") is None
    n_layer_run = spec.n_layer - (spec.nextn_layers or 0)
    expert_frac = (spec.expert_used_count / spec.expert_count) if spec.expert_count else 1.0
    state_el = recurrent_state_elements(spec) * 4.0
    # the seed's ceiling counts the whole file once: token_embd goes with the first layer's device
    # (with tied embeddings, with the output layer's, where it is read)
    first = next((k for k, p in placement.items() if 0 in p.layers), None)
    embd_home = next((k for k, p in placement.items() if p.has_output), first) if tied else \
        (first or next((k for k, p in placement.items() if p.has_output), None))
    out: dict[str, DeviceWork] = {}
    for dev_id, placed in placement.items():
        layers = set(il for il in placed.layers if il < n_layer_run)
        weights: dict[str, list[float]] = {}
        other = 0.0
        stored = 0.0
        for t in spec.tensors:
            on_dev = (t.layer is not None and t.layer in set(placed.layers)) or \
                     (t.layer is None and _is_output(t) and placed.has_output)
            if on_dev or (t.name == "token_embd.weight" and dev_id == embd_home):
                stored += t.n_bytes
            read_as_matrix = False
            if t.layer is not None:
                if t.layer not in layers:
                    continue
                read_as_matrix = len(t.shape) >= 2 and t.shape[0] > 1 and t.shape[1] > 1
                frac = expert_frac if _is_expert(t) else 1.0
            elif t.name == "token_embd.weight":
                if tied and placed.has_output:
                    read_as_matrix, frac = True, 1.0
                elif dev_id == _input_device(placement):
                    other += t.n_bytes / max(spec.n_vocab, 1)   # one row per token
                    continue
                else:
                    continue
            elif _is_output(t):
                if not placed.has_output:
                    continue
                read_as_matrix = len(t.shape) >= 2 and t.shape[1] > 1
                frac = 1.0
            else:
                continue
            if read_as_matrix:
                w = weights.setdefault(t.type_name, [0.0, 0.0])
                w[0] += t.n_elements * frac
                w[1] += t.n_bytes * frac
            else:
                other += t.n_bytes
        kv = attn = tail = state = 0.0
        dtail = head_tail(spec.head_dim_k) + head_tail(spec.head_dim_v)
        for il in sorted(layers):
            if spec.is_recurrent(il):
                state += 2.0 * state_el
                continue
            if not spec.has_kv(il):
                continue
            cells = kv_cells_read(spec, il, cfg, used)
            kv += cells * (row_bytes(cfg.cache_type_k, spec.n_embd_k_gqa(il)) +
                           row_bytes(cfg.cache_type_v, spec.n_embd_v_gqa(il)))
            attn += cells * spec.n_head_at(il) * (spec.head_dim_k + spec.head_dim_v)
            tail += cells * spec.n_head_at(il) * dtail
        out[dev_id] = DeviceWork(
            device_id=dev_id, layers=tuple(sorted(placed.layers)), has_output=placed.has_output,
            weights=MappingProxyType({k: TypeWork(v[0], v[1]) for k, v in sorted(weights.items())}),
            other_bytes=other, kv_bytes=kv, attn_ops=attn, attn_tail_ops=tail, state_bytes=state,
            placed_weight_bytes=stored)
    return out


def head_tail(head_dim: int) -> int:
    """Elements of a head past the last full SIMD step (scalar in ggml's f16 vector kernels)."""
    return head_dim % F16_SIMD_STEP


def _input_device(placement: Mapping[str, Placed]) -> str:
    """token_embd lives in host memory (llama.cpp never offloads the input layer): the CPU device if
    the placement has one, else the first device."""
    for dev_id, p in placement.items():
        if getattr(p.device, "kind", None) == "cpu":
            return dev_id
    return next(iter(placement))


# ------------------------------------------------------------------------------------------------
# rates: what each device does per byte and per weight
# ------------------------------------------------------------------------------------------------

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
    threads_note: str = ""                    # CPUs: why the rates are for fewer threads than -t asked

    @property
    def peak_bandwidth(self) -> float:
        """Bytes/s no decode can beat: the catalog peak, or for a calibrated host the larger of its
        STREAM-like figure and the best bandwidth llama.cpp itself reached in calibration."""
        return self.bandwidth_gbs * 1e9 * max(1.0, self.efficiency)

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth_gbs * 1e9 * self.efficiency

    def tg_cost(self, type_name: str) -> float | None:
        """Seconds per weight of ``type_name`` in decode, or None when the device has no compute term
        for it (GPUs)."""
        if not self.tg_s_per_weight:
            return None
        if type_name in self.tg_s_per_weight:
            return self.tg_s_per_weight[type_name]
        return self.tg_s_per_weight.get(_nearest_type(type_name, self.tg_s_per_weight))

    def pp_cost(self, type_name: str) -> float:
        if type_name in self.pp_s_per_weight:
            return self.pp_s_per_weight[type_name]
        if self.pp_s_per_weight:
            near = _nearest_type(type_name, self.pp_s_per_weight)
            if near:
                return self.pp_s_per_weight[near]
        return self.pp_default_s_per_weight


def bits_per_weight(type_name: str) -> float:
    return 8.0 * row_bytes(type_name, 256 * 32) / (256 * 32)


def _nearest_type(type_name: str, known: Mapping[str, float]) -> str | None:
    """The calibrated type with the closest bits per weight (an uncalibrated type borrows its cost)."""
    try:
        bpw = bits_per_weight(type_name)
    except ConfigError:
        return None
    best = None
    for k in known:
        try:
            d = abs(bits_per_weight(k) - bpw)
        except ConfigError:
            continue
        if best is None or d < best[0]:
            best = (d, k)
    return best[1] if best else None


def rates_for(device, cfg: RunConfig, profile: Mapping[str, Any] | None = None) -> DeviceRates:
    """How fast ``device`` is for ``cfg``: the host's calibration for a calibrated CPU, the fitted
    device-class parameters for GPUs and Apple chips, stated assumptions otherwise."""
    if device.kind == "cpu":
        cal = None
        if profile is not None:
            cal = profile.get("speed_calibration")
        elif device.id == "host":
            cal = dict(device.extra).get("speed_calibration")
        threads, note = effective_threads(cfg, device, profile)
        if cal:
            from v100lab.calibration import cpu_rates_from_calibration

            r = cpu_rates_from_calibration(device, cal, threads)
        else:
            r = _uncalibrated_cpu(device, threads)
        return replace(r, source=f"{r.source}; {note}", threads_note=note) if note else r
    from v100lab.calibration import gpu_class_fit

    fit = gpu_class_fit(device.kind)
    tflops = device.fp16_tflops or device.fp32_tflops
    if device.fp32_tflops and device.fp16_tflops and device.fp16_tflops < device.fp32_tflops:
        tflops = device.fp32_tflops        # Pascal: llama.cpp avoids the crippled FP16 path
    if not tflops:
        raise ConfigError(f"device '{device.id}': no fp16_tflops/fp32_tflops, cannot predict prompt speed")
    flops = tflops * 1e12
    pp = {t: 2.0 / (e * flops) for t, e in fit.pp_efficiency.items()}
    default = 2.0 / (fit.pp_default_efficiency * flops)
    return DeviceRates(
        device_id=device.id, kind=device.kind, bandwidth_gbs=float(device.bandwidth_gbs),
        efficiency=fit.efficiency, tg_s_per_weight=MappingProxyType({}), attn_s_per_op=0.0,
        pp_s_per_weight=MappingProxyType(pp), pp_default_s_per_weight=default,
        pp_attn_s_per_op=pp.get("F16", default), overhead_token_s=fit.overhead_token_s,
        overhead_layer_s=fit.overhead_layer_s, pp_overhead_s=fit.pp_overhead_s,
        host_link_gbs=device.host_link_gbs, source=fit.source)


def effective_threads(cfg: RunConfig, device, profile: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """The thread count a CPU prediction uses, and a note when it is not -t: threads beyond the host's cores
    (:func:`v100lab.memory.host_cores`, or the profile's) share those cores — llama.cpp starts them, but they
    compute no faster (and spin while they wait) — so the rates are those of the cores, never extrapolated
    past them."""
    from v100lab import memory

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
        host_link_gbs=None,
        source=f"uncalibrated CPU: {UNCALIBRATED_CPU_EFFICIENCY:.0%} of {device.bandwidth_gbs:g} GB/s (assumption); "
               "run `v100lab calibrate` on that machine")


# ------------------------------------------------------------------------------------------------
# prediction
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DevicePrediction:
    """One device's share of a token (decode) and of a prompt (prompt processing)."""

    device_id: str
    kind: str
    n_layers: int
    has_output: bool
    weight_bytes: float            # weights read per decoded token
    kv_bytes: float
    state_bytes: float
    flops: float                   # per decoded token
    t_memory_s: float              # decode time attributed to reading memory
    t_compute_s: float             # decode time attributed to compute (dequantisation + dot products)
    t_overhead_s: float
    t_tg_s: float                  # the device's decode time per token
    t_pp_s: float                  # the device's time for the whole prompt
    pp_bound: str
    ceiling_tg_tps: float          # the seed's plain ceiling for this device alone
    rates_source: str

    @property
    def bound(self) -> str:
        parts = {"memory": self.t_memory_s, "compute": self.t_compute_s, "overhead": self.t_overhead_s}
        return max(parts, key=parts.get)

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_layers": self.n_layers, "has_output_layer": self.has_output,
                "weight_bytes_per_token": round(self.weight_bytes), "kv_bytes_per_token": round(self.kv_bytes),
                "state_bytes_per_token": round(self.state_bytes), "flops_per_token": round(self.flops),
                "t_memory_ms": round(self.t_memory_s * 1e3, 4), "t_compute_ms": round(self.t_compute_s * 1e3, 4),
                "t_overhead_ms": round(self.t_overhead_s * 1e3, 4), "t_tg_ms": round(self.t_tg_s * 1e3, 4),
                "t_pp_ms": round(self.t_pp_s * 1e3, 3), "bound": self.bound, "pp_bound": self.pp_bound,
                "ceiling_tg_tps": _r(self.ceiling_tg_tps), "rates": self.rates_source}


def _r(x: float, nd: int = 3):
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


@dataclass(frozen=True)
class Prediction:
    """Predicted decode (tg) and prompt (pp) speed, the seed's ceiling, and what bounds them."""

    tg_tps: float
    pp_tps: float
    ceiling_tg_tps: float          # the seed's plain ceiling: Σ placed weight bytes / bandwidth, per device
    strict_ceiling_tg_tps: float   # bytes that must be read per token (weights used + KV) at peak bandwidth
    bound: str                     # memory | compute | overhead | host-link (decode)
    pp_bound: str
    by_device: Mapping[str, DevicePrediction]
    depth: int
    n_prompt: int
    t_link_s: float
    t_overhead_token_s: float
    notes: tuple[str, ...] = ()

    @property
    def tg_ms(self) -> float:
        return 1e3 / self.tg_tps

    def as_json(self) -> dict[str, Any]:
        return {"tg_tps": _r(self.tg_tps), "pp_tps": _r(self.pp_tps), "ceiling_tg_tps": _r(self.ceiling_tg_tps),
                "strict_ceiling_tg_tps": _r(self.strict_ceiling_tg_tps), "bound": self.bound,
                "pp_bound": self.pp_bound, "depth": self.depth, "n_prompt": self.n_prompt,
                "t_link_ms": round(self.t_link_s * 1e3, 4),
                "by_device": {k: v.as_json() for k, v in self.by_device.items()}, "notes": list(self.notes)}


def placement_for(spec: ModelSpec, devices: Sequence, cfg: RunConfig) -> dict[str, Placed]:
    """Where llama.cpp puts each layer: taken from the memory plan (:func:`v100lab.memory.plan`)."""
    from v100lab import memory

    mplan = memory.plan(spec, devices, cfg)
    return placement_from_plan(mplan, devices)


def placement_from_plan(mplan, devices: Sequence = ()) -> dict[str, Placed]:
    """A memory plan's layers and output layer per device, as the speed model consumes them.

    The plan names the host "host" whatever CPU device was passed (that device's rates apply to it; with
    none, this machine's measured host); accelerators keep their ids (numbered "id:i" when repeated)."""
    from v100lab.devices import get_device

    devs = [get_device(d) for d in devices]
    by_id = {d.id: d for d in devs}
    cpu = next((d for d in devs if d.kind == "cpu"), None)
    accel = [d for d in devs if d.kind != "cpu"]
    out: dict[str, Placed] = {}
    for name, dm in mplan.devices.items():
        if name == "host":
            if cpu is None and not dm.layers and not dm.has_output_layer:
                # only the input layer (a row lookup): no need to measure this machine for it
                from v100lab.devices import Device

                dev = Device(id="host", name="host (input layer only)", kind="cpu", memory_gib=1, bandwidth_gbs=1)
            else:
                dev = cpu or get_device("host")
        elif name in by_id:
            dev = by_id[name]
        else:
            base, _, idx = name.rpartition(":")
            dev = accel[int(idx)] if idx.isdigit() and int(idx) < len(accel) else get_device(base or name)
        out[name] = Placed(device=dev, layers=tuple(dm.layers), has_output=bool(dm.has_output_layer))
    return out


def predict(spec: ModelSpec, devices: Sequence | Any, cfg: RunConfig | None = None, depth: int = 0,
            n_prompt: int = 512, profile: Mapping[str, Any] | None = None,
            placement: Mapping[str, Placed] | None = None,
            rates: Mapping[str, DeviceRates] | None = None) -> Prediction:
    """Predict tg and pp tok/s for ``spec`` on ``devices`` with ``cfg`` at ``depth`` tokens of context.

    ``devices``: ids, paths or Device objects (a single one is fine); ``profile``: a host profile dict
    (default: the stored one, for ``"host"``); ``placement``: layers per device, by default from the
    memory plan; ``rates``: per-device rates to use instead of the calibrated/fitted ones (the
    benchmark's leave-one-chip-out fit passes its own)."""
    from v100lab.devices import get_device

    cfg = cfg or RunConfig()
    if n_prompt < 1:
        raise ConfigError(f"n_prompt must be >= 1, got {n_prompt}")
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        devices = [devices]
    devices = [get_device(d) for d in devices]
    if placement is None:
        placement = placement_for(spec, devices, cfg)
    work = decode_work(spec, placement, cfg, depth)
    given = dict(rates or {})
    rates = {k: given.get(k) or rates_for(p.device, cfg, profile if p.device.id == "host" else None)
             for k, p in placement.items()}
    return _combine(spec, placement, work, rates, cfg, depth, n_prompt)


def _combine(spec, placement, work, rates, cfg, depth, n_prompt) -> Prediction:
    notes: list[str] = []
    by: dict[str, DevicePrediction] = {}
    active = [k for k, w in work.items() if w.layers or w.has_output]
    t_mem_all = t_cmp_all = t_ovh_all = 0.0
    for k in work:
        w, r = work[k], rates[k]
        bw = r.effective_bandwidth
        t_mem = t_cmp = 0.0
        for tname, tw in w.weights.items():
            tm = tw.n_bytes / bw
            c = r.tg_cost(tname)
            tc = tw.n_weights * c if c else 0.0
            if c is not None and tname not in r.tg_s_per_weight and k in active:
                notes.append(f"{k}: no calibrated cost for {tname}; borrowed the nearest type's")
            if tc > tm:
                t_cmp += tc
            else:
                t_mem += tm
        t_mem += w.other_bytes / bw + w.state_bytes / bw
        tm, tc = w.kv_bytes / bw, w.attn_ops * r.attn_s_per_op + w.attn_tail_ops * r.attn_tail_s_per_op
        if tc > tm:
            t_cmp += tc
        else:
            t_mem += tm
        n_lay = len([il for il in w.layers if il < spec.n_layer - (spec.nextn_layers or 0)])
        t_ovh = r.overhead_layer_s * (n_lay + (1 if w.has_output else 0)) if k in active else 0.0
        t_pp, pp_bound = _pp_time(spec, placement, k, w, r, rates, cfg, depth, n_prompt)
        if k in active:
            t_mem_all += t_mem
            t_cmp_all += t_cmp
            t_ovh_all += t_ovh
        bw_peak = r.peak_bandwidth
        ceil = bw_peak / w.placed_weight_bytes if w.placed_weight_bytes else math.inf
        by[k] = DevicePrediction(
            device_id=k, kind=r.kind, n_layers=n_lay, has_output=w.has_output,
            weight_bytes=w.weight_bytes_read, kv_bytes=w.kv_bytes, state_bytes=w.state_bytes, flops=w.flops,
            t_memory_s=t_mem if k in active else 0.0, t_compute_s=t_cmp if k in active else 0.0,
            t_overhead_s=t_ovh, t_tg_s=(t_mem + t_cmp + t_ovh) if k in active else 0.0, t_pp_s=t_pp,
            pp_bound=pp_bound, ceiling_tg_tps=ceil, rates_source=r.source)
    # once per token: graph build and launch on the host side (the largest of the devices' figures)
    t_tok = max((rates[k].overhead_token_s for k in active), default=0.0)
    t_link = _tg_link_time(spec, placement, rates, active)
    t_total = t_mem_all + t_cmp_all + t_ovh_all + t_tok + t_link
    parts = {"memory": t_mem_all, "compute": t_cmp_all, "overhead": t_ovh_all + t_tok, "host-link": t_link}
    bound = max(parts, key=parts.get)
    # the seed's ceiling: all placed weights at peak bandwidth; strict: what must be read per token
    t_plain = sum(w.placed_weight_bytes / rates[k].peak_bandwidth for k, w in work.items())
    t_strict = sum(w.bytes_read / rates[k].peak_bandwidth for k, w in work.items())
    pp_total, pp_bound = _pp_total(spec, placement, by, rates, cfg, n_prompt)
    for k, r in rates.items():
        if k in active and r.source.startswith("uncalibrated"):
            notes.append(f"{k}: {r.source}")
        elif k in active and r.threads_note:
            notes.append(f"{k}: {r.threads_note}")
    return Prediction(
        tg_tps=1.0 / t_total, pp_tps=n_prompt / pp_total,
        ceiling_tg_tps=1.0 / t_plain if t_plain else math.inf,
        strict_ceiling_tg_tps=1.0 / t_strict if t_strict else math.inf,
        bound=bound, pp_bound=pp_bound, by_device=MappingProxyType(by), depth=depth, n_prompt=n_prompt,
        t_link_s=t_link, t_overhead_token_s=t_tok, notes=tuple(dict.fromkeys(notes)))


def _link_gbs(rates: Mapping[str, DeviceRates]) -> float | None:
    links = [r.host_link_gbs for r in rates.values() if r.host_link_gbs]
    return min(links) if links else None


def _tg_link_time(spec, placement, rates, active) -> float:
    """Activations cross the host link at every change of device along the layers, the input
    embedding goes to the first device and the logits come back (f32)."""
    link = _link_gbs({k: rates[k] for k in active})
    if link is None:
        return 0.0
    owner = {}
    for k in active:
        for il in placement[k].layers:
            owner[il] = k
    seq = [owner[il] for il in sorted(owner)]
    crossings = sum(1 for a, b in zip(seq, seq[1:]) if a != b)
    out_dev = next((k for k in active if placement[k].has_output), None)
    if seq and out_dev and out_dev != seq[-1]:
        crossings += 1
    gpu_side = [k for k in active if placement[k].device.kind != "cpu"]
    t = 0.0
    bytes_act = spec.n_embd * 4.0
    if gpu_side:
        t += LINK_LATENCY_S + bytes_act / (link * 1e9)             # input embedding to the GPU
    t += crossings * (LINK_LATENCY_S + bytes_act / (link * 1e9))
    if out_dev and placement[out_dev].device.kind != "cpu":
        t += LINK_LATENCY_S + spec.n_vocab * 4.0 / (link * 1e9)   # logits back to the host
    return t


def causal_cells(depth: int, n_prompt: int, window: int | None = None) -> float:
    """Σ over the prompt's tokens of the cells each one attends to: token i sees depth + i + 1 cells
    (at most ``window`` in a sliding-window layer)."""
    a, n = depth + 1, n_prompt
    if window is None:
        return n * a + n * (n - 1) / 2
    m = min(max(window - a, 0), n)          # tokens still inside the window
    return m * a + m * (m - 1) / 2 + (n - m) * window


def _pp_time(spec, placement, k, w: DeviceWork, r: DeviceRates, rates, cfg, depth, n_prompt) -> tuple[float, str]:
    """Prompt processing on one device: matmuls at the device's rate for each type, attention over the
    causal triangle (depth + i cells for the i-th token), and per-ubatch overhead."""
    if not (w.layers or w.has_output):
        return 0.0, "overhead"
    n_ub = math.ceil(n_prompt / max(1, min(cfg.n_ubatch, cfg.n_batch)))
    t_cmp = 0.0
    t_mem = 0.0
    # per-token matmul cost of the layers (the output layer runs for the last token only)
    for t in _layer_matrices(spec, w.layers):
        t_cmp += t.n_elements * n_prompt * r.pp_cost(t.type_name)
        t_mem += t.n_bytes * n_ub / r.effective_bandwidth
    if w.has_output:
        out_t = spec.tensor("output.weight") or spec.tensor("token_embd.weight")
        if out_t is not None:
            t_cmp += out_t.n_elements * r.pp_cost(out_t.type_name)
    # attention: the i-th prompt token sees depth + i + 1 cells (causal); per cell heads × (dk + dv)
    attn = 0.0
    for il in set(w.layers):
        if spec.is_recurrent(il) or not spec.has_kv(il) or il >= spec.n_layer - (spec.nextn_layers or 0):
            continue
        window = spec.sliding_window if (spec.is_swa(il) and spec.sliding_window) else None
        cells = causal_cells(depth, n_prompt, window)
        if not flash_attn_effective(cfg):
            # KQ over all n_kv cells of each ubatch
            cells = n_prompt * n_kv_cells(depth + n_prompt, kv_cache_cells(cfg, spec))
        attn += cells * spec.n_head_at(il) * (spec.head_dim_k + spec.head_dim_v)
    t_cmp += attn * r.pp_attn_s_per_op
    t_ovh = n_ub * r.pp_overhead_s
    t = max(t_cmp, t_mem) + t_ovh
    bound = "compute" if t_cmp >= t_mem else "memory"
    if t_ovh > max(t_cmp, t_mem):
        bound = "overhead"
    return t, bound


def _pp_total(spec, placement, by, rates, cfg, n_prompt) -> tuple[float, str]:
    """Sum the devices' prompt times; layers held by the CPU while a GPU is present have their matmuls
    offloaded to the GPU for batches of 32+ tokens: the weights cross the host link once per ubatch."""
    gpus = [k for k in by if rates[k].kind in GPU_KINDS and (by[k].n_layers or by[k].has_output)]
    cpus = [k for k in by if rates[k].kind == "cpu" and (by[k].n_layers or by[k].has_output)]
    n_ub = math.ceil(n_prompt / max(1, min(cfg.n_ubatch, cfg.n_batch)))
    ub = min(cfg.n_ubatch, cfg.n_batch, n_prompt)
    total = 0.0
    parts: dict[str, float] = {"compute": 0.0, "memory": 0.0, "overhead": 0.0, "host-link": 0.0}
    link = _link_gbs({k: rates[k] for k in gpus})
    for k, d in by.items():
        if k in cpus and gpus and ub >= OP_OFFLOAD_MIN_BATCH and link:
            # matmuls run on the (first) GPU; the CPU layers' weights stream over PCIe once per ubatch
            layers = set(placement[k].layers)
            layer_bytes = sum(t.n_bytes for t in spec.tensors if t.layer is not None and t.layer in layers)
            t_link = n_ub * layer_bytes / (link * 1e9)
            t_gpu = _offloaded_compute(spec, placement[k], rates[gpus[0]], n_prompt)
            t = max(t_link, t_gpu)
            parts["host-link" if t_link >= t_gpu else "compute"] += t
            total += t
            continue
        total += d.t_pp_s
        parts[d.pp_bound] = parts.get(d.pp_bound, 0.0) + d.t_pp_s
    return total, max(parts, key=parts.get)


def _offloaded_compute(spec, placed: Placed, gpu: DeviceRates, n_prompt: int) -> float:
    return sum(t.n_elements * n_prompt * gpu.pp_cost(t.type_name) for t in _layer_matrices(spec, placed.layers))


def _layer_matrices(spec, layers):
    """The weight matrices (2-D, more than one row) of the repeating layers in ``layers``."""
    layer_set = set(layers)
    return (t for t in spec.tensors
            if t.layer is not None and t.layer in layer_set and len(t.shape) >= 2 and t.shape[1] > 1)


# ------------------------------------------------------------------------------------------------
# flags and the seed's staircase
# ------------------------------------------------------------------------------------------------

def strict_ceiling_tps(spec: ModelSpec, device, cfg: RunConfig | None = None, depth: int = 0) -> float:
    """The physical ceiling on one device holding everything: bytes that must be read per token
    (weights used, KV at ``depth``, state) at peak bandwidth."""
    from v100lab.devices import get_device

    dev = get_device(device)
    cfg = cfg or RunConfig()
    placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
    w = decode_work(spec, placed, cfg, depth)[dev.id]
    return ceiling_tps(w.bytes_read, dev.bandwidth_gbs)


def prediction_observations(pred: Prediction, model: str, quant: str, device: str, lever: str = "",
                            value: str = "", note: str = "") -> list:
    """The prediction as tidy-table rows (tg, pp, both ceilings)."""
    from v100lab.results import Observation

    rows = []
    for metric, val in (("tg_tps", pred.tg_tps), ("pp_tps", pred.pp_tps),
                        ("ceiling_tg_tps", pred.ceiling_tg_tps), ("strict_ceiling_tg_tps", pred.strict_ceiling_tg_tps)):
        rows.append(Observation(model=model, quant=quant, device=device, lever=lever, value=str(value),
                                metric=metric, result=float(val), unit="tok/s", source="predicted",
                                above_ceiling=False if metric == "tg_tps" and val <= pred.strict_ceiling_tg_tps else None,
                                note=note or f"bound: {pred.bound}"))
    return rows


def seed_staircase(device: str = "v100-16gb", arch: str | None = None, claims_file=None) -> list:
    """The seed's staircase (DIGEST.md §8) on ``device``: for each stage one "claimed" row per end of
    the claimed range and one "predicted" row, plus the seed's plain and the strict ceiling; claims
    above the strict ceiling are marked ``above_ceiling=True`` and noted "impossible"."""
    from v100lab.calibration import load_seed_claims, seed_stage_prediction
    from v100lab.results import Observation

    claims = load_seed_claims(claims_file)
    arch = arch or claims["model"]["arch"]
    own = {c["quant"]: float(c["claimed_ceiling_tps"]) for c in claims.get("ceiling_table", [])}
    rows: list = []
    for stage in claims["stages"]:
        pred, spec, note = seed_stage_prediction(stage, claims, device, arch)
        label = f"{stage['id']} {stage['name']}"
        strict = pred.strict_ceiling_tg_tps
        plain = pred.ceiling_tg_tps
        lo, hi = stage["claimed_tps"]
        for v in sorted({float(lo), float(hi)}):
            above = v > strict
            above_plain = v > plain
            why = "impossible: above the strict ceiling" if above else (
                "above the seed's plain ceiling (bandwidth / file size)" if above_plain else "")
            if stage["quant"] in own and v > own[stage["quant"]]:
                why = "; ".join(x for x in (why, f"above the seed's own ceiling ({own[stage['quant']]:g})") if x)
            rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device,
                                    lever="stage", value=label, metric="tg_tps", result=v, unit="tok/s",
                                    source="claimed", above_ceiling=above,
                                    note="; ".join(x for x in (why, claims.get("source", "")) if x)))
        rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device, lever="stage",
                                value=label, metric="tg_tps", result=pred.tg_tps, unit="tok/s", source="predicted",
                                above_ceiling=pred.tg_tps > strict, note=f"bound: {pred.bound}; {note}".strip("; ")))
        for metric, val in (("ceiling_tg_tps", plain), ("strict_ceiling_tg_tps", strict)):
            rows.append(Observation(model=claims["model"]["label"], quant=stage["quant"], device=device, lever="stage",
                                    value=label, metric=metric, result=val, unit="tok/s", source="predicted",
                                    note="seed's plain ceiling" if metric == "ceiling_tg_tps" else
                                    "bytes read per token at peak bandwidth"))
    return rows
