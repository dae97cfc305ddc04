"""A model file is checked whole from its header — tensor data that runs past the end of
the file (or of the URL's Content-Range total) is refused with the offset, before any prediction."""

from __future__ import annotations

import base64
import http.server
import io
import re
import threading
from pathlib import Path

import pytest

from v100lab.base.errors import GGUFError
from v100lab.gguf.header import read_header, read_spec

CUT = 50_000_000   # the default model cut to 50 MB


@pytest.fixture(scope="module")
def truncated(default_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cut") / "default-50MB.gguf"
    with open(default_model, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(CUT))
    return path


def test_truncated_file_is_refused_with_the_offset(truncated, default_model):
    full = read_header(default_model)
    assert full.data_complete is True and full.file_bytes > CUT   # the cut really is inside the data
    with pytest.raises(GGUFError, match="truncated model file") as ei:
        read_header(truncated)
    assert ei.value.offset == CUT
    msg = str(ei.value)
    assert "\n" not in msg and f"byte {CUT}" in msg
    assert str(full.data_offset + full.data_bytes) in msg           # where the data should end
    # the first tensor that does not fit is named, with its byte range
    first_cut = next(t for t in full.tensors if full.data_offset + t.offset + t.n_bytes > CUT)
    assert f"'{first_cut.name}'" in msg


def test_cut_one_byte_short_is_refused(default_model, tmp_path):
    data = default_model.read_bytes()
    with pytest.raises(GGUFError, match="truncated"):
        read_header(io.BytesIO(data[:-1]))
    assert read_header(io.BytesIO(data)).data_complete is True
    assert read_header(io.BytesIO(data + b"\0" * 100)).data_complete is True   # trailing bytes: llama.cpp loads it


def test_header_only_file_is_a_description(default_model):
    """A file that ends where the data starts is a header-only description (accepted, data_complete False)."""
    full = read_header(default_model)
    head = default_model.read_bytes()[:full.data_offset]
    hdr = read_header(io.BytesIO(head))
    assert hdr.data_complete is False and hdr.tensors == full.tensors
    # one byte of data is no longer a description: it is a cut download
    with pytest.raises(GGUFError, match="truncated"):
        read_header(io.BytesIO(default_model.read_bytes()[:full.data_offset + 1]))


@pytest.mark.parametrize("argv", [["inspect"], ["inspect", "--json"], ["plan", "-d", "v100-16gb"],
                                  ["plan", "-d", "v100-16gb", "--json"]])
def test_inspect_and_plan_refuse_it(capsys, truncated, argv):
    from v100lab.cli.main import main

    cmd = argv[:1] + [str(truncated)] + argv[1:]
    assert main(cmd) == 2
    out, err = capsys.readouterr()
    assert out == ""                                  # no prediction, no "fits: yes"
    assert len(err.strip().splitlines()) == 1 and "truncated model file" in err and str(CUT) in err


def test_inspect_says_whether_the_data_is_there(capsys, default_model):
    from v100lab.cli.main import main
    import json

    assert main(["inspect", str(default_model), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data_complete"] is True
    assert main(["inspect", str(default_model)]) == 0
    assert "tensor data: complete" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# over HTTP: the size is the Content-Range total
# ------------------------------------------------------------------------------------------------

_RANGE = re.compile(r"bytes=(\d+)-(\d+)")


def _server(data: bytes, auth: str | None = None):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if auth is not None and self.headers.get("Authorization") != auth:
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            m = _RANGE.fullmatch(self.headers.get("Range", ""))
            start, end = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.server
def test_truncated_url_is_refused(default_model):
    data = default_model.read_bytes()[:CUT]
    srv = _server(data)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/m.gguf"
        with pytest.raises(GGUFError, match="truncated model file") as ei:
            read_spec(url)
        assert ei.value.offset == CUT
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.server
def test_url_credentials_are_sent_and_never_echoed(default_model, capsys):
    """user:password@ in a URL becomes a Basic Authorization header; no message repeats the password."""
    from v100lab.cli.main import main

    data = default_model.read_bytes()
    srv = _server(data, auth="Basic " + base64.b64encode(b"me:s3cret").decode())
    port = srv.server_address[1]
    try:
        assert read_spec(f"http://me:s3cret@127.0.0.1:{port}/m.gguf").n_layer == 30
        assert main(["inspect", f"http://me:s3cret@127.0.0.1:{port}/m.gguf"]) == 0
        out = capsys.readouterr().out
        assert "s3cret" not in out and "me:***@" in out
        assert main(["inspect", f"http://me:wrong-s3cret@127.0.0.1:{port}/m.gguf?token=t0ken"]) == 2
        err = capsys.readouterr().err
        assert "HTTP 401" in err and "s3cret" not in err and "t0ken" not in err
    finally:
        srv.shutdown()
        srv.server_close()
    # nothing listens there any more: the connection error does not echo the secret either
    assert main(["inspect", f"http://me:s3cret@127.0.0.1:{port}/m.gguf", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and len(err.strip().splitlines()) == 1
