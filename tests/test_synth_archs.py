"""Synthetic models of other architectures: the hybrid qwen35, qwen35moe, qwen3moe,
gemma3 with SWA and deepseek2 with MLA, written with random weights and the default model's tokenizer.

Each tiny model must load and generate in llama.cpp (in a worker process), its quant ladder must come from
llama.cpp's quantizer and match the skeleton of the same architecture tensor by tensor, and the memory plan must
match llama.cpp's own buffers (weights, KV, recurrent state, compute, output). Only the tiny presets are built
here (a few MB each); the ~0.5 B presets are measured by benchmarks/bench_memory.py."""

from __future__ import annotations

import pytest

from v100lab.gguf import llama_context
from v100lab.measure import memory_check
from v100lab.predict import memory
from v100lab.models import synth, zoo
from v100lab.facts.config import RunConfig
from v100lab.base.errors import ModelNotFoundError, RunFailed, V100labError
from v100lab.gguf.header import read_spec
from v100lab.gguf.skeleton import skeleton_spec, validate_arch

TINY = ("synth-qwen35-tiny", "synth-qwen35moe-tiny", "synth-qwen3moe-tiny", "synth-gemma3-tiny", "synth-deepseek2-tiny")
LADDER = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")


@pytest.fixture(scope="module", params=TINY)
def tiny(request):
    """(alias, F16 path) of one tiny preset, built once per cache."""
    return request.param, zoo.model_path(request.param)


# ---- the presets and their files -------------------------------------------------------------

def test_presets_are_aliases():
    for name in synth.ARCH_PRESETS:
        assert zoo.is_alias(name) and zoo.is_alias(f"{name}:Q4_K_M")
        assert name in zoo.aliases() and name in zoo.synth_presets()
    assert {"synth-qwen35-500m", "synth-qwen3moe-500m", "synth-gemma3-500m"} <= set(synth.ARCH_PRESETS)
    assert {s.architecture for s in synth.ARCH_PRESETS.values()} == set(synth.SYNTH_ARCHS)
    stems = [s.stem for s in synth.ARCH_PRESETS.values()]
    assert len(set(stems)) == len(stems)


@pytest.mark.parametrize("name", ["synth-qwen35-500m", "synth-qwen3moe-500m", "synth-gemma3-500m",
                                  "synth-deepseek2-500m"])
def test_measurement_presets_are_about_half_a_billion(name, default_model):
    """The measurement sizes, from the skeleton (nothing built): 0.45-0.6 B parameters."""
    spec = skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS[name]), "F16")
    assert 0.45e9 < spec.n_params < 0.6e9


def test_unbuilt_alias_is_named(fresh_cache):
    with pytest.raises(ModelNotFoundError, match="synth-qwen35-500m:Q4_K_M.*not built yet"):
        zoo.model_path("synth-qwen35-500m:Q4_K_M", build=False)


@pytest.mark.parametrize("kw, match", [
    (dict(architecture="mamba"), "architecture 'mamba'"),
    (dict(n_head_kv=3), "multiple of n_head_kv"),
    (dict(ssm_heads=3), "multiple of ssm_groups"),
    (dict(n_layer=3), "no full-attention layer"),
    (dict(rope_dim=15), "rope_dim"),
])
def test_invalid_specs_are_refused(kw, match):
    base = dict(architecture="qwen35", n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                ssm_state=64, ssm_groups=2, ssm_heads=4)
    with pytest.raises(V100labError, match=match):
        synth.ArchSynth(**{**base, **kw})
    with pytest.raises(V100labError, match="n_expert_used"):
        synth.ArchSynth("qwen3moe", n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                        n_expert=4, n_expert_used=5, n_ff_exp=128)


