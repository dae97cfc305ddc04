"""llama-quantize's per-tensor type mixture, mirrored from llama.cpp so skeletons get real sizes.

A "Q4_K_M" file is not all Q4_K: llama.cpp's quantizer picks a type per tensor. This module mirrors
src/llama-quant.cpp (ggml-org/llama.cpp, the version vendored by llama-cpp-python 0.3.36; it has
``tensor_type_fallback`` with "no tensor type fallback is defined for type %s"):

* ``tensor_allows_quantization`` — which tensors are never quantized (1-D tensors, norms, biases,
  ``ffn_gate_inp``, ``ssm_conv1d``, positional embeddings, RWKV's small weights, ...);
* ``llama_tensor_get_type_impl`` — output.weight (and a tied token_embd) to Q6_K, attn_v /
  attn_qkv and ffn_down bumps (``use_more_bits``) for Q4_K_M / Q5_K_M, the Q3_K_M and Q2_K rules,
  MoE (8 experts) and 70B special cases;
* ``tensor_type_fallback`` — when ``ne0`` is not a multiple of the chosen type's block size
  (Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K → Q4_0, IQ* → IQ4_NL, else F16);
* the order the quantizer visits tensors (``llama_model_loader::weight_name_comparer``: tensors
  outside the layers first by name, then layer by layer, by name within a layer), which drives the
  ``i_attention_wv`` counter.

No importance matrix is assumed (``has_imatrix`` false), ``pure`` false, no overrides — the plain
``llama-quantize in.gguf out.gguf TYPE`` a user runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import gguf

from v100lab.base.errors import V100labError

QT = gguf.GGMLQuantizationType
FT = gguf.LlamaFileType

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def ftype_from_name(name: str) -> FT:
    """"Q4_K_M" → LlamaFileType.MOSTLY_Q4_K_M ("F32" → ALL_F32)."""
    key = name.upper()
    if key == "F32":
        return FT.ALL_F32
    try:
        return FT[f"MOSTLY_{key}"]
    except KeyError:
        known = ", ".join(t.name.removeprefix("MOSTLY_") for t in FT if t.name.startswith("MOSTLY_"))
        raise V100labError(f"unknown file type '{name}' (known: F32, {known})") from None


# llama-quant.cpp llama_ftype_get_default_type
_DEFAULT_TYPE = {
    FT.MOSTLY_Q4_0: QT.Q4_0, FT.MOSTLY_Q4_1: QT.Q4_1, FT.MOSTLY_Q5_0: QT.Q5_0, FT.MOSTLY_Q5_1: QT.Q5_1,
    FT.MOSTLY_Q8_0: QT.Q8_0, FT.MOSTLY_F16: QT.F16, FT.MOSTLY_BF16: QT.BF16, FT.ALL_F32: QT.F32,
    FT.MOSTLY_MXFP4_MOE: QT.MXFP4, FT.MOSTLY_Q2_K_S: QT.Q2_K, FT.MOSTLY_Q2_K: QT.Q2_K,
    FT.MOSTLY_IQ3_XS: QT.IQ3_S, FT.MOSTLY_Q3_K_S: QT.Q3_K, FT.MOSTLY_Q3_K_M: QT.Q3_K,
    FT.MOSTLY_Q3_K_L: QT.Q3_K, FT.MOSTLY_Q4_K_S: QT.Q4_K, FT.MOSTLY_Q4_K_M: QT.Q4_K,
    FT.MOSTLY_Q5_K_S: QT.Q5_K, FT.MOSTLY_Q5_K_M: QT.Q5_K, FT.MOSTLY_Q6_K: QT.Q6_K,
    FT.MOSTLY_TQ1_0: QT.TQ1_0, FT.MOSTLY_TQ2_0: QT.TQ2_0, FT.MOSTLY_IQ2_XXS: QT.IQ2_XXS,
    FT.MOSTLY_IQ2_XS: QT.IQ2_XS, FT.MOSTLY_IQ2_S: QT.IQ2_XS, FT.MOSTLY_IQ2_M: QT.IQ2_S,
    FT.MOSTLY_IQ3_XXS: QT.IQ3_XXS, FT.MOSTLY_IQ1_S: QT.IQ1_S, FT.MOSTLY_IQ1_M: QT.IQ1_M,
    FT.MOSTLY_IQ4_NL: QT.IQ4_NL, FT.MOSTLY_IQ4_XS: QT.IQ4_XS, FT.MOSTLY_IQ3_S: QT.IQ3_S,
    FT.MOSTLY_IQ3_M: QT.IQ3_S,
}
for _n in ("MOSTLY_NVFP4", "MOSTLY_Q1_0"):
    if hasattr(FT, _n) and hasattr(QT, _n.removeprefix("MOSTLY_")):
        _DEFAULT_TYPE[FT[_n]] = QT[_n.removeprefix("MOSTLY_")]

_NOT_QUANTIZED = (QT.F32, QT.F16, QT.BF16, QT.F64, QT.I8, QT.I16, QT.I32, QT.I64)


def default_type(ftype: FT) -> QT:
    try:
        return _DEFAULT_TYPE[ftype]
    except KeyError:
        raise V100labError(f"llama.cpp cannot quantize to file type {ftype.name}") from None


def is_quantized(t: QT) -> bool:
    """ggml_is_quantized: every type but the float and integer ones."""
    return t not in _NOT_QUANTIZED


def block_size(t: QT) -> int:
    return gguf.GGML_QUANT_SIZES[t][0]


def n_bytes(t: QT, shape: Sequence[int]) -> int:
    """ggml_nbytes for a contiguous tensor: elements / block size × bytes per block."""
    blk, size = gguf.GGML_QUANT_SIZES[t]
    n = 1
    for d in shape:
        n *= int(d)
    return n // blk * size


def n_dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of size 1 do not count; at least 1."""
    for i in range(len(shape) - 1, 0, -1):
        if shape[i] > 1:
            return i + 1
    return 1


