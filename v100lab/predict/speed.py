"""The speed model: a roofline per device, with the seed's plain bandwidth ceiling beside it.

Decoding one token reads every weight that the token passes through once, plus the KV cache up to the
current depth, plus (for recurrent layers) the state (:mod:`v100lab.predict.work` counts those bytes and
operations); the seed's argument is that tok/s can therefore not exceed ``bandwidth / bytes``. That
ceiling is right for a GPU and wrong as a *prediction* on a small CPU, where dequantising 2–6-bit weights
costs more time than reading them (on a 2-core host, Q4_0 decodes no faster than F16 although it reads a
quarter of the bytes). So each device gets two terms per weight type, and the larger one wins::

    t_device = Σ_type max(bytes_type / (efficiency × bandwidth), weights_type × cost_type + rows_type × cost_row)
             + max(kv_bytes / (efficiency × bandwidth), attention_ops × cost_attention
                   + head_cells × cost_head_cell + missed head_cells × cost_miss)
             + state_bytes / (efficiency × bandwidth)
             + overhead_layer × layers_on_device
    t_token  = Σ_device t_device + overhead_token + host-link transfers

The rates — ``cost_type`` (seconds per weight, per thread count), ``cost_row`` (seconds per matrix row: each row
is one dot product, whose setup and horizontal sum a short row pays for with fewer weights; CPUs), attention's
costs (CPUs: per multiply-add, per query head × KV cell, per KV byte read, and per head × cell whose reads miss an
effective cache once a layer's KV cells outgrow it, :func:`v100lab.predict.work.attn_missed_head_cells`), the efficiency and the overheads — are an
input: :mod:`v100lab.predict.rates` gives them (the host's stored calibration, GPU classes fitted on published
llama-bench tables, stated assumptions otherwise), and :func:`predict` takes explicit ones too.
Prompt processing is compute-bound: ``weights × n_prompt × cost_pp_type`` at the device's matmul rate for
the type, plus attention, plus (CPUs) a recurrent layer's delta net and convolution stepped token by token
(:func:`v100lab.predict.work.recurrent_token_work`), plus the host link when layers kept on the CPU have their matmuls offloaded
to the GPU (llama.cpp does that for batches of 32 tokens or more).

Every figure here is a prediction; the benchmark ``benchmarks/bench_speed.py`` says how good it is.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from v100lab.predict import memory
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device, catalog, complete_gpu, get_device
from v100lab.base.errors import ConfigError, V100labError
from v100lab.gguf.llama_context import causal_cells, fa_prompt_cells, kv_cells, n_kv_cells, resolve_flash_attn
from v100lab.predict.rates import (APPLE_CFG, APPLE_TG_DEPTH, PP_CALIB_ROWS_PER_WEIGHT, DeviceRates, apple_device,
                                   arch_spec, cuda_bench_config, fit_cuda_rows, fit_gpu_rows, gpu_rates,
                                   load_apple_table, load_cuda_table, rates_for)
from v100lab.facts.spec import ModelSpec
from v100lab.predict.work import (DeviceWork, Placed, batch_shares, decode_work, layer_matrices,
                                  recurrent_token_work, single_device_work)
from v100lab.base.safeio import json_number

log = logging.getLogger(__name__)

BOUNDS = ("memory", "compute", "overhead", "host-link")
GPU_KINDS = ("gpu", "apple")
# ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_device_offload_op: matmuls of weights kept in host
# memory run on the GPU (weights copied over PCIe) when the batch has at least 32 tokens.
OP_OFFLOAD_MIN_BATCH = 32
# Latency of one small host<->device copy (activations between devices, logits back). An assumption of
# the order of a PCIe round trip plus a copy launch, not a measurement.
LINK_LATENCY_S = 10e-6

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
    weights_ceiling_tg_tps: float          # the seed's plain ceiling for this device alone
    rates_source: str

    @property
    def bound(self) -> str:
        parts = {"memory": self.t_memory_s, "compute": self.t_compute_s, "overhead": self.t_overhead_s}
        return max(parts, key=parts.get)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_layers": self.n_layers, "has_output_layer": self.has_output,
                "weight_bytes_per_token": round(self.weight_bytes), "kv_bytes_per_token": round(self.kv_bytes),
                "state_bytes_per_token": round(self.state_bytes), "flops_per_token": round(self.flops),
                "t_memory_ms": round(self.t_memory_s * 1e3, 4), "t_compute_ms": round(self.t_compute_s * 1e3, 4),
                "t_overhead_ms": round(self.t_overhead_s * 1e3, 4), "t_tg_ms": round(self.t_tg_s * 1e3, 4),
                "t_pp_ms": round(self.t_pp_s * 1e3, 3), "bound": self.bound, "pp_bound": self.pp_bound,
                "weights_ceiling_tg_tps": json_number(self.weights_ceiling_tg_tps), "rates": self.rates_source}



@dataclass(frozen=True)
class Prediction:
    """Predicted decode (tg) and prompt (pp) speed, the seed's ceiling, and what bounds them."""

    tg_tps: float
    pp_tps: float
    weights_ceiling_tg_tps: float          # the seed's plain ceiling: Σ placed weight bytes / bandwidth, per device
    physical_ceiling_tg_tps: float   # bytes that must be read per token (weights used + KV) at peak bandwidth
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

    def as_dict(self) -> dict[str, Any]:
        return {"tg_tps": json_number(self.tg_tps), "pp_tps": json_number(self.pp_tps), "weights_ceiling_tg_tps": json_number(self.weights_ceiling_tg_tps),
                "physical_ceiling_tg_tps": json_number(self.physical_ceiling_tg_tps), "bound": self.bound,
                "pp_bound": self.pp_bound, "depth": self.depth, "n_prompt": self.n_prompt,
                "t_link_ms": round(self.t_link_s * 1e3, 4),
                "by_device": {k: v.as_dict() for k, v in self.by_device.items()}, "notes": list(self.notes)}


