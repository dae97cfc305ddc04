"""The speed model: structure, the ceiling formula, monotonicity, placement, flags.

No speed is asserted here (speed targets live in benchmarks/bench_speed.py and RESULTS.md); predictions are
checked for the relationships they must keep whatever the calibration says.
"""

from __future__ import annotations

import json

import pytest

from v100lab.gguf import llama_context
from v100lab.predict import speed, work
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import get_device
from v100lab.base.errors import V100labError
from v100lab.gguf.header import read_spec
from v100lab.gguf.skeleton import skeleton_spec
from v100lab.predict.work import Placed


@pytest.fixture(scope="module")
def qwen():
    return {q: skeleton_spec("qwen35-27b", q) for q in ("Q8_0", "Q4_K_M", "Q4_0", "Q3_K_M")}


@pytest.fixture(scope="module")
def llama7b():
    return skeleton_spec("llama2-7b", "Q4_0")


def _all_on(spec, dev_id):
    dev = get_device(dev_id)
    return {dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}


# ---- the seed's ceiling ------------------------------------------------------------------------

def test_ceiling_formula_on_the_seeds_numbers():
    # the seed post: 900 GB/s over 14 GB ≈ 64 tok/s; Q4_0 14.5 GB → ~62; Q4_K_M 16.5 GB → ~54–55
    assert speed.ceiling_tps(14e9, 900) == pytest.approx(64.29, abs=0.01)
    assert speed.ceiling_tps(14.5e9, 900) == pytest.approx(62.07, abs=0.01)
    assert speed.ceiling_tps(16.5e9, 900) == pytest.approx(54.55, abs=0.01)
    # llama.cpp's V100 scoreboard model: Llama 2 7B Q4_0, 3.56 GiB
    assert speed.ceiling_tps(3.56 * 2**30, 900) == pytest.approx(235.4, abs=0.1)


@pytest.mark.parametrize("b, bw", [(0, 900), (-1, 900), (1e9, 0), (1e9, -5), (None, 900)])
def test_ceiling_rejects_nonsense(b, bw):
    with pytest.raises(V100labError):
        speed.ceiling_tps(b, bw)


def test_fewer_bytes_higher_ceiling(qwen):
    ordered = sorted(qwen.values(), key=lambda s: s.weight_bytes)
    ceilings = [speed.predict(s, ["v100-32gb"], RunConfig(n_ctx=2048)).weights_ceiling_tg_tps for s in ordered]
    assert ceilings == sorted(ceilings, reverse=True)
    preds = [speed.predict(s, ["v100-32gb"], RunConfig(n_ctx=2048)).tg_tps for s in ordered]
    assert preds == sorted(preds, reverse=True)


# ---- KV cells, as llama.cpp counts them ----------------------------------------------------------

@pytest.mark.parametrize("used, size, expect", [(1, 4096, 256), (10, 4096, 256), (300, 4096, 512),
                                                (2049, 4096, 2304), (5000, 4096, 4096), (100, 128, 128)])
def test_n_kv_cells_mirrors_get_n_kv(used, size, expect):
    assert llama_context.n_kv_cells(used, size) == expect


def test_flash_attention_reads_only_used_cells(default_model):
    spec = read_spec(default_model)
    on = llama_context.kv_cells_read(spec, 0, RunConfig(n_ctx=4096, flash_attn="on"), used=10)
    off = llama_context.kv_cells_read(spec, 0, RunConfig(n_ctx=4096, flash_attn="off"), used=10)
    assert on == 10 and off == 256


def test_sliding_window_layers_cap_cells(gemma_model):
    spec = read_spec(gemma_model)
    swa = next(il for il in range(spec.n_layer) if spec.is_swa(il))
    full = next(il for il in range(spec.n_layer) if not spec.is_swa(il))
    cfg = RunConfig(n_ctx=8192)
    assert llama_context.kv_cells_read(spec, swa, cfg, used=5000) == spec.sliding_window
    assert llama_context.kv_cells_read(spec, full, cfg, used=5000) == 5000


def test_causal_cells_closed_form():
    for depth, n, w in ((0, 512, None), (100, 64, None), (0, 512, 128), (1000, 300, 512), (10, 5, 3)):
        brute = sum(min(depth + i + 1, w) if w else depth + i + 1 for i in range(n))
        assert llama_context.causal_cells(depth, n, w) == pytest.approx(brute)


