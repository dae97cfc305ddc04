"""Property tests over the command line's inputs.

For random flag values, device files, model files, logs and parameter files, every command either returns a
result (exit 0) or prints one line on stderr with exit status 2 (1 for a failed run) — never a traceback,
never a hang (each run is bounded by an alarm) — and ``--json`` prints one valid JSON document without NaN.

The CLI runs in process (``v100lab.cli.main(argv)`` with stdout/stderr redirected), so the module stays
well under a minute on two cores; nothing here builds a model or measures anything.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from v100lab.cli.main import main

RUN_LIMIT_S = 20           # one CLI run: beyond this it is a hang
LOGS = Path(__file__).parent / "data" / "logs"
# CI runs a fixed set of 30 examples per property (derandomized: the same inputs every run, under a minute);
# V100LAB_PROPERTY_EXAMPLES=N runs N fresh random ones instead (a deeper hunt, by hand)
DEEP = int(os.environ.get("V100LAB_PROPERTY_EXAMPLES", "0"))
FAST = settings(max_examples=DEEP or 30, deadline=None, derandomize=not DEEP,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"a CLI run took longer than {RUN_LIMIT_S} s")


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``v100lab ARGV`` run in process, bounded in time. Any exception
    other than argparse's SystemExit propagates: that is a traceback the user would have seen."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, RUN_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exc:        # argparse: --help, or its one-line error
                status = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return status, out.getvalue(), err.getvalue()


def _no_nan(name):
    raise AssertionError(f"--json printed {name}")


def check_outcome(argv: list[str], *, json_out: bool = False) -> tuple[int, str]:
    """Run and check the contract; returns (status, stdout)."""
    status, out, err = run_cli(argv)
    assert "Traceback" not in err and "Traceback" not in out, err
    if status == 0:
        if json_out:
            json.loads(out, parse_constant=_no_nan)          # one document, no NaN/Infinity
        else:
            assert all(c.isprintable() or c == "\n" for c in out), repr(out[:300])   # no raw escapes
    else:
        assert status in (1, 2), (status, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1, err
        assert lines[0].isprintable(), repr(lines[0])
        if status == 2:
            assert out == "", out
    return status, out


# ------------------------------------------------------------------------------------------------
# strategies
# ------------------------------------------------------------------------------------------------

NASTY_TEXT = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "1e300", "9" * 40, "", " ", "1,", ",", "abc",
              "0x10", "1.5", "\x1b[31m", "-0", "2147483648", "4294967296", "1e-320"]
numbers_as_text = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.integers(-2**40, 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.,-e+/", max_size=8),
)
control_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF, exclude_categories=("Cs",)),
                       max_size=30)


def _flag_args(draw) -> list[str]:
    """A random subset of llama.cpp's flags with random (often hostile) values."""
    flags = ["-c", "-b", "-ub", "-ngl", "-np", "-t", "-ts", "-fa", "-ctk", "-ctv", "--depth", "--n-prompt"]
    argv: list[str] = []
    for flag in draw(st.lists(st.sampled_from(flags), max_size=4, unique=True)):
        if flag == "-fa":
            value = draw(st.sampled_from(["on", "off", "auto", "1", "0", "true", "false", "-1", "enabled",
                                          "yes", "ON", ""]))
        elif flag in ("-ctk", "-ctv"):
            value = draw(st.sampled_from(["f16", "q8_0", "q4_0", "bf16", "q2_k", "F16", ""]))
        else:
            value = draw(numbers_as_text)
        argv.append(f"{flag}={value}")       # = keeps values such as "-1" from reading as flags
    return argv


DEVICE_VALUES = st.one_of(st.sampled_from([".nan", ".inf", "-.inf", "1.0e300", "1" + "0" * 400, "0", "-3", "12",
                                           "0.5", "true", "null", "'7'", "[1]", "{a: 1}"]),
                          st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e7).map(repr))


@st.composite
def device_file(draw) -> bytes:
    fields = {"id": "prop", "name": "Prop GPU", "kind": draw(st.sampled_from(["gpu", "cpu", "apple", "tpu"])),
              "memory_gib": draw(DEVICE_VALUES), "bandwidth_gbs": draw(DEVICE_VALUES)}
    for opt in ("fp16_tflops", "host_link_gbs", "runtime_overhead_mib"):
        if draw(st.booleans()):
            fields[opt] = draw(DEVICE_VALUES)
    if draw(st.booleans()):
        fields["name"] = json.dumps(draw(control_text))
    text = "".join(f"{k}: {v}\n" for k, v in fields.items()).encode()
    mode = draw(st.sampled_from(["yaml", "yaml", "binary", "cut"]))
    if mode == "binary":
        return draw(st.binary(min_size=1, max_size=200))
    if mode == "cut":
        return text[:draw(st.integers(0, len(text)))]
    return text


# ------------------------------------------------------------------------------------------------
# plan and the flag parsers
# ------------------------------------------------------------------------------------------------

