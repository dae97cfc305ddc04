"""llama.cpp load logs: captured through the real log callback, and parsed into facts.

Real logs come from loads of the default model, gemma3-270m and a synthetic model; GPU lines (which a
CPU build never prints) are written from llama.cpp's own format strings:
src/llama-model.cpp (load_tensors), src/llama-kv-cache.cpp (llama_kv_cache::llama_kv_cache),
src/llama-kv-cache-iswa.cpp, src/llama-memory-recurrent.cpp, src/llama-context.cpp.
"""

from __future__ import annotations

import ctypes

import pytest

from v100lab.facts import loadlog
from v100lab.facts.config import RunConfig
from v100lab.base.errors import RunFailed


# ---- real loads ----------------------------------------------------------------------------

def test_default_model_load_facts(default_model):
    facts, text = loadlog.load_and_capture(default_model, RunConfig(n_ctx=2000, n_ubatch=256))
    assert "llama_kv_cache" in text
    # llama.cpp pads n_ctx to 256; the DESIGN fact: 30 layers × 3 KV heads × 64 × 2 × 2 bytes × 2048 = 45 MiB
    assert facts.n_ctx == 2048 and facts.n_ctx_seq == 2048
    assert facts.n_ubatch == 256 and facts.n_batch == 2000 and facts.n_seq_max == 1
    (kv,) = facts.kv_caches
    assert (kv.cells, kv.layers, kv.type_k, kv.type_v) == (2048, 30, "f16", "f16")
    assert kv.size_mib == pytest.approx(45.0) and kv.k_mib == pytest.approx(22.5)
    assert facts.buffer_mib("KV", "host") == pytest.approx(45.0)
    assert facts.buffer_mib("model") == pytest.approx(92.10, abs=0.01)
    assert facts.buffer_mib("compute") > 0 and facts.buffer_mib("output") > 0
    assert facts.devices == ("host",)
    assert facts.flash_attn_requested == "auto" and facts.flash_attn in ("enabled", "disabled")
    assert facts.kv_unified is False
    assert facts.n_ctx_train == 8192 and facts.model_meta["arch"] == "llama"
    # 30 blocks + the output layer (slot 30): llama.cpp counts n_layer + 1 layer slots
    assert len(facts.layer_devices) == 31 and {d for _, d in facts.layer_devices} == {"CPU"}
    assert facts.offloaded_layers is None     # a CPU-only build prints no offload line
    assert any("n_ctx_seq (2048) < n_ctx_train" in w for w in facts.warnings)
    d = facts.as_dict()
    assert d["by_device_mib"]["host"]["KV"] == pytest.approx(45.0) and "unknown_lines" not in d


def test_gemma_swa_caches_are_tagged(gemma_model):
    facts, _ = loadlog.load_and_capture(gemma_model, RunConfig(n_ctx=4096, n_parallel=2))
    tags = {k.tag: k for k in facts.kv_caches}
    assert set(tags) == {"SWA", "non-SWA"}
    assert tags["non-SWA"].cells == 2048 and tags["non-SWA"].streams == 2     # per-stream cells
    assert tags["SWA"].cells == 1024                                          # pad(512 + 512, 256)
    assert tags["SWA"].layers + tags["non-SWA"].layers == 18
    assert facts.kv_size_mib == pytest.approx(facts.buffer_mib("KV"), abs=0.02)


def test_synthetic_q4_0_has_a_repack_buffer(tiny_f16):
    from v100lab.models import zoo

    path = zoo.model_path("synth-tiny:Q4_0")
    facts, _ = loadlog.load_and_capture(path, RunConfig(n_ctx=512))
    names = {b.buffer for b in facts.buffers if b.kind == "model"}
    assert {"CPU_Mapped", "CPU_REPACK"} <= names
    assert facts.cpu_fallbacks  # token_embd cannot use the repack buffer type: llama.cpp says so


@pytest.mark.parametrize("quant", ["Q2_K", "Q4_0", "Q4_K_M", "Q8_0"])
def test_the_predicted_repack_buffer_is_llamas(tiny_f16, quant):
    """memory.is_repacked names the tensors this build re-lays out (buildflags.repack_types_in_use: Q2_K only on an
    AVX-512 build), so the predicted host weights are llama.cpp's CPU_Mapped + CPU_REPACK buffers, on either build."""
    from v100lab.predict import memory
    from v100lab.models import zoo
    from v100lab.gguf.header import read_spec

    path = zoo.model_path(f"synth-tiny:{quant}")
    spec = read_spec(path)
    facts, _ = loadlog.load_and_capture(path, RunConfig(n_ctx=512))
    repack_mib = sum(b.mib for b in facts.buffers if b.kind == "model" and b.buffer == "CPU_REPACK")
    predicted = sum(t.n_bytes for t in spec.tensors if memory.is_repacked(t))
    assert repack_mib == pytest.approx(predicted / 2**20, abs=0.01), \
        f"{quant}: CPU_REPACK {repack_mib} MiB, predicted {predicted / 2**20:.2f} MiB of {sorted(memory.REPACK_TYPES)}"
    host = memory.weights_by_device(spec, {i: memory.HOST for i in range(spec.n_layer + 1)})[memory.HOST]
    assert facts.buffer_mib("model", "host") == pytest.approx(host / 2**20, abs=0.02)


