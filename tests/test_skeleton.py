"""Skeletons and the llama-quantize mixture, checked against llama.cpp's real quantizer.

Synthetic llama models are quantized by llama.cpp (``llama_model_quantize``, through the zoo); a
skeleton built from the same architecture must give every tensor the same type, shape and byte
count. The real Gemma 3 270M Q4_K_M file checks the gemma3 layout and the tied-embedding rules."""

from __future__ import annotations

import io

import gguf
import pytest

from v100lab.models import zoo
from v100lab.base.errors import ConfigError
from v100lab.gguf.header import read_header, read_spec
from v100lab.facts.quantmix import ModelFacts, n_dims, tensor_types
from v100lab.gguf.skeleton import arch_names, load_arch, skeleton_spec, validate_arch, write_skeleton

LADDER = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q3_K_M", "Q6_K", "Q2_K", "Q8_0")

# Extra synthetic shapes (zoo's presets are left as they are):
# n_ff 544 is not a multiple of 256 → ffn_down (ne0 = n_ff) needs the k-quant fallbacks; 8 layers
# make use_more_bits pick some layers and not others; 4 query heads per KV head → n_gqa 4.
FALLBACK_SPEC = zoo.SynthSpec(n_layer=8, n_embd=256, n_ff=544, n_head=4, n_head_kv=1, seed=3)
# n_embd 288: every tensor with ne0 = n_embd falls back, output.weight to Q8_0.
ODD_EMBD_SPEC = zoo.SynthSpec(n_layer=3, n_embd=288, n_ff=512, n_head=4, n_head_kv=2, seed=4)


def synth_arch(spec: zoo.SynthSpec, n_vocab: int) -> dict:
    """The architecture spec of a zoo synthetic model (zoo.write_synthetic's keys)."""
    return {"architecture": "llama", "name": spec.stem, "n_layer": spec.n_layer, "n_embd": spec.n_embd,
            "n_ff": spec.n_ff, "n_head": spec.n_head, "n_head_kv": spec.n_head_kv,
            "n_ctx_train": spec.n_ctx_train, "n_vocab": n_vocab, "rope_freq_base": 10000.0,
            "rope_dimension_count": spec.head_dim, "rms_eps": 1e-5, "tied_embeddings": False,
            "source_type": "F16"}


def _compare(real_path, arch: dict, quant: str):
    real = read_spec(real_path)
    skel = skeleton_spec(arch, quant)
    assert real.file_type == skel.file_type == quant
    assert [t.name for t in skel.tensors] == [t.name for t in real.tensors]   # llama-quantize's order
    mismatched = [(r.name, r.type_name, s.type_name) for r, s in zip(real.tensors, skel.tensors)
                  if r.type_name != s.type_name]
    assert mismatched == []
    assert [t.shape for t in skel.tensors] == [t.shape for t in real.tensors]
    assert [t.n_bytes for t in skel.tensors] == [t.n_bytes for t in real.tensors]
    assert skel.weight_bytes == real.weight_bytes
    assert skel.n_params == real.n_params
    assert skel.layer_bytes == real.layer_bytes
    for field in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv_arr", "head_dim_k", "head_dim_v",
                  "n_ctx_train", "n_vocab", "sliding_window", "swa_layers", "recurrent_layers"):
        assert getattr(skel, field) == getattr(real, field), field


@pytest.fixture(scope="module")
def n_vocab(default_model):
    return read_spec(default_model).n_vocab


@pytest.mark.parametrize("quant", LADDER)
def test_tiny_ladder_matches_llama_quantize(tiny_f16, n_vocab, quant):
    _compare(zoo.quantized_path(tiny_f16, quant), synth_arch(zoo.SYNTH_PRESETS["synth-tiny"], n_vocab), quant)


@pytest.fixture(scope="module")
def fallback_f16():
    return zoo.synthetic_path(FALLBACK_SPEC)


@pytest.mark.parametrize("quant", LADDER)
def test_fallback_ladder_matches_llama_quantize(fallback_f16, n_vocab, quant):
    path = zoo.quantized_path(fallback_f16, quant)
    _compare(path, synth_arch(FALLBACK_SPEC, n_vocab), quant)
    types = {t.name: t.type_name for t in read_spec(path).tensors}
    if quant in ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "Q6_K"):
        # ne0 = 544 is no multiple of 256: never a k-quant
        assert not types["blk.0.ffn_down.weight"].endswith("_K")


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["Q4_K_M", "Q2_K", "Q6_K"])
def test_odd_embd_ladder_matches_llama_quantize(n_vocab, quant):
    f16 = zoo.synthetic_path(ODD_EMBD_SPEC)
    _compare(zoo.quantized_path(f16, quant), synth_arch(ODD_EMBD_SPEC, n_vocab), quant)


def test_gemma_layout_and_mixture_match_real_file(gemma_model):
    real = read_spec(gemma_model)
    arch = {"architecture": "gemma3", "name": "gemma3-270m", "n_layer": real.n_layer, "n_embd": real.n_embd,
            "n_ff": real.n_ff, "n_head": real.n_head, "n_head_kv": real.n_head_kv_arr,
            "head_dim_k": real.head_dim_k, "head_dim_v": real.head_dim_v, "n_ctx_train": real.n_ctx_train,
            "n_vocab": real.n_vocab, "sliding_window": real.sliding_window, "tied_embeddings": True,
            "rope_freq_base": real.rope_freq_base}
    skel = skeleton_spec(arch, "Q4_K_M")
    assert sorted((t.name, t.shape, t.type_name) for t in skel.tensors) == \
        sorted((t.name, t.shape, t.type_name) for t in real.tensors)
    assert skel.weight_bytes == real.weight_bytes
    assert skel.swa_layers == real.swa_layers


