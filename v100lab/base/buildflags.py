"""llama.cpp's CPU build flags for this host: native features named explicitly, AMX always off.

Why not llama.cpp's default (``GGML_NATIVE=ON``): the compiler's ``-march=native`` then enables every
feature the CPU has, AMX included, and on Sapphire-Rapids-class CPUs (``amx_tile amx_int8 amx_bf16`` in
/proc/cpuinfo) the AMX matmul of the llama.cpp commit vendored by llama-cpp-python 0.3.36 crashes on the
first batched decode (segfault in ``ggml_backend_amx_mul_mat``; upstream llama.cpp issue #20824, closed
without a fix). ``-DGGML_AMX_*=OFF`` alone changes nothing while ``GGML_NATIVE=ON``, so the safe build turns
``GGML_NATIVE`` off and names every x86 feature the host has, each ON or OFF.

The options mirror ``ggml/CMakeLists.txt`` (``option(GGML_AVX ...)`` …) and the flag each adds in
``ggml/src/ggml-cpu/CMakeLists.txt`` (the ``if (GGML_NATIVE) … else()`` branch for GCC/Clang on x86): for
example ``GGML_AVX512`` adds ``-mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw``, so it needs all five.

This module is standard-library only: ``scripts/setup.sh`` runs it (``python -m v100lab.base.buildflags``) before
the package and its dependencies are installed.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

#: x86 options of ggml, in ggml/CMakeLists.txt's order, and the /proc/cpuinfo flags each one needs (all of
#: them). AMX is listed so that it is always named, and always OFF (see the module docstring).
X86_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
)
AMX_OPTIONS: tuple[str, ...] = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")

#: the cpuinfo flags that matter to llama.cpp's CPU kernels (reported beside every measurement)
RELEVANT_FLAG_PATTERN = re.compile(r"^(sse4_2|avx.*|fma|f16c|bmi2|amx.*|neon|asimd.*|sve.*|i8mm|dotprod)$")

UPSTREAM_ISSUE = "llama.cpp issue #20824 (segfault in ggml_backend_amx_mul_mat)"


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the first processor: its model name and its feature flags."""

    model: str
    flags: frozenset[str]

    @property
    def relevant_flags(self) -> tuple[str, ...]:
        """The flags llama.cpp's kernels care about (AVX*, AMX*, FMA, F16C, …), sorted."""
        return tuple(sorted(f for f in self.flags if RELEVANT_FLAG_PATTERN.match(f)))

    @property
    def has_amx(self) -> bool:
        return any(f.startswith("amx") for f in self.flags)


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model name and flags of the first processor in a /proc/cpuinfo text (x86 ``flags``, ARM ``Features``)."""
    model, flags = "", ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = value
    return CpuInfo(model=model, flags=frozenset(flags.split()))


def safe_cmake_args(cpuinfo_text: str, machine: str = "x86_64") -> list[str]:
    """CMake arguments for a llama.cpp CPU build that is safe on the host described by ``cpuinfo_text``.

    A pure function of its inputs. On x86-64: ``-DGGML_NATIVE=OFF``, every option of :data:`X86_OPTIONS`
    ON exactly when the host has all of its flags, and AMX OFF. Elsewhere (ARM, an unknown machine) llama.cpp's
    own default (``GGML_NATIVE=ON``) is kept: its native ARM build has no known crash of this kind.
    """
    if machine.lower() not in ("x86_64", "amd64", "i686", "i386"):
        return []
    cpu = parse_cpuinfo(cpuinfo_text)
    args = ["-DGGML_NATIVE=OFF"]
    for option, needs in X86_OPTIONS:
        on = bool(cpu.flags) and all(flag in cpu.flags for flag in needs)
        args.append(f"-D{option}={'ON' if on else 'OFF'}")
    if not cpu.flags:  # cpuinfo unreadable: llama.cpp's portable x86-64 defaults (AVX2 era), still no AMX
        args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return args


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    """The host's cpuinfo text, or "" where there is none (macOS, Windows). Bounded: 1 MiB."""
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""


