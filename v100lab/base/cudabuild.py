"""llama.cpp's CUDA build for this host's NVIDIA cards: which toolkit, which CMake arguments, or why none.

:func:`plan_build` is a pure function of what ``nvidia-smi`` says (each card's name, compute capability,
memory and the driver), the CUDA toolkits found, and the safe CPU flags (:mod:`v100lab.base.buildflags`). Its rules:

* a toolkit runs on a driver whose CUDA major is at least its own (NVIDIA's minor-version compatibility:
  any 12.x toolkit on a driver ≥ 525, any 13.x on a driver ≥ 580; the build holds SASS for each card's exact
  architecture, so no PTX has to be compiled by an older driver);
* a toolkit compiles for an architecture inside its range: CUDA 11.x sm_35-, 12.x sm_50-, 13.x sm_75- (CUDA 13
  dropped offline compilation for compute capability < 7.5: a V100, P40 or P100 needs CUDA ≤ 12.x);
* the registry's toolkit (the ``nvidia-cuda-nvcc`` 13.x wheels, pinned in :data:`REGISTRY_WHEELS`, installed
  into the virtual environment) is preferred where it serves every card; else the newest toolkit of the machine
  (``$CUDACXX``, ``$CUDA_HOME``, ``/usr/local/cuda-*``, ``nvcc`` on PATH) that does.

Standard-library only, like :mod:`v100lab.base.buildflags`: ``scripts/setup.sh`` runs ``python -m v100lab.base.cudabuild``
before the package is installed. ``$V100LAB_NVIDIA_SMI`` names another nvidia-smi (a script that prints a
recorded answer: for tests of the detection; llama.cpp itself is never stood in for).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from v100lab.base import buildflags

NVIDIA_SMI_ENV = "V100LAB_NVIDIA_SMI"
#: colon-separated nvcc paths to consider instead of the machine's usual places (for tests, or to choose one)
TOOLKITS_ENV = "V100LAB_CUDA_NVCC"
#: colon-separated folders to look in for the driver's libcuda.so.1 instead of the usual ones ("" for none)
DRIVER_DIRS_ENV = "V100LAB_CUDA_DRIVER_DIRS"
NVIDIA_SMI_QUERY = ("--query-gpu=name,compute_cap,memory.total,driver_version", "--format=csv,noheader")
DETECT_TIMEOUT_S = 20.0

#: the registry's CUDA 13 toolkit, pinned: nvcc (with cudafe++, ptxas, fatbinary, nvlink; its dependencies
#: nvidia-cuda-crt and nvidia-nvvm), the runtime and cuBLAS that ggml-cuda links, CCCL's headers. All install
#: under site-packages/nvidia/cu13 ({bin,include,lib}), which is then the toolkit root.
REGISTRY_VERSION = "13.5"
REGISTRY_WHEELS = ("nvidia-cuda-nvcc==13.5.37", "nvidia-cuda-crt==13.5.37", "nvidia-nvvm==13.5.37",
                   "nvidia-cuda-runtime==13.5.37", "nvidia-cuda-cccl==13.3.5.0.6", "nvidia-cublas==13.5.1.27")
#: where those wheels put nvcc, relative to site-packages
REGISTRY_NVCC = Path("nvidia") / "cu13" / "bin" / "nvcc"

# The first driver branch of each CUDA release, Linux (NVIDIA's CUDA Toolkit release notes, table "CUDA
# Toolkit and Corresponding Driver Versions"): a driver of that branch or newer runs that CUDA version.
DRIVER_CUDA: tuple[tuple[int, tuple[int, int]], ...] = (
    (450, (11, 0)), (455, (11, 1)), (460, (11, 2)), (465, (11, 3)), (470, (11, 4)), (495, (11, 5)),
    (510, (11, 6)), (515, (11, 7)), (520, (11, 8)), (525, (12, 0)), (530, (12, 1)), (535, (12, 2)),
    (545, (12, 3)), (550, (12, 4)), (555, (12, 5)), (560, (12, 6)), (570, (12, 8)), (575, (12, 9)),
    (580, (13, 0)),
)
MIN_DRIVER_FOR_MAJOR = {11: 450, 12: 525, 13: 580}

CUDA12_HINT = ("install CUDA 12.x, e.g. NVIDIA's cuda-toolkit-12-9 package (it installs /usr/local/cuda-12.9), "
               "then run scripts/setup.sh again")


def arch_range(version: tuple[int, int]) -> tuple[int, int]:
    """The compute capabilities (as 70, 86, …) nvcc of CUDA ``version`` compiles for (``nvcc --list-gpu-arch``):
    11.0 35-80, 11.1-11.7 35-87, 11.8 35-90, 12.0-12.7 50-90, 12.8+ 50-121, 13.x 75-121."""
    major, minor = version
    if major <= 10:
        return 30, 75
    if major == 11:
        return 35, 80 if minor == 0 else 87 if minor < 8 else 90
    if major == 12:
        return 50, 90 if minor < 8 else 121
    return 75, 121


def driver_cuda(driver: str) -> tuple[int, int] | None:
    """The newest CUDA version a driver runs (``535.183.01`` → (12, 2)), or None for one older than CUDA 11."""
    m = re.match(r"\s*(\d+)", driver or "")
    if not m:
        return None
    branch = int(m.group(1))
    best = None
    for first, cuda in DRIVER_CUDA:
        if branch >= first:
            best = cuda
    return best


@dataclass(frozen=True)
class Gpu:
    """One card as ``nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version`` reports it."""

    name: str
    compute_cap: str             # "7.0"
    memory_mib: int | None
    driver: str

    @property
    def sm(self) -> int:
        major, _, minor = self.compute_cap.partition(".")
        return int(major) * 10 + int(minor or 0)


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit: its version, its nvcc, its root (``bin/``, ``include/``, ``lib*/``) and where it is from:
    ``registry`` (the pinned wheels, installed into the venv or still to be) or ``machine``."""

    version: tuple[int, int]
    nvcc: str
    root: str
    source: str

    @property
    def label(self) -> str:
        where = "the registry's wheels" if self.source == "registry" else self.root
        return f"CUDA {self.version[0]}.{self.version[1]} ({where})"