@FAST
@given(data=st.data())
def test_plan_flags_and_devices(data, tmp_path_factory):
    argv = ["plan", data.draw(st.sampled_from(["default", "skeleton:llama2-7b:Q4_0", "skeleton:qwen35-27b:Q4_K_M"]))]
    if data.draw(st.booleans()):
        d = tmp_path_factory.mktemp("dev") / "gpu.yaml"
        d.write_bytes(data.draw(device_file()))
        argv += ["-d", str(d)]
    else:
        argv += ["-d", data.draw(st.sampled_from(["v100-16gb", "t4", "a100-80gb", "nope-gpu"]))]
    argv += _flag_args(data.draw)
    json_out = data.draw(st.booleans())
    if json_out:
        argv.append("--json")
    status, out = check_outcome(argv, json_out=json_out)
    if status == 0 and json_out:
        doc = json.loads(out)
        assert isinstance(doc["fits"], bool) and doc["devices"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.one_of(numbers_as_text, st.lists(numbers_as_text, max_size=20).map(",".join)))
def test_tensor_split_parser(text):
    from v100lab.facts.config import MAX_DEVICES, parse_tensor_split
    from v100lab.base.errors import ConfigError

    try:
        split = parse_tensor_split(text)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 < len(split) < MAX_DEVICES and all(math.isfinite(x) and x >= 0 for x in split)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(spelling=st.one_of(st.sampled_from(["on", "enabled", "true", "1", "off", "disabled", "false", "0", "auto",
                                           "-1"]), st.text(max_size=6)))
def test_flash_attn_spellings(spelling):
    from v100lab.facts.config import RunConfig
    from v100lab.base.errors import ConfigError

    try:
        cfg = RunConfig(flash_attn=spelling)
    except ConfigError:
        assert spelling not in ("on", "enabled", "true", "1", "off", "disabled", "false", "0", "auto", "-1")
        return
    assert cfg.flash_attn in ("on", "off", "auto")


# ------------------------------------------------------------------------------------------------
# inspect: model files, URLs, flags
# ------------------------------------------------------------------------------------------------

def _gguf(name: str, marker: bool) -> tuple[bytes, int]:
    """A header-only GGUF of llama2-7b Q4_0 with ``name`` as general.name (and without the skeleton marker
    unless ``marker``), and the size its tensor data would have."""
    from v100lab.gguf.header import read_header
    from v100lab.gguf.skeleton import arch_metadata, header_bytes, load_arch, skeleton_tensors

    a = {**load_arch("llama2-7b"), "name": name}
    md = [m for m in arch_metadata(a, "Q4_0") if marker or m[0] != "general.description"]
    head = header_bytes(md, skeleton_tensors(a, "Q4_0"))
    hdr = read_header(io.BytesIO(head))
    return head, hdr.data_bytes


@FAST
@given(name=control_text, cut=st.floats(0, 1), marker=st.booleans(), as_dict=st.booleans())
def test_inspect_model_files(tmp_path_factory, name, cut, marker, as_dict):
    head, data_bytes = _gguf(name, marker)
    k = int(cut * 4096)                   # bytes of "tensor data" after the header (a cut download)
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + k)
    argv = ["inspect", str(path)] + (["--json"] if as_dict else [])
    status, out = check_outcome(argv, json_out=as_dict)
    if k == 0 or marker:
        assert status == 0                               # a description: accepted
        if as_dict:
            assert json.loads(out)["name"] == name
    else:
        assert status == 2                               # 0 < data < what the header says: refused


@FAST
@given(target=st.one_of(
    st.sampled_from(["/proc/self/status", "/dev/zero", "/dev/null", "/", "http://[::1", "http://", "https://:0/x",
                     "http://127.0.0.1:1/x", "http://u:p@[::1]:1/x", "ftp://x/y", "skeleton:", "skeleton:nope:Q4_0",
                     "default:", "synth-nope", "a\0b", "~", "-", "."]),
    control_text.map(lambda t: "http://127.0.0.1:1/" + t)),
    flags=st.lists(st.sampled_from(["--timeout=nan", "--timeout=-1", "--timeout=0.5", "--max-header-mib=nan",
                                    "--max-header-mib=0.001", "--max-header-mib=1e40", "--json", "--tensors"]),
                   max_size=3, unique=True))
def test_inspect_odd_targets(target, flags):
    check_outcome(["inspect", target, *flags], json_out="--json" in flags)


@FAST
@given(data=st.binary(max_size=300), prefix=st.booleans())
def test_inspect_random_bytes(tmp_path_factory, data, prefix):
    path = tmp_path_factory.mktemp("b") / "x.gguf"
    path.write_bytes((b"GGUF\x03\x00\x00\x00" if prefix else b"") + data)
    check_outcome(["inspect", str(path), "--json"], json_out=True)


# ------------------------------------------------------------------------------------------------
# doctor: log content and flags
# ------------------------------------------------------------------------------------------------

_LOG_LINES = [line for p in sorted(LOGS.glob("*.log")) for line in p.read_text().splitlines()[:80]]


