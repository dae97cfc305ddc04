"""The speed model's terms for the architectures beyond llama, each against the llama.cpp kernel it mirrors: MLA's
absorbed attention (one latent head of kv_lora_rank + n_rot, the per-head attn_k_b / attn_v_b products), routed
experts (k per token in decode, the experts a ubatch touches in a prompt, the repacked MUL_MAT_ID's one product
per routed row), and the per-term breakdown the per-op benchmark prints beside llama.cpp's own node times.
Arithmetic only: the specs come from the ~0.5 B presets' skeletons (nothing built)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from v100lab.base.errors import ConfigError
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.models import synth
from v100lab.predict import memory, speed, work
from v100lab.predict.rates import DeviceRates

FA_ON = RunConfig(flash_attn="on")


def _spec(name: str, quant: str = "Q4_K_M"):
    return skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS[name]), quant)


@pytest.fixture(scope="module")
def mla():
    return _spec("synth-deepseek2-500m")


@pytest.fixture(scope="module")
def moe():
    return _spec("synth-qwen3moe-500m")


def _cpu_rates(tg: float, pp: float, row: float = 0.0) -> DeviceRates:
    """A CPU's rates with one decode and one prompt cost per weight for every type (the figures are arbitrary: the
    tests compare which of them a term uses)."""
    types = ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "F32")
    return DeviceRates(device_id="host", kind="cpu", bandwidth_gbs=1e6, efficiency=1.0,
                       tg_s_per_weight={t: tg for t in types}, attn_s_per_op=0.0,
                       pp_s_per_weight={t: pp for t in types}, pp_default_s_per_weight=pp, pp_attn_s_per_op=0.0,
                       overhead_token_s=0.0, overhead_layer_s=0.0, pp_overhead_s=0.0, host_link_gbs=None,
                       source="test", tg_row_s=row, threads=1)


# ---- routed experts ----------------------------------------------------------------------------

def test_experts_touched_is_k_for_one_token_and_nearly_all_for_a_prompt():
    assert work.experts_touched(32, 4, 1) == pytest.approx(4.0)
    assert work.experts_touched(32, 4, 512) == pytest.approx(32 * (1 - (28 / 32) ** 512))
    assert 31.99 < work.experts_touched(32, 4, 512) <= 32
    assert work.experts_touched(8, 8, 3) == pytest.approx(8.0)


@pytest.mark.parametrize("n_tokens", [2, 8, 32])
def test_experts_touched_matches_top_k_routing_drawn_at_random(n_tokens):
    """Each token picks k distinct experts (the router's top-k), tokens independently: the mean count of distinct
    experts over many drawn batches lies within four standard errors of the closed form."""
    rng = random.Random(n_tokens)
    counts = [len(set().union(*(rng.sample(range(32), 4) for _ in range(n_tokens)))) for _ in range(3000)]
    mean = sum(counts) / len(counts)
    sd = math.sqrt(sum((c - mean) ** 2 for c in counts) / (len(counts) - 1))
    assert abs(mean - work.experts_touched(32, 4, n_tokens)) < 4 * sd / math.sqrt(len(counts)) + 1e-9


@pytest.mark.parametrize("args", [(0, 1, 1), (8, 9, 1), (8, 2, 0), (8, 0, 4)])
def test_experts_touched_refuses_nonsense(args):
    with pytest.raises(ConfigError, match="experts_touched"):
        work.experts_touched(*args)


def test_batch_shares_of_experts_and_dense_matrices(moe):
    up = moe.tensor("blk.0.ffn_up_exps.weight")
    q = moe.tensor("blk.0.attn_q.weight")
    n, k = moe.expert_count, moe.expert_used_count
    assert work.batch_shares(moe, up, 1) == pytest.approx((k / n, k / n))
    assert work.batch_shares(moe, up, 512) == pytest.approx((k / n, work.experts_touched(n, k, 512) / n))
    assert work.batch_shares(moe, q, 512) == (1.0, 1.0)


def test_decode_multiplies_the_k_experts_a_token_routes_to(moe):
    w = work.single_device_work(moe, FA_ON, 0, get_device("v100-16gb"))
    up = sum(t.n_elements for t in moe.tensors if t.name.endswith("ffn_up_exps.weight"))
    roles = {r: n for by_role in w.weights_by_role.values() for r, n in by_role.items()}
    assert roles["ffn_up_exps"] == pytest.approx(up * moe.expert_used_count / moe.expert_count)
    assert roles["ffn_gate_inp"] == pytest.approx(
        sum(t.n_elements for t in moe.tensors if t.name.endswith("ffn_gate_inp.weight")))   # the router: all of it


def test_prompt_compute_grows_with_the_experts_each_token_uses(moe):
    """A prompt's expert products are charged per token for its k experts, not for every expert: on a GPU
    (compute-bound prompt) the time grows linearly with k."""
    dev = get_device("v100-16gb")
    t = {k: 1.0 / speed.predict(dataclasses.replace(moe, expert_used_count=k), [dev], FA_ON, n_prompt=512).pp_tps
         for k in (2, 4, 8)}
    assert t[2] < t[4] < t[8]
    assert (t[8] - t[4]) / (t[4] - t[2]) == pytest.approx(2.0, rel=1e-6)


def test_repacked_experts_in_a_prompt_cost_the_decode_rate():
    """ggml-cpu's repacked MUL_MAT_ID runs one gemv per routed row: those weights cost decode's rate per weight
    and per row; a dense matrix, or experts not re-laid out, cost the prompt rate."""
    spec = _spec("synth-qwen3moe-500m", "Q4_0")
    r = _cpu_rates(tg=2e-10, pp=3e-11, row=5e-9)
    up = spec.tensor("blk.0.ffn_up_exps.weight")
    q = spec.tensor("blk.0.attn_q.weight")
    n = 1e6
    if memory.is_repacked(up):
        assert speed._pp_matrix_compute_s(up, n, r) == pytest.approx(n * 2e-10 + n / up.shape[0] * 5e-9)
    else:
        assert speed._pp_matrix_compute_s(up, n, r) == pytest.approx(n * 3e-11)
    assert speed._pp_matrix_compute_s(q, n, r) == pytest.approx(n * 3e-11)
    gpu = dataclasses.replace(r, kind="gpu")
    assert speed._pp_matrix_compute_s(up, n, gpu) == pytest.approx(n * 3e-11)


# ---- MLA -----------------------------------------------------------------------------------------

def test_mla_decode_attends_one_latent_head(mla):
    """src/models/deepseek2.cpp with MLA: K is one head of kv_lora_rank + n_rot per cell (V a view of its first
    kv_lora_rank), every query head attends over it: n_head × cells × (kv_lora_rank + n_rot + kv_lora_rank)
    multiply-adds a layer, the cache read once."""
    depth = 1024
    w = work.single_device_work(mla, FA_ON, depth, get_device("v100-16gb"))
    latent, rope = mla.kv_lora_rank, mla.head_dim_k - mla.kv_lora_rank
    assert mla.is_mla and mla.n_head_kv(1) == 1 and rope > 0
    cells = depth + 1
    assert w.kv_bytes == pytest.approx(mla.n_layer * cells * (latent + rope) * 2)           # f16
    assert w.attn_ops == pytest.approx(mla.n_layer * mla.n_head * cells * (2 * latent + rope))
    assert w.attn_head_cells == pytest.approx(mla.n_layer * mla.n_head * cells)


def test_mla_per_head_products_are_counted(mla):
    """attn_k_b {nope, kv_lora_rank, n_head} and attn_v_b {kv_lora_rank, v_head, n_head}: every head's slice is
    multiplied once a token (a 3-D MUL_MAT over the heads)."""
    w = work.single_device_work(mla, FA_ON, 0, get_device("v100-16gb"))
    roles = {r: n for by_role in w.weights_by_role.values() for r, n in by_role.items()}
    for role in ("attn_k_b", "attn_v_b"):
        assert roles[role] == sum(t.n_elements for t in mla.tensors if t.name.endswith(f"{role}.weight")) > 0


# ---- the per-term breakdown --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["synth-deepseek2-500m", "synth-qwen3moe-500m", "synth-gemma3-500m"])
@pytest.mark.parametrize("device", ["v100-16gb", "cpu"])
def test_decode_terms_add_up_to_the_prediction(name, device):
    spec = _spec(name)
    rates = _cpu_rates(tg=2e-10, pp=3e-11, row=5e-9) if device == "cpu" else None
    dev = get_device("host") if device == "cpu" else get_device(device)
    cfg = RunConfig(flash_attn="on", n_threads=1)
    for depth in (0, 1024):
        terms = speed.decode_terms(spec, dev, cfg, depth, rates=rates)
        placed = {dev.id: work.Placed(dev, tuple(range(spec.n_layer)), True)}
        p = speed.predict(spec, [dev], cfg, depth=depth, placement=placed,
                          rates={dev.id: rates} if rates else None)
        assert sum(terms.values()) == pytest.approx(1.0 / p.tg_tps, rel=1e-9)
        assert all(v >= 0 for v in terms.values()) and terms["other ops"] >= 0
        assert any(k.startswith("matmul:") for k in terms)
        if spec.is_mla:
            assert terms["matmul:attn_k_b"] > 0 and terms["matmul:attn_v_b"] > 0
        if spec.expert_count:
            assert terms["matmul:ffn_up_exps"] > 0
    assert terms["attention"] > speed.decode_terms(spec, dev, cfg, 0, rates=rates)["attention"]