def test_refused_configuration_raises_with_llamas_reason(default_model):
    with pytest.raises(RunFailed) as exc:
        loadlog.load_and_capture(default_model, RunConfig(n_ctx=512, cache_type_v="q8_0", flash_attn="off"))
    assert "flash_attn" in str(exc.value) or "Flash Attention" in str(exc.value)


def _current_callback() -> int:
    import llama_cpp

    cb = llama_cpp.llama_log_callback()
    ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(cb), ctypes.byref(ud))
    return ctypes.cast(cb, ctypes.c_void_p).value


def test_capture_restores_llama_cpp_pythons_callback_and_nests(default_model):
    from llama_cpp import _logger

    theirs = ctypes.cast(_logger.llama_log_callback, ctypes.c_void_p).value
    assert _current_callback() == theirs
    with loadlog.capture_llama_log() as outer:
        assert _current_callback() != theirs
        with loadlog.capture_llama_log() as inner:
            loadlog.load_and_capture(default_model, RunConfig(n_ctx=256))
        assert _current_callback() != theirs
    assert _current_callback() == theirs
    assert "KV buffer size" in inner.text and inner.text in outer.text
    assert inner.facts().buffer_mib("KV") > 0


# ---- GPU logs, written from llama.cpp's format strings -----------------------------------------

def _gpu_log(seqs_fmt: str = "%2u/%u seqs") -> str:
    L = []
    # src/llama-model.cpp, load_tensors
    L.append("load_tensors: loading model tensors, this can take a while... (mmap = true)")
    L.append("load_tensors: layer %3d assigned to device %s, is_swa = %d" % (0, "CPU", 0))
    L.append("load_tensors: layer %3d assigned to device %s, is_swa = %d" % (1, "CUDA0", 1))
    L.append("%s: offloading output layer to GPU" % "load_tensors")
    L.append("%s: offloading %d repeating layers to GPU" % ("load_tensors", 61))
    L.append("%s: offloaded %d/%d layers to GPU" % ("load_tensors", 62, 63))
    L.append("%s: %12s model buffer size = %8.2f MiB" % ("load_tensors", "CUDA0", 15120.44))
    L.append("%s: %12s model buffer size = %8.2f MiB" % ("load_tensors", "CPU_Mapped", 1102.50))
    # src/llama-context.cpp
    for k, v in (("n_seq_max", 1), ("n_ctx", 8192), ("n_ctx_seq", 8192), ("n_batch", 2048), ("n_ubatch", 512)):
        L.append("%s: %-21s = %u" % ("llama_context", k, v))
    L.append("%s: %-21s = %s" % ("llama_context", "flash_attn", "auto"))
    L.append("%s: %-21s = %s" % ("llama_context", "kv_unified", "false"))
    L.append("%s: %10s  output buffer size = %8.2f MiB" % ("llama_context", "CUDA_Host", 1.00))
    # src/llama-kv-cache-iswa.cpp + src/llama-kv-cache.cpp
    L.append("%s: creating non-SWA KV cache, size = %u cells" % ("llama_kv_cache_iswa", 8192))
    L.append("%s: %10s KV buffer size = %8.2f MiB" % ("llama_kv_cache", "CUDA0", 320.0))
    size = "%s: size = %7.2f MiB (%6u cells, %3d layers, " + seqs_fmt + "), K (%s): %7.2f MiB, V (%s): %7.2f MiB"
    args = ("llama_kv_cache", 340.0, 8192, 10, 1) + ((1,) if "/" in seqs_fmt else ()) + ("f16", 170.0, "f16", 170.0)
    L.append(size % args)
    L.append("%s: creating     SWA KV cache, size = %u cells" % ("llama_kv_cache_iswa", 1536))
    args = ("llama_kv_cache", 318.75, 1536, 52, 1) + ((1,) if "/" in seqs_fmt else ()) + ("q8_0", 159.4, "q8_0", 159.4)
    L.append(size % args)
    L.append("%s: layer %d is assigned to device %s but the Flash Attention tensor is assigned to device %s "
             "(usually due to missing support)" % ("llama_context", 3, "CUDA0", "CPU"))
    L.append("%s: Flash Attention was auto, set to %s" % ("llama_context", "disabled"))
    L.append("%s: %10s compute buffer size = %8.2f MiB" % ("llama_context", "CUDA0", 522.62))
    L.append("%s: %10s compute buffer size = %8.2f MiB" % ("llama_context", "CUDA_Host", 26.01))
    L.append("llama_context: graph nodes  = %d" % 2110)
    L.append("llama_context: graph splits = %d" % 2)
    # src/llama-memory-recurrent.cpp
    L.append("%s: %10s RS buffer size = %8.2f MiB" % ("llama_memory_recurrent", "CUDA0", 149.62))
    L.append("%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs %2u rs_seq), R (%s): %7.2f MiB, S (%s): %7.2f MiB"
             % ("llama_memory_recurrent", 149.62, 1, 64, 1, 0, "f32", 5.62, "f32", 144.0))
    L.append("build: 6000 (abc1234) with cc (GCC) 13.2 for x86_64-linux-gnu")
    L.append("something new that no parser knows yet")
    return "\n".join(L) + "\n"


