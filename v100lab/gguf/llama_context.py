"""llama.cpp's context arithmetic, in one place: how many KV cells a context has, how many a token reads, and
how many bytes a cell, a layer and a token take.

The memory plan (:mod:`v100lab.predict.memory`: buffer sizes), the speed model (:mod:`v100lab.predict.speed`: bytes and
operations per token), the levers and the advisor all take these figures from here. Each function mirrors a
piece of llama.cpp (the version vendored by llama-cpp-python 0.3.36) and names the file and function it follows:

* sizes of ggml types — ggml/src/ggml.c: ``ggml_row_size``, ``ggml_type_sizef`` (block sizes and bytes per block
  from gguf-py's ``GGML_QUANT_SIZES``, the same table as ggml's ``type_traits``);
* context sizes — src/llama-context.cpp, ``llama_context::llama_context``: n_batch and n_ubatch capped before
  n_ctx is padded to 256; without ``kv_unified`` each of the n_seq_max streams gets ``pad(n_ctx / n_seq_max, 256)``
  cells;
* KV cells — src/llama-kv-cache.cpp (``llama_kv_cache::llama_kv_cache``: one K and one V tensor
  ``[n_embd_gqa, kv_size, n_stream]`` per layer; ``get_n_kv``: the cells a graph spans) and
  src/llama-kv-cache-iswa.cpp (the sliding-window cache's size);
* recurrent state — src/llama-hparams.cpp (``n_embd_r``, ``n_embd_s``) and src/llama-memory-recurrent.cpp;
* flash attention — src/llama-context.cpp (``LLAMA_FLASH_ATTN_TYPE_AUTO`` resolved per device).

Measured against llama.cpp's own log in ``tests/test_llama_context.py`` and ``benchmarks/bench_memory.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import gguf

from v100lab.facts.config import RunConfig
from v100lab.base.errors import ConfigError
from v100lab.facts.spec import ModelSpec

# src/llama-context.cpp, llama_context::llama_context: cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256), and
# n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256) without kv_unified.
CTX_PAD = 256
# src/llama-kv-cache.cpp, llama_kv_cache::get_n_kv: n_pad_cur = max(n_pad, 256) — the cells a graph spans are the
# used cells padded to 256 (at least 256, at most the cache size).
KV_PAD = 256
# src/llama-kv-cache-iswa.cpp, llama_kv_cache_iswa::llama_kv_cache_iswa: "the SWA cache is always padded to 256".
SWA_PAD = 256
# Recurrent state (R and S) and logits are F32: src/llama-model.cpp create_memory passes GGML_TYPE_F32 to
# llama_memory_recurrent; 4 bytes per float.
F32 = 4
# src/llama-cparams.h: ``#define LLAMA_MAX_SEQ 256`` (what llama_max_parallel_sequences() returns);
# src/llama-context.cpp, llama_context::llama_context throws "n_seq_max must be <= 256" above it.
LLAMA_MAX_SEQ = 256
# common/common.h: common_params.n_ctx is an int32_t (llama-server parses --ctx-size with std::stoi).
MAX_CTX = 2**31 - 1


def pad(x: int, n: int) -> int:
    """ggml/include/ggml.h, ``GGML_PAD(x, n)``: x rounded up to a multiple of n."""
    return (x + n - 1) // n * n


# ------------------------------------------------------------------------------------------------
# ggml type sizes
# ------------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def type_size(type_name: str) -> tuple[int, int]:
    """(block elements, bytes per block) of a ggml type name ("q8_0", "F16", "Q4_K", ...): ggml/src/ggml.c
    ``ggml_blck_size`` and ``ggml_type_size``. ConfigError for a name ggml does not know."""
    try:
        qt = gguf.GGMLQuantizationType[type_name.upper()]
    except KeyError:
        raise ConfigError(f"unknown ggml type '{type_name}'") from None
    return gguf.GGML_QUANT_SIZES[qt]


def row_size(type_name: str, n: int) -> int:
    """ggml/src/ggml.c, ``ggml_row_size(type, ne)``: bytes of ``n`` elements of a type, an integer —
    ``type_size × ne / blck_size``. ``n`` must be a multiple of the block size (ggml asserts it; ConfigError here)."""
    block, size = type_size(type_name)
    if n % block:
        raise ConfigError(f"{n} elements cannot be stored as {type_name} (block size {block})")
    return n // block * size


def type_sizef(type_name: str) -> float:
    """ggml/src/ggml.c, ``ggml_type_sizef(type)``: bytes per element as a fraction — f16 2, q8_0 34/32, q4_0 18/32.
    For averages (bits per weight); a tensor's or a row's bytes are :func:`row_size`."""
    block, size = type_size(type_name)
    return size / block


def bits_per_weight(type_name: str) -> float:
    """Bits per element of a ggml type: 8 × :func:`type_sizef` (q4_0 4.5, q8_0 8.5, f16 16)."""
    return 8.0 * type_sizef(type_name)


def nearest_type(type_name: str, known: Iterable[str]) -> str | None:
    """The type of ``known`` with the closest bits per weight (an uncalibrated type borrows a calibrated one's
    cost, or its drift), or None when neither side is a ggml type."""
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


# ------------------------------------------------------------------------------------------------
# context sizes (src/llama-context.cpp, llama_context::llama_context)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextSizes:
    n_ctx: int          # total cells over all streams, after padding (llama.cpp's printed n_ctx)
    n_ctx_seq: int      # cells per stream (llama.cpp's printed n_ctx_seq)
    n_batch: int
    n_ubatch: int
    n_seq: int          # n_seq_max
    n_stream: int       # 1 with kv_unified, else n_seq


def context_sizes(spec: ModelSpec, cfg: RunConfig) -> ContextSizes:
    """n_ctx, n_ctx_seq, n_batch, n_ubatch and the number of KV streams as llama.cpp derives them from the
    requested values — src/llama-context.cpp, ``llama_context::llama_context``: ``n_batch = min(n_ctx, n_batch)``
    (causal attention) and ``n_ubatch = min(n_batch, n_ubatch)`` *before* ``n_ctx = GGML_PAD(n_ctx, 256)``; with
    ``kv_unified`` one stream of n_ctx cells, else ``n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)`` per sequence
    and n_ctx = n_ctx_seq × n_seq_max. n_ctx 0 means the model's training context."""
    n_ctx = cfg.n_ctx or spec.n_ctx_train
    n_batch = min(n_ctx, cfg.n_batch)
    n_ubatch = min(n_batch, cfg.n_ubatch)
    n_ctx = pad(n_ctx, CTX_PAD)
    n_seq = max(1, cfg.n_parallel)
    if cfg.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // n_seq, CTX_PAD)
        n_ctx, n_stream = n_ctx_seq * n_seq, n_seq
    return ContextSizes(n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_batch=n_batch, n_ubatch=n_ubatch, n_seq=n_seq,
                        n_stream=n_stream)


