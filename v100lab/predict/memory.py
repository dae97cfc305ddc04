"""The memory plan: where llama.cpp puts every byte, per device, before anything is loaded.

The seed's first argument is the "VRAM triangle" — model size × context length × card memory, pick two.
This module answers it from a :class:`~v100lab.facts.spec.ModelSpec` (a GGUF header, or a skeleton of a model
nobody downloaded), a device (or several) and a :class:`~v100lab.facts.config.RunConfig`, by mirroring
llama.cpp's own arithmetic:

* **context sizes, KV cache, recurrent state** — :mod:`v100lab.gguf.llama_context` (src/llama-context.cpp,
  src/llama-kv-cache.cpp, src/llama-kv-cache-iswa.cpp, src/llama-memory-recurrent.cpp): cells per stream, the
  sliding-window cache, bytes per cell and per layer; the KV of a layer lives on that layer's device. Hybrids
  (qwen35, qwen35moe) keep KV only on their full-attention layers (src/llama-model.cpp create_memory:
  filter_attn = !is_recr(il)), recurrent state on the rest.
* **weights** — src/llama-model.cpp, ``load_tensors``: ``i_gpu_start = max(n_layer + 1 - ngl, 0)``; the
  layer slots are the n_layer repeating blocks plus the output layer (slot n_layer), so ``-ngl k`` puts
  the output layer and the last k - 1 blocks on the GPU(s); block slots are split between GPUs by
  ``--tensor-split`` (``upper_bound(splits, (il - i_gpu_start) / act_gpu_layers)``); the input layer
  (token_embd) always stays on the CPU; a model with tied embeddings gets a second copy of token_embd as its
  output tensor on the output layer's device (``TENSOR_DUPLICATED``). With mmap the host's model buffer is
  the file range spanned by the host's tensors (``llama_model_loader::get_mapping_range``).
* **tensor overrides** — src/llama-model-loader.cpp, create_tensor: ``-ot PATTERN=BUFFER_TYPE`` (and
  ``--cpu-moe`` / ``--n-cpu-moe N``, common/common.h ``LLM_FFN_EXPS_REGEX`` per layer) move the matching tensors,
  the first matching pattern winning, whatever their layer's device (:func:`tensor_devices`); experts overridden to
  the CPU are repacked like any CPU weight.
* **output buffer** — src/llama-context.cpp, ``output_reserve(n_seq_max)``: ``n_vocab × 4 × n_seq_max``
  bytes of logits, in host memory.
* **compute buffer** — an estimate of ggml-alloc's peak for the worst-case graph (n_ubatch tokens, all of
  them outputs), derived below in :func:`compute_bytes_by_phase` and checked against llama.cpp's own
  "compute buffer size" lines (``benchmarks/bench_memory.py``).

The plan never loads anything; ``benchmarks/bench_memory.py`` compares it with what llama.cpp reports.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Sequence

import psutil

from v100lab.base import buildflags
from v100lab.facts.config import ALL_LAYERS, RunConfig, tensor_overrides
from v100lab.facts.devices import Device
from v100lab.base.errors import ConfigError
from v100lab.gguf.llama_context import (
    CTX_PAD,
    F32,
    LLAMA_MAX_SEQ,
    MAX_CTX,
    context_sizes,
    is_mtp_layer,
    kv_cache_bytes,
    kv_cells,
    pad,
    recurrent_bytes,
    resolve_flash_attn,
    row_size,
)
from v100lab.facts.quantmix import n_dims
from v100lab.facts.results import Observation
from v100lab.facts.spec import ModelSpec

log = logging.getLogger(__name__)

HOST = "host"
# The free memory a configuration must leave on every device, GPU and host alike (see :func:`margin_bytes`).
MARGIN_FRACTION = 0.03
MIN_MARGIN_MIB = 256

# ------------------------------------------------------------------------------------------------
# output buffer
# ------------------------------------------------------------------------------------------------


def output_bytes(spec: ModelSpec, cfg: RunConfig) -> int:
    """The logits buffer llama.cpp reserves up front: output_reserve(n_seq_max) → n_vocab × 4 × n_seq_max."""
    return spec.n_vocab * F32 * max(1, cfg.n_parallel)


# ------------------------------------------------------------------------------------------------
# placement (src/llama-model.cpp, load_tensors)
# ------------------------------------------------------------------------------------------------


def layer_slots(spec: ModelSpec) -> int:
    """n_layer + 1: the repeating blocks plus the output layer, as llama.cpp counts "N/M layers"."""
    return spec.n_layer + 1


def place_layers(spec: ModelSpec, n_gpu_layers: int, gpu_ids: Sequence[str],
                 tensor_split: Sequence[float] = ()) -> dict[int, str]:
    """Device of every layer slot 0..n_layer (slot n_layer = the output layer), llama.cpp's rule.

    ``i_gpu_start = max(n_layer + 1 - ngl, 0)``; slots from there on go to the GPUs, split by the
    cumulative, normalised ``tensor_split`` (equal shares when empty — llama.cpp would use free memory).
    Older llama.cpp builds (before the output layer was counted first) used ``n_layer - ngl``."""
    n_slots = layer_slots(spec)
    ngl = n_slots if n_gpu_layers < 0 else n_gpu_layers
    if not gpu_ids:
        return {il: HOST for il in range(n_slots)}
    i_gpu_start = max(n_slots - ngl, 0)
    act = min(ngl, n_slots)
    shares = list(tensor_split) if tensor_split and any(tensor_split) else [1.0] * len(gpu_ids)
    if len(shares) < len(gpu_ids):
        shares += [0.0] * (len(gpu_ids) - len(shares))
    shares = shares[: len(gpu_ids)]
    total = sum(shares)
    cum, acc = [], 0.0
    for s in shares:
        acc += s
        cum.append(acc / total)
    out = {}
    for il in range(n_slots):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out[il] = HOST
            continue
        frac = (il - i_gpu_start) / act
        k = next((i for i, c in enumerate(cum) if c > frac), len(cum) - 1)   # std::upper_bound
        out[il] = gpu_ids[k]
    return out


_INPUT_TENSORS = ("token_embd", "token_types", "pos_embd", "tok_embd", "per_layer_token_embd")


def _is_input(name: str) -> bool:
    return name.split(".")[0] in _INPUT_TENSORS


# ggml/src/ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type (x86 with AVX2/AVX-512, the usual host of
# a GPU): the build's repacked weight types (buildflags.repack_types: Q4_0, Q4_K, IQ4_NL and MXFP4 with AVX2, Q2_K
# too with AVX-512) are re-laid out into interleaved 8x8 blocks in a separate "CPU_REPACK" buffer
# when the tensor is a matrix multiplied on the CPU (not token_embd, read by GET_ROWS) with ne[1] % 8 == 0 —
# a 2-D weight of MUL_MAT or a 3-D stack of experts of MUL_MAT_ID (extra_buffer_type::supports_op:
# ``ggml_n_dims(src0) == 2`` for MUL_MAT, ``== 3`` for MUL_MAT_ID). A 3-D weight of a plain MUL_MAT — deepseek2's
# per-head attn_k_b / attn_v_b (src/llama-arch.cpp: GGML_OP_MUL_MAT) — stays in the mapped buffer.
# The set is the build's in use (scripts/setup.sh's record), read once per process.
REPACK_TYPES = buildflags.repack_types_in_use()


def is_repacked(t) -> bool:
    """Whether the CPU multiplies weight tensor ``t`` from its re-laid-out copy (the rule above)."""
    dims = n_dims(t.shape)
    return (t.type_name.upper() in REPACK_TYPES and (dims == 2 or (dims == 3 and "_exps." in t.name))
            and t.shape[1] % 8 == 0 and not _is_input(t.name))


def override_device(buft: str, gpu_ids: Sequence[str]) -> str:
    """The plan device a ``-ot PATTERN=BUFFER_TYPE`` buffer type names: "CPU" (and host buffers such as
    "CUDA_Host") → the host; a name ending in a number ("CUDA1", "Vulkan0") → that GPU of the plan, in device
    order; any other name → the plan's only GPU. ConfigError when the plan has no such GPU."""

    up = buft.upper()
    if up.startswith("CPU") or up.endswith("_HOST"):
        return HOST
    if not gpu_ids:
        raise ConfigError(f"override_tensor: buffer type '{buft}' names a GPU, and this plan has none")
    m = re.search(r"(\d+)$", buft)
    if m:
        k = int(m.group(1))
        if k < len(gpu_ids):
            return gpu_ids[k]
        raise ConfigError(f"override_tensor: buffer type '{buft}': the plan has {len(gpu_ids)} GPU(s)")
    if len(gpu_ids) == 1:
        return gpu_ids[0]
    raise ConfigError(f"override_tensor: buffer type '{buft}' does not say which of {len(gpu_ids)} GPUs")