def test_header_reads_each_architecture(tiny):
    alias, path = tiny
    s = synth.ARCH_PRESETS[alias]
    spec = read_spec(path)
    assert spec.architecture == s.architecture and spec.file_type == "F16"
    assert spec.n_layer == s.n_layer
    if s.mla:
        # MLA stored as MQA (conversion/deepseek.py): one KV head of kv_lora_rank + rope, per-head sizes in *_mla
        assert spec.is_mla and spec.n_head_kv(0) == 1
        assert (spec.head_dim_k, spec.head_dim_v) == (s.kv_lora_rank + s.rope_dim, s.kv_lora_rank)
        assert (spec.key_length_mla, spec.value_length_mla) == (s.head_dim, s.v_head_dim)
        assert (spec.q_lora_rank, spec.n_layer_dense_lead, spec.n_expert_shared) == \
            (s.q_lora_rank, s.n_dense_lead, s.n_expert_shared)
        assert [spec.is_moe_layer(il) for il in range(s.n_layer)] == [il >= s.n_dense_lead for il in range(s.n_layer)]
    else:
        assert spec.head_dim_k == s.head_dim and not spec.is_mla
    assert spec.n_vocab == read_spec(zoo.model_path("default")).n_vocab
    if s.hybrid:
        # llama.cpp qwen35.cpp load_arch_hparams: is_recr(i) = (i + 1) % full_attention_interval != 0
        assert spec.recurrent_layers == tuple(i for i in range(s.n_layer) if (i + 1) % 4)
        assert spec.ssm_inner_size == s.ssm_state * s.ssm_heads
        assert spec.metadata[f"{s.architecture}.rope.dimension_sections"] == tuple(synth.rope_sections(s.rope_dim))
    else:
        assert spec.recurrent_layers == ()
    if s.moe:
        assert (spec.expert_count, spec.expert_used_count, spec.n_ff_exp) == (s.n_expert, s.n_expert_used, s.n_ff_exp)
        assert spec.n_ff_shexp == s.n_ff_shexp
    if s.sliding_window:
        # gemma3: set_swa_pattern(6), five SWA layers of every six
        assert spec.sliding_window == s.sliding_window
        assert spec.swa_layers == tuple(i for i in range(s.n_layer) if i % 6 < 5)


@pytest.mark.slow
def test_each_architecture_loads_and_generates(tiny):
    alias, path = tiny
    out = synth.generate(path, n_tokens=6)
    assert out["n_generated"] == 6 and out["n_prompt"] > 0
    assert out["finite"], f"{alias}: non-finite logits"


@pytest.mark.slow
def test_quantized_rung_generates():
    out = synth.generate(zoo.model_path("synth-qwen35-tiny:Q4_K_M"), n_tokens=4)
    assert out["n_generated"] == 4 and out["finite"]


# ---- the ladder: llama.cpp's quantizer vs the skeleton -----------------------------------------

def _compare(real_path, arch: dict, quant: str):
    real = read_spec(real_path)
    skel = skeleton_spec(arch, quant)
    assert real.file_type == skel.file_type == quant
    assert [t.name for t in skel.tensors] == [t.name for t in real.tensors]      # llama-quantize's order
    assert [(t.name, t.type_name, t.shape, t.n_bytes) for t in skel.tensors] == \
        [(t.name, t.type_name, t.shape, t.n_bytes) for t in real.tensors]
    assert skel.weight_bytes == real.weight_bytes and skel.layer_bytes == real.layer_bytes
    for field in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv_arr", "head_dim_k", "n_vocab", "sliding_window",
                  "swa_layers", "recurrent_layers", "expert_count", "expert_used_count", "n_ff_exp", "n_ff_shexp",
                  "ssm_inner_size", "ssm_state_size", "ssm_group_count", "ssm_time_step_rank", "ssm_conv_kernel",
                  "kv_lora_rank", "key_length_mla", "value_length_mla", "q_lora_rank", "n_expert_shared",
                  "n_layer_dense_lead", "is_mla"):
        assert getattr(skel, field) == getattr(real, field), field


@pytest.mark.parametrize("quant", LADDER)
def test_ladder_matches_skeleton_tensor_by_tensor(tiny, quant):
    alias, f16 = tiny
    _compare(zoo.quantized_path(f16, quant), synth.arch_spec_of(synth.ARCH_PRESETS[alias]), quant)


def test_f16_file_is_its_skeleton(tiny):
    """The written F16 file has exactly the skeleton's tensors (the writer uses the skeleton's layout)."""
    alias, f16 = tiny
    real = read_spec(f16)
    skel = skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS[alias]), "F16")
    assert sorted((t.name, t.shape, t.type_name) for t in real.tensors) == \
        sorted((t.name, t.shape, t.type_name) for t in skel.tensors)


