"""llama.cpp's context arithmetic: cache cells per sequence, their padding, the cells a decoded token's
attention reads, row sizes of ggml types, and the size of a recurrent layer's state.

Each function mirrors the llama.cpp source named in its docstring or comment.
"""

from __future__ import annotations

import math

from v100lab.config import RunConfig
from v100lab.errors import ConfigError
from v100lab.spec import ModelSpec

# src/llama-kv-cache.cpp, llama_kv_cache::get_n_kv: n_kv is the used cells padded to 256 (at least 256,
# at most the cache size); the cache itself is n_ctx padded to 256.
KV_PAD = 256
# ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_device_offload_op: matmuls of weights kept in host

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