def tensor_devices(spec: ModelSpec, slots: Mapping[int, str], overrides: Sequence[tuple[str, str]] = (),
                   gpu_ids: Sequence[str] = ()) -> dict[str, str]:
    """Device of every tensor: its layer slot's (the input layer on the host, the rest of the non-repeating
    tensors on the output layer's device), unless a tensor override matches its name first
    (src/llama-model-loader.cpp, create_tensor: ``std::regex_search`` of each pattern in order, the first match
    wins; ``--cpu-moe`` / ``--n-cpu-moe`` are such overrides, config.tensor_overrides)."""

    out_dev = slots[spec.n_layer]
    compiled = [(re.compile(p), override_device(b, gpu_ids)) for p, b in overrides]
    devs: dict[str, str] = {}
    for t in spec.tensors:
        dev = next((d for rx, d in compiled if rx.search(t.name)), None)
        if dev is None:
            if t.layer is not None and 0 <= t.layer < spec.n_layer:
                dev = slots[t.layer]
            elif _is_input(t.name):
                dev = HOST
            else:
                dev = out_dev
        devs[t.name] = dev
    return devs


def weights_by_device(spec: ModelSpec, slots: Mapping[int, str], use_mmap: bool = True,
                      repack: bool = True, overrides: Sequence[tuple[str, str]] = (),
                      gpu_ids: Sequence[str] = ()) -> dict[str, int]:
    """Weight bytes per device for a slot placement (see :func:`place_layers`) and tensor overrides
    (:func:`tensor_devices`).

    Host weights are what llama.cpp's host model buffers add up to: with mmap, ``CPU_Mapped`` is the file
    span of the host tensors that stay in the plain CPU buffer type (llama_model_loader::get_mapping_range),
    plus ``CPU_REPACK``, the re-laid-out copies of the repackable ones (``repack=False``: no repacking) —
    tensors overridden to the CPU are repacked too (create_tensor: "when overriding to a CPU buffer, consider
    the extra buffer types")."""
    out_dev = slots[spec.n_layer]
    out: dict[str, int] = {}
    host_plain, host_repack = [], 0
    devs = tensor_devices(spec, slots, overrides, gpu_ids)
    for t in spec.tensors:
        if t.layer is not None and is_mtp_layer(spec, t.layer):
            continue            # not loaded (load_mtp false)
        dev = devs[t.name]
        out[dev] = out.get(dev, 0) + t.n_bytes
        if dev == HOST:
            if repack and is_repacked(t):
                host_repack += t.n_bytes
            else:
                host_plain.append(t)
    has_output = any(t.name.startswith("output.") for t in spec.tensors)
    if not has_output and out_dev != HOST:
        embd = spec.tensor("token_embd.weight")
        if embd is not None:   # tied embeddings: the output layer gets its own copy (TENSOR_DUPLICATED)
            out[out_dev] = out.get(out_dev, 0) + embd.n_bytes
    if HOST in out:
        plain = sum(t.n_bytes for t in host_plain)
        if use_mmap and host_plain and len({t.offset for t in host_plain}) == len(host_plain):
            # llama_model_loader::get_mapping_range: the mapped buffer is the file span of its tensors
            plain = max(t.offset + t.n_bytes for t in host_plain) - min(t.offset for t in host_plain)
        out[HOST] = plain + host_repack
    return out