def test_moe_quant_rules_for_eight_experts(default_model):
    """llama-quant.cpp: with 8 experts attn_v and attn_k go to Q8_0 (n_expert == 8), experts keep the base type."""
    a = synth.arch_spec_of(synth.ARCH_PRESETS["synth-qwen3moe-tiny"])
    types = {t.name: t.type_name for t in skeleton_spec(a, "Q4_K_M").tensors}
    assert types["blk.0.attn_v.weight"] == types["blk.0.attn_k.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.1.ffn_up_exps.weight"] == "Q4_K"


def test_skeleton_schema_checks_moe_and_sections():
    a = synth.arch_spec_of(synth.ARCH_PRESETS["synth-qwen3moe-tiny"])
    with pytest.raises(V100labError, match="expert_ff"):
        validate_arch({k: v for k, v in a.items() if k != "expert_ff"})
    with pytest.raises(V100labError, match="rope_sections"):
        validate_arch({**a, "rope_sections": [1, 2, 3]})


def test_seed_skeleton_carries_rope_sections():
    """llama.cpp refuses a qwen35 file without rope.dimension_sections (load_arch_hparams, required)."""
    spec = skeleton_spec("qwen35-27b", "Q4_K_M")
    assert spec.metadata["qwen35.rope.dimension_sections"] == (11, 11, 10, 0)


# ---- memory against llama.cpp's own buffers -----------------------------------------------------

TARGETS = {"weights": 0.001, "kv_cache": 0.001, "recurrent": 0.001, "compute": 0.05, "output": 0.001,
           "total": 0.02}
VALIDATION = [
    ("synth-qwen35-tiny", dict(n_ctx=8192, n_parallel=2)),
    ("synth-qwen35-tiny:Q4_0", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-qwen35-tiny:Q4_K_M", dict(n_ctx=4096, n_parallel=4, n_ubatch=128, cache_type_k="q8_0",
                                      cache_type_v="q8_0")),
    ("synth-qwen35moe-tiny:Q4_0", dict(n_ctx=16384, n_ubatch=256, flash_attn="off")),
    ("synth-qwen3moe-tiny:Q4_0", dict(n_ctx=8192, n_parallel=2, kv_unified=True)),
    ("synth-qwen3moe-tiny", dict(n_ctx=32768, flash_attn="off", n_ubatch=1024)),
    ("synth-gemma3-tiny:Q4_K_M", dict(n_ctx=16384)),
    ("synth-gemma3-tiny", dict(n_ctx=8192, n_parallel=4, swa_full=True, flash_attn="off", n_ubatch=256)),
    ("synth-deepseek2-tiny", dict(n_ctx=16384, flash_attn="off")),
    ("synth-deepseek2-tiny:Q4_K_M", dict(n_ctx=8192, n_parallel=2, cache_type_k="q8_0", cache_type_v="q8_0")),
]


@pytest.mark.parametrize("alias, kw", VALIDATION, ids=[f"{a}-{i}" for i, (a, _) in enumerate(VALIDATION)])
def test_plan_matches_llama_cpp_buffers(alias, kw, default_model):
    checks, facts, p = memory_check.check_against_llama(zoo.model_path(alias), RunConfig(**kw))
    for kind, bound in TARGETS.items():
        c = checks[kind]
        assert c.within(bound), f"{kind}: predicted {c.predicted_bytes}, llama.cpp {c.measured_bytes} ({c.error:+.2%})"
    spec = read_spec(zoo.model_path(alias))
    if spec.recurrent_layers:
        assert facts.recurrent and checks["recurrent"].measured_bytes > 0
        # KV only on the full-attention layers
        assert {k.layers for k in facts.kv_caches} == {spec.n_layer - len(spec.recurrent_layers)}
    else:
        assert checks["recurrent"].predicted_bytes == checks["recurrent"].measured_bytes == 0


# ---- the compute-buffer phases, by arithmetic ---------------------------------------------------

def _tiny_spec(alias):
    return skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS[alias]), "F16")


def test_moe_ffn_phase_uses_the_expert_width(default_model):
    spec = _tiny_spec("synth-qwen3moe-tiny")
    ph = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=4096, n_ubatch=512), True, has_output=False)
    u, E = 512, spec.n_embd
    masks = 4096 * u * 2
    assert ph["ffn"] == (4 * E + 2 * spec.expert_count + 3 * spec.n_ff_exp * spec.expert_used_count) * u * 4 + masks


