"""What one decoded token costs each device, before any rate is applied: the weights it multiplies and the
bytes it reads per ggml type, the KV cache and recurrent state it reads, the attention multiply-adds.

Decoding one token reads every weight that the token passes through once, plus the KV cache up to the
current depth, plus (for recurrent layers) the state. :mod:`v100lab.predict.rates` turns these figures into
seconds per device; :mod:`v100lab.predict.speed` combines them into tok/s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from v100lab.base import buildflags
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError
from v100lab.gguf.llama_context import F32, attn_sync_layer, kv_cell_bytes, kv_cells_read, recurrent_state_floats
from v100lab.predict.memory import is_repacked
from v100lab.facts.spec import ModelSpec, TensorInfo

# ggml-cpu simd-mappings.h: ggml_vec_dot_f16 / ggml_vec_mad_f16 (used by the CPU flash-attention kernel per KV
# cell) run SIMD over the largest multiple of GGML_F16_STEP and a scalar loop over the rest, so on an AVX-512
# build (step 64) a head_dim of 96 costs far more per element than 64 or 256; on an AVX2 build (step 32) it
# does not. The step is the build's (buildflags.f16_simd_step), read once per process.
F16_SIMD_STEP = buildflags.f16_simd_step_in_use()

# How the threads share a token's matrix-vector product, which ends at a barrier: the op lasts as long as its busiest
# thread. ggml/src/ggml-cpu/ggml-cpu.c, ggml_compute_forward_mul_mat (one activation row: nr1 = 1): chunks of
# MUL_MAT_CHUNK_ROWS rows taken in turn (every thread starts at its own index, then takes an atomic counter's next),
# or one chunk per thread when that gives fewer than 4 chunks a thread — a matrix of 576 rows (SmolLM2's q, o and
# ffn_down) is 9 chunks, 5 for one thread and 4 for the other at 2 threads: 11 % longer than an even split.
# ggml/src/ggml-cpu/repack.cpp, tensor_traits::forward_mul_mat (the re-laid-out types, memory.is_repacked): 4 chunks
# a thread of at least REPACK_NB_COLS rows, each chunk's bounds rounded up to a multiple of it.
MUL_MAT_CHUNK_ROWS = 64
REPACK_NB_COLS = 8


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=4096)
def mul_mat_chunks(n_rows: int, threads: int, repacked: bool = False) -> tuple[int, ...]:
    """The rows of each chunk ggml-cpu cuts a matrix of ``n_rows`` rows into for one token's product at ``threads``
    threads (the comment above: mul_mat's 64-row chunks, or the repacked path's)."""
    if n_rows < 1 or threads < 1:
        raise ConfigError(f"mul_mat_chunks: rows and threads must be >= 1, got {n_rows}, {threads}")
    if not repacked:
        n = _ceil_div(n_rows, MUL_MAT_CHUNK_ROWS)
        if n < 4 * threads:
            n = threads if n_rows > 1 else 1       # nr0 > nr1 ? nth : 1 (nr1 = 1)
        dr = _ceil_div(n_rows, n)
        return tuple(max(0, min(dr, n_rows - k * dr)) for k in range(n))
    n = _ceil_div(n_rows, _ceil_div(n_rows, 4 * threads))
    if n > 0 and n_rows // n < REPACK_NB_COLS and n_rows >= REPACK_NB_COLS:
        n = _ceil_div(n_rows, REPACK_NB_COLS)
    dr = _ceil_div(n_rows, n)
    if threads == 1 or (n < threads and _ceil_div(n_rows, threads) >= REPACK_NB_COLS):
        n, dr = threads, _ceil_div(n_rows, threads)
    n = min(n, _ceil_div(n_rows, REPACK_NB_COLS))

    def up(x: int) -> int:
        return _ceil_div(x, REPACK_NB_COLS) * REPACK_NB_COLS

    return tuple(max(0, min(up(min(k * dr + dr, n_rows)), n_rows) - up(k * dr)) for k in range(n))


@functools.lru_cache(maxsize=4096)
def busiest_share(n_rows: int, threads: int, repacked: bool = False) -> float:
    """How much longer than an even split a token's product of an ``n_rows`` matrix takes at ``threads`` threads: the
    busiest thread's rows × threads ÷ rows (1.0 at one thread, or when the chunks deal evenly). Thread j takes chunk j
    first, then each next chunk goes to the thread that is free first (the atomic counter), a chunk's time its
    rows'; a thread left alone at the end is assumed no faster."""
    loads = [0] * threads
    for k, rows in enumerate(mul_mat_chunks(n_rows, threads, repacked)):
        loads[k if k < threads else loads.index(min(loads))] += rows
    return max(loads) * threads / n_rows


