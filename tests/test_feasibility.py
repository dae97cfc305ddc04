"""One feasibility rule for plan and tune: every device holds its part — the GPU and the
host's RAM, each with a margin — llama.cpp's limits hold, threads stay within the cores; tune recommends only
what passes it, and says what would have to change when nothing does."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from v100lab.gguf import llama_context
from v100lab.predict import memory, speed
from v100lab.advise.tune import NothingFits, tune
from v100lab.cli.main import main
from v100lab.facts.config import RunConfig, add_flag_arguments, from_flag_args
from v100lab.facts.devices import Device, get_device
from v100lab.base.errors import ConfigError
from v100lab.gguf.skeleton import skeleton_spec

GIB = 2**30
ARCHS = ("qwen35-27b", "qwen3-32b", "gemma3-27b", "llama2-7b")
QUANTS = ("Q8_0", "Q6_K", "Q4_K_M", "Q4_0")


def _gpu_file(tmp_path, gib: float, name: str = "small") -> str:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"id: {name}\nname: a {gib:g} GiB card\nkind: gpu\nmemory_gib: {gib}\nbandwidth_gbs: 900\n"
                 "fp16_tflops: 100\nhost_link_gbs: 15.75\nruntime_overhead_mib: 512\n")
    return str(p)


def _host_file(tmp_path, gib: float, name: str = "ram") -> str:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"id: {name}\nname: a host with {gib:g} GiB\nkind: cpu\nmemory_gib: {gib}\nbandwidth_gbs: 40\n")
    return str(p)


def _argv_config(argv) -> RunConfig:
    """The RunConfig a printed llama-server command stands for (parsed with plan's own flag parser)."""
    p = argparse.ArgumentParser(add_help=False)
    add_flag_arguments(p)
    args, _ = p.parse_known_args(list(argv[3:]))
    return from_flag_args(args)


def _json(text: str):
    def no_constant(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=no_constant)


# ---- llama.cpp's limits, from this build ---------------------------------------------------------------

def test_max_sequences_is_this_builds():
    llama_cpp = pytest.importorskip("llama_cpp")
    fn = getattr(llama_cpp, "llama_max_parallel_sequences", None)
    if fn is None:
        pytest.skip("this llama-cpp-python does not bind llama_max_parallel_sequences")
    assert fn() == llama_context.LLAMA_MAX_SEQ


def test_limits_are_blockers():
    spec = skeleton_spec("qwen3-32b", "Q4_K_M")
    big = Device(id="big", name="big", kind="gpu", memory_gib=4096, bandwidth_gbs=1000)
    ok = memory.feasibility(spec, big, RunConfig(n_ctx=4096, n_parallel=llama_context.LLAMA_MAX_SEQ))
    assert ok.fits and not ok.blockers
    f = memory.feasibility(spec, big, RunConfig(n_ctx=4096, n_parallel=300))
    assert not f.fits and [b.kind for b in f.blockers] == ["parallel"]
    assert "256" in f.blockers[0].change
    f = memory.feasibility(spec, big, RunConfig(n_ctx=4096, n_parallel=100000))
    kinds = {b.kind for b in f.blockers}
    assert {"parallel", "context"} <= kinds       # and each slot would get no cell at all
    assert any("each gets none" in b.problem for b in f.blockers)
    f = memory.feasibility(spec, big, RunConfig(n_ctx=llama_context.MAX_CTX + 1))
    assert any(b.kind == "context" for b in f.blockers)


def test_margin_is_part_of_the_rule():
    spec = skeleton_spec("qwen35-27b", "Q4_0")
    cfg = RunConfig(n_ctx=2048)
    probe = Device(id="g", name="g", kind="gpu", memory_gib=64, bandwidth_gbs=900)
    total = memory.plan(spec, probe, cfg, with_max_ctx=False).devices["g"].total_bytes
    tight = Device(id="g", name="g", kind="gpu", memory_gib=(total + 100 * 2**20) / GIB, bandwidth_gbs=900)
    assert memory.feasibility(spec, tight, cfg, margin=False).fits
    f = memory.feasibility(spec, tight, cfg)
    assert not f.fits and f.smallest.device == "g" and f.smallest.shortfall_bytes > 0
    roomy = Device(id="g", name="g", kind="gpu", memory_gib=memory.capacity_for(total) / GIB, bandwidth_gbs=900)
    assert memory.feasibility(spec, roomy, cfg).fits


# ---- the host's RAM counts -----------------------------------------------------------------------------

def test_host_ram_short_blocks_a_partial_offload(tmp_path):
    """qwen3-32b Q8_0 (~32 GiB) on an 8 GiB card: the 24 GiB host cannot hold the layers left on the CPU."""
    gpu, host = _gpu_file(tmp_path, 8), _host_file(tmp_path, 24)
    spec = skeleton_spec("qwen3-32b", "Q8_0")
    devs = [get_device(gpu), get_device(host)]
    f = memory.feasibility(spec, devs, RunConfig(n_ctx=4096, n_gpu_layers=2), detail=True)
    assert not f.fits and [b.device for b in f.blockers] == ["host"]
    b = f.blockers[0]
    assert "host RAM" in b.problem and "24.0 GiB available" in b.problem
    assert "a smaller quant" in b.change and "a GPU with ≥" in b.change and "of RAM" in b.change
    # the library refuses to recommend, and says why
    with pytest.raises(NothingFits) as exc:
        tune("qwen3-32b", gpu, host=host, quants=["Q8_0"])
    r = exc.value.result
    assert r.blocker.device == "host" and "host RAM" in str(exc.value)
    assert not any(c.fits for c in r.candidates)


def test_cli_tune_nothing_fits_prints_no_command(tmp_path, capsys):
    gpu, host = _gpu_file(tmp_path, 8), _host_file(tmp_path, 24)
    assert main(["tune", "qwen3-32b", "-d", gpu, "--host-device", host, "--quants", "Q8_0"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "llama-server" not in err
    assert len(err.strip().splitlines()) == 1 and "nothing fits" in err and "host RAM" in err
    assert main(["tune", "qwen3-32b", "-d", gpu, "--host-device", host, "--quants", "Q8_0", "--json"]) == 1
    out, err = capsys.readouterr()
    doc = _json(out)
    assert doc["fits"] is False and doc["argv"] == [] and doc["command"] is None
    assert doc["blocker"]["device"] == "host" and doc["blockers"]
    assert len(err.strip().splitlines()) == 1
    # plan agrees: the configuration tune would have printed before (--gpu-layers 2) does not fit
    assert main(["plan", "skeleton:qwen3-32b:Q8_0", "-d", gpu, "-d", host, "-ngl", "2", "--json"]) == 0
    doc = _json(capsys.readouterr().out)
    assert doc["fits"] is False and doc["feasibility"]["smallest_blocker"]["device"] == "host"
    assert doc["max_ctx"] == 0        # no context makes the host hold 30 GiB of layers


def test_huge_context_is_not_recommended(tmp_path, capsys):
    host = _host_file(tmp_path, 64)
    with pytest.raises(NothingFits) as exc:
        tune("qwen35-27b", "a100-80gb", min_ctx=100_000_000, host=host, quants=["Q4_K_M"])
    r = exc.value.result
    assert any("training context" in n for n in r.notes)
    assert "--ctx-size" in r.blocker.change            # the largest context that would fit
    assert main(["tune", "skeleton:qwen35-27b:Q4_K_M", "-d", "a100-80gb", "--host-device", host,
                 "--min-ctx", "100000000"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "nothing fits a100-80gb" in err


def test_default_model_at_a_billion_tokens(default_model, tmp_path, capsys):
    host = _host_file(tmp_path, 32)
    assert main(["tune", "default", "-d", "v100-16gb", "--host-device", host, "--min-ctx", "999999999"]) == 1
    out, err = capsys.readouterr()
    assert "--ctx-size 1000000000" not in out + err and "0.0 tok/s" not in out
    assert "nothing fits v100-16gb" in err


def test_limits_no_candidate_meets_are_bad_input(capsys):
    for n in (300, 100000):
        with pytest.raises(ConfigError, match="256"):
            tune("skeleton:qwen35-27b:Q4_0", "v100-16gb", parallel=n)
        assert main(["tune", "skeleton:qwen35-27b:Q4_0", "-d", "v100-16gb", "--parallel", str(n)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "llama-server" not in err
    with pytest.raises(ConfigError, match="32-bit"):
        tune("skeleton:qwen35-27b:Q4_0", "v100-16gb", min_ctx=2**31)


def test_max_ctx_counts_the_host():
    """All layers on the CPU of a small host behind a big GPU (-ngl 0): the host's KV limits the context."""
    spec = skeleton_spec("llama2-7b", "Q4_0")
    gpu = Device(id="g", name="g", kind="gpu", memory_gib=80, bandwidth_gbs=900)
    host = Device(id="h", name="h", kind="cpu", memory_gib=9, bandwidth_gbs=40)
    cfg = RunConfig(n_gpu_layers=0)
    n = memory.max_ctx(spec, [gpu, host], cfg, margin=True)
    assert 256 <= n < spec.n_ctx_train
    assert memory.feasibility(spec, [gpu, host], cfg.with_(n_ctx=n)).fits
    over = memory.feasibility(spec, [gpu, host], cfg.with_(n_ctx=n + 256))
    assert not over.fits and [b.device for b in over.blockers] == ["host"]
    assert memory.max_ctx(spec, [gpu, host], cfg, margin=False) >= n


def test_training_context_warning(capsys):
    assert main(["plan", "skeleton:qwen3-32b:Q4_K_M", "-d", "a100-80gb", "-c", "65536"]) == 0
    out = capsys.readouterr().out
    assert "training context 40960" in out and "caps each slot" in out


# ---- threads beyond the cores ---------------------------------------------------------------------------

def _cpu(cores: int) -> Device:
    return Device(id="cpu4", name="a 4-core CPU", kind="cpu", memory_gib=64, bandwidth_gbs=40,
                  extra={"fingerprint": {"cpu_count": cores}})


def test_threads_beyond_the_cores_are_not_extrapolated():
    spec = skeleton_spec("llama2-7b", "Q4_0")
    dev = _cpu(4)
    at = {t: speed.predict(spec, dev, RunConfig(n_ctx=2048, n_threads=t)) for t in (2, 4, 256)}
    assert at[256].pp_tps == at[4].pp_tps and at[256].tg_tps == at[4].tg_tps
    assert at[4].pp_tps > at[2].pp_tps
    assert any("more threads than the 4 cores" in n for n in at[256].notes)
    assert not any("cores" in n for n in at[4].notes)
    f = memory.feasibility(spec, dev, RunConfig(n_ctx=2048, n_threads=256))
    assert [b.kind for b in f.blockers] == ["threads"] and "-t 4" in f.blockers[0].change
    assert memory.feasibility(spec, dev, RunConfig(n_ctx=2048, n_threads=4)).fits


def test_calibrated_host_is_clamped_too():
    cal = {"version": 1, "threads": {"1": {"bandwidth_gbs": 20.0, "efficiency": 1.0,
                                           "tg_s_per_weight": {"Q4_0": 8e-11}, "attn_s_per_op": 1e-11,
                                           "overhead_token_s": 0.0, "overhead_layer_s": 1e-5,
                                           "pp_s_per_weight": {"Q4_0": 2e-11}, "pp_attn_s_per_op": 1e-11,
                                           "pp_overhead_s": 0.0}}}
    profile = {"speed_calibration": cal, "fingerprint": {"cpu_count": 2}}
    dev = Device(id="host", name="h", kind="cpu", memory_gib=8, bandwidth_gbs=20)
    r256 = speed.rates_for(dev, RunConfig(n_threads=256), profile)
    r2 = speed.rates_for(dev, RunConfig(n_threads=2), profile)
    assert r256.pp_cost("Q4_0") == r2.pp_cost("Q4_0") and r256.tg_cost("Q4_0") == r2.tg_cost("Q4_0")
    assert "2 cores" in r256.threads_note and not r2.threads_note


def _profile(cost: float, cores: int, efficiency: float) -> dict:
    per = {"bandwidth_gbs": 20.0, "efficiency": efficiency, "attn_s_per_op": cost, "overhead_token_s": 0.0,
           "overhead_layer_s": 0.0, "pp_attn_s_per_op": cost, "pp_overhead_s": 0.0,
           "tg_s_per_weight": {t: cost for t in ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "F32")},
           "pp_s_per_weight": {t: cost for t in ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "F32")}}
    return {"speed_calibration": {"version": 1, "threads": {"1": per}}, "fingerprint": {"cpu_count": cores}}


@settings(max_examples=30, deadline=None)
@given(arch=st.sampled_from(ARCHS), quant=st.sampled_from(QUANTS), cores=st.integers(1, 64),
       threads=st.integers(1, 1024), cost=st.sampled_from([1e-14, 1e-11, 1e-9]),
       efficiency=st.sampled_from([0.6, 1.0, 1.3]), depth=st.integers(0, 8192))
def test_cpu_prediction_within_its_ceiling_and_cores(arch, quant, cores, threads, cost, efficiency, depth):
    """Whatever the calibration, a CPU prediction never beats the bytes it reads at peak bandwidth (the ceiling
    plan prints), and threads past the cores predict what the cores do."""
    spec = skeleton_spec(arch, quant)
    dev = Device(id="host", name="h", kind="cpu", memory_gib=512, bandwidth_gbs=20)
    prof = _profile(cost, cores, efficiency)
    cfg = RunConfig(n_ctx=16384, n_threads=threads)
    p = speed.predict(spec, dev, cfg, depth=depth, profile=prof)
    assert p.tg_tps <= p.physical_ceiling_tg_tps * (1 + 1e-9)
    q = speed.predict(spec, dev, cfg.with_(n_threads=min(threads, cores)), depth=depth, profile=prof)
    assert (p.tg_tps, p.pp_tps) == (q.tg_tps, q.pp_tps)


def test_cli_plan_threads(capsys):
    cores = memory.host_cores()
    assert main(["plan", "skeleton:llama2-7b:Q4_0", "-d", "v100-16gb", "-t", str(cores * 128), "--json"]) == 0
    doc = _json(capsys.readouterr().out)
    assert doc["fits"] is False and [b["kind"] for b in doc["feasibility"]["blockers"]] == ["threads"]


# ---- the property: tune's answer always passes plan's rule ---------------------------------------------

@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(arch=st.sampled_from(ARCHS), quants=st.lists(st.sampled_from(QUANTS), min_size=1, max_size=2, unique=True),
       gpu_gib=st.sampled_from([2, 8, 16, 24, 48, 80]), host_gib=st.sampled_from([4, 16, 32, 64, 256]),
       min_ctx=st.one_of(st.integers(1, 70_000), st.integers(70_000, 10**9)),
       parallel=st.one_of(st.integers(1, 8), st.integers(9, 400)))
def test_tune_answer_always_passes_plans_rule(tmp_path_factory, capsys, arch, quants, gpu_gib, host_gib, min_ctx,
                                             parallel):
    d = tmp_path_factory.mktemp("dev")
    gpu, host = _gpu_file(d, gpu_gib), _host_file(d, host_gib)
    devs = [get_device(gpu), get_device(host)]
    try:
        r = tune(arch, gpu, host=host, quants=quants, min_ctx=min_ctx, parallel=parallel)
    except ConfigError as exc:      # a limit no configuration meets: bad input
        event("refused")
        assert parallel > llama_context.LLAMA_MAX_SEQ and "256" in str(exc)
        return
    except NothingFits as exc:
        event("nothing fits")
        r = exc.result
        assert not any(c.fits for c in r.candidates) and r.blockers
        assert "\n" not in exc.args[0]
        # the closest candidate really does not pass the rule
        spec = skeleton_spec(arch, r.closest.quant)
        assert not memory.feasibility(spec, devs, r.closest.config).fits
        return
    event("recommended, partial offload" if r.best.offloaded_layers < r.best.n_layer_total else "recommended")
    assert parallel <= llama_context.LLAMA_MAX_SEQ
    cfg = _argv_config(r.argv)
    assert cfg == r.config                         # the printed command is the configuration judged
    spec = skeleton_spec(arch, r.quant)
    f = memory.feasibility(spec, devs, cfg)
    assert f.fits, [b.line() for b in f.blockers]
    assert math.isfinite(r.best.tg_tps) and r.best.tg_tps > 0
    # and the plan command, given the printed flags and the same devices, says it fits
    capsys.readouterr()
    assert main(["plan", f"skeleton:{arch}:{r.quant}", "-d", gpu, "-d", host, *r.argv[3:], "--json"]) == 0
    doc = _json(capsys.readouterr().out)
    assert doc["fits"] is True and doc["feasibility"]["blockers"] == []


def test_tune_answer_passes_the_plan_command(tmp_path, capsys):
    """End to end on one case: the command tune prints, given to plan with the same devices, fits."""
    gpu, host = _gpu_file(tmp_path, 16), _host_file(tmp_path, 32)
    assert main(["tune", "qwen35-27b", "-d", gpu, "--host-device", host, "--min-ctx", "8192", "--json"]) == 0
    t = _json(capsys.readouterr().out)
    assert t["fits"] is True
    flags = t["argv"][3:]
    assert main(["plan", f"skeleton:qwen35-27b:{t['quant']}", "-d", gpu, "-d", host, *flags, "--json"]) == 0
    p = _json(capsys.readouterr().out)
    assert p["fits"] is True and p["max_ctx"] >= 8192


# ---- the --fit fallback: one function for the levers, the seed's staircase and the advisor ---------------

def test_fit_gpu_layers_keeps_the_layers_that_fit():
    spec = skeleton_spec("qwen35-27b", "Q8_0")          # ~27 GiB of weights: not on a 16 GB card
    host = Device(id="host", name="h", kind="cpu", memory_gib=256, bandwidth_gbs=40)
    devs = [get_device("v100-16gb"), host]
    cfg = RunConfig(n_ctx=4096)
    ngl = memory.max_gpu_layers(spec, devs, cfg)
    assert 0 < ngl < memory.layer_slots(spec)
    fitted, note = memory.fit_gpu_layers(spec, devs, cfg)
    assert fitted == cfg.with_(n_gpu_layers=ngl)
    assert f"-ngl {ngl}" in note and "--fit" in note
    # -ngl -1 asks for every layer too (the copy in the levers never reduced it)
    assert memory.fit_gpu_layers(spec, devs, cfg.with_(n_gpu_layers=-1))[0].n_gpu_layers == ngl
    # the advisor's rule: fitting leaves the margin free, so never more layers
    with_margin = memory.fit_gpu_layers(spec, devs, cfg, margin=True)[0].n_gpu_layers
    assert with_margin == memory.max_gpu_layers(spec, devs, cfg, margin=True) <= ngl
    # unchanged where it fits as asked, and on CPUs
    assert memory.fit_gpu_layers(spec, devs, cfg.with_(n_gpu_layers=ngl)) == (cfg.with_(n_gpu_layers=ngl), "")
    assert memory.fit_gpu_layers(skeleton_spec("llama2-7b", "Q4_0"), devs, cfg) == (cfg, "")
    assert memory.fit_gpu_layers(spec, [host], cfg) == (cfg, "")
