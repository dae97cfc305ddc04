"""Models that exist only as a description: architecture spec → ModelSpec, or → header-only GGUF.

Planning the seed's 27B should not need its 16 GB file. An *architecture spec* (a small YAML file,
``v100lab/data/models/<name>.yaml``; the same files appear under ``params/models/`` as links for
people browsing the repository) holds the hyperparameters a GGUF header would; this module

* lays out the tensors llama.cpp's loader expects for that architecture (llama, mistral, qwen2,
  qwen3, gemma2, gemma3, the hybrid qwen35 with Gated DeltaNet layers, the MoE qwen3moe / qwen35moe, and
  deepseek2 with multi-head latent attention), with the shapes of
  ``llama_model::load_tensors`` (src/models/<arch>.cpp in llama.cpp);
* gives each tensor the type llama-quantize would (:mod:`v100lab.facts.quantmix`);
* serialises a real GGUF v3 header (metadata + tensor infos, no tensor data): a *skeleton*.

:func:`skeleton_spec` parses that header in memory with the same reader as real files
(:func:`v100lab.gguf.header.read_spec`), so a skeleton and a real file are described by one code path. The
model spelling ``skeleton:ARCH:QUANT`` is parsed here (:func:`parse_skeleton_name`); turning any model
argument into a ModelSpec is :func:`v100lab.models.resolve.resolve`.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Mapping

import gguf
import yaml

from v100lab.base.errors import ConfigError
from v100lab.gguf.header import read_spec
from v100lab.facts.quantmix import ModelFacts, QT, ftype_from_name, n_bytes, tensor_types, weight_order_key
from v100lab.facts.spec import ModelSpec
from v100lab.base.safeio import load_yaml

VT = gguf.GGUFValueType
ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT

# The architecture-spec schema: key → (type, required). One source of truth for validation.
_SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "architecture": (str, True),
    "name": (str, True),
    "n_layer": (int, True),
    "n_embd": (int, True),
    "n_ff": (int, True),
    "n_head": (int, True),
    "n_head_kv": ((int, list), True),
    "head_dim_k": (int, False),
    "head_dim_v": (int, False),
    "n_ctx_train": (int, True),
    "n_vocab": (int, True),
    "rope_freq_base": ((int, float), False),
    "rope_dimension_count": (int, False),
    "rms_eps": ((int, float), False),
    "tied_embeddings": (bool, False),
    "sliding_window": ((int, type(None)), False),
    "full_attention_interval": (int, False),
    "nextn_layers": (int, False),
    "ssm": (dict, False),
    "rope_sections": (list, False),
    "expert_count": (int, False),
    "expert_used_count": (int, False),
    "expert_ff": (int, False),
    "expert_shared_ff": (int, False),
    # deepseek2 (MLA): the converter's form — n_head_kv 1, head_dim_k = kv_lora_rank + rope_dimension_count,
    # head_dim_v = kv_lora_rank; head_dim_k_mla / head_dim_v_mla the per-head sizes after decompression
    "q_lora_rank": (int, False),
    "kv_lora_rank": (int, False),
    "head_dim_k_mla": (int, False),
    "head_dim_v_mla": (int, False),
    "leading_dense_blocks": (int, False),
    "expert_shared_count": (int, False),
    "expert_gating": (str, False),
    "expert_weights_scale": ((int, float), False),
    "expert_weights_norm": (bool, False),
    "expert_probs_bias": (bool, False),
    "source_type": (str, False),
    "assumption": (str, False),
    "sources": (list, False),
}
_SSM_KEYS = ("conv_kernel", "state_size", "group_count", "time_step_rank", "inner_size")
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "qwen35", "qwen3moe", "qwen35moe", "deepseek2")
HYBRID_ARCHS = ("qwen35", "qwen35moe")     # gated delta net + full attention every n-th layer
MOE_ARCHS = ("qwen3moe", "qwen35moe", "deepseek2")   # routed experts (qwen35moe, deepseek2: plus shared experts)
MLA_ARCHS = ("deepseek2",)                 # multi-head latent attention (absorbed attn_k_b / attn_v_b)
# src/llama-hparams.h llama_expert_gating_func_type (gguf-py ExpertGatingFuncType)
EXPERT_GATING = {"softmax": 1, "sigmoid": 2}


# ------------------------------------------------------------------------------------------------
# architecture specs
# ------------------------------------------------------------------------------------------------

def arch_dir():
    """The shipped architecture specs (package data, so they exist in a non-editable install)."""
    return resources.files("v100lab") / "data" / "models"


def arch_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in arch_dir().iterdir() if p.name.endswith(".yaml"))


def load_arch(name_or_path: str | os.PathLike) -> dict:
    """A validated architecture spec: a path to a YAML file, or a shipped name like ``qwen35-27b``."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        raw, where = path.read_text(), str(path)
    else:
        res = arch_dir() / f"{text}.yaml"
        if not res.is_file():
            raise ConfigError(f"unknown architecture spec '{text}' (shipped: {', '.join(arch_names())}; "
                              "or give a path to a YAML file)")
        raw, where = res.read_text(), f"{text}.yaml"
    try:
        data = load_yaml(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid YAML: nested too deeply") from None
    return validate_arch(data, where)


def validate_arch(arch: Mapping, where: str = "architecture spec") -> dict:
    if not isinstance(arch, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(arch).__name__}")
    out = dict(arch)
    for key in out:
        if key not in _SCHEMA:
            raise ConfigError(f"{where}: unknown key '{key}' (known: {', '.join(_SCHEMA)})")
    for key, (typ, required) in _SCHEMA.items():
        if key not in out:
            if required:
                raise ConfigError(f"{where}: missing key '{key}'")
            continue
        v = out[key]
        if not isinstance(v, typ) or (isinstance(v, bool) and typ is int):
            raise ConfigError(f"{where}: '{key}' has the wrong type ({type(v).__name__})")
    if out["architecture"] not in ARCHS:
        raise ConfigError(f"{where}: architecture '{out['architecture']}' has no tensor layout here "
                          f"(supported: {', '.join(ARCHS)})")
    for key in ("n_layer", "n_embd", "n_ff", "n_head", "n_ctx_train", "n_vocab"):
        if out[key] <= 0:
            raise ConfigError(f"{where}: '{key}' must be positive, got {out[key]}")
    kv = out["n_head_kv"]
    if isinstance(kv, list):
        if len(kv) != out["n_layer"] or not all(isinstance(x, int) and x >= 0 for x in kv):
            raise ConfigError(f"{where}: 'n_head_kv' list must hold {out['n_layer']} non-negative integers")
    elif kv <= 0:
        raise ConfigError(f"{where}: 'n_head_kv' must be positive, got {kv}")
    if out["architecture"] in HYBRID_ARCHS:
        ssm = out.get("ssm")
        if not isinstance(ssm, Mapping) or any(not isinstance(ssm.get(k), int) for k in _SSM_KEYS):
            raise ConfigError(f"{where}: {out['architecture']} needs 'ssm' with integer {', '.join(_SSM_KEYS)}")
    if out["architecture"] in MOE_ARCHS:
        for k in ("expert_count", "expert_used_count", "expert_ff"):
            if not isinstance(out.get(k), int) or isinstance(out.get(k), bool) or out[k] <= 0:
                raise ConfigError(f"{where}: {out['architecture']} needs a positive integer '{k}'")
        if out["expert_used_count"] > out["expert_count"]:
            raise ConfigError(f"{where}: 'expert_used_count' {out['expert_used_count']} exceeds 'expert_count' "
                              f"{out['expert_count']}")
    if out["architecture"] in MLA_ARCHS:
        _validate_mla(out, where)
    sec = out.get("rope_sections")
    if sec is not None and (len(sec) != 4 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                      for x in sec)):
        raise ConfigError(f"{where}: 'rope_sections' must be 4 non-negative integers")
    if out.get("ssm") is not None:
        for k in out["ssm"]:
            if k not in _SSM_KEYS:
                raise ConfigError(f"{where}: unknown key 'ssm.{k}' (known: {', '.join(_SSM_KEYS)})")
    src = out.get("source_type", "F16").upper()
    if src not in ("F16", "BF16", "F32"):
        raise ConfigError(f"{where}: source_type must be F16, BF16 or F32, got {src}")
    return out


