"""llama.cpp's context arithmetic (v100lab.gguf.llama_context), checked against llama.cpp itself.

The KV caches llama.cpp creates are read from its own load log (real llama.cpp through llama-cpp-python's low-level
API, in a worker process), so a formula that drifts from the vendored source fails here.
"""

from __future__ import annotations

import pytest

from v100lab.gguf import llama_context
from v100lab.predict import memory, speed
from v100lab.facts.config import RunConfig
from v100lab.facts.devices import Device
from v100lab.gguf.header import read_spec
from v100lab.facts.loadlog import load_and_capture
from v100lab.models.worker import Worker

PRINT_MIB = 0.0051      # llama.cpp prints MiB with two decimals


# ---- the sliding-window cache with several sequences: measured -------------------------------------------

GEMMA_CONFIGS = [RunConfig(n_ctx=8192, n_ubatch=ub, n_parallel=par, kv_unified=uni, n_threads=1)
                 for ub in (512, 128) for par in (2, 4) for uni in (False, True)]


@pytest.fixture(scope="module")
def gemma_loads(gemma_model):
    """gemma3-270m's spec and llama.cpp's LoadFacts for each of GEMMA_CONFIGS (one worker process, one load each)."""
    with Worker() as w:
        loads = [w.call(load_and_capture, gemma_model, cfg, what="gemma3-270m KV caches")[0] for cfg in GEMMA_CONFIGS]
    return read_spec(gemma_model), loads


@pytest.mark.parametrize("i", range(len(GEMMA_CONFIGS)),
                         ids=[f"ub{c.n_ubatch}-np{c.n_parallel}-{'unified' if c.kv_unified else 'split'}"
                              for c in GEMMA_CONFIGS])
def test_kv_caches_match_llama_cpp_with_parallel_sequences(gemma_loads, i):
    """gemma3-270m (15 SWA layers with n_swa 512, 3 full-attention layers): llama.cpp's printed cells, streams and
    sizes of both caches equal the prediction — one window per stream without kv_unified, every sequence's window
    in the one stream with it (src/llama-kv-cache-iswa.cpp)."""
    spec, loads = gemma_loads
    cfg, facts = GEMMA_CONFIGS[i], loads[i]
    assert spec.sliding_window == 512 and spec.swa_layers
    caches = {k.tag: k for k in facts.kv_caches}
    assert set(caches) == {"SWA", "non-SWA"}
    cs = llama_context.context_sizes(spec, cfg)
    assert facts.n_ctx_seq == cs.n_ctx_seq
    for tag, swa in (("non-SWA", False), ("SWA", True)):
        got = caches[tag]
        layers = [il for il in range(spec.n_layer) if spec.has_kv(il) and spec.is_swa(il) == swa]
        assert got.cells == llama_context.kv_cells(spec, cfg, swa=swa), tag
        assert got.streams == cs.n_stream and got.seqs == cfg.n_parallel, tag
        assert got.layers == len(layers), tag
        predicted = llama_context.kv_cache_bytes(spec, cfg, layers)
        assert abs(predicted / 2**20 - got.size_mib) <= PRINT_MIB, (tag, predicted / 2**20, got.size_mib)
    # the KV buffers llama.cpp allocates (one per cache) add up to the memory plan's KV bytes
    kv_buffers = facts.buffer_mib("KV")
    plan_kv = memory.plan(spec, [], cfg, with_max_ctx=False).devices[memory.HOST].kv_cache_bytes
    assert abs(plan_kv / 2**20 - kv_buffers) <= 2 * PRINT_MIB


def test_swa_cache_is_one_window_per_stream_without_kv_unified(gemma_loads):
    """The disagreement the two old copies had: n_swa × n_seq cells per stream (what the speed model assumed) is
    what llama.cpp allocates only in the one unified stream; split, each stream holds one window + a ubatch."""
    spec, loads = gemma_loads
    split = next(f for c, f in zip(GEMMA_CONFIGS, loads) if (c.n_ubatch, c.n_parallel, c.kv_unified) == (512, 4, False))
    unified = next(f for c, f in zip(GEMMA_CONFIGS, loads) if (c.n_ubatch, c.n_parallel, c.kv_unified) == (512, 4, True))
    swa = {True: next(k for k in unified.kv_caches if k.tag == "SWA"), False: next(k for k in split.kv_caches if k.tag == "SWA")}
    assert (swa[False].cells, swa[False].streams) == (1024, 4)      # pad(512 + 512, 256) per stream
    assert (swa[True].cells, swa[True].streams) == (2560, 1)        # pad(4 × 512 + 512, 256) in one stream