def host_cpu() -> CpuInfo:
    """This machine's CPU model and flags (from /proc/cpuinfo; the platform's processor name elsewhere)."""
    cpu = parse_cpuinfo(read_cpuinfo())
    if not cpu.model:
        cpu = CpuInfo(model=platform.processor() or platform.machine(), flags=cpu.flags)
    return cpu


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of the CPU's last-level cache as Linux reports it (sysfs ``index*/size`` of the highest ``level``),
    or None where it is not readable. A VM reports its host's cache — shared with the host's other guests — and
    a VM moved to another host can report another size with the same CPU model string."""
    best: tuple[int, int] | None = None
    for idx in sorted(Path(root).glob("index*")):
        try:
            level = int((idx / "level").read_text().strip())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        m = re.fullmatch(r"(\d+)\s*([KMG]?)", size)
        if not m:
            continue
        b = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
        if best is None or level > best[0]:
            best = (level, b)
    return best[1] if best else None


def host_cmake_args() -> list[str]:
    """:func:`safe_cmake_args` for this machine."""
    return safe_cmake_args(read_cpuinfo(), platform.machine())


# ----------------------------------------------------------------------------------------------- the record
#: where ``scripts/setup.sh`` records the build it made (inside the virtual environment it installed into)
def record_path(prefix: str | None = None) -> Path:
    return Path(prefix or sys.prefix) / "etc" / "v100lab" / "llama-build.json"


def read_record(prefix: str | None = None) -> dict:
    """The recorded build flags (``cmake_args``, ``source``: safe/cuda/user/native, ``cpu_model``, ``gpu``: why
    it is or is not a CUDA build), or {}."""
    try:
        data = json.loads(record_path(prefix).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(cmake_args: str, source: str, prefix: str | None = None, gpu: str | None = None) -> Path:
    """Record the build in use; ``gpu``: the one line saying why it is (or is not) a CUDA build."""
    cpu = host_cpu()
    path = record_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"cmake_args": cmake_args, "source": source, "cpu_model": cpu.model, "cpu_flags": list(cpu.relevant_flags)}
    if gpu is not None:
        rec["gpu"] = gpu
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


# ----------------------------------------------------------------------------------------- kernel facts
def option_on(cmake_args: str, option: str) -> bool | None:
    """``-DOPTION=ON`` → True, ``=OFF`` → False, not named → None (the last mention wins, as in CMake)."""
    found = None
    for m in re.finditer(rf"-D{option}=(\w+)", cmake_args or ""):
        found = m.group(1).upper() in ("ON", "1", "TRUE", "YES")
    return found


def f16_simd_step(cmake_args: str | None, cpu_flags=(), machine: str | None = None) -> int:
    """``GGML_F16_STEP`` of a llama.cpp CPU build: the elements ggml's f16 vector kernels (``ggml_vec_dot_f16``,
    ``ggml_vec_mad_f16``, used per KV cell by CPU flash attention) process per SIMD step; the rest of a row is
    a scalar loop. Mirrors ggml/src/ggml-cpu/simd-mappings.h: AVX-512 with ``__AVX512FP16__`` 128, AVX-512 64,
    AVX/AVX2 32, NEON with FP16 32, SSE3 16. ``cmake_args``: the build's flags (:func:`read_record`); a native
    build (``GGML_NATIVE`` on or not named) compiles for ``cpu_flags``, the host's."""
    machine = (machine or platform.machine()).lower()
    flags = set(cpu_flags)
    if machine not in ("x86_64", "amd64", "i686", "i386"):
        return 32 if machine in ("aarch64", "arm64") else 16
    native = option_on(cmake_args or "", "GGML_NATIVE")
    if native is not False:               # -march=native: the host's features
        if "avx512f" in flags:
            return 128 if "avx512_fp16" in flags else 64
        return 32 if "avx" in flags else 16
    if option_on(cmake_args, "GGML_AVX512"):
        return 64                         # the named options never include -mavx512fp16
    if option_on(cmake_args, "GGML_AVX2") or option_on(cmake_args, "GGML_AVX"):
        return 32
    return 16


def f16_simd_step_of_system_info(system_info: str) -> int | None:
    """:func:`f16_simd_step` of the build whose ``llama_print_system_info()`` line this is (what calibration stores
    as ``build.system_info``): ``AVX512 = 1`` 64, ``AVX2``/``AVX = 1`` 32; None when the line names no x86 SIMD
    level (another architecture, or no line). For judging a stored calibration with the step it was made with,
    not the step of the build that happens to be running."""
    on = {k.strip() for k, _, v in (part.partition("=") for part in (system_info or "").split("|"))
          if v.strip() == "1"}
    if "AVX512" in on:
        return 64
    if on & {"AVX2", "AVX"}:
        return 32
    return None