def test_recurrent_phase_counts_state_copies_that_do_not_fit(default_model):
    spec = _tiny_spec("synth-qwen35-tiny")
    one = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=4096, n_ubatch=32), True)["recurrent"]
    many = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=4096, n_ubatch=32, n_parallel=64), True)["recurrent"]
    state = (spec.ssm_inner_size * spec.ssm_state_size
             + (spec.ssm_conv_kernel - 1) * (spec.ssm_inner_size + 2 * spec.ssm_group_count * spec.ssm_state_size)) * 4
    per_seq_cells = llama_context.context_sizes(spec, RunConfig(n_ctx=4096, n_parallel=64)).n_ctx_seq
    masks_delta = (per_seq_cells - 4096) * 32 * 2
    assert many - one == 2 * state * 63 + masks_delta     # the states of 63 more sequences
    assert "recurrent" not in memory.compute_bytes_by_phase(_tiny_spec("synth-qwen3moe-tiny"), RunConfig(), True)


def test_mtp_layer_is_neither_loaded_nor_cached(default_model):
    """A qwen35 file with its MTP layer (block_count 65, nextn_predict_layers 1): this llama.cpp build skips the
    MTP tensors (load_mtp false) and keeps no KV for them in the main context."""
    from v100lab.gguf.skeleton import load_arch

    base = load_arch("qwen35-27b")
    mtp = {**base, "n_layer": 65, "nextn_layers": 1}
    with_mtp, without = skeleton_spec(mtp, "Q4_K_M"), skeleton_spec(base, "Q4_K_M")
    assert with_mtp.weight_bytes > without.weight_bytes
    cfg = RunConfig(n_ctx=8192)
    a, b = memory.plan(with_mtp, [], cfg, with_max_ctx=False), memory.plan(without, [], cfg, with_max_ctx=False)
    assert a.devices["host"].kv_cache_bytes == b.devices["host"].kv_cache_bytes
    assert a.devices["host"].recurrent_bytes == b.devices["host"].recurrent_bytes
    assert memory.weights_by_device(with_mtp, {i: "host" for i in range(66)}, use_mmap=False)["host"] == \
        memory.weights_by_device(without, {i: "host" for i in range(65)}, use_mmap=False)["host"]


# ---- MLA (deepseek2): the K-only latent cache, against llama.cpp ----------------------------------

MLA_KV = [dict(n_ctx=4096), dict(n_ctx=8192, flash_attn="off"), dict(n_ctx=4096, n_parallel=3),
          dict(n_ctx=8192, cache_type_k="q8_0", cache_type_v="q8_0"),
          dict(n_ctx=4096, cache_type_k="q4_0", cache_type_v="q4_0", n_parallel=2, kv_unified=True)]


@pytest.mark.parametrize("kw", MLA_KV, ids=[" ".join(f"{k}={v}" for k, v in kw.items()) for kw in MLA_KV])
def test_mla_kv_bytes_per_token_equal_llama_cpp_buffer(kw, default_model):
    """llama.cpp caches the compressed latent and the rotated key part (kv_lora_rank + n_rot) per layer per token
    as K, and no V (src/llama-kv-cache.cpp, has_v = !is_mla): its KV buffer is that per token × cells × streams."""
    path = zoo.model_path("synth-deepseek2-tiny")
    s = synth.ARCH_PRESETS["synth-deepseek2-tiny"]
    cfg = RunConfig(**kw)
    spec = read_spec(path)
    per_token = llama_context.kv_bytes_per_token(spec, cfg.cache_type_k, cfg.cache_type_v)
    assert per_token == s.n_layer * llama_context.row_size(cfg.cache_type_k, s.kv_lora_rank + s.rope_dim)
    checks, facts, _ = memory_check.check_against_llama(path, cfg)
    cs = llama_context.context_sizes(spec, cfg)
    assert checks["kv_cache"].predicted_bytes == per_token * cs.n_ctx_seq * cs.n_stream
    assert checks["kv_cache"].within(0.001), checks["kv_cache"]
    assert {k.layers for k in facts.kv_caches} == {s.n_layer}


def test_mla_refuses_different_k_and_v_types(default_model):
    """llama_init_from_model: 'model does not support different K and V cache types' for is_mla(); the plan
    says so beforehand."""
    path = zoo.model_path("synth-deepseek2-tiny")
    cfg = RunConfig(n_ctx=2048, cache_type_k="q8_0", cache_type_v="f16")
    p = memory.plan(read_spec(path), [], cfg, with_max_ctx=False)
    assert any("refuses" in w and "MLA" in w for w in p.warnings)
    with pytest.raises(RunFailed):
        memory_check.check_against_llama(path, cfg)