def _is_lite(a: Mapping) -> bool:
    """src/models/deepseek2.cpp load_arch_hparams: the "lite" variants (26 or 27 layers, or 48 with a 128256-token
    vocabulary) have no q_lora_rank key (one attn_q matrix); every other deepseek2 file must carry it."""
    return a["n_layer"] in (26, 27) or (a["n_layer"] == 48 and a["n_vocab"] == 128256)


def _validate_mla(out: dict, where: str) -> None:
    """deepseek2 in the form this build's converter writes (conversion/deepseek.py DeepseekV2Model: MLA as MQA,
    the absorbed attn_k_b / attn_v_b): the checks llama.cpp's loader makes, as one-line errors."""
    for k in ("kv_lora_rank", "head_dim_k_mla", "head_dim_v_mla", "rope_dimension_count", "expert_shared_count"):
        if not isinstance(out.get(k), int) or isinstance(out.get(k), bool) or out[k] < (0 if k == "expert_shared_count" else 1):
            raise ConfigError(f"{where}: deepseek2 needs a positive integer '{k}'")
    rope, r = out["rope_dimension_count"], out["kv_lora_rank"]
    if out["head_dim_k_mla"] - rope < 1:
        # src/models/deepseek2.cpp load_arch_tensors: GGML_ASSERT(n_embd_head_qk_nope >= 1)
        raise ConfigError(f"{where}: head_dim_k_mla {out['head_dim_k_mla']} must exceed rope_dimension_count {rope}")
    if out["n_head_kv"] != 1 or out.get("head_dim_k") != r + rope or out.get("head_dim_v") != r:
        raise ConfigError(f"{where}: deepseek2 with MLA is stored as MQA: n_head_kv 1, head_dim_k = kv_lora_rank + "
                          f"rope_dimension_count ({r + rope}), head_dim_v = kv_lora_rank ({r})")
    q = out.get("q_lora_rank")
    if q is None and not _is_lite(out):
        raise ConfigError(f"{where}: deepseek2 with {out['n_layer']} layers needs 'q_lora_rank' (llama.cpp reads "
                          "attention.q_lora_rank unless the model is a 26/27-layer 'lite' one; 0: one attn_q matrix)")
    if q is not None and q < 0:
        raise ConfigError(f"{where}: 'q_lora_rank' must be >= 0, got {q}")
    lead = out.get("leading_dense_blocks", 0)
    if not 0 <= lead <= out["n_layer"]:
        raise ConfigError(f"{where}: 'leading_dense_blocks' {lead} must be between 0 and n_layer {out['n_layer']}")
    g = out.get("expert_gating")
    if g is not None and g not in EXPERT_GATING:
        raise ConfigError(f"{where}: 'expert_gating' must be one of {', '.join(EXPERT_GATING)}, got '{g}'")


