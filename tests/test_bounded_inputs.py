"""Every input bounded and every string safe — one line (exit 2) for each hostile input,
reads of special files bounded by the bytes read, control characters escaped, secrets never echoed."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import pytest

from v100lab.cli.main import main
from v100lab.facts.config import RunConfig, from_flag_args, parse_tensor_split
from v100lab.base.errors import ConfigError, DeviceError, V100labError
from v100lab.base.safeio import check_creatable, read_bounded, redact_url, term_text

ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


def one_line_error(capsys, argv, status=2, within_s=10.0) -> str:
    t0 = time.monotonic()
    assert main(argv) == status
    assert time.monotonic() - t0 < within_s
    out, err = capsys.readouterr()
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "\x1b" not in err
    return lines[0]


# ------------------------------------------------------------------------------------------------
# the helpers
# ------------------------------------------------------------------------------------------------

def test_term_text_escapes_control_characters():
    assert term_text("plain name €…") == "plain name €…"
    out = term_text(f"a{ESC}b\nc\td\u202ee\x7f")
    assert out.isprintable() and "\\x1b" in out and "\\n" in out and "\\u202e" in out and "\\x7f" in out
    cut = term_text("x" * 20000, limit=300)
    assert len(cut) == 300 and cut.endswith("…")


def test_errors_are_one_terminal_safe_line():
    e = V100labError(f"bad\nname {ESC}" + "y" * 5000)
    assert "\n" not in str(e) and "\x1b" not in str(e) and len(str(e)) <= 1000


@pytest.mark.parametrize("url, hidden, shown", [
    ("https://user:pa55@example.com/m.gguf", "pa55", "user:***@example.com"),
    ("https://t0ken@example.com/m.gguf", "t0ken", "***@example.com"),
    ("https://example.com/m.gguf?X-Amz-Signature=s1g&token=t0k", "s1g", "X-Amz-Signature=***"),
    ("http://user:pa55@[::1", "pa55", "***@"),
])
def test_redact_url(url, hidden, shown):
    out = redact_url(url)
    assert hidden not in out and shown in out


# ------------------------------------------------------------------------------------------------
# bounded reads of special files
# ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_read_bounded_does_not_trust_st_size():
    assert os.stat("/proc/self/status").st_size == 0
    assert b"Name:" in read_bounded("/proc/self/status", 1 << 20, what="file", error=ConfigError)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="larger than"):
        read_bounded("/dev/zero", 1 << 20, what="file", error=ConfigError)        # 1 MiB read, then stop
    with pytest.raises(ConfigError, match="binary data"):
        read_bounded("/dev/zero", 1 << 30, what="file", error=ConfigError, refuse_binary=True)
    assert time.monotonic() - t0 < 5


def test_fifo_without_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert read_bounded(fifo, 100, what="file", error=ConfigError) == b""
    assert time.monotonic() - t0 < 5


def test_fifo_with_a_silent_writer_times_out(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)       # a reader, so the writer's open succeeds
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)      # a writer that never writes
    try:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="sent nothing"):
            read_bounded(fifo, 100, what="file", error=ConfigError, idle_s=0.5)
        assert time.monotonic() - t0 < 5
    finally:
        os.close(writer)
        os.close(keep)


def test_fifo_with_a_writer_is_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "wb") as f:
            f.write(b"hello\n")

    t = threading.Thread(target=write)
    t.start()
    time.sleep(0.2)
    try:
        assert read_bounded(fifo, 100, what="file", error=ConfigError, idle_s=5) in (b"hello\n", b"")
    finally:
        t.join(5)


def test_check_creatable(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        check_creatable(f, what="--out", error=ConfigError, folder=True)
    with pytest.raises(ConfigError, match="is a file"):
        check_creatable(f / "sub", what="--out", error=ConfigError, folder=True)
    with pytest.raises(ConfigError, match="NUL"):
        check_creatable(tmp_path / "a\0b", what="--out", error=ConfigError, folder=True)
    check_creatable(tmp_path / "new" / "deeper", what="--out", error=ConfigError, folder=True)
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------------
# device files
# ------------------------------------------------------------------------------------------------

def _device(tmp_path, text: str | bytes, name="dev.yaml"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


GOOD_DEVICE = "id: my\nname: My GPU\nkind: gpu\nmemory_gib: 12\nbandwidth_gbs: 360\n"


_BAD_VALUES = [".nan", ".inf", "-.inf", "1.0e300", "1" + "0" * 400, "0", "-5", "true", "[1, 2]", "'12'"]
_DEVICE_CASES = [(f, v) for f in ("memory_gib", "bandwidth_gbs", "fp16_tflops", "runtime_overhead_mib")
                 for v in _BAD_VALUES
                 if not (v == "0" and f in ("fp16_tflops", "runtime_overhead_mib"))]   # 0 is valid there


@pytest.mark.parametrize("field, value", _DEVICE_CASES)
def test_device_numbers_must_be_finite_and_in_range(tmp_path, capsys, field, value):
    text = GOOD_DEVICE.replace(f"{field}: 12", "").replace(f"{field}: 360", "") + f"{field}: {value}\n"
    dev = _device(tmp_path, text)
    line = one_line_error(capsys, ["plan", "default", "-d", str(dev)])
    assert field in line


@pytest.mark.parametrize("content", [b"\x00\x01\x02GGUF\xff\xfe" * 100, b"\xff\xfe\xfd not utf-8",
                                     b"[" * 5000 + b"]" * 5000, b"- a\n- b\n", b"", b"id: [1, 2]\nname: x\n"])
def test_broken_device_files(tmp_path, capsys, content):
    one_line_error(capsys, ["plan", "default", "-d", str(_device(tmp_path, content))])


def test_huge_device_file_is_refused_by_size(tmp_path):
    from v100lab.facts.devices import load_device_file

    with pytest.raises(DeviceError, match="larger than"):
        load_device_file(_device(tmp_path, "# " + "x" * (2 << 20) + "\n" + GOOD_DEVICE))


def test_device_file_on_a_fifo(tmp_path, capsys):
    os.mkfifo(tmp_path / "gpu.yaml")
    one_line_error(capsys, ["plan", "default", "-d", str(tmp_path / "gpu.yaml")])


# ------------------------------------------------------------------------------------------------
# model paths and URLs
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", [["inspect"], ["plan", "-d", "v100-16gb"]])
@pytest.mark.parametrize("target", ["/proc/self/status", "/dev/zero", "FIFO", "http://[::1", "http://:80/x",
                                    "http://h:99999/x", "https://exa mple.com/x", "a\0b"])
def test_odd_model_paths(tmp_path, capsys, cmd, target):
    if target == "FIFO":
        target = str(tmp_path / "fifo.gguf")
        os.mkfifo(target)
    one_line_error(capsys, cmd[:1] + [target] + cmd[1:])


@pytest.mark.parametrize("flag, value", [("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "inf"),
                                         ("--timeout", "0"), ("--max-header-mib", "nan"),
                                         ("--max-header-mib", "-3"), ("--max-header-mib", "1e30")])
def test_inspect_numeric_flags(capsys, default_model, flag, value):
    line = one_line_error(capsys, ["inspect", str(default_model), flag, value])
    assert flag in line


def test_model_metadata_is_escaped_in_inspect(tmp_path, capsys):
    from v100lab.gguf.skeleton import write_skeleton
    from v100lab.gguf.header import read_header

    path = write_skeleton("llama2-7b", "Q4_0", tmp_path / "m.gguf")
    data = path.read_bytes()
    old = read_header(path).metadata["general.name"].encode()
    evil = (ESC + "x" * len(old))[: len(old)].encode() if len(ESC) < len(old) else ESC[: len(old)].encode()
    assert len(evil) == len(old)
    i = data.index(struct.pack("<Q", len(old)) + old)
    path.write_bytes(data[:i + 8] + evil + data[i + 8 + len(old):])
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == evil.decode()                            # JSON keeps it exact (escaped by JSON)
    # plan and tune print the model's name too
    for argv in (["plan", str(path), "--device", "v100-16gb", "-c", "2048"],
                 ["tune", str(path), "--device", "a100-80gb", "--min-ctx", "2048"]):
        main(argv)
        out = capsys.readouterr().out
        assert out and "\x1b" not in out and "\x07" not in out, argv


# ------------------------------------------------------------------------------------------------
# flags mirrored from llama.cpp
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["nan,1", "1,inf", "-1,1", "a,b", ",", "1," * 16, "1e400"])
def test_tensor_split_refused(text):
    with pytest.raises(ConfigError, match="tensor_split"):
        parse_tensor_split(text)


def test_tensor_split_spellings():
    assert parse_tensor_split("3,1") == (3.0, 1.0) == parse_tensor_split("3/1") == parse_tensor_split("3,,1")
    with pytest.raises(ConfigError, match="finite"):
        RunConfig(tensor_split=(float("nan"), 1.0))


@pytest.mark.parametrize("spelling, value", [("on", "on"), ("enabled", "on"), ("true", "on"), ("1", "on"),
                                             ("off", "off"), ("disabled", "off"), ("false", "off"),
                                             ("0", "off"), ("auto", "auto"), ("-1", "auto")])
def test_flash_attn_spellings_of_llama_cpp(capsys, spelling, value):
    """common/arg.cpp is_truthy / is_falsey / is_autoy: every spelling llama.cpp accepts, accepted here."""
    assert RunConfig(flash_attn=spelling).flash_attn == value
    assert main(["plan", "default", "-d", "v100-16gb", "-fa", spelling, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["flash_attn"] == value


@pytest.mark.parametrize("spelling", ["yes", "ON", "2", ""])
def test_flash_attn_other_spellings_refused(capsys, spelling):
    assert "flash_attn" in one_line_error(capsys, ["plan", "default", "-d", "v100-16gb", "-fa", spelling])


@pytest.mark.parametrize("flag, value", [("-c", "999999999999"), ("-b", str(2**32)), ("-np", str(2**32)),
                                         ("-t", str(2**31)), ("-ngl", str(2**31)), ("-ts", "nan,1")])
def test_numeric_flags_in_llama_cpp_range(capsys, flag, value):
    one_line_error(capsys, ["plan", "default", "-d", "v100-16gb", flag, value])


# ------------------------------------------------------------------------------------------------
# doctor, batch, models, scenario
# ------------------------------------------------------------------------------------------------

LOGS = __import__("pathlib").Path(__file__).parent / "data" / "logs"
NOTEBOOKS = LOGS.parent / "notebooks"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e400"])
def test_doctor_free_ram(capsys, value):
    line = one_line_error(capsys, ["doctor", str(LOGS / "gpu-v100-ngl0-server.log"), "--free-ram-gib", value])
    assert "--free-ram-gib" in line


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "FIFO", "/proc/self/status", "DIR"])
def test_doctor_special_files(tmp_path, capsys, target):
    if target == "FIFO":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    elif target == "DIR":
        target = str(tmp_path)
    one_line_error(capsys, ["doctor", target], within_s=5)


def test_doctor_escapes_and_shortens_evidence(tmp_path, capsys):
    log = tmp_path / "evil.log"
    line = "warning: debug build, performance may be affected " + ESC + "z" * 20000
    log.write_text(line + "\n")
    assert main(["doctor", str(log)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    evidence = [x for x in out.splitlines() if x.strip().startswith("line 1:")]
    assert evidence and all(len(x) <= 320 for x in evidence) and evidence[0].endswith("…")
    assert max(len(x) for x in out.splitlines()) < 1000
    assert main(["doctor", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert all(len(f["evidence"]) <= 300 for f in doc["findings"])


def test_batch_out_is_a_file(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text("scenario: x\n")
    out = tmp_path / "out"
    out.write_text("I am a file")
    nb = ["--notebooks", str(NOTEBOOKS / "ok.ipynb")]
    line = one_line_error(capsys, ["batch", str(params), "--out", str(out), *nb])
    assert "--out" in line and "not a folder" in line
    line = one_line_error(capsys, ["batch", str(params), "--out", str(out / "sub"), *nb])
    assert "is a file" in line


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_batch_timeout(tmp_path, capsys, value):
    params = tmp_path / "p.yaml"
    params.write_text("scenario: x\n")
    assert "--timeout" in one_line_error(capsys, ["batch", str(params), f"--timeout={value}", "--out",
                                                  str(tmp_path / "o"), "--notebooks", str(NOTEBOOKS / "ok.ipynb")])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", ["default:NOPE", "synth-tiny:NOPE", "nope", "gemma3-270m:Q4_0", "default:"])
def test_models_make_refuses_before_building(fresh_cache, capsys, target):
    one_line_error(capsys, ["models", "make", target])
    assert not fresh_cache.exists() or not any(fresh_cache.rglob("*.gguf"))


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_empty_parameter_file_is_an_error(tmp_path, text):
    from v100lab.workbook.scenario import Scenario, load_scenario

    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match="empty"):
        load_scenario(p)
    p.write_text("{}\n")                                           # asking for every default explicitly
    assert load_scenario(p) == Scenario()


@pytest.mark.parametrize("text, match", [("tensor_split: [.nan]\n", "finite"),
                                         ("n_gen: " + "9" * 30 + "\n", "too large"),
                                         ("tensor_split: [" + "1" * 400 + "]\n", "finite"),
                                         ("n_gen: " + "9" * 5000 + "\n", "YAML"),
                                         ("flash_attn: '1'\n", None)])
def test_parameter_file_numbers(tmp_path, text, match):
    from v100lab.workbook.scenario import load_scenario

    p = tmp_path / "p.yaml"
    p.write_text("scenario: x\n" + text)
    if match is None:
        assert load_scenario(p).flash_attn == "on"
        return
    with pytest.raises(ConfigError, match=match):
        load_scenario(p)


def test_from_flag_args_reads_tensor_split():
    import argparse

    from v100lab.facts.config import add_flag_arguments

    p = argparse.ArgumentParser()
    add_flag_arguments(p)
    assert from_flag_args(p.parse_args(["-ts", "3/1", "-fa", "true"])).tensor_split == (3.0, 1.0)


@pytest.mark.parametrize("args", [["-t", "0"], ["-t", str((os.cpu_count() or 1) + 1)], ["-t", "nan"], ["-t", "1,,x"],
                                  ["-t", "9" * 5000], ["-r", "0"], ["-r", "1000000"]])
def test_calibrate_flags_refused_before_measuring(capsys, args):
    one_line_error(capsys, ["calibrate", *args], within_s=5)