# ------------------------------------------------------------------------------------------------
# KV cells: how many a cache has, how many a token reads
# ------------------------------------------------------------------------------------------------


def kv_cells(spec: ModelSpec, cfg: RunConfig, swa: bool = False) -> int:
    """Cells per stream of the full-attention cache, or (``swa=True``) of the sliding-window cache.

    The full cache has n_ctx_seq cells per stream (src/llama-model.cpp create_memory passes cparams.n_ctx_seq as
    kv_size). src/llama-kv-cache-iswa.cpp, ``llama_kv_cache_iswa::llama_kv_cache_iswa``:
    ``size_swa = GGML_PAD(min(size_base, n_swa*(unified ? n_seq_max : 1) + n_ubatch), 256)``, and
    ``size_swa = size_base`` with ``swa_full``: one window per stream, or every sequence's window in the one
    unified stream. (Measured on gemma3-270m, n_ctx 8192, n_ubatch 512: n_seq_max 4 gives 4 streams of 1024 SWA
    cells, 2560 cells in one stream with kv_unified.)"""
    cs = context_sizes(spec, cfg)
    base = cs.n_ctx_seq
    if not swa or cfg.swa_full or not spec.sliding_window:
        return base
    per_stream = spec.sliding_window * (cs.n_seq if cfg.kv_unified else 1) + cs.n_ubatch
    return pad(min(base, per_stream), SWA_PAD)