# ------------------------------------------------------------------------------------------------
# tensor layout (GGUF shapes: ne0 first)
# ------------------------------------------------------------------------------------------------

def _kv(a: dict, il: int) -> int:
    kv = a["n_head_kv"]
    return kv[il] if isinstance(kv, list) else kv


def _head_dims(a: dict) -> tuple[int, int]:
    hd = a["n_embd"] // a["n_head"]
    return a.get("head_dim_k", hd), a.get("head_dim_v", hd)


def _recurrent(a: dict) -> set[int]:
    if a["architecture"] not in HYBRID_ARCHS:
        return set()
    n_main = a["n_layer"] - a.get("nextn_layers", 0)
    fai = a.get("full_attention_interval", 4)
    # llama.cpp src/models/qwen35.cpp load_arch_hparams: is_recr = i < n_layer() && (i+1) % interval != 0
    return {i for i in range(a["n_layer"]) if i < n_main and (i + 1) % fai != 0}


def tensor_layout(a: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, GGUF shape, role) of every tensor; role "matrix" (source_type) or "f32" (kept F32).

    Shapes are those of llama.cpp's ``load_arch_tensors`` (src/models/<arch>.cpp) for each architecture."""
    arch = a["architecture"]
    E, F, H = a["n_embd"], a["n_ff"], a["n_head"]
    hk, hv = _head_dims(a)
    V = a["n_vocab"]
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (E, V), "matrix"),
                                                   ("output_norm.weight", (E,), "f32")]
    tied = a.get("tied_embeddings", arch in ("gemma2", "gemma3"))
    if not tied:
        out.append(("output.weight", (E, V), "matrix"))
    recurrent = _recurrent(a)
    for il in range(a["n_layer"]):
        b = f"blk.{il}."
        kv = _kv(a, il)
        out.append((b + "attn_norm.weight", (E,), "f32"))
        if arch in MLA_ARCHS:
            out += _mla_layer(a, il)
            continue
        if arch in HYBRID_ARCHS:
            # llama.cpp src/models/qwen35.cpp (qwen35moe.cpp) load_arch_tensors, load_block_trunk
            out.append((b + "post_attention_norm.weight", (E,), "f32"))
            if il in recurrent:
                s = a["ssm"]
                key_dim = s["state_size"] * s["group_count"]
                value_dim = s["state_size"] * s["time_step_rank"]
                conv_dim = 2 * key_dim + value_dim
                out += [(b + "attn_qkv.weight", (E, conv_dim), "matrix"),
                        (b + "attn_gate.weight", (E, value_dim), "matrix"),
                        (b + "ssm_conv1d.weight", (s["conv_kernel"], conv_dim), "f32"),
                        (b + "ssm_dt.bias", (s["time_step_rank"],), "f32"),
                        (b + "ssm_a", (s["time_step_rank"],), "f32"),
                        (b + "ssm_beta.weight", (E, s["time_step_rank"]), "matrix"),
                        (b + "ssm_alpha.weight", (E, s["time_step_rank"]), "matrix"),
                        (b + "ssm_norm.weight", (s["state_size"],), "f32"),
                        (b + "ssm_out.weight", (value_dim, E), "matrix")]
            else:
                out += [(b + "attn_q.weight", (E, hk * H * 2), "matrix"),   # query and gate
                        (b + "attn_k.weight", (E, hk * kv), "matrix"),
                        (b + "attn_v.weight", (E, hv * kv), "matrix"),
                        (b + "attn_output.weight", (hk * H, E), "matrix"),
                        (b + "attn_q_norm.weight", (hk,), "f32"),
                        (b + "attn_k_norm.weight", (hk,), "f32")]
        else:
            out += [(b + "attn_q.weight", (E, hk * H), "matrix"),
                    (b + "attn_k.weight", (E, hk * kv), "matrix"),
                    (b + "attn_v.weight", (E, hv * kv), "matrix"),
                    (b + "attn_output.weight", (hv * H, E), "matrix")]
            if arch == "qwen2":
                out += [(b + "attn_q.bias", (hk * H,), "f32"), (b + "attn_k.bias", (hk * kv,), "f32"),
                        (b + "attn_v.bias", (hv * kv,), "f32")]
            if arch in ("qwen3", "gemma3", "qwen3moe"):
                out += [(b + "attn_q_norm.weight", (hk,), "f32"), (b + "attn_k_norm.weight", (hk,), "f32")]
            if arch in ("gemma2", "gemma3"):
                out += [(b + "post_attention_norm.weight", (E,), "f32"),
                        (b + "post_ffw_norm.weight", (E,), "f32")]
            out.append((b + "ffn_norm.weight", (E,), "f32"))
        if arch in MOE_ARCHS:
            # llama.cpp src/models/qwen3moe.cpp / qwen35moe.cpp load_arch_tensors: router (never quantized:
            # llama-quant.cpp tensor_allows_quantization skips ffn_gate_inp), experts stacked on ne2
            X, Fx = a["expert_count"], a["expert_ff"]
            out += [(b + "ffn_gate_inp.weight", (E, X), "f32"),
                    (b + "ffn_gate_exps.weight", (E, Fx, X), "matrix"),
                    (b + "ffn_up_exps.weight", (E, Fx, X), "matrix"),
                    (b + "ffn_down_exps.weight", (Fx, E, X), "matrix")]
            if arch == "qwen35moe":
                # shared expert: n_ff_shexp = expert_shared_feed_forward_length, else n_ff
                Fs = a.get("expert_shared_ff", F)
                out += [(b + "ffn_gate_inp_shexp.weight", (E,), "f32"),
                        (b + "ffn_gate_shexp.weight", (E, Fs), "matrix"),
                        (b + "ffn_up_shexp.weight", (E, Fs), "matrix"),
                        (b + "ffn_down_shexp.weight", (Fs, E), "matrix")]
        else:
            out += [(b + "ffn_gate.weight", (E, F), "matrix"), (b + "ffn_up.weight", (E, F), "matrix"),
                    (b + "ffn_down.weight", (F, E), "matrix")]
    return out