# ------------------------------------------------------------------------------------------------
# compute buffer (graph-shape estimate)
# ------------------------------------------------------------------------------------------------


# Architectures whose full-attention layers project a gate with the query (Q and gate in one matrix,
# src/models/qwen35.cpp build_layer_attn) and whose output rows are gathered after the final norm
# (get_rows on inp_out_ids after output_norm, not in the last layer).
GATED_ATTN_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe"})


def compute_bytes_by_phase(spec: ModelSpec, cfg: RunConfig, flash_attn: bool, *, has_output: bool = True,
                           attn_layers: bool = True, kv_cells_full: int | None = None,
                           kv_cells_swa: int | None = None) -> dict[str, int]:
    """Peak bytes of the worst-case graph's intermediate tensors, phase by phase, on one device.

    llama.cpp reserves its compute buffer by building the graph for a full physical batch (n_ubatch tokens, every
    token an output; n_seq_max sequences) and letting ggml-alloc place every tensor: the buffer is the allocator's
    high-water mark, reached in one phase (logits, attention, ffn, recurrent: see the comments below), each the F32
    activations alive then (u = n_ubatch). The graph's masks are alive in every layer's phase. Constants pinned on
    llama.cpp's own buffer sizes (bench_memory)."""
    u = context_sizes(spec, cfg).n_ubatch
    n_seq = max(1, cfg.n_parallel)
    E = spec.n_embd
    gated = spec.architecture in GATED_ATTN_ARCHS
    phases: dict[str, int] = {}
    # logits: n_vocab × u plus the final norm's input and output, 2 × n_embd × u (one more without flash attention or
    # with a quantized cache: a fragment the allocator cannot reuse; one more where the output rows are gathered after
    # the final norm, qwen35-style)
    if has_output:
        plain_cache = cfg.cache_type_k in ("f16", "bf16", "f32") and cfg.cache_type_v in ("f16", "bf16", "f32")
        # deepseek2 (MLA): 5 more — measured, not derived: llama.cpp's buffer leaves 4-6 n_embd × u of the last
        # layer's fragments under the logits (n_embd 256 and 1024, flash attention on and off, f16 and quantized
        # caches)
        n_e = (2 if flash_attn and plain_cache else 3) + (1 if gated else 0) + (5 if spec.is_mla else 0)
        phases["logits"] = (spec.n_vocab * u + n_e * E * u) * F32
    if attn_layers:
        layers = [il for il in range(spec.n_layer)]
        n_head = max((spec.n_head_at(il) for il in layers), default=0)
        n_kv_heads = max((spec.n_head_kv(il) for il in layers), default=0)
        full = kv_cells_full if kv_cells_full is not None else kv_cells(spec, cfg)
        swa = kv_cells_swa if kv_cells_swa is not None else (kv_cells(spec, cfg, swa=True) if spec.swa_layers else 0)
        has_full = any(spec.has_kv(il) and not spec.is_swa(il) for il in layers)
        has_swa = any(spec.has_kv(il) and spec.is_swa(il) for il in layers)
        mask_cells = (full if has_full else 0) + (swa if has_swa else 0)
        # attention: without flash attention the scores n_kv × u × n_head (soft_max runs in place) and each cache's
        # F32 mask n_kv × u; with it only the F16 masks; plus residual, normed input, Q (qwen35: and its gate), K, V
        # and the output. n_kv: the cells one sequence sees in the reserve graph (per stream)
        masks = mask_cells * u * (2 if flash_attn else F32)
        n_kv = full if has_full else swa
        q_width = n_head * spec.head_dim_k * (2 if gated else 1)
        extra = 0
        if spec.is_mla:
            # MLA (src/models/deepseek2.cpp, is_mla()): per head q, q_nope·k_b, q_pe and Qcur (placed above q's hole);
            # without flash attention build_attn_mha's ggml_cont(ggml_transpose(v)) of the cache, unless it fits in
            # the hole the query tensors leave
            r, rope = spec.kv_lora_rank or 0, spec.rope_dimension_count or 0
            k_mla = spec.key_length_mla or 0
            act = (3 * E + (spec.q_lora_rank or 0) + n_head * (k_mla + 2 * r + 2 * rope)) * u * F32
            # one copy per stream: the K view spans n_kv cells of each of the n_stream streams
            v_cont = row_size(cfg.cache_type_k, r) * n_kv * context_sizes(spec, cfg).n_stream if r and not flash_attn else 0
            # the query tensors above are all dead once the scores exist: one merged hole below KQ
            q_hole = n_head * (k_mla + 2 * r + 2 * rope) * u * F32
            extra = v_cont if v_cont > q_hole else 0
        else:
            act = (3 * E + q_width + 2 * n_kv_heads * (spec.head_dim_k + spec.head_dim_v)) * u * F32
        if flash_attn:
            phases["attention"] = masks + act
        else:
            phases["attention"] = n_kv * u * n_head * F32 + masks + act + extra
        # ffn: residual, normed input and FFN input (gemma2/3: 4 × n_embd) plus gate, up and their product 3 × n_ff;
        # MoE (src/llama-graph.cpp build_moe_ffn): router logits and probabilities, the selected experts' up, gate and
        # SwiGLU outputs; leading dense layers (deepseek2) take the larger of the two
        moe_layers = [il for il in layers if spec.is_moe_layer(il)]
        dense_layers = [il for il in layers if not spec.is_moe_layer(il)]
        ffn = []
        if moe_layers:
            used = max(1, spec.expert_used_count)
            n_ff_exp = spec.n_ff_exp or max((spec.n_ff_at(il) for il in moe_layers), default=0) // used
            per_tok = 4 * E + 2 * spec.expert_count + 3 * n_ff_exp * used
            if spec.n_ff_shexp or spec.architecture == "qwen35moe":
                per_tok += E * used
            ffn.append(per_tok * u * F32 + masks)
        if dense_layers:
            n_ff = max((spec.n_ff_at(il) for il in dense_layers), default=0)
            n_e = 4 if spec.architecture in ("gemma2", "gemma3") else 3
            ffn.append((n_e * E + 3 * n_ff) * u * F32 + masks)
        phases["ffn"] = max(ffn, default=masks)
        # recurrent (src/models/qwen35.cpp build_layer_attn_linear, fused GATED_DELTA_NET): per token z, the conv
        # input and output, normalised q and k; per sequence two copies of the layer's state and conv state, unless
        # both fit in the hole the conv input leaves
        if spec.recurrent_layers and spec.ssm_inner_size:
            d_inner = spec.ssm_inner_size
            key = (spec.ssm_group_count or 0) * (spec.ssm_state_size or 0)
            conv = d_inner + 2 * key
            d_conv = spec.ssm_conv_kernel or 0
            # one layer's state per sequence: llama_hparams::n_embd_s() and n_embd_r() floats
            state = (d_inner * (spec.ssm_state_size or 0) + max(d_conv - 1, 0) * conv) * F32
            copies = 2 * state * n_seq
            per_tok = (d_inner + 2 * conv + 2 * key + 4 * E) * u * F32
            hole = conv * u * F32
            phases["recurrent"] = per_tok + masks + (0 if copies <= hole else copies)
    return phases


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes llama.cpp will hold on one device."""

    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    recurrent_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    overhead_bytes: int = 0
    capacity_bytes: int = 0
    layers: tuple[int, ...] = ()
    has_output_layer: bool = False

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.recurrent_bytes + self.compute_bytes
                + self.output_bytes + self.overhead_bytes)

    @property
    def margin_bytes(self) -> int:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def as_dict(self) -> dict:
        return {"weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "recurrent_bytes": self.recurrent_bytes, "compute_bytes": self.compute_bytes,
                "output_bytes": self.output_bytes, "overhead_bytes": self.overhead_bytes,
                "total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes}


@dataclass(frozen=True)
class MemoryPlan:
    """Where every byte goes, per device; ``fits`` when every device's total is within its capacity."""

    devices: dict[str, DeviceMemory]
    fits: bool
    offloaded_layers: int
    n_layer_total: int
    max_ctx: int | None
    warnings: list[str] = field(default_factory=list)
    n_ctx: int = 0                # after padding (all streams)
    n_ctx_seq: int = 0
    n_ubatch: int = 0
    flash_attn: bool = True       # as resolved (auto → on, the CPU and CUDA backends support it)
    model: str = ""
    quant: str = ""
    # (tensor name, its layer's device, the device an override put it on) for each layer tensor moved
    moved: tuple[tuple[str, str, str], ...] = ()

    def as_dict(self) -> dict:
        """The keys scripts rely on (a contract): devices, fits, offloaded_layers, n_layer_total, max_ctx, warnings."""
        return {"devices": {k: v.as_dict() for k, v in self.devices.items()}, "fits": self.fits,
                "offloaded_layers": self.offloaded_layers, "n_layer_total": self.n_layer_total,
                "max_ctx": self.max_ctx, "warnings": list(self.warnings)}

    @property
    def gpu_devices(self) -> dict[str, DeviceMemory]:
        return {k: v for k, v in self.devices.items() if k != HOST}