@FAST
@given(lines=st.lists(st.one_of(st.sampled_from(_LOG_LINES), control_text,
                                st.text(alphabet="0123456789.=/| ", max_size=80).map(lambda t: "eval time = " + t)),
                      max_size=40),
       free=st.one_of(st.none(), numbers_as_text),
       device=st.one_of(st.none(), st.sampled_from(["v100-16gb", "host-nope", "t4"])),
       as_dict=st.booleans())
def test_doctor_logs(tmp_path_factory, lines, free, device, as_dict):
    log = tmp_path_factory.mktemp("log") / "x.log"
    log.write_text("\n".join(lines) + "\n", errors="surrogatepass")
    argv = ["doctor", str(log)]
    if free is not None:
        argv.append(f"--free-ram-gib={free}")
    if device:
        argv += ["--device", device]
    if as_dict:
        argv.append("--json")
    status, out = check_outcome(argv, json_out=as_dict)
    if status == 0 and not as_dict:
        assert max(len(x) for x in out.splitlines()) < 2000        # evidence shortened


# ------------------------------------------------------------------------------------------------
# models, parameter files, device files, the results store
# ------------------------------------------------------------------------------------------------

@FAST
@given(base=st.sampled_from(["default", "synth-tiny", "synth-1b", "gemma3-270m", "nope", ""]),
       quant=st.one_of(st.sampled_from(["NOPE", "", "q4_0x", "Q4_K_X"]), control_text))
def test_models_make_never_builds_on_a_bad_name(fresh_cache_dir, base, quant):
    from v100lab.models import zoo
    from v100lab.base.errors import V100labError

    if base in ("default", "synth-tiny", "synth-1b") and quant:
        try:
            zoo.ftype_of(quant)
            assume(False)                      # a valid quant would build a model: not here
        except V100labError:
            pass
    if base in ("default", "synth-tiny", "synth-1b", "gemma3-270m") and not quant:
        assume(base == "gemma3-270m" and False)
    status, _ = check_outcome(["models", "make", f"{base}:{quant}" if quant or base == "" else base])
    assert status == 2
    assert not any(fresh_cache_dir.rglob("*.gguf"))


@pytest.fixture
def fresh_cache_dir(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("V100LAB_CACHE", str(d))
    return d


@FAST
@given(text=st.one_of(
    st.text(max_size=200),
    st.dictionaries(st.sampled_from(["scenario", "model", "n_ctx", "tensor_split", "flash_attn", "n_gen",
                                     "quants", "depths", "bogus"]),
                    st.one_of(numbers_as_text, st.lists(numbers_as_text, max_size=3).map(lambda v: "[" + ",".join(v) + "]")),
                    max_size=4).map(lambda d: "".join(f"{k}: {v}\n" for k, v in d.items()))))
def test_parameter_files(tmp_path_factory, text):
    from v100lab.base.errors import ConfigError
    from v100lab.workbook.scenario import load_scenario

    p = tmp_path_factory.mktemp("p") / "p.yaml"
    p.write_text(text, errors="surrogatepass")
    try:
        s = load_scenario(p)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    cfg = s.run_config()
    assert all(math.isfinite(x) for x in cfg.tensor_split) and cfg.flash_attn in ("on", "off", "auto")


@FAST
@given(content=device_file())
def test_device_files(tmp_path_factory, content):
    from v100lab.facts.devices import load_device_file
    from v100lab.base.errors import DeviceError

    p = tmp_path_factory.mktemp("d") / "gpu.yaml"
    p.write_bytes(content)
    try:
        dev = load_device_file(p)
    except DeviceError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(dev.memory_gib) and dev.capacity_bytes > 0 and math.isfinite(dev.bandwidth_gbs)


@FAST
@given(lines=st.lists(st.one_of(
    st.just('{"key": "k1", "status": "ok", "avg_ts": 1.5}'),
    st.just('{"key": "k2", "status": "ok", "avg_ts": "fast"}'),
    st.just('["a", "list"]'), st.just('{"key": ["x"], "status": "ok", "avg_ts": 2}'), st.just("{torn"),
    st.just('{"key": "k3", "status": "failed", "avg_ts": null}'), st.just('{"status": "ok", "avg_ts": 1}'),
    st.just('{"key": "k4", "status": "ok", "avg_ts": NaN}'), st.just(""), st.text(max_size=20)), max_size=10),
    newline_at_end=st.booleans())
def test_results_store_survives(tmp_path_factory, lines, newline_at_end):
    """Complete rows are never lost: each well-formed row is read back, before and after an append."""
    from v100lab.facts.store import ResultsStore, row_problem

    p = tmp_path_factory.mktemp("s") / "r.jsonl"
    body = "\n".join(lines) + ("\n" if newline_at_end else "")
    p.write_text(body, errors="surrogatepass")
    good = []
    for line in body.split("\n"):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if row_problem(row) is None:
            good.append(row)
    store = ResultsStore(p)
    assert store.rows() == good
    store.append({"key": "new", "status": "ok", "avg_ts": 3.0})
    assert store.rows() == good + [{"key": "new", "status": "ok", "avg_ts": 3.0}]