def _mla_layer(a: dict, il: int) -> list[tuple[str, tuple[int, ...], str]]:
    """One deepseek2 layer after attn_norm: llama.cpp src/models/deepseek2.cpp load_arch_tensors with
    ``is_mla()`` (the split, absorbed attn_k_b / attn_v_b of newer conversions; a legacy attn_kv_b file is not
    described here), the leading dense layers' FFN, then routed experts (optional exp_probs_b selection bias)
    and ``expert_shared_count`` shared experts of ``expert_ff`` each."""
    b = f"blk.{il}."
    E, F, H = a["n_embd"], a["n_ff"], a["n_head"]
    rope, r = a["rope_dimension_count"], a["kv_lora_rank"]
    k_mla, v_mla = a["head_dim_k_mla"], a["head_dim_v_mla"]
    q = a.get("q_lora_rank") or 0
    out: list[tuple[str, tuple[int, ...], str]] = []
    if q > 0:
        out += [(b + "attn_q_a_norm.weight", (q,), "f32")]
    out += [(b + "attn_kv_a_norm.weight", (r,), "f32")]
    if q > 0:
        out += [(b + "attn_q_a.weight", (E, q), "matrix"), (b + "attn_q_b.weight", (q, H * k_mla), "matrix")]
    else:
        out += [(b + "attn_q.weight", (E, H * k_mla), "matrix")]
    out += [(b + "attn_kv_a_mqa.weight", (E, r + rope), "matrix"),
            (b + "attn_k_b.weight", (k_mla - rope, r, H), "matrix"),
            (b + "attn_v_b.weight", (r, v_mla, H), "matrix"),
            (b + "attn_output.weight", (H * v_mla, E), "matrix"),
            (b + "ffn_norm.weight", (E,), "f32")]
    if il < a.get("leading_dense_blocks", 0):
        return out + [(b + "ffn_gate.weight", (E, F), "matrix"), (b + "ffn_down.weight", (F, E), "matrix"),
                      (b + "ffn_up.weight", (E, F), "matrix")]
    X, Fx, S = a["expert_count"], a["expert_ff"], a["expert_shared_count"]
    out.append((b + "ffn_gate_inp.weight", (E, X), "f32"))       # never quantized (tensor_allows_quantization)
    if a.get("expert_probs_bias"):
        out.append((b + "exp_probs_b.bias", (X,), "f32"))
    out += [(b + "ffn_down_exps.weight", (Fx, E, X), "matrix"), (b + "ffn_gate_exps.weight", (E, Fx, X), "matrix"),
            (b + "ffn_up_exps.weight", (E, Fx, X), "matrix")]
    if S:
        out += [(b + "ffn_gate_shexp.weight", (E, Fx * S), "matrix"), (b + "ffn_down_shexp.weight", (Fx * S, E), "matrix"),
                (b + "ffn_up_shexp.weight", (E, Fx * S), "matrix")]
    return out