@dataclass(frozen=True)
class TypeWork:
    """Per token, for one ggml type on one device: weights multiplied, bytes read and matrix rows (one dot product
    each: ggml-cpu's mul_mat computes a row of the weights against the token's activations per call of the type's
    ``vec_dot``, whose setup and final horizontal sum do not depend on the row's length)."""

    n_weights: float
    n_bytes: float
    n_rows: float = 0.0
    matrices: tuple[tuple[int, bool, float, float], ...] = ()   # (rows of one product, repacked, weights, rows) per
                                                         # kind of matrix: how the threads share them (:meth:`shared_by`)

    def shared_by(self, threads: int) -> tuple[float, float]:
        """(weights, rows) as ``threads`` threads spend time on them: each kind of matrix's by its
        :func:`busiest_share` — the figures an even split would take as long over (``n_weights``, ``n_rows`` at one
        thread)."""
        if threads <= 1 or not self.matrices:
            return self.n_weights, self.n_rows
        w, r = self.n_weights, self.n_rows
        for rows, rep, n_w, n_r in self.matrices:
            extra = busiest_share(rows, threads, rep) - 1.0
            w, r = w + n_w * extra, r + n_r * extra
        return w, r


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
    attn_split_layers: int = 0        # layers whose decode attention syncs the threads mid-sweep (attn_sync_layer)
    attn_head_cells: float = 0.0      # Σ query heads × cells: one softmax step each (mask, scale, expf, the online
                                      # max and sum), whatever head_dim is
    attn_sweeps: tuple[tuple[float, float], ...] = ()   # (query heads × cells, KV bytes of the layer's cells read)
                                      # per kind of layer: what attn_missed_head_cells prices
    weights_by_role: Mapping[str, Mapping[str, float]] = field(default_factory=dict)   # ggml type → weight role
                                      # (the tensor's name without its layer: ffn_up_exps) → weights multiplied

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
    def n_rows(self) -> float:
        return sum(w.n_rows for w in self.weights.values())

    def rows_shared_by(self, threads: int) -> float:
        """Matrix rows as ``threads`` threads spend time on them (:meth:`TypeWork.shared_by`)."""
        return sum(w.shared_by(threads)[1] for w in self.weights.values())

    @property
    def flops(self) -> float:
        """2 FLOPs per weight multiplied (one multiply-add) plus 2 per attention multiply-add."""
        return 2.0 * self.n_weights + 2.0 * self.attn_ops


@dataclass(frozen=True)
class Placed:
    """Which repeating layers (and whether the output layer) a device holds; tensor overrides (-ot, --cpu-moe,
    --n-cpu-moe) move single tensors of a layer: ``moved_in`` names those held here though their layer is
    elsewhere, ``moved_out`` those of its layers held elsewhere."""

    device: Any                       # v100lab.facts.devices.Device
    layers: tuple[int, ...]
    has_output: bool
    moved_in: frozenset[str] = frozenset()
    moved_out: frozenset[str] = frozenset()

    def holds(self, t: TensorInfo) -> bool:
        """Whether this device holds a repeating layer's tensor ``t``."""
        return t.name in self.moved_in or (t.layer in self.layers and t.name not in self.moved_out)


def _is_expert(t: TensorInfo) -> bool:
    return "_exps" in t.name