def n_kv_cells(used: int, cache_cells: int, n_pad: int = KV_PAD) -> int:
    """The cells a graph spans when ``used`` cells of a stream are occupied — src/llama-kv-cache.cpp,
    ``llama_kv_cache::get_n_kv``: ``min(size, max(n_pad, GGML_PAD(used_max_p1, n_pad)))``."""
    return int(min(cache_cells, max(n_pad, pad(used, n_pad))))


def resolve_flash_attn(cfg: RunConfig) -> bool:
    """Whether flash attention runs: "on", or "auto" — src/llama-context.cpp sets ``cparams.flash_attn =
    flash_attn_type != LLAMA_FLASH_ATTN_TYPE_DISABLED`` and resolves AUTO by probing each layer's device, which
    the CPU, CUDA and Metal backends pass for the usual head sizes (llama.cpp turns it off with a warning where a
    layer's device cannot run it; the load log says which)."""
    return cfg.flash_attn != "off"


def kv_cells_read(spec: ModelSpec, il: int, cfg: RunConfig, used: int) -> int:
    """KV cells the attention of layer ``il`` touches for one token when ``used`` cells of its stream are occupied.

    Without flash attention, KQ is a matmul over all n_kv cells (:func:`n_kv_cells` of the layer's cache —
    the sliding-window cache for an SWA layer). The flash-attention kernels skip masked cells (ggml-cpu ops.cpp,
    ggml_compute_forward_flash_attn_ext_f16_one_chunk: ``if (mv == -INFINITY) continue``; CUDA stops at the last
    unmasked KV tile), so they read only the cells in use — for a sliding-window layer at most n_swa of them
    (with --swa-full the cache is full-size, and the mask still hides cells outside the window)."""
    cache = kv_cells(spec, cfg, swa=spec.is_swa(il))
    fa = resolve_flash_attn(cfg)
    if spec.is_swa(il) and spec.sliding_window:
        return min(used, spec.sliding_window) if fa else n_kv_cells(used, cache)
    return min(used, cache) if fa else n_kv_cells(used, cache)


#: ggml-cpu ops.cpp, ggml_compute_forward_flash_attn_ext_f16: a single-token query over at least this many KV cells
#: (nek1, the graph's padded n_kv) is split across the threads by KV chunks, with a barrier and a reduction of the
#: partial softmaxes per head (``use_split_kv_path``); below it, the threads split the query heads.
FA_SPLIT_KV_MIN_CELLS = 512


def fa_split_kv(spec: ModelSpec, il: int, cfg: RunConfig, used: int) -> bool:
    """Whether layer ``il``'s decode attention takes the CPU flash-attention kernel's split-KV path when ``used``
    cells of its stream are occupied: flash attention on, K and V of one type, F16 or F32 (``kv_is_f32_or_f16 &&
    k->type == v->type``), and the graph's n_kv (:func:`n_kv_cells` of the layer's cache) at least
    :data:`FA_SPLIT_KV_MIN_CELLS`. One query token per sequence (``neq1 == 1``) — true of a decode step."""
    if not resolve_flash_attn(cfg) or not spec.has_kv(il):
        return False
    tk, tv = str(cfg.cache_type_k).lower(), str(cfg.cache_type_v).lower()
    if tk != tv or tk not in ("f16", "f32"):
        return False
    return n_kv_cells(used, kv_cells(spec, cfg, swa=spec.is_swa(il))) >= FA_SPLIT_KV_MIN_CELLS


def attn_sync_layer(spec: ModelSpec, il: int, cfg: RunConfig, used: int) -> bool:
    """Whether layer ``il``'s decode attention synchronises the CPU threads mid-attention over a long KV sweep (the
    cost the speed model charges per such layer): with flash attention, its split-KV path (:func:`fa_split_kv`:
    one barrier and a reduction of the partial softmaxes); without, the graph's own barriers — ggml-cpu
    (ggml/src/ggml-cpu/ggml-cpu.c, ggml_graph_compute_thread) waits at a barrier after every node, and the
    attention is three nodes (KQ mul_mat, soft_max_ext, KQV mul_mat; src/llama-graph.cpp, build_attn_mha) where
    flash attention is one (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16). So turning flash
    attention off never saves this cost: at the same n_kv both paths pay it."""
    if not spec.has_kv(il):
        return False
    if resolve_flash_attn(cfg):
        return fa_split_kv(spec, il, cfg, used)
    return n_kv_cells(used, kv_cells(spec, cfg, swa=spec.is_swa(il))) >= FA_SPLIT_KV_MIN_CELLS