# ------------------------------------------------------------------------------------------------
# metadata
# ------------------------------------------------------------------------------------------------

def arch_metadata(a: dict, file_type: str,
                  description: str = "v100lab skeleton: header only, no tensor data") -> list[tuple[str, object, object]]:
    """(key, value, GGUFValueType or (ARRAY, element type)) in the order a converter writes them."""
    arch = a["architecture"]
    ft = ftype_from_name(file_type)
    p = f"{arch}."
    md: list[tuple[str, object, object]] = [
        ("general.architecture", arch, VT.STRING),
        ("general.type", "model", VT.STRING),
        ("general.name", a["name"], VT.STRING),
        ("general.description", description, VT.STRING),
        (p + "block_count", a["n_layer"], VT.UINT32),
        (p + "context_length", a["n_ctx_train"], VT.UINT32),
        (p + "embedding_length", a["n_embd"], VT.UINT32),
        (p + "feed_forward_length", a["n_ff"], VT.UINT32),
        (p + "attention.head_count", a["n_head"], VT.UINT32),
    ]
    kv = a["n_head_kv"]
    if isinstance(kv, list):
        md.append((p + "attention.head_count_kv", kv, (VT.ARRAY, VT.UINT32)))
    else:
        md.append((p + "attention.head_count_kv", kv, VT.UINT32))
    hk, hv = _head_dims(a)
    if "head_dim_k" in a or hk != a["n_embd"] // a["n_head"]:
        md.append((p + "attention.key_length", hk, VT.UINT32))
    if "head_dim_v" in a or hv != a["n_embd"] // a["n_head"]:
        md.append((p + "attention.value_length", hv, VT.UINT32))
    md.append((p + "attention.layer_norm_rms_epsilon", float(a.get("rms_eps", 1e-6)), VT.FLOAT32))
    if a.get("rope_freq_base") is not None:
        md.append((p + "rope.freq_base", float(a["rope_freq_base"]), VT.FLOAT32))
    if a.get("rope_dimension_count") is not None:
        md.append((p + "rope.dimension_count", a["rope_dimension_count"], VT.UINT32))
    if a.get("rope_sections") is not None:
        # required by qwen35/qwen35moe (load_arch_hparams: get_key_or_arr(LLM_KV_ROPE_DIMENSION_SECTIONS, ..., 4, true))
        md.append((p + "rope.dimension_sections", list(a["rope_sections"]), (VT.ARRAY, VT.INT32)))
    if a.get("sliding_window"):
        md.append((p + "attention.sliding_window", a["sliding_window"], VT.UINT32))
    if a.get("full_attention_interval") is not None:
        md.append((p + "full_attention_interval", a["full_attention_interval"], VT.UINT32))
    if a.get("nextn_layers"):
        md.append((p + "nextn_predict_layers", a["nextn_layers"], VT.UINT32))
    for k in _SSM_KEYS:
        if a.get("ssm") and k in a["ssm"]:
            md.append((p + f"ssm.{k}", a["ssm"][k], VT.UINT32))
    for key, gguf_key in (("expert_count", "expert_count"), ("expert_used_count", "expert_used_count"),
                          ("expert_ff", "expert_feed_forward_length"),
                          ("expert_shared_ff", "expert_shared_feed_forward_length")):
        if a.get(key) is not None:
            md.append((p + gguf_key, a[key], VT.UINT32))
    if arch in MLA_ARCHS:
        # the keys conversion/deepseek.py DeepseekV2Model.set_gguf_parameters writes (src/models/deepseek2.cpp
        # load_arch_hparams reads them; q_lora_rank is absent in a "lite" model)
        md.append((p + "leading_dense_block_count", a.get("leading_dense_blocks", 0), VT.UINT32))
        if a.get("q_lora_rank") is not None:
            md.append((p + "attention.q_lora_rank", a["q_lora_rank"], VT.UINT32))
        md += [(p + "attention.kv_lora_rank", a["kv_lora_rank"], VT.UINT32),
               (p + "attention.key_length_mla", a["head_dim_k_mla"], VT.UINT32),
               (p + "attention.value_length_mla", a["head_dim_v_mla"], VT.UINT32),
               (p + "expert_shared_count", a["expert_shared_count"], VT.UINT32)]
        if a.get("expert_weights_scale") is not None:
            md.append((p + "expert_weights_scale", float(a["expert_weights_scale"]), VT.FLOAT32))
        if a.get("expert_weights_norm"):
            md.append((p + "expert_weights_norm", True, VT.BOOL))
        if a.get("expert_gating") is not None:
            md.append((p + "expert_gating_func", EXPERT_GATING[a["expert_gating"]], VT.UINT32))
    md += [(p + "vocab_size", a["n_vocab"], VT.UINT32),
           ("general.quantization_version", 2, VT.UINT32),
           ("general.file_type", int(ft), VT.UINT32)]
    return md