def _as_list(devices: Device | Sequence[Device]) -> list[Device]:
    if isinstance(devices, Device):
        return [devices]
    return list(devices)


def _host_capacity() -> int:
    return int(psutil.virtual_memory().total)


def _plan(spec: ModelSpec, devices: list[Device], cfg: RunConfig) -> MemoryPlan:
    accel = [d for d in devices if d.kind != "cpu"]
    host_dev = next((d for d in devices if d.kind == "cpu"), None)
    gpu_ids = [d.id for d in accel]
    if len(set(gpu_ids)) != len(gpu_ids):   # two cards of the same kind: number them
        gpu_ids = [f"{d.id}:{i}" for i, d in enumerate(accel)]
    cs = context_sizes(spec, cfg)
    fa = resolve_flash_attn(cfg)
    slots = place_layers(spec, cfg.n_gpu_layers, gpu_ids, cfg.tensor_split)
    overrides = tensor_overrides(cfg)
    weights = weights_by_device(spec, slots, cfg.use_mmap, overrides=overrides, gpu_ids=gpu_ids)
    warnings: list[str] = []
    # experts kept in host memory while their layer is on a GPU (--cpu-moe, --n-cpu-moe, -ot ...=CPU)
    moved = _moved_tensors(spec, slots, overrides, gpu_ids) if overrides else []

    # Apple / unified memory: one pool; treat it like a GPU (Metal buffers) whose capacity is the device's.
    ids = list(dict.fromkeys(gpu_ids + [HOST]))
    full_cells = kv_cells(spec, cfg)
    swa_cells = kv_cells(spec, cfg, swa=True) if spec.swa_layers else 0
    devmem: dict[str, DeviceMemory] = {}
    for dev_id in ids:
        layers = tuple(il for il in range(spec.n_layer) if slots[il] == dev_id)
        has_out = slots[spec.n_layer] == dev_id
        kv = kv_cache_bytes(spec, cfg, layers)
        rs = recurrent_bytes(spec, cfg, layers)
        phases = compute_bytes_by_phase(spec, cfg, fa, has_output=has_out, attn_layers=bool(layers),
                                        kv_cells_full=full_cells, kv_cells_swa=swa_cells)
        compute = max(phases.values(), default=0)
        if dev_id == HOST and not layers and not has_out:
            # host holds only the input layer: token embeddings for one ubatch (get_rows output) and the
            # graph inputs (tokens, positions, masks: the masks live in host memory next to the inputs)
            u = cs.n_ubatch
            masks = (full_cells + swa_cells) * u * (2 if fa else F32) if gpu_ids else 0
            compute = 2 * spec.n_embd * u * F32 + masks
        if dev_id == HOST and any(d == HOST for _, _, d in moved):
            # the experts' products run on the CPU for small batches (ggml-cuda offload_op copies host weights
            # to the GPU only from op_offload_min_batch_size tokens on): the FFN phase of a decode step
            # (n_seq_max tokens) in the host compute buffer
            step = compute_bytes_by_phase(spec, cfg.with_(n_ubatch=min(cs.n_seq, cfg.n_batch)), fa, has_output=False,
                                          kv_cells_full=full_cells, kv_cells_swa=swa_cells)
            compute = max(compute, step.get("ffn", 0))
        if dev_id == HOST:
            cap = host_dev.capacity_bytes if host_dev else _host_capacity()
            over = host_dev.overhead_bytes if host_dev else 0
            out_b = output_bytes(spec, cfg)
        else:
            d = accel[gpu_ids.index(dev_id)]
            cap, over, out_b = d.capacity_bytes, d.overhead_bytes, 0
        w = weights.get(dev_id, 0)
        devmem[dev_id] = DeviceMemory(weights_bytes=w, kv_cache_bytes=kv, recurrent_bytes=rs, compute_bytes=compute,
                                      output_bytes=out_b, overhead_bytes=over, capacity_bytes=cap, layers=layers,
                                      has_output_layer=has_out)

    offloaded = sum(1 for il in range(layer_slots(spec)) if slots[il] != HOST)
    gpu_fit = all(m.fits for k, m in devmem.items() if k != HOST)
    host_fit = devmem[HOST].fits
    if not host_fit:
        warnings.append(f"host: {devmem[HOST].total_bytes / 2**30:.2f} GiB needed, "
                        f"{devmem[HOST].capacity_bytes / 2**30:.2f} GiB of RAM"
                        + (" (mmap pages can be evicted, but every token re-reads them from disk)" if cfg.use_mmap else ""))
    for k, m in devmem.items():
        if k != HOST and not m.fits:
            warnings.append(f"{k}: needs {m.total_bytes / 2**30:.2f} GiB of {m.capacity_bytes / 2**30:.2f} GiB "
                            f"({(m.total_bytes - m.capacity_bytes) / 2**20:.0f} MiB over)")
    if spec.is_mla and cfg.cache_type_k != cfg.cache_type_v:
        warnings.append(f"cache_type_k {cfg.cache_type_k} and cache_type_v {cfg.cache_type_v} differ: llama.cpp refuses "
                        "this context for an MLA model ('model does not support different K and V cache types', "
                        "llama_init_from_model); give both the same type")
    if cfg.kv_quantized_v and cfg.flash_attn == "off":
        warnings.append(f"cache_type_v {cfg.cache_type_v} with flash attention off: llama.cpp refuses this "
                        "context ('quantized V cache requires flash_attn'); use -fa on or auto")
    if spec.n_ctx_train and cs.n_ctx_seq > spec.n_ctx_train:
        warnings.append(ctx_train_warning(spec, cs.n_ctx_seq))
    if gpu_ids and offloaded < layer_slots(spec):
        warnings.append(f"only {offloaded}/{layer_slots(spec)} layers on the GPU: "
                        f"{layer_slots(spec) - offloaded} run on the CPU from host memory")
    if moved:
        n_layers = len({t.layer for t, _, _ in moved})
        to_host = sum(t.n_bytes for t, _, d in moved if d == HOST)
        warnings.append(f"tensor overrides: {len(moved)} tensors of {n_layers} GPU layer(s) elsewhere "
                        f"({to_host / 2**30:.2f} GiB in host memory); for prompts llama.cpp copies host "
                        "experts to the GPU per batch (op offload) — that GPU compute-buffer share is not "
                        "modelled (no GPU to validate it)")
    return MemoryPlan(devices=devmem, fits=gpu_fit and host_fit, offloaded_layers=offloaded,
                      n_layer_total=layer_slots(spec), max_ctx=None, warnings=warnings, n_ctx=cs.n_ctx,
                      n_ctx_seq=cs.n_ctx_seq, n_ubatch=cs.n_ubatch, flash_attn=fa, model=spec.name,
                      quant=spec.file_type, moved=tuple((t.name, src, dst) for t, src, dst in moved))