@dataclass(frozen=True)
class CudaPlan:
    """The decision: ``cuda`` and the CMake arguments, toolkit, wheels to install and build environment;
    or no CUDA build, the safe CPU arguments and ``reason`` (one line) saying why."""

    cuda: bool
    cmake_args: tuple[str, ...]
    reason: str
    gpus: tuple[Gpu, ...] = ()
    toolkit: Toolkit | None = None
    install: tuple[str, ...] = ()            # pip requirements (the registry's toolkit, not yet installed)
    env: tuple[tuple[str, str], ...] = ()    # CUDACXX, CUDAToolkit_ROOT for the build
    archs: tuple[int, ...] = field(default=())

    @property
    def args(self) -> str:
        return " ".join(self.cmake_args)

    def as_dict(self) -> dict:
        return asdict(self)

    def shell(self) -> str:
        """Shell assignments scripts/setup.sh evaluates (every value quoted)."""
        tk = self.toolkit
        pairs = {"cuda": "1" if self.cuda else "0", "cuda_args": self.args, "cuda_reason": self.reason,
                 "cuda_install": " ".join(self.install), "cuda_toolkit": tk.label if tk else "",
                 "cuda_toolkit_source": tk.source if tk else "", "cuda_gpus": "; ".join(
                     f"{g.name} (sm_{g.sm})" for g in self.gpus),
                 "cuda_env": " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)}
        return "\n".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items())


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """The cards of an ``nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version
    --format=csv,noheader`` answer. Raises ValueError naming the first line that is not such a row."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.rsplit(",", 3)]
        if len(parts) != 4 or not re.fullmatch(r"\d+\.\d+", parts[1]):
            raise ValueError(f"not an nvidia-smi row of name, compute_cap, memory.total, driver_version: {line!r}")
        m = re.match(r"(\d+)\s*MiB", parts[2])
        gpus.append(Gpu(name=parts[0], compute_cap=parts[1], memory_mib=int(m.group(1)) if m else None,
                        driver=parts[3]))
    return tuple(gpus)


def _serves(tk: Toolkit, archs: tuple[int, ...], driver: tuple[int, int] | None) -> bool:
    lo, hi = arch_range(tk.version)
    return driver is not None and driver[0] >= tk.version[0] and all(lo <= a <= hi for a in archs)


def registry_toolkit(site_packages: str | None = None) -> Toolkit:
    """The registry's toolkit: installed where its nvcc is under ``site_packages``, else still to install."""
    nvcc = Path(site_packages).absolute() / REGISTRY_NVCC if site_packages else None   # the build runs elsewhere
    major, minor = (int(x) for x in REGISTRY_VERSION.split("."))
    if nvcc is not None and nvcc.is_file():
        return Toolkit((major, minor), str(nvcc), str(nvcc.parent.parent), "registry")
    return Toolkit((major, minor), "", "", "registry")