# ------------------------------------------------------------------------------------------------
# GGUF v3 serialisation (header only)
# ------------------------------------------------------------------------------------------------

_FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
        VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v, vtype) -> bytes:
    if isinstance(vtype, tuple):
        _, et = vtype
        out = struct.pack("<IIQ", VT.ARRAY, et, len(v))
        if et == VT.STRING:
            return out + b"".join(_str(x) for x in v)
        return out + b"".join(struct.pack(_FMT[et], x) for x in v)
    if vtype == VT.STRING:
        return struct.pack("<I", VT.STRING) + _str(v)
    return struct.pack("<I", vtype) + struct.pack(_FMT[vtype], v)


def header_bytes(metadata: list[tuple[str, object, object]],
                 tensors: list[tuple[str, tuple[int, ...], QT]]) -> bytes:
    """A GGUF v3 header (magic … tensor infos, padded to the alignment) for these tensors, laid
    out back to back with alignment padding, as gguf.cpp expects."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, v, vt in metadata:
        parts += [_str(key), _value(v, vt)]
    offset = 0
    for name, shape, qtype in tensors:
        parts += [_str(name), struct.pack("<I", len(shape)), struct.pack(f"<{len(shape)}q", *shape),
                  struct.pack("<iQ", int(qtype), offset)]
        offset += -(-n_bytes(qtype, shape) // ALIGNMENT) * ALIGNMENT
    raw = b"".join(parts)
    return raw + b"\0" * (-len(raw) % ALIGNMENT)


def _facts(a: dict) -> ModelFacts:
    arch = a["architecture"]
    return ModelFacts(arch=arch, n_layer_all=a["n_layer"], n_head=a["n_head"], n_head_kv=_kv(a, 0),
                      n_expert=a.get("expert_count", 0), is_70b=arch == "llama" and a["n_layer"] == 80)


def skeleton_tensors(a: dict, file_type: str) -> list[tuple[str, tuple[int, ...], QT]]:
    """(name, shape, ggml type) in llama-quantize's output order, with its per-tensor mixture."""
    src = QT[a.get("source_type", "F16").upper()]
    layout = tensor_layout(a)
    unquant = [(n, s, src if role == "matrix" else QT.F32) for n, s, role in layout]
    types = tensor_types(unquant, file_type, _facts(a))
    ordered = sorted(layout, key=lambda x: weight_order_key(x[0]))
    return [(n, s, types[n]) for n, s, _ in ordered]