def _moved_tensors(spec: ModelSpec, slots: Mapping[int, str], overrides, gpu_ids) -> list:
    """(tensor, layer device, override device) of the layer tensors an override moves off their layer's device."""
    devs = tensor_devices(spec, slots, overrides, gpu_ids)
    return [(t, slots[t.layer], devs[t.name]) for t in spec.tensors
            if t.layer is not None and 0 <= t.layer < spec.n_layer and devs[t.name] != slots[t.layer]]


def plan(spec: ModelSpec, devices: Device | Sequence[Device], cfg: RunConfig | None = None,
         with_max_ctx: bool = True) -> MemoryPlan:
    """The memory plan of ``spec`` on ``devices`` (one Device or a list; GPUs in --tensor-split order).

    The host appears as device "host" when layers or buffers stay there (always: llama.cpp keeps the input
    layer and the output buffer in host memory). ``max_ctx`` is the largest n_ctx that fits with every
    other setting fixed (None when ``with_max_ctx`` is false)."""
    cfg = cfg or RunConfig()
    devs = _as_list(devices)
    p = _plan(spec, devs, cfg)
    if with_max_ctx:
        p = replace(p, max_ctx=max_ctx(spec, devs, cfg))
    return p


# ------------------------------------------------------------------------------------------------
# fit search
# ------------------------------------------------------------------------------------------------


def _fits_gpu(p: MemoryPlan, margin: bool = False) -> bool:
    """Fit as the layer search means it: every accelerator within capacity (host RAM only when it is the
    device); with ``margin``, leaving :func:`margin_bytes` free on each."""
    devs = p.gpu_devices or {HOST: p.devices[HOST]}
    return all(m.total_bytes + (margin_bytes(m.capacity_bytes) if margin else 0) <= m.capacity_bytes
               for m in devs.values())


def _within(p: MemoryPlan, margin: bool = False) -> bool:
    """Every device of the plan (GPUs and the host) within its capacity; with ``margin``, leaving
    :func:`margin_bytes` free on each."""
    return all(m.total_bytes + (margin_bytes(m.capacity_bytes) if margin else 0) <= m.capacity_bytes
               for m in p.devices.values())