def weight_role(name: str) -> str:
    """A tensor's name without its layer and suffix (``blk.3.ffn_up_exps.weight`` → ``ffn_up_exps``): the role
    it plays in every layer, as llama.cpp's graph names its weights."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) > 2:
        parts = parts[2:]
    return ".".join(p for p in parts if p != "weight")


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
    state_el = recurrent_state_floats(spec) * float(F32)
    # the seed's ceiling counts the whole file once: token_embd goes with the first layer's device
    # (with tied embeddings, with the output layer's, where it is read)
    first = next((k for k, p in placement.items() if 0 in p.layers), None)
    embd_home = next((k for k, p in placement.items() if p.has_output), first) if tied else \
        (first or next((k for k, p in placement.items() if p.has_output), None))
    out: dict[str, DeviceWork] = {}
    for dev_id, placed in placement.items():
        layers = set(il for il in placed.layers if il < n_layer_run)
        weights: dict[str, list[float]] = {}
        roles: dict[str, dict[str, float]] = {}
        other = 0.0
        stored = 0.0
        for t in spec.tensors:
            on_dev = (t.layer is not None and placed.holds(t)) or \
                     (t.layer is None and _is_output(t) and placed.has_output)
            if on_dev or (t.name == "token_embd.weight" and dev_id == embd_home):
                stored += t.n_bytes
            read_as_matrix = False
            if t.layer is not None:
                if t.layer >= n_layer_run or not placed.holds(t):
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
                w = weights.setdefault(t.type_name, [0.0, 0.0, 0.0, {}])
                w[0] += t.n_elements * frac
                w[1] += t.n_bytes * frac
                w[2] += t.n_elements / t.shape[0] * frac      # rows: ne[0] is a row's length (ggml order)
                # one product's rows: ne[1] (a 3-D stack of experts is one product per expert used)
                m = w[3].setdefault((int(t.shape[1]), is_repacked(t)), [0.0, 0.0])
                m[0] += t.n_elements * frac
                m[1] += t.n_elements / t.shape[0] * frac
                by_role = roles.setdefault(t.type_name, {})
                by_role[weight_role(t.name)] = by_role.get(weight_role(t.name), 0.0) + t.n_elements * frac
            else:
                other += t.n_bytes
        kv = attn = tail = head_cells = state = 0.0
        split = 0
        sweeps: dict[float, float] = {}
        dtail = head_tail(spec.head_dim_k) + head_tail(spec.head_dim_v)
        for il in sorted(layers):
            if spec.is_recurrent(il):
                state += 2.0 * state_el
                continue
            if not spec.has_kv(il):
                continue
            cells = kv_cells_read(spec, il, cfg, used)
            row = float(kv_cell_bytes(spec, il, cfg.cache_type_k, cfg.cache_type_v))
            kv += cells * row
            hc = cells * spec.n_head_at(il)
            attn += hc * (spec.head_dim_k + spec.head_dim_v)
            tail += hc * dtail
            head_cells += hc
            split += attn_sync_layer(spec, il, cfg, used)
            sweeps[cells * row] = sweeps.get(cells * row, 0.0) + hc
        out[dev_id] = DeviceWork(
            device_id=dev_id, layers=tuple(sorted(placed.layers)), has_output=placed.has_output,
            weights=MappingProxyType({k: _type_work(*v) for k, v in sorted(weights.items())}),
            other_bytes=other, kv_bytes=kv, attn_ops=attn, attn_tail_ops=tail, attn_split_layers=split,
            attn_head_cells=head_cells, attn_sweeps=tuple((hc, foot) for foot, hc in sorted(sweeps.items())),
            state_bytes=state, placed_weight_bytes=stored,
            weights_by_role=MappingProxyType({k: MappingProxyType(v) for k, v in sorted(roles.items())}))
    return out


def _type_work(n_weights: float, n_bytes: float, n_rows: float, matrices: Mapping[tuple[int, bool], list]) -> TypeWork:
    """A TypeWork from decode_work's sums: ``matrices`` (rows of one product, repacked) → [weights, rows]."""
    kinds = tuple((rows, rep, n_w, n_r) for (rows, rep), (n_w, n_r) in sorted(matrices.items()))
    return TypeWork(n_weights, n_bytes, n_rows, kinds)


def experts_touched(n_expert: int, n_used: int, n_tokens: int) -> float:
    """Expected distinct experts a batch of ``n_tokens`` tokens routes to, each token choosing ``n_used`` distinct
    experts of ``n_expert`` (the router's top-k: src/llama-graph.cpp, build_moe_ffn, ``ggml_argsort_top_k``),
    routing taken as uniform and independent between tokens: an expert is missed by a token with probability
    1 − k/n, so n·(1 − (1 − k/n)^T) — k for one token, nearly all n for a 512-token prompt of a 32-expert top-4
    model (31.9). Routing of a trained model is less even, which only lowers the count for short batches."""
    if n_expert < 1 or not 0 < n_used <= n_expert or n_tokens < 1:
        raise ConfigError(f"experts_touched: need 0 < used <= experts and tokens >= 1, got {n_used} of {n_expert}, "
                          f"{n_tokens} tokens")
    return n_expert * (1.0 - (1.0 - n_used / n_expert) ** n_tokens)


def batch_shares(spec: ModelSpec, t: TensorInfo, n_tokens: int) -> tuple[float, float]:
    """(multiply share, read share) of weight matrix ``t`` in one ubatch of ``n_tokens`` tokens: the part of its
    weights each token multiplies, and the part read once for the ubatch. 1 and 1 for a dense matrix; for a stack
    of routed experts k/n and :func:`experts_touched`/n — ggml-cpu's MUL_MAT_ID (ggml/src/ggml-cpu/ggml-cpu.c,
    ggml_compute_forward_mul_mat_id) groups the batch's rows by expert (``matrix_row_counts``) and multiplies each
    expert that has rows, skipping the others (``if (cne1 == 0) continue``); CUDA's mul_mat_id does the same."""
    if not (_is_expert(t) and spec.expert_count and spec.expert_used_count):
        return 1.0, 1.0
    n, k = spec.expert_count, spec.expert_used_count
    return k / n, experts_touched(n, k, n_tokens) / n