def _tiled_cells_brute(depth: int, n: int, window: int | None) -> int:
    """ggml_compute_forward_flash_attn_ext_tiled's loop, cell by cell: a 64-cell KV tile is computed for a 64-query
    tile unless the mask hides every one of its cells from every query of the tile (``can_skip``)."""
    n_kv = depth + n
    total = 0
    for q0 in range(0, n, 64):
        q_rows = range(q0, min(q0 + 64, n))
        for ic in range(0, n_kv, 64):
            # query i sees cells depth+i-window+1 .. depth+i: does any of them fall in this tile?
            visible = any(max(ic, depth + i - (window or n_kv) + 1) <= min(ic + 63, depth + i) for i in q_rows)
            total += len(q_rows) * 64 if visible else 0
    return total


@pytest.mark.parametrize("depth,n,window", [(0, 512, None), (2048, 512, None), (100, 200, None), (0, 512, 128),
                                             (1000, 300, 512), (4096, 512, 512)])
def test_prompt_attention_counts_the_cells_of_the_tiles_ggml_cpu_computes(depth, n, window):
    assert llama_context.fa_prompt_cells(depth, n, window) == _tiled_cells_brute(depth, n, window)
    # the tiles' overshoot: about half a tile per query on the diagonal (and at the window's start)
    extra = llama_context.fa_prompt_cells(depth, n, window) - llama_context.causal_cells(depth, n, window)
    assert 0 < extra <= n * 64 * (2 if window else 1)
    # below one query tile, the one-query-at-a-time kernel: the causal cells
    assert llama_context.fa_prompt_cells(depth, 63, window) == llama_context.causal_cells(depth, 63, window)


# ---- bytes and work per token ------------------------------------------------------------------

def test_decode_work_counts_what_llama_cpp_reads(default_model):
    spec = read_spec(default_model)       # SmolLM2: tied embeddings, Q8_0 token_embd as output
    w = speed.decode_work(spec, _all_on(spec, "v100-32gb"), RunConfig(n_ctx=2048), depth=0)["v100-32gb"]
    embd = spec.tensor("token_embd.weight")
    layer_bytes = sum(spec.layer_bytes)
    assert w.weights["Q8_0"].n_bytes == embd.n_bytes            # tied output read in full
    assert w.weight_bytes_read == pytest.approx(layer_bytes + embd.n_bytes + spec.tensor("output_norm.weight").n_bytes)
    assert w.placed_weight_bytes == spec.weight_bytes            # the seed's ceiling: the whole file
    assert w.state_bytes == 0 and w.kv_bytes > 0