# ------------------------------------------------------------------------------------------------
# categories (llama-quant.cpp tensor_get_category)
# ------------------------------------------------------------------------------------------------

TOKEN_EMBD, ATTN_Q, ATTN_V, ATTN_K, ATTN_QKV, ATTN_KV_B, ATTN_OUTPUT, FFN_UP, FFN_GATE, FFN_DOWN, OUTPUT, OTHER = (
    "token_embd", "attn_q", "attn_v", "attn_k", "attn_qkv", "attn_kv_b", "attn_output", "ffn_up",
    "ffn_gate", "ffn_down", "output", "other")


def category(name: str) -> str:
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for needle, cat in (("attn_qkv.weight", ATTN_QKV), ("attn_kv_b.weight", ATTN_KV_B),
                        ("attn_v.weight", ATTN_V), ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q),
                        ("attn_output.weight", ATTN_OUTPUT), ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE),
                        ("ffn_down", FFN_DOWN)):
        if needle in name:
            return cat
    return OTHER


def _is_attn_v(cat: str) -> bool:
    return cat in (ATTN_V, ATTN_QKV, ATTN_KV_B)


_NEVER = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
          "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
          "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
          "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
          "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
          "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
          "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
          "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")


def allows_quantization(name: str, shape: Sequence[int]) -> bool:
    """llama-quant.cpp tensor_allows_quantization (quantize_output_tensor true, only_copy false)."""
    if n_dims(shape) < 2:
        return False
    if not name.endswith("weight"):
        return False
    if any(s in name for s in _NEVER):
        return False
    if name in ("position_embd.weight", "token_types.weight"):
        return False
    return True


def weight_order_key(name: str) -> tuple[int, str]:
    """llama_model_loader::weight_name_comparer: layer number (-1 outside layers), then name."""
    m = _LAYER_RE.match(name)
    return (int(m.group(1)) if m else -1, name)