def placement_for(spec: ModelSpec, devices: Sequence, cfg: RunConfig) -> dict[str, Placed]:
    """Where llama.cpp puts each layer: taken from the memory plan (:func:`v100lab.predict.memory.plan`)."""
    mplan = memory.plan(spec, devices, cfg)
    return placement_from_plan(mplan, devices)


def placement_from_plan(mplan, devices: Sequence = ()) -> dict[str, Placed]:
    """A memory plan's layers and output layer per device, as the speed model consumes them.

    The plan names the host "host" whatever CPU device was passed (that device's rates apply to it; with
    none, this machine's host); accelerators keep their ids (numbered "id:i" when repeated)."""
    devs = [get_device(d) for d in devices]
    by_id = {d.id: d for d in devs}
    cpu = next((d for d in devs if d.kind == "cpu"), None)
    accel = [d for d in devs if d.kind != "cpu"]
    out: dict[str, Placed] = {}
    moved = getattr(mplan, "moved", ())    # tensor overrides: (tensor, layer's device, override's device)
    for name, dm in mplan.devices.items():
        if name == "host":
            if cpu is None and not dm.layers and not dm.has_output_layer and not any(d == name for *_, d in moved):
                # only the input layer (a row lookup): no need for this machine's figures
                dev = Device(id="host", name="host (input layer only)", kind="cpu", memory_gib=1, bandwidth_gbs=1)
            else:
                dev = cpu or get_device("host")
        elif name in by_id:
            dev = by_id[name]
        else:
            base, _, idx = name.rpartition(":")
            dev = accel[int(idx)] if idx.isdigit() and int(idx) < len(accel) else get_device(base or name)
        out[name] = Placed(device=dev, layers=tuple(dm.layers), has_output=bool(dm.has_output_layer),
                           moved_in=frozenset(t for t, _, dst in moved if dst == name),
                           moved_out=frozenset(t for t, src, _ in moved if src == name))
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
    cfg = cfg or RunConfig()
    if n_prompt < 1:
        raise ConfigError(f"n_prompt must be >= 1, got {n_prompt}")
    placement, work, rates = prepare(spec, devices, cfg, depth, profile, placement, rates)
    return roofline(spec, placement, work, rates, cfg, depth, n_prompt)