def test_quantmix_on_real_gemma_tensors(gemma_model):
    real = read_spec(gemma_model)
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    src = [(t.name, t.shape, F16 if n_dims(t.shape) >= 2 else F32) for t in real.tensors]
    got = tensor_types(src, "Q4_K_M", ModelFacts("gemma3", real.n_layer, real.n_head, real.n_head_kv(0)))
    assert {n: t.name for n, t in got.items()} == {t.name: t.type_name for t in real.tensors}


# ------------------------------------------------------------------------------------------------
# shipped architecture specs
# ------------------------------------------------------------------------------------------------

def test_shipped_specs_load():
    assert {"qwen35-27b", "gemma3-27b", "qwen3-32b", "llama2-7b"} <= set(arch_names())
    for name in arch_names():
        spec = skeleton_spec(name, "Q4_K_M")
        assert spec.n_params > 1e9 and spec.file_bytes is None


def test_qwen35_hybrid_layers():
    spec = skeleton_spec("qwen35-27b", "Q4_K_M")
    full = [il for il in range(spec.n_layer) if not spec.is_recurrent(il)]
    assert full == list(range(3, 64, 4))
    assert len(spec.recurrent_layers) == 48
    assert [il for il in range(spec.n_layer) if spec.has_kv(il)] == full
    assert spec.ssm_state_size == 128 and spec.ssm_inner_size == 6144 and spec.full_attention_interval == 4
    assert spec.tensor("blk.0.ssm_conv1d.weight").type_name == "F32"       # never quantized
    assert spec.tensor("blk.0.attn_qkv.weight") is not None and spec.tensor("blk.0.attn_q.weight") is None
    assert spec.tensor("blk.3.attn_q.weight").shape == (5120, 24 * 256 * 2)   # query + gate
    assert spec.n_embd_k_gqa(3) == 4 * 256


def test_qwen35_mtp_layer_is_not_recurrent():
    arch = load_arch("qwen35-27b")
    arch.update(n_layer=65, nextn_layers=1)
    spec = skeleton_spec(arch, "Q8_0")
    assert spec.nextn_layers == 1 and 64 not in spec.recurrent_layers and len(spec.recurrent_layers) == 48


def test_gemma3_27b_swa_pattern():
    spec = skeleton_spec("gemma3-27b", "Q4_0")
    assert spec.sliding_window == 1024
    assert [il for il in range(spec.n_layer) if not spec.is_swa(il)] == list(range(5, 62, 6))
    assert spec.tensor("output.weight") is None and spec.tensor("token_embd.weight").type_name == "Q6_K"


def test_llama2_7b_q4_0_size_matches_llamacpp_table():
    # claimed figure: llama.cpp's CUDA scoreboard (discussion #15013) lists Llama 2 7B Q4_0 as 3.56 GiB
    spec = skeleton_spec("llama2-7b", "Q4_0")
    assert round(spec.weight_bytes / 2**30, 2) == 3.56
    assert round(spec.n_params / 1e9, 2) == 6.74


def test_k_quant_ladder_sizes_are_ordered():
    sizes = [skeleton_spec("qwen3-32b", q).weight_bytes for q in ("Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")]
    assert sizes == sorted(sizes)


# ------------------------------------------------------------------------------------------------
# skeleton files
# ------------------------------------------------------------------------------------------------

def test_write_skeleton_round_trip(tmp_path):
    path = write_skeleton("qwen35-27b", "Q4_K_M", tmp_path / "q35.gguf")
    hdr = read_header(path)
    assert hdr.data_complete is False and hdr.file_bytes == hdr.data_offset
    spec = read_spec(path)
    mem = skeleton_spec("qwen35-27b", "Q4_K_M")
    assert spec.tensors == mem.tensors and spec.recurrent_layers == mem.recurrent_layers
    assert spec.file_bytes == path.stat().st_size < 100_000
    # a skeleton cut inside its data section still reads (data cut short)
    assert read_spec(io.BytesIO(path.read_bytes() + b"\0" * 1000)).tensors == mem.tensors


def test_skeleton_header_parses_in_gguf_reader(tmp_path):
    """gguf-py agrees on the header of a skeleton (given the data it expects, zero-filled)."""
    arch = synth_arch(zoo.SYNTH_PRESETS["synth-tiny"], 1000)
    path = write_skeleton(arch, "Q4_K_M", tmp_path / "tiny.gguf")
    spec = read_spec(path)
    with open(path, "ab") as f:
        f.truncate(spec.data_offset + sum(-(-t.n_bytes // 32) * 32 for t in spec.tensors))
    ref = gguf.GGUFReader(str(path))
    assert [(t.name, t.tensor_type.name, int(t.n_bytes)) for t in ref.tensors] == \
        [(t.name, t.type_name, t.n_bytes) for t in spec.tensors]


@pytest.mark.parametrize("change, match", [
    ({"bogus": 1}, "unknown key"),
    ({"n_layer": 0}, "positive"),
    ({"architecture": "mamba"}, "no tensor layout"),
    ({"n_head_kv": [1, 2]}, "non-negative integers"),
    ({"n_embd": "5120"}, "wrong type"),
])
def test_bad_arch_specs(change, match):
    arch = load_arch("llama2-7b")
    arch.update(change)
    with pytest.raises(ConfigError, match=match):
        validate_arch(arch)


def test_unknown_arch_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown architecture spec"):
        load_arch("no-such-model")
    bad = tmp_path / "x.yaml"
    bad.write_text("architecture: [unclosed")
    with pytest.raises(ConfigError, match="YAML"):
        load_arch(bad)