# ------------------------------------------------------------------------------------------------
# the mixture
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFacts:
    """The hyperparameters llama_tensor_get_type looks at."""

    arch: str
    n_layer_all: int          # hparams.n_layer_all: block_count, nextn layers included
    n_head: int               # n_head(0)
    n_head_kv: int            # n_head_kv(0)
    n_expert: int = 0
    is_70b: bool = False      # llama.cpp model.type == LLM_TYPE_70B (llama family, 80 layers)

    @property
    def n_gqa(self) -> int:
        """llama_hparams::n_gqa(0)."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    # llama-quant.cpp llama_tensor_get_type_impl: use_more_bits (C++ integer division, non-negative)
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


class _State:
    def __init__(self):
        self.n_attention_wv = 0
        self.i_attention_wv = 0
        self.i_ffn_down = 0
        self.i_ffn_gate = 0
        self.i_ffn_up = 0
        self.has_tied_embeddings = True


def _layer_info(st_i: int, n_layer: int, name: str, facts: ModelFacts) -> tuple[int, int]:
    if max(1, facts.n_expert) > 1:
        m = _LAYER_RE.match(name)
        if not m:
            raise V100labError(f"quantmix: cannot determine the layer of tensor {name}")
        return int(m.group(1)), n_layer
    return st_i, n_layer


def _get_type_impl(st: _State, new: QT, name: str, shape: Sequence[int], ft: FT, cat: str,
                   facts: ModelFacts) -> QT:
    """llama-quant.cpp llama_tensor_get_type_impl, branch for branch (has_imatrix = false)."""
    arch = facts.arch
    n_expert = facts.n_expert
    gqa = facts.n_gqa
    falcon = arch == "falcon"
    IQ_LOW = (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M,
              FT.MOSTLY_IQ1_M)
    if cat == OUTPUT or (st.has_tied_embeddings and cat == TOKEN_EMBD):
        nx = shape[0]
        qk_k = block_size(new)
        if ft == FT.MOSTLY_MXFP4_MOE:
            new = QT.Q8_0
        elif falcon or nx % qk_k != 0:
            new = QT.Q8_0
        elif ft in (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ3_XXS, FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ2_S,
                    FT.MOSTLY_IQ2_M, FT.MOSTLY_IQ1_M):
            new = QT.Q5_K
        elif new != QT.Q8_0:
            new = QT.Q6_K
    elif ft == FT.MOSTLY_MXFP4_MOE:
        new = QT.MXFP4 if len(shape) > 2 and shape[2] > 1 else QT.Q8_0
    elif cat == TOKEN_EMBD:
        if ft in (FT.MOSTLY_IQ2_XXS, FT.MOSTLY_IQ2_XS, FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ1_M):
            new = QT.Q2_K
        elif ft in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M, FT.MOSTLY_IQ3_XXS):
            new = QT.IQ3_S
        elif ft in (FT.MOSTLY_TQ1_0, FT.MOSTLY_TQ2_0):
            new = QT.Q4_K
    elif ft in IQ_LOW:
        if _is_attn_v(cat):
            if gqa >= 4 or n_expert >= 4:
                new = QT.Q4_K
            else:
                new = QT.IQ3_S if ft in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M) else QT.Q2_K
            st.i_attention_wv += 1
        elif n_expert == 8 and cat == ATTN_K:
            new = QT.Q4_K
        elif cat == FFN_DOWN:
            if st.i_ffn_down < facts.n_layer_all // 8:
                new = QT.IQ3_S if ft in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M) else QT.Q2_K
            st.i_ffn_down += 1
        elif cat == ATTN_OUTPUT:
            if n_expert == 8:
                new = QT.Q5_K
            elif ft in (FT.MOSTLY_IQ1_S, FT.MOSTLY_IQ1_M):
                new = QT.IQ2_XXS
            elif ft in (FT.MOSTLY_IQ2_S, FT.MOSTLY_IQ2_M):
                new = QT.IQ3_S
    elif _is_attn_v(cat):
        if ft == FT.MOSTLY_Q2_K:
            new = QT.Q4_K if gqa >= 4 else QT.Q3_K
        elif ft == FT.MOSTLY_Q2_K_S and gqa >= 4:
            new = QT.Q4_K
        elif ft == FT.MOSTLY_IQ3_XXS:
            new = QT.Q4_K if gqa >= 4 else QT.IQ3_S
        elif ft in (FT.MOSTLY_IQ3_XS, FT.MOSTLY_IQ3_S) and gqa >= 4:
            new = QT.Q4_K
        elif ft == FT.MOSTLY_IQ3_M:
            new = QT.Q4_K
        elif ft == FT.MOSTLY_Q3_K_M:
            new = QT.Q5_K if st.i_attention_wv < 2 else QT.Q4_K
        elif ft == FT.MOSTLY_Q3_K_L:
            new = QT.Q5_K
        elif ft in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS) and gqa >= 4:
            new = QT.Q5_K
        elif ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and _use_more_bits(st.i_attention_wv, st.n_attention_wv):
            new = QT.Q6_K
        elif ft == FT.MOSTLY_Q4_K_S and st.i_attention_wv < 4:
            new = QT.Q5_K
        if facts.is_70b and new in (QT.Q3_K, QT.Q4_K):
            new = QT.Q5_K
        if n_expert == 8:
            new = QT.Q8_0
        st.i_attention_wv += 1
    elif cat == ATTN_K:
        if n_expert == 8:
            new = QT.Q8_0
        elif ft == FT.MOSTLY_IQ3_XS:
            new = QT.IQ3_XXS
        elif ft == FT.MOSTLY_IQ3_XXS:
            new = QT.IQ2_S
    elif cat == ATTN_Q:
        if ft == FT.MOSTLY_IQ3_XS:
            new = QT.IQ3_XXS
        elif ft == FT.MOSTLY_IQ3_XXS:
            new = QT.IQ2_S
    elif cat == FFN_DOWN:
        i_layer, n_layer = _layer_info(st.i_ffn_down, facts.n_layer_all, name, facts)
        if ft == FT.MOSTLY_Q2_K:
            new = QT.Q3_K
        elif ft == FT.MOSTLY_Q2_K_S:
            if i_layer < n_layer // 8:
                new = QT.Q4_K
        elif ft == FT.MOSTLY_IQ3_XXS:
            new = QT.Q4_K if i_layer < n_layer // 8 else QT.Q3_K
        elif ft == FT.MOSTLY_Q3_K_M:
            new = (QT.Q5_K if i_layer < n_layer // 16
                   else QT.Q4_K if (not falcon or _use_more_bits(i_layer, n_layer)) else QT.Q3_K)
        elif ft == FT.MOSTLY_IQ3_M and (i_layer < n_layer // 8 or (n_expert == 8 and _use_more_bits(i_layer, n_layer))):
            new = QT.Q4_K
        elif ft == FT.MOSTLY_Q3_K_L:
            new = QT.Q4_K if falcon else QT.Q5_K
        elif ft == FT.MOSTLY_Q4_K_M:
            if falcon:
                new = (QT.Q6_K if i_layer < n_layer // 16
                       else QT.Q5_K if _use_more_bits(i_layer, n_layer) else QT.Q4_K)
            elif _use_more_bits(i_layer, n_layer):
                new = QT.Q6_K
        elif i_layer < n_layer // 8 and ft in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS):
            new = QT.Q5_K
        elif ft == FT.MOSTLY_Q5_K_M and _use_more_bits(i_layer, n_layer):
            new = QT.Q6_K
        elif ft == FT.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
            new = QT.Q5_K
        # (Q4_0/Q5_0 → Q4_1/Q5_1 in the first layers only with an imatrix)
        st.i_ffn_down += 1
    elif cat == ATTN_OUTPUT:
        if not falcon:
            if n_expert == 8:
                if ft in (FT.MOSTLY_Q2_K, FT.MOSTLY_IQ3_XS, FT.MOSTLY_IQ3_XXS, FT.MOSTLY_Q3_K_S, FT.MOSTLY_Q3_K_M,
                          FT.MOSTLY_IQ4_NL, FT.MOSTLY_Q4_K_S, FT.MOSTLY_Q4_K_M, FT.MOSTLY_IQ3_S, FT.MOSTLY_IQ3_M,
                          FT.MOSTLY_IQ4_XS):
                    new = QT.Q5_K
            else:
                if ft == FT.MOSTLY_Q2_K:
                    new = QT.Q3_K
                elif ft == FT.MOSTLY_IQ3_XXS:
                    new = QT.IQ3_S
                elif ft == FT.MOSTLY_Q3_K_M:
                    new = QT.Q4_K
                elif ft == FT.MOSTLY_Q3_K_L:
                    new = QT.Q5_K
                elif ft == FT.MOSTLY_IQ3_M:
                    new = QT.Q4_K
        elif ft == FT.MOSTLY_Q3_K_L:
            new = QT.Q4_K
    elif cat == ATTN_QKV:  # unreachable: attn_qkv is attn_v-like above (kept as in llama.cpp)
        pass
    elif cat == FFN_GATE:
        i_layer, n_layer = _layer_info(st.i_ffn_gate, facts.n_layer_all, name, facts)
        if ft == FT.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new = QT.IQ3_XXS
        st.i_ffn_gate += 1
    elif cat == FFN_UP:
        i_layer, n_layer = _layer_info(st.i_ffn_up, facts.n_layer_all, name, facts)
        if ft == FT.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
            new = QT.IQ3_XXS
        st.i_ffn_up += 1
    return new


_FALLBACK = {
    QT.IQ1_S: QT.IQ4_NL, QT.IQ1_M: QT.IQ4_NL, QT.IQ2_XXS: QT.IQ4_NL, QT.IQ2_XS: QT.IQ4_NL,
    QT.IQ2_S: QT.IQ4_NL, QT.IQ3_XXS: QT.IQ4_NL, QT.IQ3_S: QT.IQ4_NL, QT.IQ4_XS: QT.IQ4_NL,
    QT.Q2_K: QT.Q4_0, QT.Q3_K: QT.Q4_0, QT.TQ1_0: QT.Q4_0, QT.TQ2_0: QT.Q4_0,
    QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0,
}


def fallback(name: str, ne0: int, target: QT) -> QT:
    """llama-quant.cpp tensor_type_fallback: a type whose block size divides ne0."""
    if ne0 % block_size(target) == 0:
        return target
    try:
        new = _FALLBACK[target]
    except KeyError:
        raise V100labError(f"quantmix: no tensor type fallback is defined for type {target.name} "
                           f"(tensor {name}, ne0 {ne0})") from None
    if ne0 % block_size(new) != 0:
        new = QT.F16
    return new


def tensor_types(tensors: Iterable[tuple[str, Sequence[int], QT]], file_type: str | FT,
                 facts: ModelFacts) -> dict[str, QT]:
    """name → ggml type llama-quantize gives each tensor for ``file_type``.

    ``tensors``: (name, GGUF shape, source type) of the unquantized model (F16/BF16/F32 weights).
    Mirrors llama_model_quantize_impl's preliminary loop: counters from init_quantize_state_counters,
    tensors visited in weight_name_comparer order, then llama_tensor_get_type for each.
    """
    ft = file_type if isinstance(file_type, FT) else ftype_from_name(file_type)
    dflt = default_type(ft)
    items = sorted(((n, tuple(s), t) for n, s, t in tensors), key=lambda x: weight_order_key(x[0]))
    st = _State()
    for name, _, _ in items:
        cat = category(name)
        if _is_attn_v(cat):
            st.n_attention_wv += 1
        if cat == OUTPUT:
            st.has_tied_embeddings = False
    out: dict[str, QT] = {}
    for name, shape, src in items:
        if not allows_quantization(name, shape):
            out[name] = src
            continue
        new = dflt
        if is_quantized(dflt):
            new = _get_type_impl(st, new, name, shape, ft, category(name), facts)
            new = fallback(name, shape[0], new)
        out[name] = new
    return out