def f16_simd_step_in_use() -> int:
    """:func:`f16_simd_step` of the build ``scripts/setup.sh`` recorded, on this CPU (no record: a native build)."""
    return f16_simd_step(read_record().get("cmake_args"), host_cpu().flags)


# ggml/src/ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type (llama.cpp 0c1e570), on x86: the weight types
# the CPU backend re-lays out into 8x8 interleaved blocks, by the SIMD the build was compiled for —
# ggml_cpu_has_avx2() (``__AVX2__``; every AVX-512 build has it) gives Q4_0, Q4_K, IQ4_NL and MXFP4,
# ggml_cpu_has_avx512() (``__AVX512F__``) adds Q2_K (q2_K_8x8_q8_K). A build without AVX2 repacks nothing on x86.
REPACK_TYPES_AVX2 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
REPACK_TYPES_AVX512 = REPACK_TYPES_AVX2 | {"Q2_K"}


def repack_types(cmake_args: str | None, cpu_flags=(), machine: str | None = None) -> frozenset[str]:
    """The weight types a llama.cpp CPU build re-lays out (the table above), from its flags as :func:`f16_simd_step`
    reads them: ``GGML_AVX512`` → :data:`REPACK_TYPES_AVX512`, ``GGML_AVX2`` → :data:`REPACK_TYPES_AVX2`, a native
    build the host's ``avx512f`` / ``avx2``. Arm and other machines — whose kernels (NEON dotprod / i8mm, 4-row
    interleaves) are not modelled here — are given the AVX2 set."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i686", "i386"):
        return REPACK_TYPES_AVX2
    flags = set(cpu_flags)
    if option_on(cmake_args or "", "GGML_NATIVE") is not False:      # -march=native: the host's features
        avx512, avx2 = "avx512f" in flags, "avx2" in flags
    else:
        avx512 = bool(option_on(cmake_args, "GGML_AVX512"))
        avx2 = avx512 or bool(option_on(cmake_args, "GGML_AVX2"))
    return REPACK_TYPES_AVX512 if avx512 else REPACK_TYPES_AVX2 if avx2 else frozenset()


def repack_types_in_use() -> frozenset[str]:
    """:func:`repack_types` of the build ``scripts/setup.sh`` recorded, on this CPU (no record: a native build)."""
    return repack_types(read_record().get("cmake_args"), host_cpu().flags)


#: where ``scripts/build-tools.sh`` records the llama-server/llama-bench/llama-batched-bench it built and installed
#: into the virtual environment's bin/ (same llama.cpp commit as llama-cpp-python, linked against its libraries)
def tools_record_path(prefix: str | None = None) -> Path:
    return Path(prefix or sys.prefix) / "etc" / "v100lab" / "llama-tools.json"


def read_tools_record(prefix: str | None = None) -> dict:
    """The recorded tools build (``llama_cpp_commit``, ``cmake_args``, ``bin_dir``, ``tools``, ``version``,
    ``build_s``, ``cache_entry``), or {} when scripts/build-tools.sh has not installed any here."""
    try:
        data = json.loads(tools_record_path(prefix).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m v100lab.base.buildflags",
                                 description="print the safe llama.cpp CMAKE_ARGS for this host, or record a build")
    ap.add_argument("--cpuinfo", help="read this cpuinfo file instead of /proc/cpuinfo")
    ap.add_argument("--machine", default=platform.machine(), help="uname -m (default: this machine's)")
    ap.add_argument("--record", metavar="CMAKE_ARGS", help="record these flags as the build in use")
    ap.add_argument("--source", default="safe", choices=("safe", "cuda", "user", "native"), help="with --record")
    ap.add_argument("--gpu-note", help="with --record: why this is (or is not) a CUDA build")
    args = ap.parse_args(argv)
    if args.record is not None:
        print(write_record(args.record, args.source, gpu=args.gpu_note))
        return 0
    text = read_cpuinfo(args.cpuinfo) if args.cpuinfo else read_cpuinfo()
    print(" ".join(safe_cmake_args(text, args.machine)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