def causal_cells(depth: int, n_prompt: int, window: int | None = None) -> float:
    """Σ over a prompt's tokens of the cells each one attends to (the causal mask src/llama-kv-cache.cpp
    ``llama_kv_cache::set_input_kq_mask`` builds): token i of the prompt sees depth + i + 1 cells, at most ``window``
    in a sliding-window layer."""
    a, n = depth + 1, n_prompt
    if window is None:
        return n * a + n * (n - 1) / 2
    m = min(max(window - a, 0), n)          # tokens still inside the window
    return m * a + m * (m - 1) / 2 + (n - m) * window


#: ggml/src/ggml-cpu/common.h: GGML_FA_TILE_Q and GGML_FA_TILE_KV, the tiles of CPU flash attention over a batch
FA_TILE_Q = 64
FA_TILE_KV = 64


def fa_prompt_cells(depth: int, n_prompt: int, window: int | None = None) -> float:
    """Σ over a prompt's tokens of the KV cells CPU flash attention computes for it. With at least FA_TILE_Q
    queries, ggml-cpu takes the tiled kernel (ggml/src/ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16:
    ``use_tiled`` when ``neq1 >= Q_TILE_SZ``; ggml_compute_forward_flash_attn_ext_tiled): a tile of 64 queries runs
    over the KV cells 64 at a time and skips a KV tile only where the mask hides all of it from every query of the
    tile (``can_skip``) — each query computes to the end of the KV tile that holds its tile's last visible cell,
    and, in a sliding-window layer, from the start of the tile that holds its tile's first. Fewer queries: the
    causal cells (:func:`causal_cells`). Cells count from 0 at the cache's first, as in a cache filled in order."""
    if n_prompt < FA_TILE_Q:
        return causal_cells(depth, n_prompt, window)
    total = 0.0
    for q0 in range(0, n_prompt, FA_TILE_Q):
        rows = min(FA_TILE_Q, n_prompt - q0)
        last = depth + q0 + rows - 1                              # the tile's last query sees cells 0..last
        first = max(0, depth + q0 - window + 1) if window else 0  # its first query's window starts here
        tiles = last // FA_TILE_KV - first // FA_TILE_KV + 1
        total += rows * tiles * FA_TILE_KV
    return total


# ------------------------------------------------------------------------------------------------
# KV bytes
# ------------------------------------------------------------------------------------------------


def kv_widths(spec: ModelSpec, il: int) -> tuple[int, int]:
    """(K width, V width) per cell of layer il: ``n_embd_k_gqa``, ``n_embd_v_gqa`` (src/llama-hparams.cpp).

    MLA (``hparams.is_mla()``: attention.key_length_mla and value_length_mla both set) keeps a K tensor only —
    src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache: ``has_v = !is_mla``, K is
    ``ggml_new_tensor_3d(ctx, type_k, n_embd_k_gqa, kv_size, n_stream)``. For deepseek2 the converter writes
    head_count_kv 1 and key_length = kv_lora_rank + qk_rope_head_dim, so a cell holds the compressed latent and the
    rotated part (src/models/deepseek2.cpp graph: ``Kcur = concat(kv_cmpr, k_pe)``, ``Vcur = kv_cmpr``, V read
    as a view of K). A legacy DeepSeek file (one attn_kv_b, no *_mla keys) is plain multi-head K and V."""
    if spec.is_mla:
        return spec.n_embd_k_gqa(il), 0
    return spec.n_embd_k_gqa(il), spec.n_embd_v_gqa(il)


def is_mtp_layer(spec: ModelSpec, il: int) -> bool:
    """Whether layer il is a multi-token-prediction (nextn) layer at the end of the stack. This llama.cpp build
    loads them only for an MTP draft context (llama_model_params.load_mtp, default false: their tensors are
    TENSOR_SKIP in load_arch_tensors) and gives them no KV cache in the main context (src/llama-model.cpp
    create_memory: ``filter = il < n_layer()`` when n_layer_nextn > 0)."""
    return spec.nextn_layers > 0 and il >= spec.n_layer - spec.nextn_layers


