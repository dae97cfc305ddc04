"""Hostile input: nothing already written is lost, nothing hangs, nothing is injected into what a user copies.

Real parts only: a real local HTTP server that trickles, a real small tmpfs for a full disk (skipped where the
test cannot mount one), real YAML alias bombs, real GGUF headers built byte by byte, the real shell.
"""

from __future__ import annotations

import errno
import http.server
import io
import json
import logging
import os
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from v100lab.cli import main as cli
from v100lab.base.errors import ConfigError, DeviceError, GGUFError, OutputError
from v100lab.base.safeio import (check_creatable, load_yaml, shell_join, shell_word, short_repr, term_text,
                            write_atomic)
from v100lab.facts.store import ResultsStore, StoreError, check_writable

from test_header_hostile import ARR, F16, U32, gguf_file, kv, kv_str, kv_u32, ti


def _row(i, **kw):
    r = {"model_header_sha256": "abc", "model_file_size": 10, "backend": "inprocess", "config": {"n_ctx": 256},
         "n_prompt": 0, "n_gen": 8, "n_depth": i, "repetitions": 2, "status": "ok", "avg_ts": 1.0 + i,
         "stddev_ts": 0.1}
    r.update(kw)
    return r


def _one_line_exit(code, capsys, want: int = 2) -> str:
    err = capsys.readouterr().err
    assert code == want, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


# ------------------------------------------------------------------------------------------------
# results store: what is there stays there
# ------------------------------------------------------------------------------------------------

def test_a_50_mb_unterminated_line_is_kept_whole(tmp_path, caplog):
    p = tmp_path / "r.jsonl"
    old = b"x" * 52_428_800                       # one 50 MB line, no newline: not a row
    p.write_bytes(old)
    with caplog.at_level(logging.WARNING, logger="v100lab.facts.store"):
        ResultsStore(p).append(_row(0))
    data = p.read_bytes()
    assert len(data) > 52_428_800 and data[:52_428_800] == old
    assert data[52_428_800:52_428_801] == b"\n"
    assert json.loads(data[52_428_801:])["n_depth"] == 0
    assert any("kept" in m for m in caplog.messages)
    assert [r["n_depth"] for r in ResultsStore(p).rows()] == [0]


def test_a_note_without_newline_is_kept(tmp_path, caplog):
    p = tmp_path / "r.jsonl"
    s = ResultsStore(p)
    s.append(_row(0))
    with open(p, "ab") as f:
        f.write(b"# measured on the quiet box, fans at 100 %")
    before = p.read_bytes()
    with caplog.at_level(logging.WARNING, logger="v100lab.facts.store"):
        s.append(_row(1))
    assert p.read_bytes().startswith(before + b"\n")
    assert any("kept" in m and "next line" in m for m in caplog.messages)
    assert [r["n_depth"] for r in s.rows()] == [0, 1]