def _as_arch(arch: dict | str | os.PathLike) -> dict:
    if isinstance(arch, Mapping):
        return validate_arch(arch)
    return load_arch(arch)


def skeleton_header(arch: dict | str | os.PathLike, file_type: str) -> bytes:
    a = _as_arch(arch)
    return header_bytes(arch_metadata(a, file_type), skeleton_tensors(a, file_type))


def skeleton_spec(arch: dict | str | os.PathLike, file_type: str) -> ModelSpec:
    """The ModelSpec of ``arch`` quantized to ``file_type`` by llama-quantize, built in memory.

    ``file_bytes`` is None (no file); ``header_bytes`` is the skeleton header's real size."""
    spec = read_spec(io.BytesIO(skeleton_header(arch, file_type)))
    return replace(spec, file_bytes=None)


# ------------------------------------------------------------------------------------------------
# the ``skeleton:ARCH:QUANT`` model spelling (the one parser of it)
# ------------------------------------------------------------------------------------------------

SKELETON_PREFIX = "skeleton:"


def is_skeleton_name(model) -> bool:
    """Whether ``model`` is spelled ``skeleton:...`` (a model described, not downloaded)."""
    return isinstance(model, (str, os.PathLike)) and os.fspath(model).startswith(SKELETON_PREFIX)


def parse_skeleton_name(model: str | os.PathLike) -> tuple[str, str] | None:
    """``(ARCH, QUANT)`` of ``skeleton:ARCH:QUANT`` (QUANT upper-cased), None for any other model name.

    ARCH is a shipped architecture name or a YAML path; the quant is after the *last* colon, so a path
    that holds a colon still parses."""
    if not is_skeleton_name(model):
        return None
    text = os.fspath(model)
    rest = text[len(SKELETON_PREFIX):]
    arch, sep, quant = rest.rpartition(":")
    if not sep:
        raise ConfigError(f"model '{text}': a skeleton is written skeleton:ARCH:QUANT; no ':QUANT' after '{rest}'")
    if not arch:
        raise ConfigError(f"model '{text}': a skeleton is written skeleton:ARCH:QUANT; ARCH is empty")
    if not quant:
        raise ConfigError(f"model '{text}': a skeleton is written skeleton:ARCH:QUANT; QUANT is empty")
    return arch, quant.upper()