def prepare(spec: ModelSpec, devices: Sequence | Any, cfg: RunConfig, depth: int,
            profile: Mapping[str, Any] | None = None, placement: Mapping[str, Placed] | None = None,
            rates: Mapping[str, DeviceRates] | None = None):
    """What the roofline takes, as :func:`predict` resolves it: (placement, work per device, rates per device).
    Given ``placement`` and ``rates`` are kept; missing rates come from :func:`v100lab.predict.rates.rates_for`."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        devices = [devices]
    devices = [get_device(d) for d in devices]
    if placement is None:
        placement = placement_for(spec, devices, cfg)
    work = decode_work(spec, placement, cfg, depth)
    given = dict(rates or {})
    rates = {k: given.get(k) or rates_for(p.device, cfg, profile if p.device.id == "host" else None)
             for k, p in placement.items()}
    return placement, work, rates


def roofline(spec, placement, work, rates, cfg, depth, n_prompt) -> Prediction:
    """Decode and prompt speed from each device's work and rates (the module docstring's formula)."""
    notes: list[str] = []
    by: dict[str, DevicePrediction] = {}
    # a device with no layer of its own is active when it multiplies matrices moved to it (experts on the host)
    active = [k for k, w in work.items() if w.layers or w.has_output or w.weights]
    t_mem_all = t_cmp_all = t_ovh_all = 0.0
    for k in work:
        w, r = work[k], rates[k]
        bw = r.effective_bandwidth
        t_mem = t_cmp = 0.0
        for tname, tw in w.weights.items():
            tm = tw.n_bytes / r.bandwidth_for(tname)
            c = r.tg_cost(tname)
            tc = r.tg_compute_s(tname, *tw.shared_by(r.threads))     # the busiest thread's share
            if c is not None and tname not in r.tg_s_per_weight and k in active:
                notes.append(f"{k}: no calibrated cost for {tname}; borrowed the nearest type's")
            if tc > tm:
                t_cmp += tc
            else:
                t_mem += tm
        t_mem += w.other_bytes / bw + w.state_bytes / bw
        # GPUs: CUDA-core work per weight (dequantisation, activation quantisation) on top of the memory time
        t_cmp += sum(tw.n_weights for tw in w.weights.values()) * r.tg_add_s_per_weight
        tm, tc = w.kv_bytes / bw, r.attn_compute_s(w.attn_ops, w.attn_tail_ops, w.attn_head_cells, w.attn_sweeps,
                                    w.kv_bytes)
        if tc > tm:
            t_cmp += tc
        else:
            t_mem += tm
        n_lay = len([il for il in w.layers if il < spec.n_layer - (spec.nextn_layers or 0)])
        t_ovh = r.overhead_layer_s * (n_lay + (1 if w.has_output else 0)) if k in active else 0.0
        t_ovh += r.attn_split_layer_s * w.attn_split_layers if k in active else 0.0
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
            pp_bound=pp_bound, weights_ceiling_tg_tps=ceil, rates_source=r.source)
    # once per token: graph build and launch on the host side (the largest of the devices' figures)
    t_tok = max((rates[k].overhead_token_s for k in active), default=0.0)
    t_link = tg_link_time(spec, placement, rates, active)
    t_total = t_mem_all + t_cmp_all + t_ovh_all + t_tok + t_link
    parts = {"memory": t_mem_all, "compute": t_cmp_all, "overhead": t_ovh_all + t_tok, "host-link": t_link}
    bound = max(parts, key=parts.get)
    # the seed's ceiling: all placed weights at peak bandwidth; physical: what must be read per token
    t_plain = sum(w.placed_weight_bytes / rates[k].peak_bandwidth for k, w in work.items())
    t_strict = sum(w.bytes_read / rates[k].peak_bandwidth for k, w in work.items())
    pp_total, pp_bound = _pp_total(spec, placement, by, rates, cfg, n_prompt)
    for k, r in rates.items():
        if k in active and r.profile_note and not r.source.startswith("uncalibrated"):
            notes.append(f"{k}: {r.profile_note}")      # the host profile's age and quality
        if k in active:
            notes += [f"{k}: warning: {w}" for w in r.profile_warnings]
            notes += [f"{k}: {a.line}" for a in r.assumptions]     # a device file's missing fields, as inferred
        if k in active and r.source.startswith("uncalibrated"):
            notes.append(f"{k}: {r.source}")
        elif k in active and r.threads_note:
            notes.append(f"{k}: {r.threads_note}")
    return Prediction(
        tg_tps=1.0 / t_total, pp_tps=n_prompt / pp_total,
        weights_ceiling_tg_tps=1.0 / t_plain if t_plain else math.inf,
        physical_ceiling_tg_tps=1.0 / t_strict if t_strict else math.inf,
        bound=bound, pp_bound=pp_bound, by_device=MappingProxyType(by), depth=depth, n_prompt=n_prompt,
        t_link_s=t_link, t_overhead_token_s=t_tok, notes=tuple(dict.fromkeys(notes)))


def decode_terms(spec: ModelSpec, device: Any, cfg: RunConfig | None = None, depth: int = 0,
                 profile: Mapping[str, Any] | None = None, rates: DeviceRates | None = None) -> dict[str, float]:
    """Seconds of one decoded token per term, on one ``device`` holding every layer and the output layer: the
    matrix products per weight role (``"matmul:ffn_up_exps"``: the tensor's name without its layer), attention
    over the KV cache (``"attention"``, its threads' mid-sweep sync included), and the nodes that are neither
    (``"other ops"``: the per-layer and per-token overhead, norms and embedding rows, recurrent state); a GPU's
    ``"host link"`` (the embedding in, the logits out). They add up to :func:`roofline`'s decode time; a type's
    time (the larger of its memory and compute terms) is shared among its roles by the weights each multiplies.
    ``benchmarks/bench_ops.py --predicted`` prints them beside llama.cpp's own per-node times."""
    cfg = cfg or RunConfig()
    dev = get_device(device)
    placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
    w = decode_work(spec, placed, cfg, depth)[dev.id]
    r = rates or rates_for(dev, cfg, profile if dev.id == "host" else None)
    bw = r.effective_bandwidth
    terms: dict[str, float] = {}
    for tname, tw in w.weights.items():
        t_type = max(tw.n_bytes / r.bandwidth_for(tname), r.tg_compute_s(tname, *tw.shared_by(r.threads)))
        t_type += tw.n_weights * r.tg_add_s_per_weight
        roles = w.weights_by_role.get(tname) or {tname: tw.n_weights}
        total = sum(roles.values()) or 1.0
        for role, n_w in roles.items():
            key = f"matmul:{role}"
            terms[key] = terms.get(key, 0.0) + t_type * n_w / total
    terms["attention"] = max(w.kv_bytes / bw, r.attn_compute_s(w.attn_ops, w.attn_tail_ops, w.attn_head_cells,
                                                               w.attn_sweeps, w.kv_bytes)) \
        + r.attn_split_layer_s * w.attn_split_layers
    n_lay = len([il for il in w.layers if il < spec.n_layer - (spec.nextn_layers or 0)])
    terms["other ops"] = (r.overhead_layer_s * (n_lay + 1) + r.overhead_token_s
                          + (w.other_bytes + w.state_bytes) / bw)
    link = tg_link_time(spec, placed, {dev.id: r}, [dev.id])
    if link:
        terms["host link"] = link
    return terms


#: a field a device file lacks is worth a warning when its range moves the prediction by more than this
ASSUMPTION_WARN_CHANGE = 0.10


def assumption_warnings(spec: ModelSpec, placement: Mapping[str, Placed], cfg: RunConfig, depth: int = 0,
                        n_prompt: int = 512, threshold: float = ASSUMPTION_WARN_CHANGE) -> list[str]:
    """One line per field a device file lacked (:func:`v100lab.facts.devices.complete_gpu`) that matters here: set to the
    lowest and the highest value among the catalog cards it was inferred from, it moves tg or pp by more than
    ``threshold``. A missing compute capability always warns (it picks llama.cpp's kernel family)."""
    rates = {k: rates_for(p.device, cfg) for k, p in placement.items() if p.device.kind == "gpu"}
    if not any(r.assumptions for r in rates.values()):
        return []
    devices = [p.device for p in placement.values()]
    base = predict(spec, devices, cfg, depth=depth, n_prompt=n_prompt, placement=placement, rates=rates)
    out = []
    for k, r in rates.items():
        full, _ = complete_gpu(placement[k].device)
        for a in r.assumptions:
            if a.field == "compute_capability":
                out.append(f"{k}: the device file lacks compute_capability, which picks llama.cpp's kernel family "
                           "and the catalog cards its other fields are inferred from; add it (nvidia-smi "
                           "--query-gpu=compute_cap --format=csv)")
                continue
            worst, what = 0.0, ""
            for v in (a.low, a.high):
                alt = replace(full, **{a.field: float(v)})
                q = predict(spec, devices, cfg, depth=depth, n_prompt=n_prompt,
                            placement={**placement, k: replace(placement[k], device=alt)},
                            rates={**rates, k: rates_for(alt, cfg)})
                for name, new, old in (("tg", q.tg_tps, base.tg_tps), (f"pp{n_prompt}", q.pp_tps, base.pp_tps)):
                    if not (0 < old < math.inf and 0 < new < math.inf):
                        continue
                    if abs(new / old - 1.0) > abs(worst):
                        worst, what = new / old - 1.0, name
            if abs(worst) > threshold:
                out.append(f"{k}: the device file lacks {a.field}; over its range among the catalog cards it was "
                           f"inferred from ({a.low:.3g}-{a.high:.3g}) it moves the {what} prediction by up to "
                           f"{100 * abs(worst):.0f} % (assumed {a.value:.4g}): add it from the card's spec sheet")
    return out


def _link_gbs(rates: Mapping[str, DeviceRates]) -> float | None:
    links = [r.host_link_gbs for r in rates.values() if r.host_link_gbs]
    return min(links) if links else None


def tg_link_time(spec, placement, rates, active) -> float:
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
    # a layer whose tensors an override put on another active device: there and back (experts on the host)
    crossings += 2 * len({il for k in active for t in spec.tensors
                          if t.name in placement[k].moved_in and (il := t.layer) in owner and owner[il] != k})
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


def _pp_time(spec, placement, k, w: DeviceWork, r: DeviceRates, rates, cfg, depth, n_prompt) -> tuple[float, str]:
    """Prompt processing on one device: its compute terms (:func:`pp_parts`) or its weights streamed once per
    ubatch, whichever is longer, plus the per-ubatch overhead."""
    if not (w.layers or w.has_output):
        return 0.0, "overhead"
    parts = pp_parts(spec, w.layers, w.has_output, r, cfg, depth, n_prompt)
    t_mem, t_ovh = parts.pop("memory"), parts.pop("overhead")
    t_cmp = sum(parts.values())
    t = max(t_cmp, t_mem) + t_ovh
    bound = "compute" if t_cmp >= t_mem else "memory"
    if t_ovh > max(t_cmp, t_mem):
        bound = "overhead"
    return t, bound


def pp_parts(spec: ModelSpec, layers, has_output: bool, r: DeviceRates, cfg: RunConfig, depth: int,
             n_prompt: int) -> dict[str, float]:
    """Seconds of a whole prompt of ``n_prompt`` tokens after ``depth`` on one device holding ``layers`` (and the
    output layer if ``has_output``), per term: ``"matmul:TYPE"`` (the layers' weight products per ggml type),
    ``"output:TYPE"`` (the output product, for the last token only), ``"attention"``; ``"memory"`` (the weights
    streamed once per ubatch: the alternative bound, not added) and ``"overhead"`` (per ubatch)."""
    n_ub = math.ceil(n_prompt / max(1, min(cfg.n_ubatch, cfg.n_batch)))
    parts: dict[str, float] = {}
    t_mem = 0.0
    # per-token matmul cost of the layers (the output layer runs for the last token only); routed experts: each
    # token multiplies its k, each ubatch reads the experts its tokens touch (work.batch_shares)
    ub = min(cfg.n_ubatch, cfg.n_batch, n_prompt)
    for t in layer_matrices(spec, layers):
        per_token, per_ubatch = batch_shares(spec, t, ub)
        key = f"matmul:{t.type_name}"
        parts[key] = parts.get(key, 0.0) + _pp_matrix_compute_s(t, t.n_elements * per_token * n_prompt, r)
        t_mem += t.n_bytes * per_ubatch * n_ub / r.effective_bandwidth
    if has_output:
        out_t = spec.tensor("output.weight") or spec.tensor("token_embd.weight")
        if out_t is not None:
            parts[f"output:{out_t.type_name}"] = out_t.n_elements * r.pp_cost(out_t.type_name)
    # attention: the i-th prompt token sees depth + i + 1 cells (causal); per cell heads × (dk + dv). ggml-cpu's
    # flash attention computes whole 64-cell tiles for 64-query tiles (fa_prompt_cells), and spends per head × cell
    # besides per multiply-add (pp_attn_s_per_head_cell: mask, scale, softmax)
    attn = head_cells = 0.0
    for il in set(layers):
        if spec.is_recurrent(il) or not spec.has_kv(il) or il >= spec.n_layer - (spec.nextn_layers or 0):
            continue
        window = spec.sliding_window if (spec.is_swa(il) and spec.sliding_window) else None
        if not resolve_flash_attn(cfg):
            # KQ over all n_kv cells of each ubatch
            cells = n_prompt * n_kv_cells(depth + n_prompt, kv_cells(spec, cfg, swa=spec.is_swa(il)))
        elif r.kind == "cpu":
            cells = fa_prompt_cells(depth, n_prompt, window)
        else:
            cells = causal_cells(depth, n_prompt, window)
        head_cells += cells * spec.n_head_at(il)
        attn += cells * spec.n_head_at(il) * (spec.head_dim_k + spec.head_dim_v)
    parts["attention"] = r.pp_attn_compute_s(attn, head_cells)
    # recurrent layers: the delta net's state update and the short convolution step through the prompt token by
    # token (work.recurrent_token_work). Their rows are short f32 rows already in the core's cache (a 128-wide
    # head's state is 64 KiB), so each costs what a decode matrix row's fixed part costs (its loop, setup and sum:
    # the calibrated cost per row), and its elements next to nothing beside it. CPUs only: a GPU has no row cost,
    # and runs the heads in parallel.
    rec = [recurrent_token_work(spec, il) for il in set(layers)
           if spec.is_recurrent(il) and il < spec.n_layer - (spec.nextn_layers or 0)]
    if rec and r.kind == "cpu":
        parts["recurrent"] = n_prompt * r.tg_compute_s("F32", 0.0, sum(x.delta_rows + x.conv_rows for x in rec))
    parts["memory"] = t_mem
    parts["overhead"] = n_ub * r.pp_overhead_s
    return parts


def prompt_terms(spec: ModelSpec, device: Any, cfg: RunConfig | None = None, depth: int = 0, n_prompt: int = 512,
                 profile: Mapping[str, Any] | None = None, rates: DeviceRates | None = None) -> dict[str, float]:
    """Seconds per prompt token of each of :func:`pp_parts`' terms on one ``device`` holding every layer and the
    output layer (the memory bound left out: it never binds a CPU's prompt). ``benchmarks/bench_ops.py --prompt``
    prints them beside llama.cpp's own per-node times."""
    cfg = cfg or RunConfig()
    dev = get_device(device)
    r = rates or rates_for(dev, cfg, profile if dev.id == "host" else None)
    parts = pp_parts(spec, range(spec.n_layer), True, r, cfg, depth, n_prompt)
    parts.pop("memory")
    return {k: v / n_prompt for k, v in parts.items()}


def _pp_matrix_compute_s(t, n_weights: float, r: DeviceRates) -> float:
    """Prompt compute time of ``n_weights`` weights multiplied of matrix ``t`` (all its tokens' together). At the
    device's prompt rate for the type — except a CPU's re-laid-out stack of routed experts: ggml-cpu's repacked
    MUL_MAT_ID (ggml/src/ggml-cpu/repack.cpp, tensor_traits::forward_mul_mat_id) runs one ``gemv`` per routed
    row, a token's product at a time as in decode, so those weights cost the decode rate (weights and rows)."""
    if r.kind == "cpu" and "_exps" in t.name and memory.is_repacked(t) and r.tg_cost(t.type_name):
        return r.tg_compute_s(t.type_name, n_weights, n_weights / t.shape[0])
    # ggml-cpu's generic product (ggml-cpu.c, ggml_compute_forward_mul_mat_one_chunk) calls vec_dot once per row and
    # token, each call paying a fixed setup and sum (decode's row cost). The calibrated cost per weight holds the
    # share of calibration's prompt model, whose rows are long (rates.PP_CALIB_ROWS_PER_WEIGHT): a matrix of shorter
    # rows pays more per weight. sgemm's and the repacked gemm's tiles do not work row by row.
    row = 0.0 if memory.is_repacked(t) else r.pp_row_cost(t.type_name)
    per_weight = r.pp_cost(t.type_name)
    if row and t.shape[0]:
        per_weight = max(0.0, per_weight - row * PP_CALIB_ROWS_PER_WEIGHT) + row / t.shape[0]
    return n_weights * per_weight


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
        moved = sum(t.n_bytes for t in spec.tensors if t.name in placement[k].moved_in)
        if moved and rates[k].kind == "cpu" and gpus and ub >= OP_OFFLOAD_MIN_BATCH and link:
            # tensors moved to the host (experts) are multiplied on the GPU for large batches: ggml-cuda's
            # offload_op copies them over the host link once per ubatch; their compute is in the GPU's layers
            parts["host-link"] += n_ub * moved / (link * 1e9)
            total += n_ub * moved / (link * 1e9)
    return total, max(parts, key=parts.get)


def _offloaded_compute(spec, placed: Placed, gpu: DeviceRates, n_prompt: int) -> float:
    return sum(t.n_elements * batch_shares(spec, t, n_prompt)[0] * n_prompt * gpu.pp_cost(t.type_name)
               for t in layer_matrices(spec, placed.layers))


# ------------------------------------------------------------------------------------------------
# ceilings and flags
# ------------------------------------------------------------------------------------------------

def physical_ceiling_tps(spec: ModelSpec, device, cfg: RunConfig | None = None, depth: int = 0) -> float:
    """The physical ceiling on one device holding everything: bytes that must be read per token
    (weights used, KV at ``depth``, state) at peak bandwidth."""
    dev = get_device(device)
    w = single_device_work(spec, cfg or RunConfig(), depth, dev)
    return ceiling_tps(w.bytes_read, dev.bandwidth_gbs)


def apple_rows(split: str = "leave-one-chip-out"):
    """Predicted vs published Apple rows, one row per (chip variant, quant, test).

    ``split="leave-one-chip-out"``: each chip (all its GPU-core variants) is predicted by a fit on the
    other chips' comparable rows — the honest figure. ``split="none"``: one fit on every comparable row
    (in-sample; shown only to size the optimism). Newer-build rows are predicted with the fit on all
    comparable rows and marked ``comparable=False``: they are not judged."""
    import pandas as pd   # heavy: only this table needs it

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
        spec = arch_spec("llama2-7b", str(row["quant"]))
        placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
        rates = {dev.id: gpu_rates(dev, fit)}
        p_tg = predict(spec, [dev], APPLE_CFG, depth=APPLE_TG_DEPTH, n_prompt=512, placement=placed, rates=rates)
        p_pp = predict(spec, [dev], APPLE_CFG, depth=0, n_prompt=512, placement=placed, rates=rates)
        for metric, pub, pr in (("tg128", row["tg128"], p_tg.tg_tps), ("pp512", row["pp512"], p_pp.pp_tps)):
            out.append({"chip": chip, "gpu_cores": int(row["gpu_cores"]), "bandwidth_gbs": float(row["bandwidth_gbs"]),
                        "quant": row["quant"], "test": metric, "published": float(pub), "predicted": float(pr),
                        "error": float(pr) / float(pub) - 1.0, "weights_ceiling_tg_tps": p_tg.weights_ceiling_tg_tps,
                        "above_ceiling": bool(metric == "tg128" and float(pub) > p_tg.physical_ceiling_tg_tps),
                        "comparable": bool(row["comparable"]), "fit_on": fit_on, "build": row["build"],
                        "source": row["source"]})
    return pd.DataFrame(out)


CUDA_SPLITS = ("leave-one-card-out", "none", "device-file")
#: what a device file from a spec sheet's headline figures holds (the README's example); the rest is inferred
SPARSE_DEVICE_FIELDS = ("bandwidth_gbs", "fp16_tflops", "compute_capability")


def sparse_device(dev: Device, keep: Sequence[str] = SPARSE_DEVICE_FIELDS) -> Device:
    """``dev`` as a user's device file gives it: of its speed fields only ``keep`` (default: the headline three)."""
    return Device(id=dev.id, name=dev.name, kind=dev.kind, memory_gib=dev.memory_gib,
                  bandwidth_gbs=dev.bandwidth_gbs, runtime_overhead_mib=dev.runtime_overhead_mib,
                  **{f: getattr(dev, f) for f in keep if f != "bandwidth_gbs"})


def held_out_reference(dev: Device) -> list[Device]:
    """The catalog GPUs a held-out card's fields may be inferred from: all but the card and its spec twins (a
    second memory size of the same board: same bandwidth, peaks, power and compute capability)."""
    key = lambda d: (d.bandwidth_gbs, d.fp16_tflops, d.fp32_tflops, d.board_power_w, d.compute_capability)
    return [d for d in catalog().values() if d.kind == "gpu" and d.id != dev.id and key(d) != key(dev)]


def cuda_rows(split: str = "leave-one-card-out", infer: bool = True, keep: Sequence[str] = SPARSE_DEVICE_FIELDS):
    """Predicted vs published CUDA rows (``data/cuda_llama7b.csv``), one row per published row.

    ``split="leave-one-card-out"``: each card's rows are predicted by a CUDA-class fit on every other card's
    rows (:func:`v100lab.predict.rates.fit_cuda_rows`) — the honest figure. ``split="device-file"``: the same, with the
    card given as a device file with only the fields ``keep`` (:func:`sparse_device`), the others inferred from the
    other catalog cards (:func:`held_out_reference`; ``infer=False``: left missing). ``split="none"``: one fit on every
    row (in-sample; shown only to size the optimism)."""
    import pandas as pd  # heavy: only this table needs it

    if split not in CUDA_SPLITS:
        raise ConfigError(f"cuda_rows: split must be one of {', '.join(CUDA_SPLITS)}, got '{split}'")
    df = load_cuda_table()
    full = fit_cuda_rows(df) if split == "none" else None
    out = []
    for card, rows in df.groupby("device", sort=False):
        fit = full or fit_cuda_rows(df[df["device"] != card])
        dev = get_device(str(card))
        assumed, reference = (), []
        if split == "device-file":
            reference = held_out_reference(dev)
            dev = sparse_device(dev, keep)
            if infer:
                dev, assumed = complete_gpu(dev, reference)
        for _, row in rows.iterrows():
            spec = arch_spec(str(row["arch"]), str(row["quant"]))
            cfg, depth, n_prompt = cuda_bench_config(str(row["test"]), int(row["fa"]))
            placed = {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
            p = predict(spec, [dev], cfg, depth=depth, n_prompt=n_prompt, placement=placed,
                        rates={dev.id: gpu_rates(dev, fit, cfg)})
            pred = p.pp_tps if row["test"] == "pp512" else p.tg_tps
            out.append({"device": dev.id, "quant": row["quant"], "fa": int(row["fa"]), "test": row["test"],
                        "published": float(row["tps"]), "predicted": float(pred),
                        "error": float(pred) / float(row["tps"]) - 1.0, "build": row["build"],
                        "above_ceiling": bool(row["test"] == "tg128" and float(row["tps"]) > p.physical_ceiling_tg_tps),
                        "fit_on": "all rows" if full else f"all cards but {dev.id}", "source": row["source_url"],
                        "assumed": ", ".join(f"{a.field} {a.value:.4g}" for a in assumed if a.value is not None),
                        "inferred_from": ",".join(d.id for d in reference)})
    return pd.DataFrame(out)
