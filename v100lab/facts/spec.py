"""Immutable descriptions of a GGUF model: its tensors and the hyperparameters llama.cpp derives.

``ModelSpec`` is what the header reader (``v100lab.gguf.header``) returns for a real file, what the
skeleton writer describes, and what the memory and speed models consume. Per-layer quantities are
methods taking the layer index ``il``, mirroring llama.cpp's ``llama_hparams`` (src/llama-hparams.h):
``n_head_kv(il)``, ``n_embd_k_gqa(il)``, ``n_embd_v_gqa(il)``, ``is_swa(il)``, ``is_recurrent(il)``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it. ``shape`` is GGUF order (ne0 first, ne0 contiguous)."""

    name: str
    shape: tuple[int, ...]
    type_name: str          # ggml type name, e.g. "Q4_K", "F16" (gguf.GGMLQuantizationType member name)
    n_bytes: int            # bytes of data: n_elements / block_size * type_size
    offset: int = 0         # offset of the data relative to the start of the data section
    layer: int | None = None  # blk.N → N; None for tensors outside the repeating layers

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _per_layer(value, il: int) -> int:
    if isinstance(value, tuple):
        return value[il]
    return value


@dataclass(frozen=True)
class ModelSpec:
    """Everything v100lab needs to know about a model, from its GGUF header alone."""

    architecture: str
    name: str
    file_type: str                      # "Q4_K_M", "Q4_0", "F16", ... (from general.file_type), or "unknown"
    n_layer: int                        # repeating blocks (block_count), nextn/MTP layers included
    n_embd: int
    n_ff: int | tuple[int, ...]
    n_head: int | tuple[int, ...]
    n_head_kv_arr: int | tuple[int, ...]   # as stored: int, or one value per layer
    head_dim_k: int                     # attention.key_length, else n_embd / n_head
    head_dim_v: int                     # attention.value_length, else n_embd / n_head
    n_ctx_train: int
    n_vocab: int
    tensors: tuple[TensorInfo, ...] = ()
    rope_freq_base: float | None = None
    rope_dimension_count: int | None = None
    sliding_window: int | None = None    # n_swa; None when the model has no SWA layers
    swa_layers: tuple[int, ...] = ()
    recurrent_layers: tuple[int, ...] = ()   # layers with recurrent state (SSM / linear attention), no KV
    nextn_layers: int = 0                    # MTP layers at the end (not used for plain decoding)
    # MLA (DeepSeek-style): attention.key_length_mla / value_length_mla are the per-head sizes after
    # decompression; with both set (llama_hparams::is_mla) the K cache holds kv_lora_rank + rope dims, no V cache
    kv_lora_rank: int | None = None
    key_length_mla: int | None = None
    value_length_mla: int | None = None
    q_lora_rank: int | None = None      # attention.q_lora_rank (0 or absent: one attn_q matrix)
    # MoE
    expert_count: int = 0
    expert_used_count: int = 0
    n_ff_exp: int = 0          # expert_feed_forward_length (0: llama.cpp uses n_ff / n_expert_used)
    n_ff_shexp: int = 0        # expert_shared_feed_forward_length (qwen35moe's shared expert; 0: none or n_ff)
    n_expert_shared: int = 0   # expert_shared_count (deepseek2: shared expert width n_ff_exp × this)
    n_layer_dense_lead: int = 0   # leading_dense_block_count (deepseek2: the first layers have a dense FFN)
    # recurrent / hybrid (mamba, gated delta net): ssm.* fields
    ssm_conv_kernel: int | None = None
    ssm_state_size: int | None = None
    ssm_group_count: int | None = None
    ssm_time_step_rank: int | None = None
    ssm_inner_size: int | None = None
    full_attention_interval: int | None = None
    # file layout
    alignment: int = 32
    header_bytes: int = 0      # bytes before the data section (metadata + tensor infos + padding)
    data_offset: int = 0
    file_bytes: int | None = None     # real file size; None for an in-memory description
    # every header key → value (arrays as tuples); not part of the hash (a mapping is unhashable)
    metadata: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    # ---- per-layer hyperparameters (llama_hparams) --------------------------------------
    def n_head_at(self, il: int) -> int:
        return _per_layer(self.n_head, il)

    def n_head_kv(self, il: int) -> int:
        return _per_layer(self.n_head_kv_arr, il)

    def n_ff_at(self, il: int) -> int:
        return _per_layer(self.n_ff, il)

    def n_embd_k_gqa(self, il: int) -> int:
        """llama_hparams::n_embd_k_gqa: key width per token in layer il."""
        return self.head_dim_k * self.n_head_kv(il)

    def n_embd_v_gqa(self, il: int) -> int:
        """llama_hparams::n_embd_v_gqa: value width per token in layer il."""
        return self.head_dim_v * self.n_head_kv(il)

    @property
    def is_mla(self) -> bool:
        """llama_hparams::is_mla (src/llama-hparams.cpp): key_length_mla and value_length_mla both non-zero —
        MLA with the absorbed k_b / v_b matrices, a K-only cache of ``key_length`` (= kv_lora_rank + n_rot) per
        cell. A legacy DeepSeek file (one attn_kv_b, no *_mla keys) is plain multi-head attention."""
        return bool(self.key_length_mla) and bool(self.value_length_mla)

    def is_moe_layer(self, il: int) -> bool:
        """Whether layer il routes experts (deepseek2: not the first n_layer_dense_lead layers)."""
        return self.expert_count > 0 and il >= self.n_layer_dense_lead

    def is_swa(self, il: int) -> bool:
        return il in self.swa_layers

    def is_recurrent(self, il: int) -> bool:
        return il in self.recurrent_layers

    def has_kv(self, il: int) -> bool:
        """Whether layer il owns a KV cache (not recurrent, n_head_kv > 0)."""
        return not self.is_recurrent(il) and self.n_head_kv(il) > 0

    # ---- tensor totals ---------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.weight_bytes / self.n_params if self.n_params else 0.0

    @property
    def layer_bytes(self) -> tuple[int, ...]:
        """Bytes of weights per repeating layer, index = layer."""
        out = [0] * self.n_layer
        for t in self.tensors:
            if t.layer is not None and 0 <= t.layer < self.n_layer:
                out[t.layer] += t.n_bytes
        return tuple(out)

    @property
    def nonlayer_bytes(self) -> int:
        """Bytes outside the repeating layers (token_embd, output, output_norm, ...)."""
        return sum(t.n_bytes for t in self.tensors if t.layer is None)

    @property
    def tensor_types(self) -> dict[str, int]:
        """ggml type name → number of tensors of that type."""
        return dict(Counter(t.type_name for t in self.tensors))

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None