def write_skeleton(arch: dict | str | os.PathLike, file_type: str, path: str | os.PathLike) -> Path:
    """Write a header-only GGUF (no tensor data) that :func:`v100lab.gguf.header.read_spec` accepts."""
    data = skeleton_header(arch, file_type)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def arch_spec_of(spec: ModelSpec) -> dict | None:
    """An architecture spec (this module's schema) for the shapes in ``spec``'s header, so the same model can
    be described at other quants without building their files; None when there is no tensor layout here for
    the architecture (or its shapes vary per layer in a way the schema cannot say). The recurrent (``ssm``)
    and expert facts are written for the architectures that have them (:data:`HYBRID_ARCHS`,
    :data:`MOE_ARCHS`)."""
    if spec.architecture not in ARCHS or not isinstance(spec.n_ff, int) or not isinstance(spec.n_head, int):
        return None
    a: dict = {
        "architecture": spec.architecture, "name": spec.name or spec.architecture,
        "n_layer": spec.n_layer, "n_embd": spec.n_embd, "n_ff": spec.n_ff, "n_head": spec.n_head,
        "n_head_kv": list(spec.n_head_kv_arr) if isinstance(spec.n_head_kv_arr, tuple) else spec.n_head_kv_arr,
        "head_dim_k": spec.head_dim_k, "head_dim_v": spec.head_dim_v, "n_ctx_train": spec.n_ctx_train or 4096,
        "n_vocab": spec.n_vocab, "tied_embeddings": spec.tensor("output.weight") is None, "source_type": "F16",
    }
    if spec.rope_freq_base:
        a["rope_freq_base"] = float(spec.rope_freq_base)
    if spec.rope_dimension_count:
        a["rope_dimension_count"] = int(spec.rope_dimension_count)
    if spec.sliding_window:
        a["sliding_window"] = int(spec.sliding_window)
    if spec.full_attention_interval:
        a["full_attention_interval"] = int(spec.full_attention_interval)
    if spec.nextn_layers:
        a["nextn_layers"] = int(spec.nextn_layers)
    if spec.architecture in HYBRID_ARCHS:
        a["ssm"] = {"conv_kernel": spec.ssm_conv_kernel, "state_size": spec.ssm_state_size,
                    "group_count": spec.ssm_group_count, "time_step_rank": spec.ssm_time_step_rank,
                    "inner_size": spec.ssm_inner_size}
    if spec.architecture in MOE_ARCHS:
        a.update(expert_count=spec.expert_count, expert_used_count=spec.expert_used_count)
        if spec.n_ff_exp:
            a["expert_ff"] = spec.n_ff_exp
        if spec.n_ff_shexp:
            a["expert_shared_ff"] = spec.n_ff_shexp
    if spec.architecture in MLA_ARCHS:
        if not spec.is_mla:
            return None      # a legacy deepseek2 file (one attn_kv_b): no layout here
        md = spec.metadata
        p = f"{spec.architecture}."
        a.update(kv_lora_rank=spec.kv_lora_rank, head_dim_k_mla=spec.key_length_mla,
                 head_dim_v_mla=spec.value_length_mla, leading_dense_blocks=spec.n_layer_dense_lead,
                 expert_shared_count=spec.n_expert_shared)
        if spec.q_lora_rank is not None:
            a["q_lora_rank"] = spec.q_lora_rank
        if md.get(p + "expert_weights_scale") is not None:
            a["expert_weights_scale"] = float(md[p + "expert_weights_scale"])
        if md.get(p + "expert_weights_norm"):
            a["expert_weights_norm"] = True
        gating = {v: k for k, v in EXPERT_GATING.items()}.get(md.get(p + "expert_gating_func"))
        if gating:
            a["expert_gating"] = gating
        if any(t.name.endswith("exp_probs_b.bias") for t in spec.tensors):
            a["expert_probs_bias"] = True
    return a
