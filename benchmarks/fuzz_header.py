"""A longer fuzz run of the header reader than CI's (tests/test_header_hostile.py).

    .venv/bin/python benchmarks/fuzz_header.py [--seconds 300] [--seed 1]

Mutates real headers (the default model's first 64 KiB plus small built files and a skeleton) with
bit flips, hostile 64-bit values at random positions, insertions, deletions and cuts, and parses
each through read_header and spec_from_header. Anything other than success or GGUFError is a bug:
the script prints the input's hex and exits 1. Also reports parses per second and the slowest one.
"""

from __future__ import annotations

import argparse
import io
import random
import struct
import sys
import time

from v100lab.models import zoo
from v100lab.base.errors import GGUFError
from v100lab.gguf.header import read_header, spec_from_header
from v100lab.gguf.skeleton import skeleton_header

HOSTILE = [0, 1, 2**31, 2**32 - 1, 2**62, 2**63, 2**64 - 1, 2**30 + 1]


def corpus() -> list[bytes]:
    seeds = [skeleton_header({"architecture": "llama", "name": "f", "n_layer": 2, "n_embd": 64, "n_ff": 128,
                              "n_head": 4, "n_head_kv": 2, "n_ctx_train": 256, "n_vocab": 32}, "Q4_K_M"),
             skeleton_header({"architecture": "gemma3", "name": "g", "n_layer": 7, "n_embd": 64, "n_ff": 128,
                              "n_head": 4, "n_head_kv": [1, 1, 1, 1, 1, 1, 1], "n_ctx_train": 256,
                              "n_vocab": 32, "sliding_window": 16}, "Q8_0")]
    try:
        with open(zoo.model_path("default"), "rb") as f:
            seeds.append(f.read(64 * 1024))   # metadata + the start of the tokenizer arrays
    except Exception:  # noqa: BLE001 - the default model is optional for this script
        pass
    return seeds


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(max(len(buf), 1))
        kind = rng.random()
        if kind < 0.4 and buf:
            buf[pos] ^= 1 << rng.randrange(8)
        elif kind < 0.6:
            buf[pos:pos + 8] = struct.pack("<Q", rng.choice(HOSTILE))
        elif kind < 0.7:
            buf[pos:pos + 4] = struct.pack("<I", rng.randrange(16))
        elif kind < 0.8:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif kind < 0.9:
            del buf[pos:pos + rng.randint(1, 16)]
        else:
            del buf[pos:]
    return bytes(buf)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    seeds = corpus()
    n = ok = errors = 0
    slowest = (0.0, b"")
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        data = mutate(rng, rng.choice(seeds))
        t = time.perf_counter()
        try:
            spec_from_header(read_header(io.BytesIO(data)))
            ok += 1
        except GGUFError:
            errors += 1
        except Exception as exc:  # noqa: BLE001 - that is the point
            print(f"BUG: {type(exc).__name__}: {exc}\ninput ({len(data)} bytes): {data[:512].hex()}")
            return 1
        dt = time.perf_counter() - t
        if dt > slowest[0]:
            slowest = (dt, data)
        n += 1
    print(f"{n} inputs in {args.seconds:.0f} s ({n / args.seconds:.0f}/s): {ok} parsed, {errors} GGUFError, "
          f"0 other exceptions; slowest {slowest[0] * 1e3:.1f} ms ({len(slowest[1])} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