# ---- the speed model reads the cache the memory plan sizes ---------------------------------------------

def test_speed_reads_the_swa_cache_memory_sizes(gemma_model):
    spec = read_spec(gemma_model)
    swa = spec.swa_layers[0]
    for uni in (False, True):
        cfg = RunConfig(n_ctx=8192, n_parallel=4, kv_unified=uni, flash_attn="off")
        cache = llama_context.kv_cells(spec, cfg, swa=True)
        # without flash attention a token spans the whole (padded) cache in use: at most the SWA cache's cells
        assert llama_context.kv_cells_read(spec, swa, cfg, used=5000) == cache == (2560 if uni else 1024)
    host = Device(id="host", name="h", kind="cpu", memory_gib=64, bandwidth_gbs=20)
    cfg = RunConfig(n_ctx=8192, n_parallel=4, flash_attn="off")
    work = speed.decode_work(spec, {"host": speed.Placed(host, tuple(range(spec.n_layer)), True)}, cfg, depth=4999)
    expect = sum(llama_context.kv_cells_read(spec, il, cfg, 5000) *
                 llama_context.kv_cell_bytes(spec, il, cfg.cache_type_k, cfg.cache_type_v)
                 for il in range(spec.n_layer))
    assert work["host"].kv_bytes == expect


# ---- formulas --------------------------------------------------------------------------------------

def test_row_size_is_integer_and_refuses_partial_blocks():
    assert llama_context.row_size("q8_0", 64) == 2 * 34
    assert llama_context.row_size("F16", 3) == 6
    assert llama_context.type_sizef("q4_0") == 18 / 32
    assert llama_context.bits_per_weight("q8_0") == 8.5
    with pytest.raises(Exception, match="block size 32"):
        llama_context.row_size("q4_0", 48)
    with pytest.raises(Exception, match="unknown ggml type"):
        llama_context.type_size("q9_9")


def test_context_sizes_pad_before_splitting():
    """n_ctx is padded to 256 before it is split between sequences (src/llama-context.cpp): 513 tokens for
    two sequences are 768 cells, 384 each, padded to 512 per stream (not 513 // 2 = 256)."""
    from v100lab.gguf.skeleton import skeleton_spec

    spec = skeleton_spec("llama2-7b", "Q4_0")
    cs = llama_context.context_sizes(spec, RunConfig(n_ctx=513, n_parallel=2))
    assert (cs.n_ctx, cs.n_ctx_seq, cs.n_stream) == (1024, 512, 2)
    assert llama_context.kv_cells(spec, RunConfig(n_ctx=513, n_parallel=2)) == 512


def test_flash_attn_resolution():
    assert llama_context.resolve_flash_attn(RunConfig(flash_attn="auto"))
    assert llama_context.resolve_flash_attn(RunConfig(flash_attn="on"))
    assert not llama_context.resolve_flash_attn(RunConfig(flash_attn="off"))


def test_kv_bytes_per_token_skips_layers_without_a_cache():
    from v100lab.gguf.skeleton import skeleton_spec

    spec = skeleton_spec("qwen35-27b", "Q4_0")     # hybrid: recurrent layers keep no KV
    per_token = llama_context.kv_bytes_per_token(spec)
    attn = [il for il in range(spec.n_layer) if llama_context.has_kv_cache(spec, il)]
    assert 0 < len(attn) < spec.n_layer
    assert per_token == len(attn) * llama_context.kv_cell_bytes(spec, attn[0])
    cfg = RunConfig(n_ctx=4096)
    assert llama_context.kv_cache_bytes(spec, cfg) == per_token * llama_context.kv_cells(spec, cfg)
