"""MoE expert offload as a run-config lever: --n-cpu-moe, --cpu-moe and -ot in the run
configuration and in the memory plan, with llama.cpp's spellings and rules (common/arg.cpp, common/common.h
LLM_FFN_EXPS_REGEX, src/llama-model-loader.cpp's first-match override)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from v100lab.measure import harness, memory_check
from v100lab.predict import memory
from v100lab.models import synth, zoo
from v100lab.facts.config import (LLM_FFN_EXPS_REGEX, RunConfig, add_flag_arguments, from_flag_args, moe_offload_argv,
                            tensor_overrides)
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.gguf.skeleton import skeleton_spec

V100 = "v100-16gb"


def _flags(*argv) -> RunConfig:
    p = argparse.ArgumentParser()
    add_flag_arguments(p)
    return from_flag_args(p.parse_args(list(argv)))


@pytest.fixture(scope="module")
def moe_spec(default_model):
    """The ~0.5 B qwen3moe preset as a Q4_K_M skeleton (nothing built): 8 layers of 32 experts."""
    return skeleton_spec(synth.arch_spec_of(synth.ARCH_PRESETS["synth-qwen3moe-500m"]), "Q4_K_M")


# ---- the flags ---------------------------------------------------------------------------------

def test_llama_cpp_spellings_parse():
    cfg = _flags("-ncmoe", "3", "-ot", "attn_q=CPU,attn_k=CPU", "--override-tensor", "token_embd=CPU", "-cmoe")
    assert cfg.n_cpu_moe == 3 and cfg.cpu_moe
    assert cfg.override_tensor == ("attn_q=CPU", "attn_k=CPU", "token_embd=CPU")
    assert _flags("--n-cpu-moe", "2", "--cpu-moe") == RunConfig(n_cpu_moe=2, cpu_moe=True)


def test_overrides_in_llama_cpp_order():
    """-ot entries first, then --cpu-moe, then one pattern per layer of --n-cpu-moe (llm_add_n_cpu_ffn_overrides)."""
    cfg = RunConfig(n_cpu_moe=2, cpu_moe=True, override_tensor=("x=CUDA0",))
    assert tensor_overrides(cfg) == (("x", "CUDA0"), (LLM_FFN_EXPS_REGEX, "CPU"),
                                      (r"blk\.0" + LLM_FFN_EXPS_REGEX, "CPU"), (r"blk\.1" + LLM_FFN_EXPS_REGEX, "CPU"))
    assert moe_offload_argv(cfg) == ["--override-tensor", "x=CUDA0", "--cpu-moe", "--n-cpu-moe", "2"]
    assert cfg.to_server_argv()[-5:] == moe_offload_argv(cfg)
    assert tensor_overrides(RunConfig()) == () and moe_offload_argv(RunConfig()) == []


def test_layer_patterns_match_only_their_layer():
    rx = re.compile(tensor_overrides(RunConfig(n_cpu_moe=2))[1][0])       # layer 1
    assert rx.search("blk.1.ffn_up_exps.weight") and rx.search("blk.1.ffn_gate_up_exps.weight")
    assert not rx.search("blk.11.ffn_up_exps.weight") and not rx.search("blk.21.ffn_down_exps.weight")
    assert not rx.search("blk.1.ffn_up_shexp.weight") and not rx.search("blk.1.ffn_gate_inp.weight")


@pytest.mark.parametrize("kw, match", [
    (dict(n_cpu_moe=-1), "n_cpu_moe"),
    (dict(override_tensor="exps"), "PATTERN=BUFFER_TYPE"),
    (dict(override_tensor="=CPU"), "needs a pattern"),
    (dict(override_tensor="exps="), "needs a pattern"),
    (dict(override_tensor="ffn_(up=CPU"), "not a regular expression"),
])
def test_bad_values_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        tensor_overrides(RunConfig(**kw))


def test_bad_values_are_refused_by_runconfig():
    with pytest.raises(ConfigError, match="n_cpu_moe"):
        RunConfig(n_cpu_moe=-1)
    with pytest.raises(ConfigError, match="PATTERN=BUFFER_TYPE"):
        RunConfig(override_tensor="exps")


def test_from_mapping_and_as_dict():
    cfg = RunConfig.from_mapping({"n_cpu_moe": 4, "override_tensor": ["exps=CPU"]})
    assert cfg.override_tensor == ("exps=CPU",) and cfg.as_dict()["override_tensor"] == ["exps=CPU"]
    with pytest.raises(ConfigError, match="override_tensor"):
        RunConfig.from_mapping({"override_tensor": 3})


def test_scenario_keys():
    from v100lab.workbook.scenario import load_scenario

    rc = load_scenario({"n_cpu_moe": 2, "cpu_moe": True, "override_tensor": ["exps=CPU"]}).run_config()
    assert (rc.n_cpu_moe, rc.cpu_moe, rc.override_tensor) == (2, True, ("exps=CPU",))
    with pytest.raises(ConfigError, match="n_cpu_moe"):
        load_scenario({"n_cpu_moe": -2})
    with pytest.raises(ConfigError, match="override_tensor"):
        load_scenario({"override_tensor": ["exps"]})


def test_llama_python_class_refuses_overrides():
    """llama_cpp.Llama() has kv_overrides but no tensor_buft_overrides: a config with overrides is refused, not run
    without them (the in-process backend sets llama_model_params itself, apply_to_model_params)."""
    assert "n_gpu_layers" in RunConfig().to_llama_kwargs()
    for cfg in (RunConfig(n_cpu_moe=1), RunConfig(cpu_moe=True), RunConfig(override_tensor=("exps=CPU",))):
        with pytest.raises(ConfigError, match="llama-server backend"):
            cfg.to_llama_kwargs()


# ---- the plan ----------------------------------------------------------------------------------

def _experts(spec, layers):
    return sum(t.n_bytes for t in spec.tensors if t.layer in layers and "_exps." in t.name)


def test_n_cpu_moe_moves_exactly_those_experts(moe_spec):
    dev = get_device(V100)
    base = memory.plan(moe_spec, dev, RunConfig(), with_max_ctx=False)
    moved = memory.plan(moe_spec, dev, RunConfig(n_cpu_moe=3), with_max_ctx=False)
    assert base.devices[V100].weights_bytes - moved.devices[V100].weights_bytes == _experts(moe_spec, {0, 1, 2})
    assert moved.devices[V100].kv_cache_bytes == base.devices[V100].kv_cache_bytes
    assert moved.offloaded_layers == base.offloaded_layers          # the layers stay on the GPU
    assert any("tensor overrides" in w for w in moved.warnings)
    # --cpu-moe: every layer's experts; a -ot pattern that names the same tensors is the same plan
    every = memory.plan(moe_spec, dev, RunConfig(cpu_moe=True), with_max_ctx=False)
    assert base.devices[V100].weights_bytes - every.devices[V100].weights_bytes == _experts(moe_spec, set(range(8)))
    ot = memory.plan(moe_spec, dev, RunConfig(override_tensor=r"blk\.[0-2]\.ffn_(up|down|gate)_exps=CPU"),
                     with_max_ctx=False)
    assert ot.devices[V100].weights_bytes == moved.devices[V100].weights_bytes
    assert ot.devices["host"].weights_bytes == moved.devices["host"].weights_bytes


def test_host_mapping_spans_the_moved_experts(moe_spec):
    """With mmap the host's CPU_Mapped buffer is the file range from its first to its last tensor
    (llama_model_loader::get_mapping_range), GPU tensors in between included; without mmap only the tensors."""
    dev = get_device(V100)
    mapped = memory.plan(moe_spec, dev, RunConfig(n_cpu_moe=3), with_max_ctx=False).devices["host"].weights_bytes
    read = memory.plan(moe_spec, dev, RunConfig(n_cpu_moe=3, use_mmap=False), with_max_ctx=False).devices["host"]
    embd = moe_spec.tensor("token_embd.weight").n_bytes
    assert read.weights_bytes == embd + _experts(moe_spec, {0, 1, 2})
    assert mapped >= read.weights_bytes


def test_expert_offload_lowers_the_gpu_need(moe_spec):
    """What the lever is for: experts off the GPU leave room there (the advisor's alternative to fewer layers)."""
    dev = get_device(V100)
    totals = [memory.plan(moe_spec, dev, RunConfig(n_cpu_moe=n), with_max_ctx=False).devices[V100].total_bytes
              for n in (0, 2, 4, 8)]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]