def _chunks_by_simulation(n_rows: int, threads: int, repacked: bool) -> list[int]:
    """ggml-cpu's chunk bounds for one token's product, by stepping through the C (ggml-cpu.c
    ggml_compute_forward_mul_mat with nr1 = 1; repack.cpp forward_mul_mat) chunk index by chunk index."""
    out = []
    if not repacked:
        nchunk0 = (n_rows + 63) // 64
        if nchunk0 * 1 < threads * 4:
            nchunk0 = threads if n_rows > 1 else 1
        dr0 = (n_rows + nchunk0 - 1) // nchunk0
        for c in range(nchunk0):
            start = dr0 * c
            out.append(max(0, min(start + dr0, n_rows) - start))
        return out
    chunk_size0 = (n_rows + threads * 4 - 1) // (threads * 4)
    nchunk0 = (n_rows + chunk_size0 - 1) // chunk_size0
    if nchunk0 > 0 and n_rows // nchunk0 < 8 and n_rows >= 8:
        nchunk0 = (n_rows + 7) // 8
    dr0 = (n_rows + nchunk0 - 1) // nchunk0
    if threads == 1 or (nchunk0 < threads and (n_rows + threads - 1) // threads >= 8):
        nchunk0 = threads
        dr0 = (n_rows + nchunk0 - 1) // nchunk0
    nchunk0 = min(nchunk0, (n_rows + 7) // 8)
    for c in range(nchunk0):
        start, end = dr0 * c, min(dr0 * c + dr0, n_rows)
        start = start + 8 - start % 8 if start % 8 else start
        end = min(end + 8 - end % 8 if end % 8 else end, n_rows)
        out.append(max(0, end - start))
    return out


@pytest.mark.parametrize("n_rows", [1, 7, 64, 96, 192, 576, 640, 960, 1000, 1536, 2816, 49152])
@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("repacked", [False, True])
def test_mul_mat_chunks_follow_ggml_cpu(n_rows, threads, repacked):
    from v100lab.predict import work

    chunks = work.mul_mat_chunks(n_rows, threads, repacked)
    assert list(chunks) == _chunks_by_simulation(n_rows, threads, repacked)
    assert sum(chunks) == n_rows                      # every row once
    share = work.busiest_share(n_rows, threads, repacked)
    assert 1.0 <= share <= threads                    # never faster than an even split, never slower than one thread
    if threads == 1:
        assert share == 1.0


def test_a_576_row_product_is_five_chunks_against_four_at_two_threads():
    from v100lab.predict import work

    # SmolLM2's q, o and ffn_down: 9 chunks of 64 rows, 5 for one thread and 4 for the other
    assert work.mul_mat_chunks(576, 2) == (64,) * 9
    assert work.busiest_share(576, 2) == pytest.approx(5 / 4.5)
    # the rungs calibration fits on split evenly (calib-wide's 1024 and 2816, calib-wide512's 512 and 1408)
    assert [work.busiest_share(n, 2) for n in (1024, 2816, 512, 1408, 256, 128)] == [1.0] * 6
    # the repacked path cuts 4 chunks a thread: 576 rows split evenly
    assert work.busiest_share(576, 2, repacked=True) == 1.0
    with pytest.raises(V100labError, match="rows and threads"):
        work.mul_mat_chunks(0, 2)


def test_the_busiest_thread_sets_a_cpu_products_time(default_model):
    from v100lab.predict.rates import cpu_rates_from_calibration

    spec = read_spec(default_model)
    host = get_device("host")
    w = speed.decode_work(spec, {"host": Placed(host, tuple(range(spec.n_layer)), True)}, RunConfig(n_ctx=1024))["host"]
    q41 = w.weights["Q4_1"]
    assert q41.shared_by(1) == (q41.n_weights, q41.n_rows)
    # q, o (576 × 576) and ffn_down (576 rows of 1536) take 10/9 as long; k, v (192 rows) and gate, up (1536) do not
    per_layer_576 = 2 * 576 * 576 + 576 * 1536
    n_w, n_r = q41.shared_by(2)
    assert n_w == pytest.approx(q41.n_weights + spec.n_layer * per_layer_576 * (5 / 4.5 - 1))
    assert n_r == pytest.approx(q41.n_rows + spec.n_layer * 3 * 576 * (5 / 4.5 - 1))
    # the tied output (token_embd, 49152 rows): 768 chunks, even
    assert w.weights["Q8_0"].shared_by(2)[0] == w.weights["Q8_0"].n_weights
    # priced: the same costs at 1 and 2 threads, only the split differs
    fit = {"bandwidth_gbs": 1000.0, "efficiency": 1.0, "tg_s_per_weight": {"Q4_1": 1e-10, "Q8_0": 1e-10},
           "tg_row_s": 1e-8}
    cal = {"threads": {"1": fit, "2": fit}}
    t = {}
    for th in (1, 2):
        r = cpu_rates_from_calibration(host, cal, th)
        assert r.threads == th
        t[th] = 1 / speed.predict(spec, "host", RunConfig(n_ctx=1024, n_threads=th), rates={"host": r}).tg_tps
    extra = spec.n_layer * (per_layer_576 * 1e-10 + 3 * 576 * 1e-8) * (5 / 4.5 - 1)     # weights and rows
    assert t[2] - t[1] == pytest.approx(extra, rel=0.02)


def test_untied_embedding_is_a_row_lookup(tiny_f16):
    spec = read_spec(tiny_f16)
    from v100lab.facts.devices import device_from_mapping

    dev = get_device("v100-32gb")
    host = device_from_mapping({"id": "host", "name": "h", "kind": "cpu", "memory_gib": 8, "bandwidth_gbs": 20}, "t")
    placement = {"host": Placed(host, (), False), dev.id: Placed(dev, tuple(range(spec.n_layer)), True)}
    work = speed.decode_work(spec, placement, RunConfig(n_ctx=512))
    embd = spec.tensor("token_embd.weight")
    assert work["host"].other_bytes == pytest.approx(embd.n_bytes / spec.n_vocab)
    assert "F16" in work[dev.id].weights
    assert work[dev.id].weights["F16"].n_bytes < spec.weight_bytes - embd.n_bytes + 1


def test_recurrent_state_read_and_written(qwen):
    spec = qwen["Q4_0"]
    # llama_hparams: n_embd_r = 3 × (6144 + 2·16·128), n_embd_s = 128 × 6144 (the model load log of Qwen3.5 27B)
    assert llama_context.recurrent_state_floats(spec) == 3 * 10240 + 128 * 6144
    w = speed.decode_work(spec, _all_on(spec, "v100-32gb"), RunConfig(n_ctx=2048))["v100-32gb"]
    assert w.state_bytes == pytest.approx(2 * 48 * (3 * 10240 + 128 * 6144) * 4)


def test_delta_net_prompt_work_follows_the_kernel(qwen, llama7b):
    spec = qwen["Q4_0"]
    rec = [il for il in range(spec.n_layer) if spec.is_recurrent(il)]
    attn = next(il for il in range(spec.n_layer) if not spec.is_recurrent(il))
    # 48 value heads of S_v = 6144 / 48 = 128: the state scaled once and swept three times per token; the short
    # convolution's 10240 channels of 4 taps (the same conv_dim as the state's n_embd_r)
    w = work.recurrent_token_work(spec, rec[0])
    assert (w.delta_elements, w.delta_rows) == (4 * 48 * 128 * 128, 3 * 48 * 128)
    assert (w.conv_elements, w.conv_rows) == (10240 * 4, 10240)
    assert work.recurrent_token_work(spec, attn) == work.RecurrentWork()
    assert not any("ssm_conv1d" in t.name for t in work.layer_matrices(spec, range(spec.n_layer)))
    assert "recurrent" not in speed.prompt_terms(llama7b, "host", RunConfig(n_ctx=2048, n_threads=1))


def test_prompt_terms_add_up_to_the_prompt_prediction(qwen):
    """With rates that charge every term (not this machine's stored profile, whose fit may leave a term at 0), the
    terms are each there and add up to the prediction's prompt time."""
    from v100lab.predict.rates import DeviceRates

    spec = qwen["Q4_K_M"]
    types = {t: 2e-10 for t in ("F32", "F16", "Q8_0", "Q6_K", "Q5_K", "Q4_K")}
    for threads in (1, 2):
        r = DeviceRates("host", "cpu", 20.0, 0.8, types, 1e-10, {t: 3e-11 for t in types}, 3e-11, 1e-10, 1e-4, 1e-5,
                        1e-3, None, "test", tg_row_s=1.7e-8 / threads, threads=threads)
        cfg = RunConfig(n_ctx=4096, n_threads=threads)
        terms = speed.prompt_terms(spec, "host", cfg, depth=1024, n_prompt=512, rates=r)
        assert terms["recurrent"] > 0 and terms["attention"] > 0
        pred = speed.predict(spec, ["host"], cfg, depth=1024, n_prompt=512, rates={"host": r})
        assert 1.0 / pred.pp_tps == pytest.approx(sum(terms.values()), rel=1e-9)


def test_more_depth_slower_decode(llama7b):
    preds = [speed.predict(llama7b, ["v100-32gb"], RunConfig(n_ctx=8192), depth=d) for d in (0, 1024, 4096)]
    tgs = [p.tg_tps for p in preds]
    kv = [p.by_device["v100-32gb"].kv_bytes for p in preds]
    assert tgs[0] > tgs[1] > tgs[2]
    assert kv[0] < kv[1] < kv[2]
    # the ceiling of the seed does not move with depth; the strict one does
    assert preds[0].weights_ceiling_tg_tps == preds[2].weights_ceiling_tg_tps
    assert preds[0].physical_ceiling_tg_tps > preds[2].physical_ceiling_tg_tps


def test_quantized_kv_reads_fewer_bytes(llama7b):
    f16 = speed.predict(llama7b, ["v100-32gb"], RunConfig(n_ctx=8192), depth=4096)
    q8 = speed.predict(llama7b, ["v100-32gb"], RunConfig(n_ctx=8192, cache_type_k="q8_0", cache_type_v="q8_0"), depth=4096)
    assert q8.by_device["v100-32gb"].kv_bytes < f16.by_device["v100-32gb"].kv_bytes
    assert q8.tg_tps > f16.tg_tps


# ---- predictions --------------------------------------------------------------------------------

def test_prediction_structure_and_json(llama7b):
    p = speed.predict(llama7b, "v100-16gb", RunConfig(n_ctx=4096), depth=0, n_prompt=512)
    doc = json.loads(json.dumps(p.as_dict()))
    for key in ("tg_tps", "pp_tps", "weights_ceiling_tg_tps", "bound", "by_device"):
        assert key in doc
    assert doc["bound"] in speed.BOUNDS
    assert set(doc["by_device"]) >= {"v100-16gb"}
    assert 0 < p.tg_tps <= p.physical_ceiling_tg_tps
    assert p.pp_tps > p.tg_tps                   # a batch amortises the weight reads
    with pytest.raises(Exception):
        p.tg_tps = 1.0                           # frozen


def test_gpu_decode_is_memory_bound_and_pp_compute_bound(llama7b):
    p = speed.predict(llama7b, ["v100-32gb"], RunConfig(n_ctx=4096))
    assert p.bound == "memory"
    assert p.pp_bound == "compute"


def test_partial_offload_is_slower_and_uses_the_host(llama7b):
    host = {"id": "test-host", "name": "test host", "kind": "cpu", "memory_gib": 64, "bandwidth_gbs": 50,
            "source_url": "test"}
    from v100lab.facts.devices import device_from_mapping

    cpu = device_from_mapping(host, "test")
    full = speed.predict(llama7b, ["v100-32gb", cpu], RunConfig(n_ctx=4096))
    half = speed.predict(llama7b, ["v100-32gb", cpu], RunConfig(n_ctx=4096, n_gpu_layers=16))
    none = speed.predict(llama7b, ["v100-32gb", cpu], RunConfig(n_ctx=4096, n_gpu_layers=0))
    assert full.tg_tps > half.tg_tps > none.tg_tps
    assert half.by_device["host"].n_layers == 17 and half.by_device["v100-32gb"].n_layers == 15
    assert half.t_link_s > 0
    # prompt with layers left on the CPU: their weights cross PCIe every ubatch
    assert half.pp_bound in ("host-link", "compute")
    assert none.pp_tps < full.pp_tps


def test_two_gpus_add_up_per_layer(llama7b):
    one = speed.predict(llama7b, ["v100-32gb"], RunConfig(n_ctx=4096))
    two = speed.predict(llama7b, ["v100-32gb", "v100-32gb"], RunConfig(n_ctx=4096))
    assert len([k for k, d in two.by_device.items() if d.n_layers]) == 2
    # layer split: each token still passes every layer, one GPU after the other, so no faster
    assert two.tg_tps <= one.tg_tps


def test_uncalibrated_cpu_says_so(llama7b):
    from v100lab.facts.devices import device_from_mapping

    cpu = device_from_mapping({"id": "x", "name": "x", "kind": "cpu", "memory_gib": 64, "bandwidth_gbs": 50,
                               "source_url": "test"}, "test")
    p = speed.predict(llama7b, [cpu], RunConfig(n_ctx=2048))
    assert any("uncalibrated" in n for n in p.notes)


# ---- flags -------------------------------------------------------------------------------------



def test_flash_attention_never_costs_the_cpu_its_thread_sync():
    """ggml-cpu syncs its threads after every graph node: attention without flash attention is three nodes (KQ,
    soft_max, KQV) where flash attention is one that, over a long KV sweep, syncs once inside (its split-KV path).
    So a per-layer sync cost is charged to both paths alike, and flash attention — which also reads only the cells
    in use — is never predicted slower than off for it on a CPU (what 07 measures: no difference beyond the noise)."""
    import dataclasses

    from v100lab.predict import rates, work

    spec = skeleton_spec("llama2-7b", "Q4_0")
    host = get_device("host")
    base = rates._uncalibrated_cpu(host, 2)
    r = dataclasses.replace(base, attn_split_layer_s=2e-4, attn_s_per_op=1e-10)
    on, off = RunConfig(flash_attn="on", n_ctx=2048, n_gpu_layers=0), RunConfig(flash_attn="off", n_ctx=2048,
                                                                                 n_gpu_layers=0)
    for depth, synced in ((1024, spec.n_layer), (100, 0)):
        w_on = work.single_device_work(spec, on, depth, host)
        w_off = work.single_device_work(spec, off, depth, host)
        assert w_on.attn_split_layers == w_off.attn_split_layers == synced
        assert w_on.kv_bytes <= w_off.kv_bytes, "flash attention reads only the cells in use"
        p_on = speed.predict(spec, host, on, depth=depth, rates={"host": r})
        p_off = speed.predict(spec, host, off, depth=depth, rates={"host": r})
        assert p_on.tg_tps >= p_off.tg_tps, depth