def plan_build(gpus: tuple[Gpu, ...], toolkits: tuple[Toolkit, ...], cpu_args: list[str] | tuple[str, ...],
               *, registry: Toolkit | None = None, detect_error: str = "", driver_library: bool = True,
               compile_anyway: bool = False) -> CudaPlan:
    """The CUDA build for ``gpus`` with one of ``toolkits`` (the machine's) or ``registry`` (the pinned wheels;
    None: not offered), or the reason there is none. ``driver_library``: the driver's ``libcuda.so.1`` is on this
    machine. Without it a CUDA build cannot run here (the CUDA runtime loads the driver through it), so there is
    no CUDA build, in a second rather than after the long compile; ``compile_anyway`` (``V100LAB_GPU=1``) compiles
    it all the same, without the VMM pool that links the driver (``-DGGML_CUDA_NO_VMM=ON``), e.g. on a build
    machine. Pure: the same inputs give the same plan."""
    cpu = tuple(cpu_args)
    if not gpus:
        why = detect_error or "nvidia-smi lists no GPU"
        return CudaPlan(False, cpu, f"no NVIDIA GPU found ({why}): building for the CPU")
    archs = tuple(sorted({g.sm for g in gpus}))
    drivers = sorted({g.driver for g in gpus})
    driver = min((driver_cuda(d) for d in drivers), key=lambda v: v or (0, 0))
    cards = ", ".join(dict.fromkeys(f"{g.name} (sm_{g.sm})" for g in gpus))
    base = dict(gpus=tuple(gpus), archs=archs)
    if not driver_library and not compile_anyway:
        return CudaPlan(False, cpu, f"no CUDA build: nvidia-smi lists {cards}, but the driver's libcuda.so.1 is not "
                        f"on this machine, so a CUDA build could not run here (in a container, expose the driver's "
                        f"compute libraries: NVIDIA_DRIVER_CAPABILITIES=compute,utility; V100LAB_GPU=1 compiles it "
                        f"anyway); building for the CPU", **base)
    if driver is None:
        return CudaPlan(False, cpu, f"the NVIDIA driver {drivers[0]} is older than CUDA 11 supports (≥ 450): "
                        "update the driver, then run scripts/setup.sh again", **base)
    candidates = ([registry] if registry is not None else []) + sorted(
        toolkits, key=lambda t: t.version, reverse=True)
    chosen = next((t for t in candidates if _serves(t, archs, driver)), None)
    if chosen is not None:
        # ggml/src/ggml-cuda/CMakeLists.txt links CUDA::cuda_driver unless GGML_CUDA_NO_VMM
        no_vmm = () if driver_library else ("-DGGML_CUDA_NO_VMM=ON",)
        args = ("-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(map(str, archs))}") + no_vmm + cpu
        env = (("CUDACXX", chosen.nvcc), ("CUDAToolkit_ROOT", chosen.root)) if chosen.nvcc else ()
        install = REGISTRY_WHEELS if chosen.source == "registry" and not chosen.nvcc else ()
        pool = "" if driver_library else "; no libcuda.so.1 on this machine: without the VMM pool (GGML_CUDA_NO_VMM)"
        return CudaPlan(True, args, f"CUDA build for {cards} with {chosen.label}, driver {drivers[0]} "
                        f"(CUDA {driver[0]}.x){pool}", toolkit=chosen, install=install, env=env, **base)
    # no toolkit serves: say the one thing that would make one
    old = [g for g in gpus if g.sm < 75]
    have = ", ".join(t.label for t in candidates) or "none"
    if old and driver[0] >= 12:
        names = ", ".join(dict.fromkeys(f"{g.name} (sm_{g.sm})" for g in old))
        why = (f"{names} needs a CUDA 12.x toolkit: CUDA 13 (the registry's nvcc) cannot compile for compute "
               f"capability < 7.5; {CUDA12_HINT}")
    elif driver[0] < 12:
        why = (f"the NVIDIA driver {drivers[0]} runs CUDA {driver[0]}.x only: update the driver (≥ "
               f"{MIN_DRIVER_FOR_MAJOR[12]} for CUDA 12, ≥ {MIN_DRIVER_FOR_MAJOR[13]} for CUDA 13)")
    elif driver[0] < 13 and registry is not None:
        why = (f"the NVIDIA driver {drivers[0]} runs CUDA {driver[0]}.x, and the registry's CUDA 13 toolkit "
               f"needs a driver ≥ {MIN_DRIVER_FOR_MAJOR[13]}: update the driver, or {CUDA12_HINT}")
    else:
        hi = max(archs)
        why = (f"no CUDA toolkit here compiles for {cards} on driver {drivers[0]} (sm_{hi} needs CUDA "
               f"{'≥ 12.8' if hi > 90 else '≥ 11.8'}, the driver's CUDA major at most {driver[0]})")
    return CudaPlan(False, cpu, f"no CUDA build: {why} (toolkits found: {have}); building for the CPU", **base)