@pytest.mark.parametrize("seqs_fmt", ["%2u/%u seqs", "%2u seqs"])
def test_gpu_log_from_llama_cpp_format_strings(seqs_fmt):
    f = loadlog.parse_load_log(_gpu_log(seqs_fmt))
    assert (f.offloaded_layers, f.offloadable_layers) == (62, 63)
    assert f.repeating_layers_offloaded == 61 and f.output_layer_offloaded is True
    assert dict(f.layer_devices) == {0: "CPU", 1: "CUDA0"}
    by = f.by_device()
    assert by["CUDA0"] == pytest.approx({"model": 15120.44, "KV": 320.0, "compute": 522.62, "RS": 149.62})
    assert by["host"] == pytest.approx({"model": 1102.50, "output": 1.0, "compute": 26.01})
    assert f.buffer_bytes("KV", "CUDA0") == int(round(320.0 * 2**20))
    non_swa, swa = f.kv_caches
    assert (non_swa.tag, non_swa.cells, non_swa.layers) == ("non-SWA", 8192, 10)
    assert (swa.tag, swa.cells, swa.type_k, swa.v_mib) == ("SWA", 1536, "q8_0", 159.4)
    assert non_swa.streams == (1 if "/" in seqs_fmt else None)
    (rs,) = f.recurrent
    assert (rs.cells, rs.layers, rs.type_s, rs.s_mib, rs.rs_seq) == (1, 64, "f32", 144.0, 0)
    assert f.flash_attn_requested == "auto" and f.flash_attn == "disabled"
    assert any("Flash Attention tensor is assigned to device CPU" in x for x in f.cpu_fallbacks)
    assert (f.n_ctx, f.n_ubatch, f.graph_nodes, f.graph_splits) == (8192, 512, 2110, 2)
    assert f.build.startswith("6000 (abc1234)")
    assert f.unknown_lines == ("something new that no parser knows yet",)


def test_newer_flash_attention_lines_and_old_buffer_format():
    text = ("resolve_fused_ops: Flash Attention enabled\n"
            "llm_load_tensors:        CPU buffer size =    92.10 MiB\n"
            "llama_new_context_with_model: flash_attn = 0\n")
    f = loadlog.parse_load_log(text)
    assert f.flash_attn == "enabled"
    assert f.buffer_mib("model", "host") == pytest.approx(92.10)
    f2 = loadlog.parse_load_log("sched_reserve: Flash Attention was auto, set to enabled\n"
                                "llama_context:      Metal compute buffer size =   304.00 MiB\n")
    assert f2.flash_attn == "enabled" and f2.by_device() == {"Metal": {"compute": 304.0}}
    # src/llama-context.cpp, resolve_fused_ops: "%s: layer %d is assigned to device %s but %s is assigned to
    # device %s (usually due to missing support)" then "%s: %s not supported, set to disabled"
    f3 = loadlog.parse_load_log(
        "resolve_fused_ops: layer 2 is assigned to device CUDA0 but Flash Attention is assigned to device CPU "
        "(usually due to missing support)\nresolve_fused_ops: Flash Attention not supported, set to disabled\n")
    assert f3.flash_attn == "disabled" and len(f3.cpu_fallbacks) == 1


def test_empty_and_garbage_logs_give_empty_facts():
    assert loadlog.parse_load_log("") == loadlog.LoadFacts()
    f = loadlog.parse_load_log("....\n\x00binary?\nllama_kv_cache: size = not a number\n")
    assert f.kv_caches == () and f.buffers == ()


def test_nested_captures_each_get_their_lines_and_unwind_cleanly(default_model):
    import llama_cpp

    from v100lab.facts.loadlog import capture_llama_log

    with capture_llama_log() as outer:
        with capture_llama_log() as inner:
            pass  # identical (empty) captures: removing the inner one must not remove the outer
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(default_model).encode(), params)
        llama_cpp.llama_model_free(model)
    assert inner.text == ""
    assert "llama_model_loader" in outer.text
