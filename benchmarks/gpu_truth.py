"""The Python half of benchmarks/gpu_truth.sh: the models it benches, and its table of measured llama-bench rows
beside the CUDA class's prediction for the card.

    python benchmarks/gpu_truth.py models                       # name, path, -ngl half, n_layer (tab-separated)
    python benchmarks/gpu_truth.py table --bench bench.jsonl --nvidia-smi nvidia-smi.csv [--json out.json]

The card is the catalog device nvidia-smi's name matches (as the doctor matches a log's GPU); the prediction is
:func:`v100lab.predict.speed.predict` on [that card, this host] with the row's -ngl, -fa and threads. Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from v100lab.base import cudabuild
from v100lab.predict import speed
from v100lab.models import zoo
from v100lab.facts.config import ALL_LAYERS, RunConfig
from v100lab.facts.devices import catalog
from v100lab.advise.doctor import GpuFact, guess_device
from v100lab.gguf.header import read_spec
from v100lab.measure.llamabench import parse_llama_bench

MODELS = ("default", "gemma3-270m", "synth-1b")
VENDOR = {"tesla", "nvidia", "geforce"}


def models() -> list[tuple[str, Path, int, int]]:
    """(name, path, half of the layers, n_layer) of each model gpu_truth.sh benches (built or assembled once)."""
    out = []
    for name in MODELS:
        path = zoo.model_path(name)
        n = read_spec(path).n_layer
        out.append((name, path, n // 2, n))
    return out


def card(nvidia_smi_text: str):
    """The catalog device of the first card in an nvidia-smi query answer (None when the catalog lacks it)."""
    gpus = cudabuild.parse_nvidia_smi(nvidia_smi_text)
    if not gpus:
        return None
    g = gpus[0]
    dev = guess_device([GpuFact(name="CUDA0", description=g.name, compute_capability=g.compute_cap,
                                total_mib=g.memory_mib)])
    if dev is not None or not g.memory_mib:
        return dev
    # nvidia-smi's total is below the marketed size (a T4's 15360 MiB is "16GB"): match the name without the
    # size, then take the catalog card of the nearest memory
    words = set(re.findall(r"[a-z0-9]+", g.name.lower()))
    near = [d for d in catalog().values() if d.kind == "gpu"
            and (set(re.findall(r"[a-z0-9]+", d.name.lower())) - VENDOR - {w for w in words if w.endswith("gb")}
                 - {w for w in re.findall(r"[a-z0-9]+", d.name.lower()) if re.fullmatch(r"\d+gb", w)}) <= words]
    return min(near, key=lambda d: abs(d.memory_gib * 1024 - g.memory_mib), default=None)


def rows(records: list[dict], device) -> list[dict]:
    """One row per llama-bench record: model, -ngl, -fa, test, measured and predicted tok/s, error."""
    out = []
    specs: dict[str, object] = {}
    for r in records:
        path = r.get("model_filename") or ""
        spec = specs.get(path) or specs.setdefault(path, read_spec(path))
        n_prompt, n_gen = int(r.get("n_prompt") or 0), int(r.get("n_gen") or 0)
        ngl = int(r.get("n_gpu_layers", -1))
        fa = int(r.get("flash_attn", 0) in (1, True, "1", "on", "true"))
        cfg = RunConfig(n_gpu_layers=ALL_LAYERS if ngl < 0 else ngl, flash_attn="on" if fa else "off",
                        n_threads=int(r.get("n_threads") or 1), n_ctx=max(512, n_prompt + n_gen + 1))
        test = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
        measured = float(r.get("avg_ts") or 0.0)
        predicted = None
        if device is not None:
            p = speed.predict(spec, [device, "host"], cfg, n_prompt=max(n_prompt, 1))
            predicted = p.pp_tps if n_prompt else p.tg_tps
        out.append({"model": Path(path).name, "ngl": ngl, "fa": fa, "test": test, "measured_tps": measured,
                    "predicted_tps": predicted,
                    "error": (predicted / measured - 1) if predicted and measured else None})
    return out


def format_table(table: list[dict], device) -> str:
    head = f"card: {device.id if device is not None else 'not in the catalog (no prediction)'}\n\n"
    lines = ["| model | -ngl | -fa | test | measured t/s | predicted t/s | error |", "|---|---:|---:|---|---:|---:|---:|"]
    for t in table:
        pred = f"{t['predicted_tps']:.1f}" if t["predicted_tps"] else "–"
        err = f"{100 * t['error']:+.1f} %" if t["error"] is not None else "–"
        lines.append(f"| {t['model']} | {t['ngl']} | {t['fa']} | {t['test']} | {t['measured_tps']:.1f} | {pred} | {err} |")
    return head + "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("models", help="the models to bench: name, path, half of the layers, n_layer")
    t = sub.add_parser("table", help="measured llama-bench rows beside the prediction")
    t.add_argument("--bench", required=True, help="llama-bench -o jsonl output")
    t.add_argument("--nvidia-smi", required=True, help="the nvidia-smi query answer of the card")
    t.add_argument("--json", help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    if a.cmd == "models":
        for name, path, half, n in models():
            print(f"{name}\t{path}\t{half}\t{n}")
        return 0
    device = card(Path(a.nvidia_smi).read_text())
    table = rows(parse_llama_bench(Path(a.bench).read_text(), "jsonl"), device)
    print(format_table(table, device))
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device.id if device else None, "rows": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
