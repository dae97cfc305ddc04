"""benchmarks/gpu_truth.sh (for a machine with an NVIDIA card) and its Python half, checked where no card is:
the script parses, the card is found in the catalog from nvidia-smi's answer, and the table's prediction
column follows each row's -ngl."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from v100lab.facts.devices import get_device

ROOT = Path(__file__).resolve().parents[1]
SMI = ROOT / "tests" / "data" / "nvidia-smi"


def gpu_truth():
    spec = importlib.util.spec_from_file_location("gpu_truth", ROOT / "benchmarks" / "gpu_truth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_truth.sh")], check=True)


@pytest.mark.parametrize("answer,device", [("v100-driver535.csv", "v100-sxm2-16gb"), ("t4.csv", "t4"),
                                           ("p40.csv", "p40"), ("a100-x2.csv", "a100-40gb"),
                                           ("rtx4090.csv", "rtx-4090")])
def test_the_card_from_nvidia_smi(answer, device):
    dev = gpu_truth().card((SMI / answer).read_text())
    assert dev is not None and dev.id == device


def test_rows_follow_ngl(default_model):
    g = gpu_truth()
    rec = {"model_filename": str(default_model), "n_prompt": 0, "n_gen": 128, "flash_attn": 1, "n_threads": 2,
           "avg_ts": 100.0}
    rows = g.rows([{**rec, "n_gpu_layers": 0}, {**rec, "n_gpu_layers": 99}], get_device("t4"))
    assert [r["ngl"] for r in rows] == [0, 99] and all(r["test"] == "tg128" for r in rows)
    assert rows[1]["predicted_tps"] > rows[0]["predicted_tps"]     # the T4's bandwidth against the host's
    assert rows[0]["error"] == pytest.approx(rows[0]["predicted_tps"] / 100.0 - 1)
    table = g.format_table(rows, get_device("t4"))
    assert table.startswith("card: t4") and table.count("| tg128 |") == 2