def test_override_to_a_gpu(moe_spec):
    dev = get_device(V100)
    p = memory.plan(moe_spec, dev, RunConfig(n_gpu_layers=0, override_tensor=r"blk\.7\.=CUDA0"), with_max_ctx=False)
    assert p.devices[V100].weights_bytes == sum(t.n_bytes for t in moe_spec.tensors if t.layer == 7)
    with pytest.raises(ConfigError, match="names a GPU"):
        memory.plan(moe_spec, [], RunConfig(override_tensor="exps=CUDA0"), with_max_ctx=False)
    with pytest.raises(ConfigError, match="1 GPU"):
        memory.plan(moe_spec, dev, RunConfig(override_tensor="exps=CUDA1"), with_max_ctx=False)


def test_dense_model_has_nothing_to_move(default_model):
    spec = skeleton_spec("qwen35-27b", "Q4_K_M")
    dev = get_device(V100)
    a = memory.plan(spec, dev, RunConfig(n_ctx=4096), with_max_ctx=False)
    b = memory.plan(spec, dev, RunConfig(n_ctx=4096, n_cpu_moe=8), with_max_ctx=False)
    assert a.devices == b.devices


# ---- llama.cpp applies them (CPU build: every tensor is on the CPU anyway) ------------------------

def test_llama_cpp_applies_the_overrides(default_model):
    """The in-process loader passes the overrides to llama.cpp (llama_model_params.tensor_buft_overrides): its log
    names each expert tensor of layer 0 as overridden, and the plan still matches its buffers."""
    from v100lab.facts.loadlog import load_and_capture
    from v100lab.models.worker import call_isolated

    path = zoo.model_path("synth-qwen3moe-tiny:Q4_0")
    cfg = RunConfig(n_ctx=1024, n_cpu_moe=1)
    _, text = call_isolated(load_and_capture, path, cfg)
    overridden = sorted(re.findall(r"tensor (\S+) .*buffer type overridden to CPU", text))
    assert overridden == ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"]
    checks, _, _ = memory_check.check_against_llama(path, cfg)
    assert checks["weights"].within(0.001) and checks["total"].within(0.02)


