"""The build self-test: does this llama.cpp build run here, on this CPU, without crashing?

A llama.cpp build can load a model and still crash on the first batched decode (the AMX matmul of a
``GGML_NATIVE=ON`` build on Sapphire-Rapids-class CPUs: llama.cpp issue #20824). The self-test runs, each in
a worker child process (:mod:`v100lab.models.worker`) under a timeout, what every measurement needs: load the
default model, process a prompt of at least 64 tokens (a batched decode) and generate, at 1 thread and at
all cores. It reports the llama.cpp build (commit, llama.cpp's system-info line), the CPU and its flags,
the build flags ``scripts/setup.sh`` recorded, which llama-server/llama-bench/llama-batched-bench the package
would use (where from, the commit their ``--version`` names, and whether it is the library's), and pass or
fail with one line saying why and how to rebuild (the tools do not decide pass or fail).

``scripts/setup.sh`` runs it after installing (``python -m v100lab.measure.selftest``) and falls back to the safe
build once when it fails; ``v100lab selftest`` runs it on demand. ``--gpu`` checks a CUDA build on the card
instead (:func:`run_gpu_selftest`): GPU offload compiled in, every layer offloaded, a model buffer on a GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from v100lab.base import buildflags
from v100lab.measure import harness
from v100lab.models import zoo
from v100lab.measure.backends.isolated import IsolatedBackend, gpu_probe, llama_build
from v100lab.measure.backends.server import SERVER_ENV
from v100lab.measure.backends.types import (
    BATCHED_BENCH_ENV,
    locate_binary,
    same_commit,
    tool_version,
)
from v100lab.facts.config import RunConfig
from v100lab.base.errors import RunFailed, V100labError
from v100lab.measure.llamabench import BENCH_ENV

log = logging.getLogger(__name__)

SELFTEST_PROMPT = 64      # tokens: a batched decode, where the AMX crash happens
SELFTEST_GEN = 16
SELFTEST_TIMEOUT_S = 120.0
#: llama.cpp's tools the package runs, and the variable that names each one's binary
TOOLS = (("llama-server", SERVER_ENV), ("llama-bench", BENCH_ENV), ("llama-batched-bench", BATCHED_BENCH_ENV))
REBUILD_COMMAND = ('CMAKE_ARGS="$(python -m v100lab.base.buildflags)" python -m pip install --force-reinstall '
                   '--no-cache-dir --no-deps llama-cpp-python=={version}')


@dataclass(frozen=True)
class Step:
    """One part of the self-test: what ran, at how many threads, and how it ended."""

    name: str
    threads: int
    status: str                  # ok | failed | crashed | timeout
    tokens_per_s: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class SelfTestReport:
    passed: bool
    steps: tuple[Step, ...]
    build: dict[str, Any]        # llama.cpp commit, system info, llama-cpp-python version (from a worker)
    build_flags: dict[str, Any]  # what scripts/setup.sh recorded (cmake_args, source)
    cpu_model: str
    cpu_flags: tuple[str, ...]
    message: str                 # one line: "ok" or what failed, with the rebuild command
    log_tail: str = ""
    tools: dict[str, Any] = field(default_factory=dict)  # llama-server & co: path, source, commit, same_commit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"llama.cpp build: {self.build.get('build_commit') or '?'} "
                 f"(llama-cpp-python {self.build.get('llama_cpp_python') or '?'})",
                 f"system info:     {self.build.get('system_info') or '?'}",
                 f"build flags:     {self.build_flags.get('cmake_args') or '(not recorded: installed by hand?)'}"
                 + (f" [{self.build_flags['source']}]" if self.build_flags.get("source") else ""),
                 f"CPU:             {self.cpu_model or '?'}",
                 f"CPU flags:       {' '.join(self.cpu_flags) or '?'}"]
        for name, t in self.tools.items():
            lines.append(f"{name + ':':16s} {format_tool(t)}")
        for s in self.steps:
            speed = f"{s.tokens_per_s:8.1f} tok/s" if s.tokens_per_s else " " * 14
            lines.append(f"  {s.status:8s} {s.name:6s} {s.threads:2d} thread(s) {speed} {s.detail}".rstrip())
        lines.append(("PASS: " if self.passed else "FAIL: ") + self.message)
        if not self.passed and self.log_tail:
            lines.append("last llama.cpp log lines:")
            lines += ["  " + line for line in self.log_tail.splitlines()]
        return "\n".join(lines)


def tools_report(library_commit: str | None) -> dict[str, dict[str, Any]]:
    """For each of :data:`TOOLS`: the binary the package would run, where it came from
    (:data:`v100lab.measure.backends.types.BINARY_SOURCES`), what its ``--version`` says, and whether its commit is
    ``library_commit`` (llama-cpp-python's). Never raises: a bad ``$V100LAB_*`` path becomes ``error``."""
    out: dict[str, dict[str, Any]] = {}
    for name, env in TOOLS:
        try:
            path, source = locate_binary(name, env)
        except V100labError as exc:
            out[name] = {"path": None, "error": str(exc)}
            continue
        if path is None:
            out[name] = {"path": None}
            continue
        v = tool_version(path)
        out[name] = {"path": str(path), "source": source, **v,
                     "same_commit": same_commit(v.get("commit"), library_commit)}
    return out


def format_tool(t: dict[str, Any]) -> str:
    """One line for one tool of :func:`tools_report`."""
    if not t.get("path"):
        return t.get("error") or "not found (scripts/build-tools.sh builds it)"
    head = f"{t['path']} [{t.get('source')}]"
    if t.get("error"):
        return f"{head}: {t['error']}"
    same = {True: "the same commit as llama-cpp-python", False: "NOT llama-cpp-python's commit",
            None: "commit unknown: cannot tell whether it is llama-cpp-python's"}[t.get("same_commit")]
    return f"{head} build {t.get('build_number')}, commit {t.get('commit') or 'unknown'}: {same}"


def rebuild_command() -> str:
    try:
        v = version("llama-cpp-python")
    except Exception:  # not installed: the version pyproject pins
        v = "0.3.36"
    return REBUILD_COMMAND.format(version=v)


def run_selftest(model: str | os.PathLike | None = None, *, threads: tuple[int, ...] | None = None,
                 timeout: float = SELFTEST_TIMEOUT_S, n_prompt: int = SELFTEST_PROMPT,
                 n_gen: int = SELFTEST_GEN) -> SelfTestReport:
    """Load ``model`` (default: the default model) and run pp``n_prompt`` and tg``n_gen`` at each thread
    count (default 1 and all cores), each configuration in its own worker under ``timeout`` seconds."""
    if not (0 < timeout < float("inf")):
        raise V100labError(f"--timeout must be a positive number of seconds, got {timeout}")
    if n_prompt < 2:
        raise V100labError(f"the self-test needs a prompt of at least 2 tokens (a batched decode), got {n_prompt}")
    path = zoo.model_path(model or "default")
    ncpu = os.cpu_count() or 1
    threads = tuple(sorted(set(threads or (1, ncpu))))
    backend = IsolatedBackend(timeout=timeout)
    steps: list[Step] = []
    tail = ""
    for th in threads:
        cfg = RunConfig(n_ctx=max(256, n_prompt + n_gen + 1), n_threads=th, n_gpu_layers=0)
        rows = harness.run_tests(path, cfg, [f"pp{n_prompt}", f"tg{n_gen}"], (0,), 1, backend=backend,
                               monitor=False)
        for r in rows:
            steps.append(Step(name=r["test"], threads=th, status=r["status"], tokens_per_s=r.get("avg_ts"),
                              detail="" if r["status"] == "ok" else str(r.get("reason") or "")))
            if r["status"] != "ok" and not tail:
                tail = (r.get("crash") or {}).get("log_tail") or ""
    bad = [s for s in steps if s.status != "ok"]
    if not bad:
        message = f"llama.cpp loads {Path(path).name}, processes a {n_prompt}-token prompt and generates at " \
                  f"{', '.join(map(str, threads))} thread(s)"
    else:
        first = bad[0]
        message = (f"{first.name} at {first.threads} thread(s) {first.status}: {first.detail}; rebuild llama.cpp "
                   f"with the safe flags: {rebuild_command()}")
    cpu = buildflags.host_cpu()
    build = llama_build()
    return SelfTestReport(passed=not bad, steps=tuple(steps), build=build, build_flags=buildflags.read_record(),
                          cpu_model=cpu.model, cpu_flags=cpu.relevant_flags, message=message, log_tail=tail,
                          tools=tools_report(build.get("build_commit")))


@dataclass(frozen=True)
class GpuSelfTest:
    """The build on the card: offload compiled in, layers offloaded, buffers per device, pp/tg at all layers."""

    passed: bool
    message: str                             # one line: what runs on the card, or what failed
    gpu_offload: bool | None                 # llama_supports_gpu_offload(); None: the library did not load
    offloaded_layers: int | None = None
    offloadable_layers: int | None = None
    buffers_mib: dict[str, dict[str, float]] = field(default_factory=dict)   # device → kind → MiB
    steps: tuple[Step, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"GPU offload:     {self.gpu_offload}",
                 f"offloaded:       {self.offloaded_layers}/{self.offloadable_layers} layers"]
        for dev, kinds in self.buffers_mib.items():
            lines.append(f"  {dev:14s} " + ", ".join(f"{k} {v:.1f} MiB" for k, v in kinds.items()))
        for s in self.steps:
            speed = f"{s.tokens_per_s:8.1f} tok/s" if s.tokens_per_s else ""
            lines.append(f"  {s.status:8s} {s.name:6s} all layers on the GPU {speed} {s.detail}".rstrip())
        lines.append(("PASS: " if self.passed else "FAIL: ") + self.message)
        return "\n".join(lines)


def judge_gpu_probe(probe: dict[str, Any]) -> tuple[bool, str]:
    """Pass/fail and one line for :func:`v100lab.measure.backends.isolated.gpu_probe`'s answer: offload compiled in,
    every layer offloaded, and a model buffer on a GPU device (CUDA0, …)."""
    if not probe.get("gpu_offload"):
        # a GPU build whose backend found no device says so at registration (ggml-cuda.cu ggml_cuda_init)
        failed = [line for line in probe.get("backend_log") or () if "failed to initialize" in line]
        if failed:
            return False, f"this GPU build of llama.cpp finds no usable device: {failed[-1]}"
        return False, "this llama.cpp was built without GPU offload (llama_supports_gpu_offload() is false)"
    n, m = probe.get("offloaded"), probe.get("offloadable")
    if n is None or m is None or n < m:
        return False, f"only {n}/{m} layers were offloaded with -ngl all"
    gpu = [d for d, kinds in (probe.get("buffers") or {}).items()
           if d != "host" and kinds.get("model") and not d.upper().startswith("CPU")]
    if not gpu:
        return False, f"{n}/{m} layers offloaded but no model buffer on a GPU device in the load log"
    return True, f"{n}/{m} layers offloaded; model buffer on {', '.join(gpu)}"


def run_gpu_selftest(model: str | os.PathLike | None = None, *, timeout: float = SELFTEST_TIMEOUT_S,
                     n_prompt: int = SELFTEST_PROMPT, n_gen: int = SELFTEST_GEN) -> GpuSelfTest:
    """The GPU build's self-test: load ``model`` (default: the default model) with every layer offloaded, read
    the load log, then pp``n_prompt``/tg``n_gen`` at all layers — each in a worker under ``timeout``."""
    path = zoo.model_path(model or "default")
    try:
        probe = gpu_probe(path, timeout=timeout)
    except (RunFailed, OSError, ImportError, RuntimeError) as exc:  # RuntimeError: llama_cpp's "Failed to load"
        return GpuSelfTest(False, f"llama.cpp does not load here: {' '.join(str(exc).split())[:300]}", None)
    ok, message = judge_gpu_probe(probe)
    common = dict(gpu_offload=probe.get("gpu_offload"), offloaded_layers=probe.get("offloaded"),
                  offloadable_layers=probe.get("offloadable"), buffers_mib=probe.get("buffers") or {})
    if not ok:
        return GpuSelfTest(False, message, **common)
    cfg = RunConfig(n_ctx=max(256, n_prompt + n_gen + 1), n_threads=os.cpu_count() or 1)
    rows = harness.run_tests(path, cfg, [f"pp{n_prompt}", f"tg{n_gen}"], (0,), 1,
                             backend=IsolatedBackend(timeout=timeout), monitor=False)
    steps = tuple(Step(name=r["test"], threads=cfg.n_threads, status=r["status"], tokens_per_s=r.get("avg_ts"),
                       detail="" if r["status"] == "ok" else str(r.get("reason") or "")) for r in rows)
    bad = [s for s in steps if s.status != "ok"]
    if bad:
        return GpuSelfTest(False, f"{bad[0].name} on the GPU {bad[0].status}: {bad[0].detail}", steps=steps, **common)
    return GpuSelfTest(True, f"{message}; pp{n_prompt} and tg{n_gen} run on the card", steps=steps, **common)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m v100lab.measure.selftest", description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=SELFTEST_TIMEOUT_S, help="seconds per configuration")
    ap.add_argument("--gpu", action="store_true", help="check the GPU build on the card (every layer offloaded)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        report = run_gpu_selftest(timeout=args.timeout) if args.gpu else run_selftest(timeout=args.timeout)
    except V100labError as exc:
        print(f"selftest: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print(report.format())
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