def attn_missed_head_cells(sweeps, capacity_bytes: float) -> float:
    """Query heads × KV cells whose reads miss a cache of ``capacity_bytes``, given a token's
    :attr:`DeviceWork.attn_sweeps`. ggml-cpu's flash-attention kernel walks a layer's KV cells once per *query* head
    (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk: ``ik2 = iq2 / rk2``), one K row
    and one V row a cell. While a layer's cells fit in the cache those reads hit it; beyond, the share
    1 − capacity / the layer's KV bytes of every head × cell misses (random replacement), and a miss costs about the
    same whatever the row's length (heads of 128 cost what heads of 64 cost a head × cell, at twice the bytes). The
    capacity is fitted per host and thread count (:func:`v100lab.measure.calibration.fit_cpu`): an effective figure,
    not the L2's nominal size."""
    if not capacity_bytes:
        return 0.0
    return sum(hc * max(0.0, 1.0 - capacity_bytes / foot) for hc, foot in sweeps if foot > 0)


def head_tail(head_dim: int, step: int | None = None) -> int:
    """Elements of a head past the last full SIMD step (scalar in ggml's f16 vector kernels); ``step``: the
    build's GGML_F16_STEP (default: the build in use)."""
    return head_dim % (step or F16_SIMD_STEP)


def _input_device(placement: Mapping[str, Placed]) -> str:
    """token_embd lives in host memory (llama.cpp never offloads the input layer): the CPU device if
    the placement has one, else the first device."""
    for dev_id, p in placement.items():
        if getattr(p.device, "kind", None) == "cpu":
            return dev_id
    return next(iter(placement))


def layer_matrices(spec, layers):
    """The weight matrices (2-D, more than one row) of the repeating layers in ``layers``; a recurrent layer's
    convolution kernel (``ssm_conv1d``) is not one: SSM_CONV reads it (:func:`recurrent_token_work`)."""
    layer_set = set(layers)
    return (t for t in spec.tensors
            if t.layer is not None and t.layer in layer_set and len(t.shape) >= 2 and t.shape[1] > 1
            and "ssm_conv1d" not in t.name)


#: architectures whose recurrent layers are a gated delta net (src/models/delta-net-base.cpp)
DELTA_NET_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})


@dataclass(frozen=True)
class RecurrentWork:
    """One token's pass through a recurrent layer's two f32 kernels, as row sweeps: ``elements`` multiplied and
    ``rows`` swept (each row one loop with its own setup and sum, like a matrix row in decode)."""

    delta_elements: float = 0.0
    delta_rows: float = 0.0
    conv_elements: float = 0.0
    conv_rows: float = 0.0


def recurrent_token_work(spec: ModelSpec, il: int) -> RecurrentWork:
    """What one token costs layer ``il``'s recurrent kernels (a zero RecurrentWork for other layers, and for
    recurrent architectures other than the gated delta net).

    * the delta net: on the CPU llama.cpp runs the fused GATED_DELTA_NET op for prompts as for decode
      (src/llama-context.cpp: ``fused_gdn_ar`` and ``fused_gdn_ch`` on; src/models/delta-net-base.cpp
      build_delta_net → build_delta_net_fused), which steps through the tokens one by one:
      ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_gated_delta_net_one_chunk, per value head and token, scales
      the S_v × S_v f32 state once (ggml_vec_scale_f32), then sweeps its S_v rows three times (ggml_vec_dot_f32
      against k, ggml_vec_mad_f32 of the update, ggml_vec_dot_f32 against q): 4 S_v² elements, 3 S_v rows;
    * the short convolution: ops.cpp, ggml_compute_forward_ssm_conv_f32, per token a scalar dot of d_conv taps
      for each of the conv_dim = d_inner + 2 n_group d_state channels (rows ``d_conv - 1 + n_tokens`` floats
      apart: one row each)."""
    if not spec.is_recurrent(il) or spec.architecture not in DELTA_NET_ARCHS:
        return RecurrentWork()
    d_inner = spec.ssm_inner_size or 0
    h_v = spec.ssm_time_step_rank or 0            # value heads (ssm.time_step_rank)
    if not (d_inner and h_v):
        return RecurrentWork()
    s_v = d_inner / h_v
    conv_dim = d_inner + 2 * (spec.ssm_group_count or 0) * (spec.ssm_state_size or 0)
    d_conv = spec.ssm_conv_kernel or 0
    return RecurrentWork(delta_elements=4.0 * h_v * s_v * s_v, delta_rows=3.0 * h_v * s_v,
                         conv_elements=float(conv_dim * d_conv), conv_rows=float(conv_dim) if d_conv else 0.0)



def single_device_work(spec: ModelSpec, cfg: RunConfig, depth: int, device: Any) -> DeviceWork:
    """One decoded token's work with every layer and the output layer on ``device``."""
    placed = {device.id: Placed(device, tuple(range(spec.n_layer)), True)}
    return decode_work(spec, placed, cfg, depth)[device.id]
