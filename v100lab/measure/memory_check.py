"""The memory model checked against llama.cpp itself: load a model with a configuration (CPU build, in a
worker process), read the buffer sizes llama.cpp prints, and compare them with :func:`v100lab.predict.memory.plan`'s
figures for the host, buffer kind by buffer kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from v100lab.facts.config import RunConfig
from v100lab.gguf.header import read_spec
from v100lab.facts.loadlog import load_and_capture
from v100lab.predict.memory import HOST, plan
from v100lab.facts.spec import ModelSpec
from v100lab.models.worker import call_isolated

PRINT_MIB = 0.0051  # llama.cpp prints buffer sizes as %8.2f MiB: ±0.005 MiB of rounding


@dataclass(frozen=True)
class BufferCheck:
    """Predicted vs llama.cpp-reported bytes of one buffer kind on the host."""

    kind: str               # weights | kv_cache | recurrent | compute | output | total
    predicted_bytes: int
    measured_bytes: int     # from the log's MiB figure (rounded to 0.01 MiB)
    n_printed: int = 1      # how many printed (rounded) figures the measurement sums

    @property
    def error(self) -> float:
        """Relative error (predicted / measured - 1); 0 where both are 0."""
        if not self.measured_bytes:
            return 0.0 if not self.predicted_bytes else float("inf")
        return self.predicted_bytes / self.measured_bytes - 1

    def within(self, rel: float) -> bool:
        """|error| ≤ rel, allowing for the log's two-decimal rounding of MiB (±0.005 MiB per printed figure)."""
        slack = max(rel * self.measured_bytes, PRINT_MIB * 2**20 * max(1, self.n_printed))
        return abs(self.predicted_bytes - self.measured_bytes) <= slack


def check_against_llama(model_path, cfg: RunConfig, spec: ModelSpec | None = None):
    """Load ``model_path`` with ``cfg`` in llama.cpp (CPU build), read its buffer sizes from the log, and
    compare them with the memory model's plan for the host. Returns (checks by kind, LoadFacts, MemoryPlan).
    Raises RunFailed when llama.cpp refuses the configuration (WorkerCrashed when it crashes: the load
    runs in a worker process)."""
    spec = spec or read_spec(model_path)
    facts, _ = call_isolated(load_and_capture, model_path, cfg, what=f"loading {Path(model_path).name}")
    # mirror llama.cpp's own flash-attention decision (auto resolves per backend) for the compute estimate
    fa = {"enabled": "on", "disabled": "off"}.get(facts.flash_attn or "", cfg.flash_attn)
    p = plan(spec, [], cfg.with_(flash_attn=fa), with_max_ctx=False)
    h = p.devices[HOST]
    m = facts.by_device().get(HOST, {})

    def b(mib: float) -> int:
        return int(round(mib * 2**20))

    # the KV cache (attention layers) and the recurrent state (RS: conv + SSM/delta-net state) are separate
    # buffers in llama.cpp (llama_kv_cache, llama_memory_recurrent), checked separately
    kinds = {"weights": "model", "kv_cache": "KV", "recurrent": "RS", "compute": "compute", "output": "output"}
    host = [x for x in facts.buffers if x.device == HOST]
    printed = {k: sum(1 for x in host if x.kind == kind) for k, kind in kinds.items()}
    measured = {k: b(m.get(kind, 0.0)) for k, kind in kinds.items()}
    predicted = {"weights": h.weights_bytes, "kv_cache": h.kv_cache_bytes, "recurrent": h.recurrent_bytes,
                 "compute": h.compute_bytes, "output": h.output_bytes}
    measured["total"] = sum(measured.values())
    predicted["total"] = sum(predicted.values())
    printed["total"] = sum(printed.values())
    checks = {k: BufferCheck(k, predicted[k], measured[k], printed[k]) for k in measured}
    return checks, facts, p