def test_mla_attention_phase_by_arithmetic(default_model):
    """The MLA attention phase (memory.compute_bytes_by_phase): q, absorbed q_nope, q_pe and Qcur per head; without
    flash attention the scores over one MQA head and the contiguous V copy of the latent cache."""
    spec = _tiny_spec("synth-deepseek2-tiny")
    s = synth.ARCH_PRESETS["synth-deepseek2-tiny"]
    u, n_kv, E, H = 512, 16384, spec.n_embd, spec.n_head
    act = (3 * E + s.q_lora_rank + H * (s.head_dim + 2 * s.kv_lora_rank + 2 * s.rope_dim)) * u * 4
    fa = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=n_kv), True)["attention"]
    assert fa == act + n_kv * u * 2
    no_fa = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=n_kv, flash_attn="off"), False)["attention"]
    v_cont = s.kv_lora_rank * n_kv * 2           # larger than the query tensors' hole here: it counts
    assert v_cont > H * (s.head_dim + 2 * s.kv_lora_rank + 2 * s.rope_dim) * u * 4
    assert no_fa == n_kv * u * H * 4 + n_kv * u * 4 + act + v_cont
    short = memory.compute_bytes_by_phase(spec, RunConfig(n_ctx=4096, flash_attn="off"), False)["attention"]
    assert short == 4096 * u * H * 4 + 4096 * u * 4 + act     # 1 MiB of V copy fits in the 3.25 MiB hole


def test_deepseek_v2_lite_skeleton():
    """The shipped DeepSeek-V2-Lite spec: 15.7 B parameters, 27 layers of which 26 MoE, 576 cached values per layer
    per token (K only), the lite form without q_lora_rank (one attn_q)."""
    spec = skeleton_spec("deepseek-v2-lite", "Q4_K_M")
    assert 15.6e9 < spec.n_params < 15.8e9
    assert spec.is_mla and spec.q_lora_rank is None and spec.tensor("blk.0.attn_q.weight") is not None
    assert spec.tensor("blk.0.ffn_up.weight") is not None and spec.tensor("blk.1.ffn_up_exps.weight").shape == (2048, 1408, 64)
    assert spec.tensor("blk.1.ffn_up_shexp.weight").shape == (2048, 2 * 1408)
    assert llama_context.kv_bytes_per_token(spec) == 27 * 576 * 2
    # attn_k_b / attn_v_b are 3-D (one matrix per head); quantized like other matrices, with ne0 fallbacks
    assert spec.tensor("blk.0.attn_k_b.weight").shape == (128, 512, 16)
    assert spec.tensor("blk.0.attn_v_b.weight").type_name == "Q4_K"


@pytest.mark.parametrize("kw, match", [
    (dict(n_head_kv=2), "stored as MQA"),
    (dict(head_dim_k=512), "stored as MQA"),
    (dict(head_dim_k_mla=64), "must exceed rope_dimension_count"),
    (dict(n_layer=30), "needs 'q_lora_rank'"),
    (dict(expert_gating="relu"), "expert_gating"),
    (dict(kv_lora_rank=0), "positive integer 'kv_lora_rank'"),
])
def test_mla_spec_errors_are_one_line(kw, match):
    from v100lab.gguf.skeleton import load_arch

    with pytest.raises(V100labError, match=match):
        validate_arch({**load_arch("deepseek-v2-lite"), **kw})


def test_mla_arch_spec_round_trips_through_the_header(default_model):
    """skeleton.arch_spec_of a real deepseek2 file describes it again at another quant, tensor by tensor."""
    from v100lab.gguf.skeleton import arch_spec_of

    f16 = zoo.model_path("synth-deepseek2-tiny")
    arch = arch_spec_of(read_spec(f16))
    assert arch["expert_gating"] == "sigmoid" and arch["expert_probs_bias"] and arch["q_lora_rank"] == 96
    real = read_spec(zoo.quantized_path(f16, "Q4_K_M"))
    skel = skeleton_spec(arch, "Q4_K_M")
    assert [(t.name, t.type_name, t.shape) for t in skel.tensors] == [(t.name, t.type_name, t.shape) for t in real.tensors]
