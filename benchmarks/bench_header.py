"""Header parse time and bytes read: v100lab.gguf.header vs gguf.GGUFReader; request count over HTTP.

Run under the shared measurement lock:
    flock /tmp/v100lab-measure.lock .venv/bin/python benchmarks/bench_header.py [--repeats 15]

Prints one table (median, coefficient of variation, bytes read, requests) and a JSON line.
Targets: default model ≤ 50 ms and ≥ 50× faster than GGUFReader; bytes read ≤
header_bytes + 1 MiB; a remote header under 8 MiB in ≤ 3 range requests.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import statistics
import threading
import time
from pathlib import Path

import gguf

from v100lab.models import zoo
from v100lab.gguf.header import read_header

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def _timed(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0
    return med, cv


def _serve(path: Path):
    size = path.stat().st_size
    seen: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Range", ""))
            m = _RANGE.fullmatch(self.headers.get("Range", ""))
            start = int(m.group(1))
            end = min(int(m.group(2) or size - 1), size - 1)
            with open(path, "rb") as f:
                f.seek(start)
                body = f.read(end - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/m.gguf", seen


def bench(alias: str, repeats: int, ref_repeats: int) -> dict:
    path = zoo.model_path(alias)
    hdr = read_header(path)
    ours, ours_cv = _timed(lambda: read_header(path), repeats)
    ref, ref_cv = _timed(lambda: gguf.GGUFReader(str(path)), ref_repeats)
    srv, url, seen = _serve(path)
    try:
        remote, remote_cv = _timed(lambda: read_header(url), max(3, repeats // 3))
        seen.clear()
        rh = read_header(url)
        n_requests = len(seen)
    finally:
        srv.shutdown()
        srv.server_close()
    return {"model": alias, "header_bytes": hdr.header_bytes, "file_bytes": hdr.file_bytes,
            "parse_ms": ours * 1e3, "parse_cv": ours_cv, "ggufreader_ms": ref * 1e3, "ggufreader_cv": ref_cv,
            "speedup": ref / ours, "bytes_read": hdr.bytes_read,
            "bytes_read_minus_header": hdr.bytes_read - hdr.header_bytes,
            "remote_ms": remote * 1e3, "remote_cv": remote_cv, "remote_requests": n_requests,
            "remote_bytes_read": rh.bytes_read}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ref-repeats", type=int, default=3, help="GGUFReader runs (each takes seconds)")
    ap.add_argument("--models", nargs="*", default=["default", "gemma3-270m"])
    args = ap.parse_args()
    rows = [bench(m, args.repeats, args.ref_repeats) for m in args.models]
    print(f"{'model':<12} {'header':>10} {'ours ms':>9} {'cv':>5} {'GGUFReader ms':>14} {'cv':>5} {'speedup':>8} "
          f"{'read-hdr':>10} {'remote ms':>10} {'reqs':>5}")
    for r in rows:
        print(f"{r['model']:<12} {r['header_bytes']:>10} {r['parse_ms']:>9.1f} {r['parse_cv']:>5.2f} "
              f"{r['ggufreader_ms']:>14.0f} {r['ggufreader_cv']:>5.2f} {r['speedup']:>7.0f}x "
              f"{r['bytes_read_minus_header']:>10} {r['remote_ms']:>10.1f} {r['remote_requests']:>5}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