@pytest.fixture
def full_tmpfs(tmp_path):
    """A real 64 KiB tmpfs, filled to the last byte; skipped where this process cannot mount one."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(folder: Path) -> None:
    fd = os.open(folder / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_full_disk_append_is_one_line_and_leaves_no_partial_row(full_tmpfs):
    p = full_tmpfs / "r.jsonl"
    s = ResultsStore(p)
    s.append(_row(0))
    with open(p, "ab") as f:
        f.write(b'{"torn": ')                    # a row a kill cut short: kept
    before = p.read_bytes()
    _fill(full_tmpfs)
    with pytest.raises(StoreError) as ei:
        s.append(_row(1, raw_log="llama.cpp log " * 2000))
    assert "\n" not in str(ei.value) and "No space left" in str(ei.value)
    assert p.read_bytes() == before
    assert not [x for x in full_tmpfs.rglob("*") if x.name.endswith(".tmp")]
    # the path is refused before anything is measured once the disk is full
    with pytest.raises(StoreError, match="no space left"):
        check_writable(full_tmpfs / "other.jsonl")


def test_full_disk_report_write_keeps_the_old_file(full_tmpfs):
    report = full_tmpfs / "index.html"
    report.write_text("the old report")
    _fill(full_tmpfs)
    with pytest.raises(OutputError, match="No space left"):
        write_atomic(report, "x" * 200_000, what="report", error=OutputError)
    assert report.read_text() == "the old report"
    assert sorted(x.name for x in full_tmpfs.iterdir()) == ["ballast", "index.html"]


def _ignore_sigxfsz():
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    return lambda: signal.signal(signal.SIGXFSZ, old)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.binary(max_size=3000) | st.text(max_size=300).map(str.encode),
       cut=st.none() | st.integers(min_value=0, max_value=400))
def test_appending_never_changes_the_bytes_already_there(tmp_path_factory, old, cut):
    """Any existing contents, and an append the kernel stops part-way (a file size limit: a real short
    write, as a full disk gives): the old bytes stay a prefix, a completed append adds exactly one row."""
    p = tmp_path_factory.mktemp("store") / "r.jsonl"
    p.write_bytes(old)
    s = ResultsStore(p)
    if cut is None:
        s.append(_row(7))
        data = p.read_bytes()
        assert data.startswith(old)
        tail = data[len(old):]
        assert tail.count(b"\n") == (1 if old.endswith(b"\n") or not old else 2)
        assert json.loads(tail.strip(b"\n"))["n_depth"] == 7
        return
    restore = _ignore_sigxfsz()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(old) + cut, hard))
    try:
        with pytest.raises(StoreError):
            s.append(_row(7, note="y" * 500))       # longer than any cut: the write always stops short
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        restore()
    assert p.read_bytes() == old                      # no partial row, nothing of the old removed


def test_pseudo_and_read_only_file_systems_are_refused_before_measuring(tmp_path, capsys):
    for target in ("/proc/v100lab-results.jsonl", "/sys/v100lab-results.jsonl", "/proc/self/status"):
        with pytest.raises(StoreError, match="not storage|not a regular"):
            check_writable(target)
    with pytest.raises(ConfigError, match="proc"):
        check_creatable("/proc/v100lab-out", what="--out", error=ConfigError, folder=True)
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True)
    if r.returncode == 0:
        try:
            with pytest.raises(StoreError, match="read-only"):
                check_writable(ro / "r.jsonl")
        finally:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
    # the command: refused before the model is even loaded (an unknown path would be exit 2 as well, but later)
    t0 = time.monotonic()
    code = cli.main(["bench", "default", "--results", "/proc/v100lab-results.jsonl", "-r", "1"])
    err = _one_line_exit(code, capsys)
    assert "proc" in err and time.monotonic() - t0 < 30


def test_batch_out_in_proc_is_one_line(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text("scenario: hostile\nmodel: default\n")
    nb = Path(__file__).parent / "data" / "notebooks" / "ok.ipynb"
    code = cli.main(["batch", str(params), "--notebooks", str(nb), "--out", "/proc/v100lab-reports"])
    assert "proc" in _one_line_exit(code, capsys)


# ------------------------------------------------------------------------------------------------
# network: one deadline for the whole fetch
# ------------------------------------------------------------------------------------------------

class _Trickle(http.server.BaseHTTPRequestHandler):
    """206 for 1 MiB of a 10 GB file, then one byte a second (or, with ``slow_headers``, the status line
    itself a byte a second)."""

    slow_headers = False

    def do_GET(self):
        try:
            if self.slow_headers:
                for b in b"HTTP/1.1 206 Partial Content\r\n":
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(1)
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes 0-1048575/10737418240")
            self.send_header("Content-Length", "1048576")
            self.end_headers()
            self.wfile.write(b"GGUF")
            for _ in range(30):
                self.wfile.write(b"\0")
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            pass

    def log_message(self, *a):
        pass


@pytest.fixture(params=[False, True], ids=["trickled-body", "trickled-headers"])
def trickle_url(request):
    handler = type("H", (_Trickle,), {"slow_headers": request.param})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/x.gguf"
    srv.shutdown()
    srv.server_close()


def test_inspect_of_a_trickling_server_returns_within_its_timeout(trickle_url, capsys):
    t0 = time.monotonic()
    code = cli.main(["inspect", trickle_url, "--timeout", "2"])
    took = time.monotonic() - t0
    err = _one_line_exit(code, capsys)
    assert took < 3.0, took
    assert "2 s timeout" in err


def test_a_ray_address_without_a_cluster_fails_at_once(tmp_path, capsys):
    from v100lab.workbook.fleet import check_address

    params = tmp_path / "p.yaml"
    params.write_text("scenario: hostile\nmodel: default\n")
    nb = Path(__file__).parent / "data" / "notebooks" / "ok.ipynb"
    t0 = time.monotonic()
    code = cli.main(["batch", str(params), "--notebooks", str(nb), "--out", str(tmp_path / "o"),
                     "--engine", "ray", "--address", "127.0.0.1:1"])
    err = _one_line_exit(code, capsys)
    assert time.monotonic() - t0 < 15 and "127.0.0.1:1" in err
    assert not (tmp_path / "o").exists()
    for bad in ("127.0.0.1:0", "ray://h:99999"):
        with pytest.raises(ConfigError, match="1-65535"):
            check_address(bad)


# ------------------------------------------------------------------------------------------------
# YAML: aliases bounded before they are expanded
# ------------------------------------------------------------------------------------------------

def _bomb(key: str, levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\n{key}: *a{levels}\n"


def _bounded(fn):
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        fn()
    finally:
        took = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert took < 1.0 and peak < 100 * 2**20, (took, peak)


def test_alias_bomb_in_a_parameter_file(tmp_path):
    from v100lab.workbook.scenario import load_scenario, read_parameters

    p = tmp_path / "bomb.yaml"
    p.write_text("scenario: bomb\n" + _bomb("quants"))

    def load():
        with pytest.raises(ConfigError, match="alias") as ei:
            read_parameters(p)
        assert len(str(ei.value)) < 300
    _bounded(load)
    # aliases of a sane size still work (a merge key)
    q = tmp_path / "ok.yaml"
    q.write_text("scenario: merged\nbase: &b {n_gen: 9}\n")
    assert read_parameters(q)["base"] == {"n_gen": 9}
    with pytest.raises(ConfigError):
        load_scenario(read_parameters(q))     # an unknown key: one line, as ever


def test_alias_bomb_in_a_device_file(tmp_path):
    from v100lab.facts.devices import load_device_file

    p = tmp_path / "bomb.yaml"
    p.write_text("id: bomb\nkind: gpu\nmemory_gib: 16\nbandwidth_gbs: 900\n" + _bomb("name"))

    def load():
        with pytest.raises(DeviceError, match="alias"):
            load_device_file(p)
    _bounded(load)


def test_recursive_alias_and_bounded_messages():
    with pytest.raises(Exception, match="contains it"):
        load_yaml("a: &x [1, *x]\n")
    shared = ["lol"] * 9
    for _ in range(30):                  # 9**30 leaves when walked: only a bounded view is printed
        shared = [shared] * 9
    t0 = time.monotonic()
    text = short_repr(shared) + short_repr(10 ** 100_000) + short_repr("\x1b[2J" * 10_000)
    assert time.monotonic() - t0 < 0.5 and len(text) <= 180 and "\x1b" not in text


# ------------------------------------------------------------------------------------------------
# commands to copy: one shell word per argument, no control characters
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["m x;touch PWNED;$(id).gguf", "m\nrm -rf ~.gguf", "e\x1b]0;pwn\x07.gguf",
                                  "q'uo\"te\\.gguf", "\u202egguf.exe", "ü € \x85.gguf"])
def test_shell_words_are_one_word_and_printable(tmp_path, name):
    cmd = shell_join(["printf", "%s\\0", name, "--flag"])
    assert cmd.isprintable()
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, cwd=tmp_path).stdout
    assert out.decode("utf-8", "surrogateescape").split("\0")[:-1] == [name, "--flag"]
    assert not (tmp_path / "PWNED").exists()


def test_tune_prints_a_hostile_model_path_as_one_shell_word(tmp_path, capsys):
    from v100lab.gguf.skeleton import write_skeleton

    hostile = tmp_path / "m x;touch PWNED;$(id)\n.gguf"
    write_skeleton("llama2-7b", "Q4_0", hostile)       # a header-only GGUF at a hostile path
    code = cli.main(["tune", str(hostile), "--device", "v100-32gb", "--min-ctx", "2048", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    cmd = doc["command"]
    assert cmd.isprintable() and shell_word(str(hostile)) in cmd
    argv = subprocess.run(["bash", "-c", "printf '%s\\0' " + cmd.split(" ", 1)[1]], capture_output=True,
                          cwd=tmp_path).stdout.decode().split("\0")[:-1]
    assert argv == doc["argv"][1:]
    assert not (tmp_path / "PWNED").exists()


def test_batch_progress_shows_a_scenario_name_escaped():
    from v100lab.cli.commands.batch import _progress_label

    class Run:
        class scenario:
            scenario = "evil\x1b]0;owned\x07\x1b[2J"
        notebook = Path("nb\r.ipynb")
    label = _progress_label(Run)
    assert "\x1b" not in label and "\r" not in label and "\\x1b" in label


def test_term_text_is_the_one_escaping_helper():
    assert term_text("a\x1b[31mb\nc") == "a\\x1b[31mb\\nc"


def test_log_lines_are_escaped(capsys):
    """The command's log handler escapes every message: a path or a server body cannot add a line or
    send a terminal escape."""
    fmt = cli._TerminalSafe("%(levelname)s %(name)s: %(message)s")
    rec = logging.LogRecord("v100lab.facts.store", logging.WARNING, __file__, 1, "%s: kept", ("r\nINFO fake\x1b[2J",), None)
    line = fmt.format(rec)
    assert line == "WARNING v100lab.facts.store: r\\nINFO fake\\x1b[2J: kept"


# ------------------------------------------------------------------------------------------------
# models llama.cpp would refuse, and flags beyond any context
# ------------------------------------------------------------------------------------------------

def _model(heads: int = 4, kv_heads: int | None = None, embd: int = 64, layers: int = 1, extra=()) -> bytes:
    kvs = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", layers),
           kv_u32("llama.embedding_length", embd), kv_u32("llama.attention.head_count", heads), *extra]
    if kv_heads is not None:
        kvs.append(kv_u32("llama.attention.head_count_kv", kv_heads))
    return gguf_file(kvs, [ti("blk.0.attn_q.weight", (64, 64), F16, 0)])


@pytest.mark.parametrize("data, match", [
    (_model(heads=0), "head_count' is 0"),
    (_model(heads=4, kv_heads=8), "larger than"),
    (_model(heads=6, kv_heads=4), "not a multiple"),
    (_model(embd=0), "embedding_length' is 0"),
    (_model(heads=128, embd=64), "head size is 0"),
    (_model(layers=0), "plausible layer count"),
    (_model(layers=513), "plausible layer count"),
    (_model(extra=[kv_u32("llama.expert_count", 4), kv_u32("llama.expert_used_count", 8)]), "expert_used_count"),
    (_model(extra=[kv_u32("llama.expert_count", 8)]), "expert_used_count' is 0"),
    (_model(extra=[kv("llama.attention.head_count_kv", ARR, struct.pack("<IQ", U32, 1) + struct.pack("<I", 3))]),
     "not a multiple"),
])
def test_hyperparameters_llama_cpp_refuses(data, match):
    from v100lab.gguf.header import read_spec

    with pytest.raises(GGUFError, match=match) as ei:
        read_spec(io.BytesIO(data))
    assert "llama.cpp" in str(ei.value) or "plausible" in str(ei.value) or "negative" in str(ei.value)


def test_sane_hyperparameters_pass():
    from v100lab.gguf.header import read_spec

    spec = read_spec(io.BytesIO(_model(heads=8, kv_heads=2, embd=64)))
    assert spec.n_head == 8 and spec.head_dim_k == 8
    # a recurrent model has no heads and is fine
    mamba = gguf_file([kv_str("general.architecture", "mamba"), kv_u32("mamba.block_count", 2),
                       kv_u32("mamba.embedding_length", 64), kv_u32("mamba.attention.head_count", 0)],
                      [ti("blk.0.ssm_in.weight", (64, 256), F16, 0)])
    assert read_spec(io.BytesIO(mamba)).n_layer == 2


def test_plan_of_a_refused_model_and_of_an_absurd_depth_exit_2(tmp_path, capsys):
    bad = tmp_path / "zero-heads.gguf"
    bad.write_bytes(_model(heads=0))
    err = _one_line_exit(cli.main(["plan", str(bad), "--device", "v100-16gb"]), capsys)
    assert "head_count" in err
    assert capsys.readouterr().out == ""
    err = _one_line_exit(cli.main(["plan", "default", "--device", "v100-16gb", "--depth", "10000000000"]), capsys)
    assert "beyond any context" in err
    err = _one_line_exit(cli.main(["bench", "default", "--depth", "0,10000000000"]), capsys)
    assert "beyond any context" in err


def test_calibrate_show_refuses_a_profile_with_nan(fresh_cache):
    from v100lab.measure import calibration
    from v100lab.facts import devices

    fresh_cache.mkdir(parents=True, exist_ok=True)
    devices.write_host_profile({"id": "host", "name": "host CPU", "kind": "cpu", "memory_gib": 8, "bandwidth_gbs": 20.0,
                                "fingerprint": devices.host_fingerprint(), calibration.PROFILE_KEY: {"threads": {"1": {
        "bandwidth_gbs": float("nan"), "efficiency": 0.5, "overhead_token_s": 1e-4, "overhead_layer_s": 1e-6,
        "tg_s_per_weight": {"F16": 1e-9}}}}})
    r = subprocess.run([sys.executable, "-m", "v100lab", "calibrate", "--show"], capture_output=True, text=True)
    assert r.returncode == 2 and "nan" not in r.stdout.lower()
    assert len(r.stderr.strip().splitlines()) == 1 and "bandwidth_gbs is nan" in r.stderr
    r = subprocess.run([sys.executable, "-m", "v100lab", "plan", "skeleton:llama2-7b:Q4_0", "--device", "host"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bandwidth_gbs is nan" in r.stderr