def max_ctx(spec: ModelSpec, devices: Device | Sequence[Device], cfg: RunConfig | None = None,
            limit: int | None = None, margin: bool = False) -> int:
    """The largest n_ctx (a multiple of 256 × n_parallel, up to ``limit`` or the training context) with
    which every device — each GPU and the host's RAM — holds its part, everything else fixed; with
    ``margin``, leaving :func:`margin_bytes` free on each (the rule of :func:`feasibility`). 0 when not
    even the smallest context fits."""
    cfg = cfg or RunConfig()
    devs = _as_list(devices)
    hi = min(limit or spec.n_ctx_train or 131072, MAX_CTX)
    step = CTX_PAD * max(1, cfg.n_parallel if not cfg.kv_unified else 1)
    lo_n, hi_n = 1, max(1, hi // step)

    def ok(n: int) -> bool:
        return _within(_plan(spec, devs, cfg.with_(n_ctx=n * step)), margin)

    if not ok(lo_n):
        return 0
    if ok(hi_n):
        return hi_n * step
    while hi_n - lo_n > 1:          # memory grows monotonically with n_ctx
        mid = (lo_n + hi_n) // 2
        if ok(mid):
            lo_n = mid
        else:
            hi_n = mid
    return lo_n * step


def max_gpu_layers(spec: ModelSpec, devices: Device | Sequence[Device], cfg: RunConfig | None = None,
                   margin: bool = False) -> int:
    """The largest -ngl (0 … n_layer + 1) whose GPU share fits (with ``margin``: leaving :func:`margin_bytes`
    free); 0 when nothing fits. The host is not checked: fewer GPU layers only ever put more on it."""
    cfg = cfg or RunConfig()
    devs = _as_list(devices)
    lo, hi = 0, layer_slots(spec)
    if _fits_gpu(_plan(spec, devs, cfg.with_(n_gpu_layers=hi)), margin):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_gpu(_plan(spec, devs, cfg.with_(n_gpu_layers=mid)), margin):
            lo = mid
        else:
            hi = mid
    return lo


def fit_gpu_layers(spec: ModelSpec, devices: Device | Sequence[Device], cfg: RunConfig | None = None, *,
                   margin: bool = False) -> tuple[RunConfig, str]:
    """``cfg`` as it runs when the GPU(s) cannot hold the layers it asks for: with the most --gpu-layers whose GPU
    share fits (:func:`max_gpu_layers`), and a note saying so; ``cfg`` unchanged and "" when it fits as asked, or
    when every device is a CPU. ``margin``: fitting means leaving :func:`margin_bytes` free on each GPU.

    This is the layer half of llama.cpp's ``--fit`` (common/fit.cpp, ``common_fit_params``, on by default in
    llama-server): with -ngl at its default it moves layers off the GPUs until the rest fits (older builds refuse
    to load instead). Its other half — shrinking the context when n_ctx is 0 — and its default 1 GiB target
    margin per device are not modelled."""
    cfg = cfg or RunConfig()
    devs = _as_list(devices)
    if all(d.kind == "cpu" for d in devs) or _fits_gpu(_plan(spec, devs, cfg), margin):
        return cfg, ""
    slots = layer_slots(spec)
    asked = slots if cfg.n_gpu_layers < 0 else min(cfg.n_gpu_layers, slots)
    ngl = max_gpu_layers(spec, devs, cfg, margin=margin)
    if ngl >= asked:
        return cfg, ""
    return (cfg.with_(n_gpu_layers=ngl),
            f"does not fit with -ngl {cfg.n_gpu_layers}: predicted with -ngl {ngl} (as llama.cpp's --fit)")


# ------------------------------------------------------------------------------------------------
# feasibility: the one rule that `plan` and `tune` share
# ------------------------------------------------------------------------------------------------


def margin_bytes(device: Device | int) -> int:
    """The free memory a configuration must leave on a device (a Device, or its capacity in bytes): 3 % of it,
    at least 256 MiB — on every GPU and on the host alike. Why: weights and KV in the plan are exact to
    llama.cpp's printed MiB, but the compute buffer is an estimate (within 5 % on the CPU, not validated on
    CUDA), the runtime overhead is a typical figure, not a measurement, and the host's
    RAM is shared with the operating system and whatever else runs there."""
    cap = device if isinstance(device, int) else device.capacity_bytes
    return max(MIN_MARGIN_MIB * 2**20, int(MARGIN_FRACTION * cap))


def capacity_for(total_bytes: int) -> int:
    """The smallest capacity that holds ``total_bytes`` and still leaves its :func:`margin_bytes`."""
    return max(total_bytes + MIN_MARGIN_MIB * 2**20, math.ceil(total_bytes / (1 - MARGIN_FRACTION)) + 1)


def host_cores(devices: Device | Sequence[Device] = ()) -> int:
    """CPU cores of the machine that runs the CPU part: those a host profile recorded (``fingerprint.cpu_count``,
    written by the host measurement) when one of ``devices`` is a CPU that carries one, else this machine's."""
    for d in _as_list(devices):
        if d.kind == "cpu":
            n = cores_of_profile(d.extra)
            if n:
                return n
    return os.cpu_count() or 1


def cores_of_profile(profile: Mapping | None) -> int | None:
    """``fingerprint.cpu_count`` of a host profile (a dict or a Device's extra fields), if it is a positive int."""
    fp = (profile or {}).get("fingerprint")
    n = fp.get("cpu_count") if isinstance(fp, Mapping) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def fmt_bytes(n: float, up: bool = False) -> str:
    """Bytes as MiB, GiB or TiB for a message (``up``: rounded up, for "at least" figures)."""
    for unit, scale, nd in (("TiB", 2**40, 1), ("GiB", 2**30, 1), ("MiB", 2**20, 0)):
        if abs(n) >= scale or unit == "MiB":
            x = n / scale
            if up:
                x = math.ceil(x * 10**nd) / 10**nd
            return f"{x:,.{nd}f} {unit}"
    raise AssertionError("unreachable")


def ctx_train_warning(spec: ModelSpec, n_ctx_seq: int) -> str:
    """The warning for a context per sequence beyond the model's training context (src/llama-context.cpp warns
    "possible training context overflow"; tools/server/server-context.cpp, ``n_ctx_slot``, caps each slot there)."""
    return (f"n_ctx_seq {n_ctx_seq} exceeds the model's training context {spec.n_ctx_train}: llama-server caps each "
            f"slot at {spec.n_ctx_train} tokens, and the model was never trained beyond them")


@dataclass(frozen=True)
class Blocker:
    """One reason a configuration cannot run as asked: what does not hold, and what would have to change."""

    kind: str                 # memory | parallel | context | threads
    device: str               # the device it concerns ("host", a GPU id), "" for a limit of llama.cpp itself
    problem: str              # one line: what does not hold
    change: str               # one line: what would have to change
    excess: float             # how far past the limit, relative (0.25: a quarter over); orders blockers
    shortfall_bytes: int = 0  # memory: bytes beyond what the device holds with its margin

    def line(self) -> str:
        return f"{self.problem}: {self.change}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "device": self.device, "problem": self.problem, "change": self.change,
                "line": self.line(), "excess": round(self.excess, 6) if math.isfinite(self.excess) else None,
                "shortfall_bytes": self.shortfall_bytes}