def has_kv_cache(spec: ModelSpec, il: int) -> bool:
    """Whether layer il has a KV cache in the main context: attention with KV heads (not recurrent), not MTP."""
    return spec.has_kv(il) and not is_mtp_layer(spec, il)


def kv_cell_bytes(spec: ModelSpec, il: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """Bytes one cell of layer il's cache takes (K and V rows; 0 for a layer without a cache) — one column of
    src/llama-kv-cache.cpp's ``ggml_new_tensor_3d(ctx, type_k, n_embd_k_gqa, kv_size, n_stream)`` and its V twin:
    ``ggml_row_size(type_k, n_embd_k_gqa) + ggml_row_size(type_v, n_embd_v_gqa)``."""
    if not has_kv_cache(spec, il):
        return 0
    wk, wv = kv_widths(spec, il)
    return row_size(type_k, wk) + (row_size(type_v, wv) if wv else 0)


def kv_bytes_per_token(spec: ModelSpec, type_k: str = "f16", type_v: str = "f16") -> int:
    """Bytes of K and V cache one token adds over the layers that have a cache (the seed's 2 × layers × KV heads ×
    head_dim × bytes, with GQA, MLA, SWA, recurrent and MTP layers as llama.cpp has them)."""
    return sum(kv_cell_bytes(spec, il, type_k, type_v) for il in range(spec.n_layer))


def kv_layer_bytes(spec: ModelSpec, cfg: RunConfig, il: int) -> int:
    """Bytes of layer il's KV cache (0 for layers without one: recurrent, n_head_kv == 0, or an MTP layer):
    :func:`kv_cell_bytes` × cells per stream (:func:`kv_cells`, the SWA cache's for an SWA layer) × streams —
    src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache."""
    per_cell = kv_cell_bytes(spec, il, cfg.cache_type_k, cfg.cache_type_v)
    if not per_cell:
        return 0
    return per_cell * kv_cells(spec, cfg, swa=spec.is_swa(il)) * context_sizes(spec, cfg).n_stream


def kv_cache_bytes(spec: ModelSpec, cfg: RunConfig, layers: Iterable[int] | None = None) -> int:
    """Total KV cache bytes over ``layers`` (default: all): the sum of :func:`kv_layer_bytes`."""
    layers = range(spec.n_layer) if layers is None else layers
    return sum(kv_layer_bytes(spec, cfg, il) for il in layers)


# ------------------------------------------------------------------------------------------------
# recurrent state (src/llama-memory-recurrent.cpp)
# ------------------------------------------------------------------------------------------------


def recurrent_state_floats(spec: ModelSpec) -> int:
    """F32 elements of one recurrent layer's state for one sequence: ``n_embd_r() + n_embd_s()`` —
    src/llama-hparams.cpp: conv state ``(d_conv - 1) × (d_inner + 2 × n_group × d_state)``, SSM state
    ``d_state × d_inner``. Qwen3.5 (gated delta net): 3 × 10240 + 128 × 6144 per layer."""
    d_conv = spec.ssm_conv_kernel or 0
    d_inner = spec.ssm_inner_size or 0
    d_state = spec.ssm_state_size or 0
    n_group = spec.ssm_group_count or 0
    n_r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    n_s = d_state * d_inner
    return n_r + n_s


def recurrent_layer_bytes(spec: ModelSpec, cfg: RunConfig, il: int) -> int:
    """Bytes of layer il's recurrent state (0 for other layers): :func:`recurrent_state_floats` F32 values per
    cell, with ``max(1, n_seq_max)`` cells — src/llama-model.cpp create_memory builds llama_memory_recurrent
    with GGML_TYPE_F32 R and S and ``mem_size = max(1, n_seq_max)``; independent of n_ctx."""
    if not spec.is_recurrent(il):
        return 0
    return recurrent_state_floats(spec) * F32 * max(1, cfg.n_parallel)


def recurrent_bytes(spec: ModelSpec, cfg: RunConfig, layers: Iterable[int] | None = None) -> int:
    """Total recurrent-state bytes over ``layers`` (default: all)."""
    layers = range(spec.n_layer) if layers is None else layers
    return sum(recurrent_layer_bytes(spec, cfg, il) for il in layers)