# ------------------------------------------------------------------------------------------ the host (impure)
def nvidia_smi_command() -> list[str] | None:
    """``$V100LAB_NVIDIA_SMI`` or ``nvidia-smi`` on PATH, with the query; None when neither exists."""
    exe = os.environ.get(NVIDIA_SMI_ENV) or shutil.which("nvidia-smi")
    return [exe, *NVIDIA_SMI_QUERY] if exe else None


def detect_gpus() -> tuple[tuple[Gpu, ...], str]:
    """This host's cards and, where there are none, why (no nvidia-smi, it failed, or it answered nonsense)."""
    cmd = nvidia_smi_command()
    if cmd is None:
        return (), "no nvidia-smi on PATH: no NVIDIA driver installed"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=DETECT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"{cmd[0]} could not run: {exc}"
    if p.returncode != 0:
        last = (p.stdout + p.stderr).strip().splitlines()
        return (), f"{cmd[0]} failed (exit {p.returncode}): {last[-1] if last else 'no output'}"
    try:
        return parse_nvidia_smi(p.stdout), ""
    except ValueError as exc:
        return (), f"{cmd[0]}: {exc}"


def nvcc_version(nvcc: str) -> tuple[int, int] | None:
    """``release X.Y`` of ``nvcc --version``, or None when it does not run."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=DETECT_TIMEOUT_S).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def machine_toolkits() -> tuple[Toolkit, ...]:
    """The machine's CUDA toolkits: ``$CUDACXX``, ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda*``, nvcc on
    PATH (or only the nvccs ``$V100LAB_CUDA_NVCC`` lists, "" for none); one per version (the first found)."""
    if TOOLKITS_ENV in os.environ:
        nvccs = os.environ[TOOLKITS_ENV].split(":")
    else:
        nvccs = [os.environ.get("CUDACXX", "")]
        nvccs += [os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
        nvccs += sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"), reverse=True) + ["/usr/local/cuda/bin/nvcc"]
        nvccs.append(shutil.which("nvcc") or "")
    found: dict[tuple[int, int], Toolkit] = {}
    for nvcc in nvccs:
        if not nvcc or not os.path.isfile(nvcc) or not os.access(nvcc, os.X_OK):
            continue
        v = nvcc_version(nvcc)
        if v and v not in found:
            found[v] = Toolkit(v, nvcc, str(Path(nvcc).resolve().parent.parent), "machine")
    return tuple(found.values())


def site_packages(prefix: str) -> str | None:
    """The site-packages of the virtual environment at ``prefix`` (None when there is none)."""
    hits = sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")))
    return hits[-1] if hits else None


def host_plan(prefix: str | None = None, cpu_args: list[str] | None = None,
              compile_anyway: bool = False) -> CudaPlan:
    """:func:`plan_build` for this host and the virtual environment at ``prefix``."""
    gpus, why = detect_gpus()
    cpu = buildflags.host_cmake_args() if cpu_args is None else cpu_args
    if not gpus:  # no toolkit probing on a box without a card
        return plan_build((), (), cpu, detect_error=why)
    return plan_build(gpus, machine_toolkits(), cpu, registry=registry_toolkit(site_packages(prefix or sys.prefix)),
                      driver_library=driver_library() is not None, compile_anyway=compile_anyway)


#: the CUDA libraries ggml-cuda needs at run time (cudart, cuBLAS)
RUNTIME_LIBS = ("libcudart.so*", "libcublas.so*", "libcublasLt.so*")


def link_runtime(toolkit_root: str, llama_lib: str) -> list[str]:
    """Link the toolkit's CUDA runtime libraries into llama-cpp-python's lib folder (its libraries look for
    their dependencies beside themselves, ``$ORIGIN``): a toolkit in the venv or under /usr/local/cuda-* is not
    on the loader's path. Existing files are left alone. Returns the links made."""
    made = []
    dirs = [d for d in (os.path.join(toolkit_root, "lib64"), os.path.join(toolkit_root, "lib")) if os.path.isdir(d)]
    for d in dirs:
        for pattern in RUNTIME_LIBS:
            for lib in sorted(glob.glob(os.path.join(d, pattern))):
                dest = os.path.join(llama_lib, os.path.basename(lib))
                if not os.path.lexists(dest):
                    os.symlink(os.path.relpath(lib, llama_lib), dest)
                    made.append(dest)
    return made