@dataclass(frozen=True)
class Feasibility:
    """Whether a configuration runs (:func:`feasibility`), and if not, every blocker."""

    fits: bool
    blockers: tuple[Blocker, ...] = ()
    margins: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))   # bytes kept free per device

    @property
    def smallest(self) -> Blocker | None:
        """The blocker nearest to being lifted (the least relative excess); None when it fits."""
        return min(self.blockers, key=lambda b: b.excess, default=None)

    @property
    def distance(self) -> float:
        """How far the configuration is from fitting: the sum of its blockers' relative excesses (0 when it fits)."""
        return sum(b.excess for b in self.blockers)

    def as_dict(self) -> dict:
        s = self.smallest
        return {"fits": self.fits, "blockers": [b.as_dict() for b in self.blockers],
                "smallest_blocker": s.as_dict() if s else None, "margin_bytes": dict(self.margins)}


def limit_blockers(spec: ModelSpec | None, cfg: RunConfig, devices: Device | Sequence[Device] = ()) -> list[Blocker]:
    """The limits of llama.cpp and of the machine that no amount of memory lifts: sequences, context, threads.
    ``spec`` is needed only for ``n_ctx`` 0 (the training context); None reads that as no training context."""
    out: list[Blocker] = []
    n_seq = max(1, cfg.n_parallel)
    if n_seq > LLAMA_MAX_SEQ:
        out.append(Blocker("parallel", "", f"--parallel {n_seq}: llama.cpp refuses more than {LLAMA_MAX_SEQ} sequences "
                           f"('n_seq_max must be <= {LLAMA_MAX_SEQ}')", f"use --parallel {LLAMA_MAX_SEQ} or fewer",
                           n_seq / LLAMA_MAX_SEQ - 1))
    n_ctx = cfg.n_ctx or (spec.n_ctx_train if spec is not None else 0)
    padded = pad(n_ctx, CTX_PAD)
    if n_ctx <= 0:
        out.append(Blocker("context", "", "--ctx-size 0 means the training context, and this model records none",
                           "give --ctx-size", 1.0))
    elif n_ctx > MAX_CTX:
        out.append(Blocker("context", "", f"--ctx-size {n_ctx} is beyond llama-server's limit {MAX_CTX} (a 32-bit int)",
                           f"use --ctx-size {MAX_CTX} or less", n_ctx / MAX_CTX - 1))
    elif not cfg.kv_unified and pad(padded // n_seq, CTX_PAD) < 1:
        # src/llama-context.cpp, llama_context::llama_context: n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256),
        # and 0 throws "n_ctx_seq == 0" (see context_sizes)
        out.append(Blocker("context", "", f"{n_seq} slots share {padded} cells: each gets none (llama.cpp refuses: "
                           "'n_ctx_seq == 0')", f"use --ctx-size {n_seq} or more, fewer --parallel slots, or --kv-unified",
                           n_seq / padded - 1))
    cores = host_cores(devices)
    if cfg.n_threads > cores:
        out.append(Blocker("threads", HOST, f"-t {cfg.n_threads}: the host has {cores} cores",
                           f"use -t {cores} or fewer (0 = all cores)", cfg.n_threads / cores - 1))
    return out


def _join_or(opts: Sequence[str]) -> str:
    opts = list(dict.fromkeys(opts))
    return opts[0] if len(opts) == 1 else ", ".join(opts[:-1]) + " or " + opts[-1]


def _memory_blocker(spec: ModelSpec, devs: list[Device], cfg: RunConfig, mplan: MemoryPlan, name: str, margin: int,
                    detail: bool) -> Blocker:
    """A device that does not hold its part (with its margin), and the changes that would make it."""
    m = mplan.devices[name]
    short = m.total_bytes + margin - m.capacity_bytes
    kept = f" with {fmt_bytes(margin)} kept free" if margin else ""
    if name == HOST:
        problem = f"needs {fmt_bytes(m.total_bytes)} of host RAM, {fmt_bytes(m.capacity_bytes)} available{kept}"
    else:
        problem = f"needs {fmt_bytes(m.total_bytes)} on {name}, {fmt_bytes(m.capacity_bytes)} available{kept}"
    use_margin = bool(margin)
    opts: list[str] = []
    holds_layers = bool(m.layers or m.has_output_layer)
    if name != HOST and holds_layers:
        if detail:
            k = max_gpu_layers(spec, devs, cfg, margin=use_margin)
            if 0 < k < mplan.offloaded_layers:
                fewer = _plan(spec, devs, cfg.with_(n_gpu_layers=k))
                if _within(replace(fewer, devices={HOST: fewer.devices[HOST]}), use_margin):
                    opts.append(f"--gpu-layers {k}")          # only where the host then holds the rest
        else:
            opts.append("fewer --gpu-layers")
    if m.weights_bytes >= short and holds_layers:
        opts.append("a smaller quant")
    if m.kv_cache_bytes + m.compute_bytes >= short:
        if detail:
            # up to the training context: llama-server caps each slot there anyway
            asked, train = cfg.n_ctx or spec.n_ctx_train, spec.n_ctx_train
            mc = max_ctx(spec, devs, cfg, limit=max(1, min(asked, train) if train else asked), margin=use_margin)
            if mc > 0:
                what = "the model's training context" if train and mc >= train else "the largest that fits"
                opts.append(f"--ctx-size {mc} ({what})")
        else:
            opts.append("a shorter context")
    if cfg.cache_type_v in ("f16", "f32", "bf16") and m.kv_cache_bytes // 2 >= short:
        opts.append("a q8_0 KV cache (-ctk q8_0 -ctv q8_0 -fa on)")
    if cfg.n_parallel > 1 and m.output_bytes + m.recurrent_bytes >= short:
        opts.append("fewer --parallel slots")
    gpus = mplan.gpu_devices
    if name == HOST:
        if holds_layers and len(gpus) == 1:
            gpu = next(iter(gpus))
            if detail:
                full = _plan(spec, devs, cfg.with_(n_gpu_layers=ALL_LAYERS))
                if _within(replace(full, devices={HOST: full.devices[HOST]}), use_margin):
                    need = full.devices[gpu].total_bytes
                    opts.append(f"a GPU with ≥ {fmt_bytes(capacity_for(need) if use_margin else need, up=True)} "
                                "(every layer off the host)")
            else:
                opts.append("a larger GPU (more layers off the host)")
        need = m.total_bytes
        opts.append(f"a host with ≥ {fmt_bytes(capacity_for(need) if use_margin else need, up=True)} of RAM")
    else:
        need = m.total_bytes
        opts.append(f"a GPU with ≥ {fmt_bytes(capacity_for(need) if use_margin else need, up=True)}")
    return Blocker("memory", name, problem, "use " + _join_or(opts), short / m.capacity_bytes, short)


def feasibility(spec: ModelSpec, devices: Device | Sequence[Device], cfg: RunConfig | None = None,
                mplan: MemoryPlan | None = None, *, margin: bool = True, detail: bool = False) -> Feasibility:
    """The one rule ``plan`` and ``tune`` share: does this configuration run on these devices?

    It fits only if every device holds its part — each GPU, and the host's RAM for what stays on the CPU (the
    input layer, layers not offloaded, the output buffer; the plan's host breakdown), each leaving
    :func:`margin_bytes` free (``margin=False``: within capacity) — and the limits of :func:`limit_blockers`
    hold: at most LLAMA_MAX_SEQ sequences, cells for every sequence, a context within llama-server's int32, no
    more threads than the host's cores. Each blocker says what would have to change; ``detail`` adds figures that
    take more plans to find (the -ngl, context, GPU and RAM sizes that would fit). ``mplan``: the plan of
    exactly these arguments, when the caller has it."""
    cfg = cfg or RunConfig()
    devs = _as_list(devices)
    blockers = limit_blockers(spec, cfg, devs)
    if mplan is None:
        mplan = _plan(spec, devs, cfg)
    margins = {k: (margin_bytes(m.capacity_bytes) if margin else 0) for k, m in mplan.devices.items()}
    limits_only_threads = all(b.kind == "threads" for b in blockers)
    for name, m in mplan.devices.items():
        if m.total_bytes + margins[name] > m.capacity_bytes:
            blockers.append(_memory_blocker(spec, devs, cfg, mplan, name, margins[name],
                                            detail and limits_only_threads))
    return Feasibility(fits=not blockers, blockers=tuple(blockers), margins=MappingProxyType(margins))


def triangle(specs_by_quant: Mapping[str, ModelSpec], device: Device | Sequence[Device],
             contexts: Sequence[int] = (2048, 4096, 8192), cache_types: Sequence[str] = ("f16", "q8_0"),
             cfg: RunConfig | None = None):
    """The VRAM triangle as tidy observations (source "predicted"): for each quant × context × cache type,
    with all layers requested on the device(s): ``total_bytes`` (the busiest accelerator), ``margin_bytes``,
    ``fits`` (1/0), ``max_gpu_layers`` and ``layers_spilled`` (layer slots that must stay on the CPU), and per
    quant × cache type the largest context (``max_ctx``). Lever "n_ctx"; the rows' ``cache_type`` says which."""
    cfg = cfg or RunConfig()
    devs = _as_list(device)
    dev_label = "+".join(d.id for d in devs)
    rows: list[Observation] = []
    for quant, spec in specs_by_quant.items():
        label = spec.name or quant
        for ct in cache_types:
            base = cfg.with_(cache_type_k=ct, cache_type_v=ct)
            for n_ctx in contexts:
                c = base.with_(n_ctx=n_ctx)
                p = _plan(spec, devs, c)
                busiest = max(p.gpu_devices.values() or [p.devices[HOST]], key=lambda m: m.total_bytes - m.capacity_bytes)
                ngl = max_gpu_layers(spec, devs, c)
                for metric, value, unit in (("total_bytes", busiest.total_bytes, "bytes"),
                                            ("margin_bytes", busiest.margin_bytes, "bytes"),
                                            ("fits", float(_fits_gpu(p)), "bool"),
                                            ("max_gpu_layers", ngl, "layers"),
                                            ("layers_spilled", layer_slots(spec) - ngl, "layers")):
                    rows.append(Observation(model=label, quant=quant, device=dev_label, lever="n_ctx",
                                            value=str(n_ctx), metric=metric, result=float(value), unit=unit,
                                            source="predicted", cache_type=ct))
            rows.append(Observation(model=label, quant=quant, device=dev_label, lever="cache_type", value=ct,
                                    metric="max_ctx", result=float(max_ctx(spec, devs, base)), unit="tokens",
                                    source="predicted", cache_type=ct))
    return rows