# ---- the speed prediction follows the overrides -------------------------------------------------

def test_decode_work_follows_the_overrides(moe_spec):
    """-ngl 99 --cpu-moe: the GPU reads every layer's weights but the experts, the host the experts' active
    fraction (expert_used_count / expert_count of each expert tensor) per token."""
    from v100lab.predict import speed

    dev = get_device(V100)
    cfg = RunConfig(n_gpu_layers=99, cpu_moe=True)
    placement = speed.placement_for(moe_spec, [dev], cfg)
    work = speed.decode_work(moe_spec, placement, cfg)
    base = speed.decode_work(moe_spec, speed.placement_for(moe_spec, [dev], RunConfig(n_gpu_layers=99)), cfg)
    frac = moe_spec.expert_used_count / moe_spec.expert_count
    experts = _experts(moe_spec, set(range(moe_spec.n_layer)))
    gpu, host = work[V100], work["host"]
    assert placement[V100].layers == tuple(range(moe_spec.n_layer)) and placement["host"].moved_in
    assert "input layer only" not in placement["host"].device.name   # the host's own rates, not the stub's
    assert sum(w.n_bytes for w in host.weights.values()) == pytest.approx(experts * frac)
    assert base[V100].weight_bytes_read - gpu.weight_bytes_read == pytest.approx(experts * frac)
    assert gpu.placed_weight_bytes == base[V100].placed_weight_bytes - experts
    assert gpu.kv_bytes == base[V100].kv_bytes                 # the layers (and their KV) stay on the GPU
    # the prediction: the host is part of every token now (its bandwidth, and the activations' round trips)
    p, b = (speed.predict(moe_spec, [dev], c, placement=speed.placement_for(moe_spec, [dev], c))
            for c in (cfg, RunConfig(n_gpu_layers=99)))
    assert p.by_device["host"].t_tg_s > 0 and b.by_device["host"].t_tg_s == 0
    assert p.tg_tps < b.tg_tps and p.t_link_s > b.t_link_s


def test_n_cpu_moe_moves_only_those_layers_work(moe_spec):
    from v100lab.predict import speed

    dev = get_device(V100)
    cfg = RunConfig(n_cpu_moe=2)
    placement = speed.placement_for(moe_spec, [dev], cfg)
    assert {moe_spec.tensor(n).layer for n in placement["host"].moved_in} == {0, 1}
    assert placement[V100].moved_out == placement["host"].moved_in


# ---- tune: experts before layers -----------------------------------------------------------------