#: where the NVIDIA driver's libcuda.so.1 usually is (Debian/Ubuntu, RHEL, WSL)
DRIVER_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib",
                   "/usr/local/nvidia/lib64")


def driver_library(driver_lib_dirs: tuple[str, ...] | None = None) -> str | None:
    """The driver's ``libcuda.so.1`` on this machine (in ``driver_lib_dirs``, default ``$V100LAB_CUDA_DRIVER_DIRS``
    or :data:`DRIVER_LIB_DIRS`), or None."""
    if driver_lib_dirs is None:
        env = os.environ.get(DRIVER_DIRS_ENV)
        driver_lib_dirs = DRIVER_LIB_DIRS if env is None else tuple(d for d in env.split(":") if d)
    return next((os.path.join(d, "libcuda.so.1") for d in driver_lib_dirs
                 if os.path.exists(os.path.join(d, "libcuda.so.1"))), None)


def prepare_toolkit(root: str, driver_lib_dirs: tuple[str, ...] | None = None) -> list[str]:
    """Make the registry's wheels a toolkit CMake's FindCUDAToolkit accepts: the wheels ship ``libcudart.so.13``
    but not the ``libcudart.so`` it looks for, and no ``lib/stubs/libcuda.so`` (ggml-cuda links the driver
    for its VMM pool): link both, the latter to the driver's ``libcuda.so.1`` where there is one. Idempotent;
    returns the links made."""
    lib = os.path.join(root, "lib")
    made = []
    for versioned in sorted(glob.glob(os.path.join(lib, "lib*.so.*"))):
        m = re.match(r"(lib[\w+-]+\.so)\.\d+$", os.path.basename(versioned))
        dev = os.path.join(lib, m.group(1)) if m else None
        if dev and not os.path.lexists(dev):
            os.symlink(os.path.basename(versioned), dev)
            made.append(dev)
    stub = os.path.join(lib, "stubs", "libcuda.so")
    driver = driver_library(driver_lib_dirs)
    if driver and not os.path.lexists(stub):
        os.makedirs(os.path.dirname(stub), exist_ok=True)
        os.symlink(driver, stub)
        made.append(stub)
    return made


