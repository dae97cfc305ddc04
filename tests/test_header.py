"""The header reader against llama.cpp itself and gguf.GGUFReader, locally and over real HTTP.

Reference values come from the same files: llama-cpp-python's model accessors and load log
(llama.cpp's own derivation), and gguf-py's GGUFReader (field values, tensor byte counts)."""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest

from v100lab.base.errors import GGUFError, ModelNotFoundError
from v100lab.gguf.header import read_header, read_spec
from v100lab.models.resolve import resolve


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_q4km(tiny_f16):
    from v100lab.models import zoo

    return zoo.quantized_path(tiny_f16, "Q4_K_M")


@pytest.fixture(params=["default", "gemma", "tiny_f16", "tiny_q4km"])
def model_path(request):
    name = {"default": "default_model", "gemma": "gemma_model"}.get(request.param, request.param)
    return Path(request.getfixturevalue(name))


# ------------------------------------------------------------------------------------------------
# against gguf.GGUFReader
# ------------------------------------------------------------------------------------------------

def _reader_value(field):
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return list(field.contents())
    return field.contents()


def test_matches_gguf_reader(model_path):
    hdr = read_header(model_path)
    ref = gguf.GGUFReader(str(model_path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(hdr.metadata) == keys
    for k in keys:
        ours = hdr.metadata[k]
        theirs = _reader_value(ref.fields[k])
        if isinstance(ours, np.ndarray):
            np.testing.assert_array_equal(ours, np.asarray(theirs), err_msg=k)
        elif isinstance(ours, tuple):
            assert list(ours) == theirs, k
        elif isinstance(ours, float):
            assert ours == pytest.approx(theirs, rel=1e-6), k
        else:
            assert ours == theirs, k
    assert hdr.alignment == ref.alignment
    assert hdr.data_offset == ref.data_offset
    assert len(hdr.tensors) == len(ref.tensors)
    for ours, theirs in zip(hdr.tensors, ref.tensors):
        assert ours.name == theirs.name
        assert list(ours.shape) == [int(x) for x in theirs.shape]
        assert ours.type_name == theirs.tensor_type.name
        assert ours.n_bytes == int(theirs.n_bytes)
        assert hdr.data_offset + ours.offset == int(theirs.data_offset)
    assert hdr.data_complete is True
    assert hdr.file_bytes == model_path.stat().st_size


def test_reads_only_the_header(model_path):
    hdr = read_header(model_path)
    assert hdr.bytes_read <= hdr.header_bytes + 2**20
    assert hdr.bytes_read >= hdr.tensor_infos_end


# ------------------------------------------------------------------------------------------------
# against llama.cpp (llama-cpp-python accessors and load log)
# ------------------------------------------------------------------------------------------------

def _llama_facts(path: Path) -> dict:
    import llama_cpp

    from v100lab.facts.loadlog import capture_llama_log

    with capture_llama_log() as cap:
        mp = llama_cpp.llama_model_default_params()
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        assert model, "llama.cpp failed to load the model"
        try:
            vocab = llama_cpp.llama_model_get_vocab(model)
            facts = {
                "n_layer": llama_cpp.llama_model_n_layer(model),
                "n_embd": llama_cpp.llama_model_n_embd(model),
                "n_head": llama_cpp.llama_model_n_head(model),
                "n_head_kv": llama_cpp.llama_model_n_head_kv(model),
                "n_params": llama_cpp.llama_model_n_params(model),
                "size": llama_cpp.llama_model_size(model),
                "n_swa": llama_cpp.llama_model_n_swa(model),
                "n_ctx_train": llama_cpp.llama_model_n_ctx_train(model),
                "n_vocab": llama_cpp.llama_vocab_n_tokens(vocab),
                "is_recurrent": bool(llama_cpp.llama_model_is_recurrent(model)),
            }
        finally:
            llama_cpp.llama_model_free(model)
    text = cap.text
    info = dict(re.findall(r"print_info: (\w+)\s+= (.*)", text))
    facts["log"] = info
    facts["file_type"] = re.search(r"print_info: file type\s+= (.+)", text).group(1).strip()
    facts["is_swa"] = {int(a): b == "1" for a, b in re.findall(r"layer\s+(\d+) assigned to device \S+, is_swa = (\d)", text)}
    return facts


def _llama_ftype_name(name: str) -> str:
    """Our "Q4_K_M" → llama.cpp's llama_model_ftype_name "Q4_K - Medium" (src/llama-model-loader.cpp)."""
    if name == "Q2_K":
        return "Q2_K - Medium"
    for suffix, word in (("_S", "Small"), ("_M", "Medium"), ("_L", "Large")):
        if name.endswith("_K" + suffix):
            return f"{name[:-2]} - {word}"
    return name


def test_matches_llama_cpp(model_path):
    spec = read_spec(model_path)
    ll = _llama_facts(model_path)
    assert spec.n_layer == ll["n_layer"]
    assert spec.n_embd == ll["n_embd"]
    assert spec.n_head_at(0) == ll["n_head"]
    assert spec.n_head_kv(0) == ll["n_head_kv"]
    assert spec.n_params == ll["n_params"]
    assert spec.weight_bytes == ll["size"]
    assert (spec.sliding_window or 0) == ll["n_swa"]
    assert spec.n_ctx_train == ll["n_ctx_train"]
    assert spec.n_vocab == ll["n_vocab"]
    assert bool(spec.recurrent_layers) == ll["is_recurrent"]
    log = ll["log"]
    assert spec.head_dim_k == int(log["n_embd_head_k"])
    assert spec.head_dim_v == int(log["n_embd_head_v"])
    assert spec.n_ff_at(0) == int(log["n_ff"])
    assert spec.n_embd_k_gqa(0) == int(log["n_embd_k_gqa"])
    assert _llama_ftype_name(spec.file_type) == ll["file_type"]
    for il in range(spec.n_layer):
        assert spec.is_swa(il) == ll["is_swa"].get(il, False), f"layer {il}"


def test_file_type_names(default_model, gemma_model, tiny_f16, tiny_q4km):
    assert read_spec(default_model).file_type == "Q4_1"
    assert read_spec(gemma_model).file_type == "Q4_K_M"
    assert read_spec(tiny_f16).file_type == "F16"
    assert read_spec(tiny_q4km).file_type == "Q4_K_M"


def test_gemma_swa_layers(gemma_model):
    spec = read_spec(gemma_model)
    assert spec.architecture == "gemma3"
    assert spec.sliding_window == 512
    assert [il for il in range(spec.n_layer) if not spec.is_swa(il)] == [5, 11, 17]
    assert spec.head_dim_k == 256 != spec.n_embd // spec.n_head


def test_derived_totals(default_model):
    spec = read_spec(default_model)
    assert sum(spec.layer_bytes) + spec.nonlayer_bytes == spec.weight_bytes
    assert len(spec.layer_bytes) == spec.n_layer
    assert spec.tensor("token_embd.weight").layer is None
    assert spec.tensor("blk.3.attn_q.weight").layer == 3
    assert spec.header_bytes == spec.data_offset
    assert spec.data_offset % spec.alignment == 0
    assert 4.0 < spec.bits_per_weight < 8.5


# ------------------------------------------------------------------------------------------------
# sources: path, str, file object (an alias is resolve's job, never the reader's)
# ------------------------------------------------------------------------------------------------

def test_sources_agree(default_model):
    by_path = read_spec(default_model)
    assert read_spec(str(default_model)) == by_path
    assert resolve("default") == (default_model, by_path)
    with open(default_model, "rb") as f:
        assert read_spec(f) == by_path
    # a non-seekable stream: size unknown, still parses (bounded by the cap)
    data = default_model.read_bytes()[: by_path.header_bytes + 100]

    class Stream(io.RawIOBase):
        def __init__(self, b):
            self.b = io.BytesIO(b)

        def readable(self):
            return True

        def readinto(self, buf):
            chunk = self.b.read(len(buf))
            buf[: len(chunk)] = chunk
            return len(chunk)

    spec = read_spec(io.BufferedReader(Stream(data)))
    assert spec.tensors == by_path.tensors


def test_missing_model_is_model_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError):
        read_spec(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError):
        read_spec("not-an-alias")
    with pytest.raises(ModelNotFoundError):
        resolve("not-an-alias")


def test_reader_never_resolves_an_alias(fresh_cache):
    """An alias given to the reader is a missing file, not a model to build: nothing lands in the cache."""
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        read_spec("synth-tiny:Q4_0")
    with pytest.raises(ModelNotFoundError, match="not built yet"):
        resolve("synth-tiny:Q4_0")          # building is explicit: resolve(..., build=True)
    assert not list(fresh_cache.iterdir())


# ------------------------------------------------------------------------------------------------
# remote: a real HTTP server with Range support on 127.0.0.1
# ------------------------------------------------------------------------------------------------

_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")


def _make_handler(path: Path, mode: str, counter: list):
    size = path.stat().st_size

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # keep test output quiet
            pass

        def do_GET(self):
            counter.append(self.headers.get("Range"))
            if self.path != "/model.gguf":
                self.send_error(404)
                return
            m = _RANGE_RE.fullmatch(self.headers.get("Range", ""))
            if mode == "ignore-range" or not m:
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                with open(path, "rb") as f:
                    try:
                        while chunk := f.read(1 << 20):
                            self.wfile.write(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                return
            if mode == "416":
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            with open(path, "rb") as f:
                f.seek(start)
                body = f.read(end - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if mode == "short":
                body = body[: len(body) // 2]
                self.close_connection = True
            self.wfile.write(body)

    return Handler


@pytest.fixture
def serve(default_model):
    servers = []

    def start(mode="ok", path=None):
        counter: list = []
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(Path(path or default_model), mode, counter))
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/model.gguf", counter

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.server
def test_remote_equals_local(serve, default_model):
    url, requests = serve("ok")
    hdr = read_header(url)
    local = read_header(default_model)
    assert hdr.tensors == local.tensors
    assert hdr.file_bytes == default_model.stat().st_size
    assert len(requests) <= 3 and hdr.requests == len(requests)
    assert all(r and r.startswith("bytes=") for r in requests)
    spec = read_spec(url)
    assert spec.n_layer == 30 and spec.file_type == "Q4_1"


@pytest.mark.server
def test_remote_gemma_few_requests(serve, gemma_model):
    url, requests = serve("ok", gemma_model)
    spec = read_spec(url)
    assert spec.header_bytes > 4 * 2**20          # a 6 MiB header, still
    assert len(requests) <= 3
    assert spec.swa_layers == read_spec(gemma_model).swa_layers


@pytest.mark.server
@pytest.mark.parametrize("mode, message", [("ignore-range", "ignores Range"), ("416", "416"),
                                           ("short", "short read")])
def test_remote_misbehaving_servers(serve, mode, message):
    url, _ = serve(mode)
    with pytest.raises(GGUFError, match=message):
        read_spec(url, timeout=10)


@pytest.mark.server
def test_remote_header_over_cap(serve):
    url, requests = serve("ok")
    with pytest.raises(GGUFError, match="larger than the cap"):
        read_spec(url, max_header_bytes=256 * 1024)
    assert len(requests) == 1


@pytest.mark.server
def test_remote_404(serve):
    url, _ = serve("ok")
    with pytest.raises(ModelNotFoundError):
        read_spec(url.replace("model.gguf", "other.gguf"))


def test_local_header_over_cap(default_model):
    with pytest.raises(GGUFError, match="larger than the cap"):
        read_header(default_model, max_header_bytes=2**20)


# ------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------

INSPECT_KEYS = {"architecture", "name", "file_type", "n_layer", "n_embd", "n_ff", "n_head", "n_head_kv",
                "head_dim_k", "head_dim_v", "n_ctx_train", "n_vocab", "sliding_window", "swa_layers",
                "recurrent_layers", "n_params", "weight_bytes", "bits_per_weight", "header_bytes",
                "file_bytes", "tensor_types", "layer_bytes"}


def test_inspect_json(capsys, gemma_model):
    from v100lab.cli.main import main

    assert main(["inspect", str(gemma_model), "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert INSPECT_KEYS <= set(doc)
    assert doc["swa_layers"] == [i for i in range(18) if i not in (5, 11, 17)]
    assert doc["sliding_window"] == 512 and doc["recurrent_layers"] == []
    assert sum(doc["tensor_types"].values()) == 236
    assert doc["n_head_kv"] == 1 and doc["file_type"] == "Q4_K_M"


def test_inspect_text_and_errors(capsys, tmp_path, default_model):
    from v100lab.cli.main import main

    assert main(["inspect", "default"]) == 0
    assert "llama" in capsys.readouterr().out
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + b"\0" * 40)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "version 7" in err
    assert main(["inspect", "--json", str(tmp_path / "missing.gguf")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "does not exist" in captured.err


@pytest.mark.server
def test_inspect_url(serve, capsys):
    from v100lab.cli.main import main

    url, requests = serve("ok")
    assert main(["inspect", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_layer"] == 30 and doc["n_head_kv"] == 3 and doc["file_bytes"] > doc["header_bytes"]
    assert len(requests) <= 3