@pytest.fixture(scope="module")
def moe_skeleton(tmp_path_factory):
    """The ~0.5 B qwen3moe preset as a ``skeleton:PATH:QUANT`` model argument (an architecture YAML file)."""
    import yaml

    path = tmp_path_factory.mktemp("arch") / "qwen3moe-500m.yaml"
    path.write_text(yaml.safe_dump(synth.arch_spec_of(synth.ARCH_PRESETS["synth-qwen3moe-500m"])))
    return f"skeleton:{path}:Q4_K_M"


def _small_gpu(gib: float):
    from v100lab.facts.devices import Device

    return Device(id="small-gpu", name=f"a {gib} GiB GPU", kind="gpu", memory_gib=gib, bandwidth_gbs=300,
                  fp16_tflops=30, host_link_gbs=16, runtime_overhead_mib=512)


def test_tune_moves_experts_before_layers(default_model, moe_skeleton, moe_spec):
    """A GPU that cannot hold every layer with its experts: tune keeps every layer on it and moves the experts of
    the fewest layers to the host (llama.cpp's --fit order), and its reasons say so."""
    from v100lab.advise.tune import tune

    gpu = _small_gpu(1.05)
    r = tune(moe_skeleton, gpu, min_ctx=4096)
    cfg = r.config
    assert r.best.fits and r.best.offloaded_layers == r.best.n_layer_total
    assert cfg.n_cpu_moe > 0 and not cfg.cpu_moe
    # the fewest: one layer fewer leaves the GPU short of its margin
    short = memory.feasibility(moe_spec, [gpu], cfg.with_(n_cpu_moe=cfg.n_cpu_moe - 1))
    assert not short.fits and any(b.device == "small-gpu" for b in short.blockers)
    assert ("--n-cpu-moe", str(cfg.n_cpu_moe)) == tuple(r.argv[-2:])
    why = next(x for x in r.reasons if x.flag == f"--n-cpu-moe {cfg.n_cpu_moe}").why
    assert "before dropping whole layers" in why and "--gpu-layers" in why
    # every layer with its experts on that GPU needs more than it has: no candidate without expert offload fits
    assert not any(c.fits for c in r.candidates if not (c.config.n_cpu_moe or c.config.cpu_moe))


def test_tune_leaves_a_moe_alone_when_it_fits(default_model, moe_skeleton):
    from v100lab.advise.tune import tune

    r = tune(moe_skeleton, V100, min_ctx=4096)
    assert r.config.n_cpu_moe == 0 and not r.config.cpu_moe \
        and not any(x.flag.startswith(("--n-cpu-moe", "--cpu-moe")) for x in r.reasons)


def test_llama_cpp_python_server_refuses_overrides(default_model):
    """llama-cpp-python's server has no tensor-override setting: the row fails saying so (nothing is started)."""
    rows = harness.run_tests(default_model, RunConfig(n_ctx=256, n_cpu_moe=1), "tg8", (0,), 1,
                             backend="llama-cpp-python-server")
    assert rows[0]["status"] != "ok" and "use llama-server" in rows[0]["reason"]


def test_llama_bench_fields_round_trip():
    """llama-bench's n_cpu_moe and tensor_buft_overrides fields (tools/llama-bench/llama-bench.cpp: "none" or
    PATTERN=BUFT joined by ';'; it has no --cpu-moe, so that is written as its pattern)."""
    from v100lab.measure.llamabench import export_llama_bench_json, import_llama_bench

    cfg = RunConfig(n_cpu_moe=2, cpu_moe=True, override_tensor=("attn_q=CPU",))
    row = {"status": "ok", "n_prompt": 0, "n_gen": 8, "n_depth": 0, "n_gpu_layers": 999, "flash_attn": "auto",
           "type_k": "f16", "type_v": "f16", "n_batch": 2048, "n_ubatch": 512, "n_threads": 2,
           "config": cfg.as_dict(), **harness.summarize([100_000_000], 8)}
    text = export_llama_bench_json([row])
    rec = json.loads(text)[0]
    assert rec["n_cpu_moe"] == 2 and rec["tensor_buft_overrides"] == f"attn_q=CPU;{LLM_FFN_EXPS_REGEX}=CPU"
    back = RunConfig.from_mapping(import_llama_bench(text)[0]["config"])
    assert tensor_overrides(back) == tensor_overrides(cfg)
    plain = json.loads(export_llama_bench_json([{**row, "config": RunConfig().as_dict()}]))[0]
    assert plain["n_cpu_moe"] == 0 and plain["tensor_buft_overrides"] == "none"