STAGES = {"install": "could not install the registry's CUDA toolkit", "compile": "failed to compile",
          "load": "does not load here", "selftest": "failed its self-test on the card"}


def fallback_reason(stage: str, detail: str, plan_reason: str = "") -> str:
    """The one line setup prints when the CUDA build fails at ``stage`` (:data:`STAGES`) and the CPU build
    is made instead."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    detail = " ".join((detail or "").split())[:300] or "no detail"
    what = f" ({plan_reason})" if plan_reason else ""
    return (f"the CUDA build{what} {STAGES[stage]}: {detail}; building for the CPU instead "
            "(V100LAB_GPU=0 skips the CUDA attempt, V100LAB_GPU=1 retries it)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m v100lab.base.cudabuild",
                                 description="decide llama.cpp's CUDA build for this host's NVIDIA cards")
    ap.add_argument("--prefix", help="the virtual environment the registry's toolkit goes into (default: this one)")
    ap.add_argument("--cpu-args", help="the CPU flags to add (default: python -m v100lab.base.buildflags)")
    ap.add_argument("--shell", action="store_true", help="print shell assignments (for scripts/setup.sh)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fallback", metavar="STAGE", choices=tuple(STAGES),
                    help="print the one-line reason for falling back to the CPU build after STAGE failed")
    ap.add_argument("--detail", default="", help="with --fallback: what failed")
    ap.add_argument("--prepare-toolkit", action="store_true",
                    help="give the registry's toolkit in the venv the library links CMake looks for")
    ap.add_argument("--link-runtime", action="store_true",
                    help="link the chosen toolkit's CUDA runtime libraries beside llama-cpp-python's")
    ap.add_argument("--plan-reason", default="", help="with --fallback: the plan's reason")
    ap.add_argument("--compile-anyway", action="store_true",
                    help="plan the CUDA build even where it cannot run (no libcuda.so.1 here): V100LAB_GPU=1")
    a = ap.parse_args(argv)
    if a.fallback:
        print(fallback_reason(a.fallback, a.detail, a.plan_reason))
        return 0
    plan = host_plan(a.prefix, a.cpu_args.split() if a.cpu_args is not None else None, a.compile_anyway)
    if a.prepare_toolkit:
        tk = registry_toolkit(site_packages(a.prefix or sys.prefix))
        if not tk.root:
            print("prepare-toolkit: the registry's CUDA toolkit is not installed in this venv", file=sys.stderr)
            return 1
        made = prepare_toolkit(tk.root)
        print(f"prepare-toolkit: {len(made)} links made under {tk.root}", file=sys.stderr)
        return 0
    if a.link_runtime:
        sp = site_packages(a.prefix or sys.prefix)
        if not (plan.cuda and plan.toolkit and plan.toolkit.root and sp):
            print("link-runtime: no CUDA toolkit chosen here; nothing linked", file=sys.stderr)
            return 1
        made = link_runtime(plan.toolkit.root, os.path.join(sp, "llama_cpp", "lib"))
        print(f"link-runtime: {len(made)} CUDA runtime libraries linked from {plan.toolkit.root}", file=sys.stderr)
        return 0
    if a.shell:
        print(plan.shell())
    elif a.json:
        print(json.dumps(plan.as_dict(), indent=1))
    else:
        print(plan.args if plan.cuda else plan.reason)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
