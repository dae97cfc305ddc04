"""Watching the machine while a test runs: the seed's ``nvidia-smi -l 1`` view, recorded instead of eyeballed.

A :class:`Monitor` is a context manager that starts a sampler thread: about once a second (and once at
start and at stop, so even a sub-second test has two samples) it records

* always: the watched process's resident memory (RSS) and CPU utilisation (psutil; 100 % = one core), and
  the whole machine's CPU utilisation;
* where an NVIDIA GPU is visible: GPU memory used, utilisation and power per GPU, through NVML
  (``pynvml`` from the ``nvidia-ml-py`` package, extra ``[gpu]``), else by calling ``nvidia-smi`` when it is on
  PATH.

``summary()`` condenses the series into a few numbers for the result row (peak RSS, mean CPU, peak GPU memory,
mean GPU utilisation and power); ``series`` is the full list of samples, kept beside the raw log so a
notebook can plot "the GPU sat idle".
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import subprocess
import threading
import time
from typing import Any

import psutil

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0


class _Nvml:
    """GPU telemetry via NVML; ``None`` from ``open()`` when unavailable."""

    def __init__(self, nvml, handles):
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls):
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            log.debug("NVML unavailable: %s", exc)
            return None
        return cls(pynvml, handles) if handles else None

    def sample(self) -> list[dict[str, float]]:
        out = []
        for h in self.handles:
            g: dict[str, float] = {}
            try:
                g["mem_used_bytes"] = float(self.nvml.nvmlDeviceGetMemoryInfo(h).used)
                g["util_pct"] = float(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                g["power_w"] = self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception as exc:
                log.debug("NVML sample failed: %s", exc)
            out.append(g)
        return out

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class _NvidiaSmi:
    """GPU telemetry by calling ``nvidia-smi`` once per sample (slower; only when NVML is absent)."""

    QUERY = "memory.used,utilization.gpu,power.draw"

    def __init__(self, exe: str):
        self.exe = exe

    @classmethod
    def open(cls):
        exe = shutil.which("nvidia-smi")
        if not exe:
            return None
        inst = cls(exe)
        return inst if inst.sample() else None

    def sample(self) -> list[dict[str, float]]:
        try:
            out = subprocess.run([self.exe, f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        gpus = []
        for line in out.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            g: dict[str, float] = {}
            for key, val, scale in zip(("mem_used_bytes", "util_pct", "power_w"), parts, (2**20, 1, 1)):
                try:
                    g[key] = float(val) * scale
                except ValueError:
                    pass
            gpus.append(g)
        return gpus

    def close(self):
        pass


class Monitor:
    """Sample process and GPU figures on a thread while a test runs (see the module docstring).

    ``pid`` is the process to watch (default: this one; the server backend passes the server's pid).
    """

    def __init__(self, pid: int | None = None, interval: float = DEFAULT_INTERVAL_S, gpu: bool = True):
        self.pid = pid or os.getpid()
        self.interval = interval
        self.series: list[dict[str, Any]] = []
        self.gpu_source: str | None = None
        self._proc = psutil.Process(self.pid)
        self._psutil = psutil
        self._gpu = None
        if gpu:
            self._gpu = _Nvml.open()
            self.gpu_source = "nvml" if self._gpu else None
            if not self._gpu:
                self._gpu = _NvidiaSmi.open()
                self.gpu_source = "nvidia-smi" if self._gpu else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def __enter__(self) -> "Monitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._t0 = time.monotonic()
        try:  # prime cpu_percent: its first call returns 0.0 by design
            self._proc.cpu_percent(None)
            self._psutil.cpu_percent(None)
        except self._psutil.Error:
            pass
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="v100lab-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._thread = None
        self._sample()
        if self._gpu:
            self._gpu.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        s: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 3)}
        try:
            s["rss_bytes"] = self._proc.memory_info().rss
            s["cpu_pct"] = self._proc.cpu_percent(None)
            s["sys_cpu_pct"] = self._psutil.cpu_percent(None)
        except self._psutil.Error as exc:  # the watched process went away (a server that died)
            s["error"] = str(exc)
        if self._gpu:
            s["gpus"] = self._gpu.sample()
        self.series.append(s)

    def summary(self) -> dict[str, Any]:
        """A few numbers for the result row (None where nothing was measured)."""
        rss = [s["rss_bytes"] for s in self.series if "rss_bytes" in s]
        # the first sample's cpu_percent is primed to 0; the stop sample covers the tail interval
        cpu = [s["cpu_pct"] for s in self.series[1:] if "cpu_pct" in s]
        sys_cpu = [s["sys_cpu_pct"] for s in self.series[1:] if "sys_cpu_pct" in s]
        out: dict[str, Any] = {
            "samples": len(self.series),
            "duration_s": self.series[-1]["t"] if self.series else 0.0,
            "rss_max_bytes": max(rss) if rss else None,
            "cpu_pct_mean": round(statistics.fmean(cpu), 1) if cpu else None,
            "sys_cpu_pct_mean": round(statistics.fmean(sys_cpu), 1) if sys_cpu else None,
            "gpu_source": self.gpu_source,
        }
        gpu_samples = [s["gpus"] for s in self.series if s.get("gpus")]
        if gpu_samples:
            n = max(len(g) for g in gpu_samples)
            per = []
            for i in range(n):
                vals = [g[i] for g in gpu_samples if i < len(g)]
                mem = [v["mem_used_bytes"] for v in vals if "mem_used_bytes" in v]
                util = [v["util_pct"] for v in vals if "util_pct" in v]
                power = [v["power_w"] for v in vals if "power_w" in v]
                per.append({"mem_used_max_bytes": max(mem) if mem else None,
                            "util_pct_mean": round(statistics.fmean(util), 1) if util else None,
                            "power_w_mean": round(statistics.fmean(power), 1) if power else None})
            out["gpus"] = per
        return out
