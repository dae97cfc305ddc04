"""The memory plan: llama.cpp's arithmetic mirrored, checked against llama.cpp's own buffers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from v100lab.gguf import llama_context
from v100lab.measure import memory_check
from v100lab.predict import memory
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device, get_device
from v100lab.gguf.header import read_spec
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.facts.spec import ModelSpec, TensorInfo

V100 = "v100-16gb"


def toy_spec(n_layer=4, tied=False, **kw) -> ModelSpec:
    """A small llama-like spec with real tensor sizes (F16 blocks, Q8_0 embeddings)."""
    E, F, V = 256, 512, 1000
    tensors, off = [], 0

    def add(name, shape, type_name, nbytes, layer=None):
        nonlocal off
        tensors.append(TensorInfo(name, shape, type_name, nbytes, off, layer))
        off += nbytes

    add("token_embd.weight", (E, V), "Q8_0", E * V // 32 * 34)
    for il in range(n_layer):
        for t, shape in (("attn_q", (E, E)), ("attn_k", (E, 128)), ("attn_v", (E, 128)), ("attn_output", (E, E)),
                         ("ffn_gate", (E, F)), ("ffn_up", (E, F)), ("ffn_down", (F, E))):
            add(f"blk.{il}.{t}.weight", shape, "F16", shape[0] * shape[1] * 2, il)
    add("output_norm.weight", (E,), "F32", E * 4)
    if not tied:
        add("output.weight", (E, V), "F16", E * V * 2)
    base = dict(architecture="llama", name="toy", file_type="F16", n_layer=n_layer, n_embd=E, n_ff=F, n_head=4,
                n_head_kv_arr=2, head_dim_k=64, head_dim_v=64, n_ctx_train=8192, n_vocab=V, tensors=tuple(tensors))
    base.update(kw)
    return ModelSpec(**base)


# ---- llama.cpp's formulas ---------------------------------------------------------------------

def test_context_sizes_mirror_llama_context():
    s = toy_spec()
    cs = llama_context.context_sizes(s, RunConfig(n_ctx=300))
    assert (cs.n_ctx, cs.n_ctx_seq, cs.n_batch, cs.n_ubatch) == (512, 512, 300, 300)   # batch capped before padding
    cs = llama_context.context_sizes(s, RunConfig(n_ctx=1000, n_parallel=3))
    assert (cs.n_ctx, cs.n_ctx_seq, cs.n_stream) == (1536, 512, 3)
    cs = llama_context.context_sizes(s, RunConfig(n_ctx=4096, n_parallel=4, kv_unified=True))
    assert (cs.n_ctx, cs.n_ctx_seq, cs.n_stream) == (4096, 4096, 1)
    assert llama_context.context_sizes(s, RunConfig(n_ctx=0)).n_ctx == 8192   # 0 = the training context


def test_kv_cache_design_fact(default_model):
    # SmolLM2 at n_ctx 2048, f16: 30 layers × 3 KV heads × 64 × 2 (K and V) × 2 bytes × 2048 = 45 MiB
    spec = read_spec(default_model)
    assert llama_context.kv_cache_bytes(spec, RunConfig(n_ctx=2048)) == 30 * 3 * 64 * 2 * 2 * 2048
    # quantized rows: q8_0 stores 32 values in 34 bytes, q4_0 in 18
    q8 = llama_context.kv_cache_bytes(spec, RunConfig(n_ctx=2048, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert q8 == 30 * 2 * (192 // 32 * 34) * 2048
    assert llama_context.row_size("q4_0", 192) == 6 * 18


def test_swa_cells_and_swa_full():
    s = toy_spec(sliding_window=512, swa_layers=(0, 1, 2))
    assert llama_context.kv_cells(s, RunConfig(n_ctx=4096), swa=True) == 1024            # pad(512 + 512, 256)
    assert llama_context.kv_cells(s, RunConfig(n_ctx=4096, n_ubatch=100), swa=True) == 768
    assert llama_context.kv_cells(s, RunConfig(n_ctx=4096, swa_full=True), swa=True) == 4096
    assert llama_context.kv_cells(s, RunConfig(n_ctx=512), swa=True) == 512              # never above the base size
    # unified: the window is kept for every sequence
    assert llama_context.kv_cells(s, RunConfig(n_ctx=4096, n_parallel=2, kv_unified=True), swa=True) == 1536
    full = llama_context.kv_layer_bytes(s, RunConfig(n_ctx=4096), 3)
    swa = llama_context.kv_layer_bytes(s, RunConfig(n_ctx=4096), 0)
    assert full == 4 * swa


def test_recurrent_state_is_f32_per_sequence_and_independent_of_n_ctx():
    s = toy_spec(recurrent_layers=(0, 1, 2), ssm_conv_kernel=4, ssm_inner_size=512, ssm_state_size=128,
                 ssm_group_count=2)
    per_seq = (3 * (512 + 2 * 2 * 128) + 128 * 512) * 4
    assert llama_context.recurrent_layer_bytes(s, RunConfig(n_ctx=512), 0) == per_seq
    assert llama_context.recurrent_bytes(s, RunConfig(n_ctx=32768)) == 3 * per_seq
    assert llama_context.recurrent_bytes(s, RunConfig(n_ctx=4096, n_parallel=4)) == 12 * per_seq
    # only the layer without recurrence has a KV cache
    assert llama_context.kv_layer_bytes(s, RunConfig(), 0) == 0 and llama_context.kv_layer_bytes(s, RunConfig(), 3) > 0


def test_mla_caches_k_only():
    # deepseek2 as the converter writes it: MQA with key_length kv_lora_rank + rope; is_mla() by the *_mla keys
    s = toy_spec(kv_lora_rank=512, rope_dimension_count=64, key_length_mla=192, value_length_mla=128,
                 head_dim_k=576, head_dim_v=512, n_head_kv_arr=1)
    assert llama_context.kv_layer_bytes(s, RunConfig(n_ctx=256), 0) == (512 + 64) * 2 * 256
    # a legacy file (one attn_kv_b, no *_mla keys) is plain multi-head attention: K and V
    legacy = toy_spec(kv_lora_rank=512, rope_dimension_count=64, head_dim_k=192, head_dim_v=128, n_head_kv_arr=4)
    assert llama_context.kv_layer_bytes(legacy, RunConfig(n_ctx=256), 0) == 4 * (192 + 128) * 2 * 256


# ---- placement -----------------------------------------------------------------------------------

def test_ngl_counts_the_output_layer_first():
    s = toy_spec(n_layer=4)
    slots = lambda ngl: memory.place_layers(s, ngl, ["gpu"])  # noqa: E731
    assert set(slots(0).values()) == {"host"}
    assert [il for il, d in slots(1).items() if d == "gpu"] == [4]           # the output layer only
    assert [il for il, d in slots(4).items() if d == "host"] == [0]          # -ngl n_layer leaves block 0
    assert set(slots(999).values()) == {"gpu"}
    split = memory.place_layers(s, 999, ["a", "b"], (3, 1))
    assert [split[il] for il in range(5)] == ["a", "a", "a", "a", "b"]
    assert [memory.place_layers(s, 999, ["a", "b"])[il] for il in range(5)] == ["a", "a", "a", "b", "b"]


def test_weights_follow_the_layers_and_tied_embeddings_are_copied():
    s = toy_spec(tied=True)
    embd = s.tensor("token_embd.weight").n_bytes
    w = memory.weights_by_device(s, memory.place_layers(s, 999, ["gpu"]))
    assert w["host"] == embd                                     # the input layer stays on the CPU
    assert w["gpu"] == s.weight_bytes - embd + embd              # blocks + norm + a copy of token_embd
    w0 = memory.weights_by_device(s, memory.place_layers(s, 0, ["gpu"]))
    assert w0 == {"host": s.weight_bytes}


def test_plan_json_keys_and_host_device():
    s = toy_spec()
    p = memory.plan(s, get_device(V100), RunConfig(n_ctx=4096, n_gpu_layers=3))
    doc = p.as_dict()
    assert set(doc) == {"devices", "fits", "offloaded_layers", "n_layer_total", "max_ctx", "warnings"}
    assert set(doc["devices"]) == {V100, "host"}
    for d in doc["devices"].values():
        assert set(d) == {"weights_bytes", "kv_cache_bytes", "recurrent_bytes", "compute_bytes", "output_bytes",
                          "overhead_bytes", "total_bytes", "capacity_bytes"}
        assert d["total_bytes"] == sum(v for k, v in d.items() if k not in ("total_bytes", "capacity_bytes"))
    assert doc["n_layer_total"] == 5 and doc["offloaded_layers"] == 3
    assert p.devices[V100].layers == (2, 3) and p.devices[V100].has_output_layer
    assert p.devices["host"].layers == (0, 1)
    assert p.devices["host"].output_bytes == s.n_vocab * 4
    assert p.devices[V100].overhead_bytes == 512 * 2**20
    total_kv = sum(m.kv_cache_bytes for m in p.devices.values())
    assert total_kv == llama_context.kv_cache_bytes(s, RunConfig(n_ctx=4096))
    assert any("3/5 layers" in w for w in doc["warnings"])


def test_quantized_v_without_flash_attention_warns():
    p = memory.plan(toy_spec(), get_device(V100), RunConfig(cache_type_v="q8_0", flash_attn="off"))
    assert any("refuses" in w for w in p.warnings)
    assert not any("refuses" in w for w in memory.plan(toy_spec(), get_device(V100),
                                                          RunConfig(cache_type_v="q8_0")).warnings)


# ---- fit search ----------------------------------------------------------------------------------

def small_card(gib: float) -> Device:
    return Device(id="card", name="card", kind="gpu", memory_gib=gib, bandwidth_gbs=100, runtime_overhead_mib=0)


def test_max_ctx_is_the_boundary():
    s = toy_spec(n_ctx_train=65536)
    card = small_card(0.06)
    n = memory.max_ctx(s, card, RunConfig())
    assert 256 <= n < 65536 and n % 256 == 0
    assert memory.plan(s, card, RunConfig(n_ctx=n), with_max_ctx=False).fits
    assert not memory.plan(s, card, RunConfig(n_ctx=n + 256), with_max_ctx=False).fits
    assert memory.max_ctx(s, small_card(0.001), RunConfig()) == 0
    assert memory.plan(s, card, RunConfig(n_ctx=1024)).max_ctx == n


def test_max_gpu_layers_is_the_boundary():
    s = toy_spec(n_layer=8)
    card = small_card(0.006)
    cfg = RunConfig(n_ctx=1024, n_ubatch=64)
    k = memory.max_gpu_layers(s, card, cfg)
    assert 0 < k < 9
    assert memory.plan(s, card, cfg.with_(n_gpu_layers=k), with_max_ctx=False).fits
    assert not memory.plan(s, card, cfg.with_(n_gpu_layers=k + 1), with_max_ctx=False).fits
    assert memory.max_gpu_layers(s, small_card(100), cfg) == 9


def test_triangle_rows_are_predicted_observations():
    from v100lab.facts.results import tidy_frame

    specs = {"F16": toy_spec(), "F16-tied": toy_spec(tied=True)}
    rows = memory.triangle(specs, small_card(0.05), contexts=(1024, 8192), cache_types=("f16", "q8_0"))
    df = tidy_frame(rows)
    assert set(df["source"]) == {"predicted"}
    assert {"total_bytes", "margin_bytes", "fits", "max_gpu_layers", "layers_spilled", "max_ctx"} <= set(df["metric"])
    fits = df[(df.metric == "fits") & (df.cache_type == "f16")].set_index(["quant", "value"])["result"]
    assert fits[("F16", "1024")] >= fits[("F16", "8192")]      # more context never fits better
    assert len(df[df.metric == "fits"]) == 2 * 2 * 2            # quant × cache type × context, one row each
    assert set(df[df.metric == "max_ctx"]["cache_type"]) == {"f16", "q8_0"}


def test_skeleton_27b_on_v100_needs_partial_offload_at_q8():
    spec = skeleton_spec("qwen35-27b", "Q8_0")
    p = memory.plan(spec, get_device(V100), RunConfig(n_ctx=4096), with_max_ctx=False)
    assert not p.fits and p.devices[V100].recurrent_bytes > 0
    k = memory.max_gpu_layers(spec, get_device(V100), RunConfig(n_ctx=4096))
    assert 0 < k < p.n_layer_total
    rec = llama_context.recurrent_bytes(spec, RunConfig(n_ctx=2048))
    assert rec == llama_context.recurrent_bytes(spec, RunConfig(n_ctx=32768))


# ---- against llama.cpp itself (CPU build: every buffer on the host) ------------------------------

TARGETS = {"weights": 0.001, "kv_cache": 0.001, "compute": 0.05, "total": 0.02}
VALIDATION = [
    ("default", dict(n_ctx=4096)),
    ("default", dict(n_ctx=32768, flash_attn="off", n_ubatch=256)),
    ("default", dict(n_ctx=3000, n_parallel=3, cache_type_k="q8_0", cache_type_v="q8_0")),
    ("default", dict(n_ctx=8192, n_parallel=4, kv_unified=True, cache_type_k="q4_0", cache_type_v="q4_0")),
    ("gemma3-270m", dict(n_ctx=8192, n_ubatch=100)),
    ("gemma3-270m", dict(n_ctx=16384, n_parallel=2, swa_full=True, flash_attn="off", n_ubatch=64)),
    ("gemma3-270m", dict(n_ctx=8192, n_parallel=4, kv_unified=True)),
    ("synth-tiny:Q4_0", dict(n_ctx=8192, n_parallel=2, flash_attn="off")),
    ("synth-tiny", dict(n_ctx=16384, flash_attn="off", n_ubatch=1024)),
]


@pytest.mark.parametrize("alias, kw", VALIDATION, ids=[f"{a}-{i}" for i, (a, _) in enumerate(VALIDATION)])
def test_plan_matches_llama_cpp_buffers(alias, kw, default_model):
    from v100lab.models import zoo
    from v100lab.base.errors import ModelNotFoundError

    try:
        path = zoo.model_path(alias)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    checks, facts, _ = memory_check.check_against_llama(path, RunConfig(**kw))
    for kind, bound in TARGETS.items():
        c = checks[kind]
        assert c.within(bound), f"{kind}: predicted {c.predicted_bytes}, llama.cpp {c.measured_bytes} ({c.error:+.2%})"
    assert checks["output"].within(0.001)


def test_known_deviation_tiny_model_compute(tiny_f16):
    """synth-tiny at ubatch 512 is the one model whose logits-phase fragment differs (ggml-alloc places the
    final norm higher): compute stays within 5 %, total misses 2 % (RESULTS.md reports it)."""
    checks, _, _ = memory_check.check_against_llama(tiny_f16, RunConfig(n_ctx=4096))
    assert checks["compute"].within(0.05)
    assert checks["weights"].within(0.001) and checks["kv_cache"].within(0.001)
    assert abs(checks["total"].error) < 0.04


# ---- CLI -------------------------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "v100lab", *args], capture_output=True, text=True, timeout=120)


def test_cli_plan_json(default_model):
    r = _cli("plan", "default", "--device", V100, "-c", "4096", "-ngl", "20", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"devices", "fits", "offloaded_layers", "n_layer_total", "max_ctx", "warnings"} <= set(doc)
    assert doc["n_layer_total"] == 31 and doc["offloaded_layers"] == 20 and doc["fits"] is True
    assert set(doc["devices"]) == {V100, "host"}


def test_cli_plan_errors_are_one_line():
    r = _cli("plan", "default", "--device", "v100-17gb")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    r = _cli("plan", "default", "--device", V100, "-ctk", "q9_0")
    assert r.returncode == 2 and "cache_type_k" in r.stderr
    r = _cli("plan", "skeleton:nope", "--device", V100)
    assert r.returncode == 2


def test_cli_plan_human(default_model):
    r = _cli("plan", "default", "--device", "t4", "-ctv", "q8_0", "-fa", "off")
    assert r.returncode == 0 and "fits:" in r.stdout and "refuses" in r.stdout
