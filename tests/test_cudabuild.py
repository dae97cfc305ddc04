"""The CUDA build decision: a pure function of nvidia-smi's answer, the toolkits found and the CPU flags.

The nvidia-smi answers are in tests/data/nvidia-smi (SOURCES.md there); a script that prints one stands in
for nvidia-smi in the detection tests. Toolkits are described, not installed: the decision only reads their
version and paths.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from v100lab.base import cudabuild
from v100lab.base.cudabuild import Gpu, Toolkit, plan_build

DATA = Path(__file__).parent / "data" / "nvidia-smi"
ROOT = Path(__file__).resolve().parents[1]
CPU = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AMX_TILE=OFF"]
REGISTRY = cudabuild.registry_toolkit(None)   # the pinned wheels, not installed yet


def gpus(name: str) -> tuple[Gpu, ...]:
    return cudabuild.parse_nvidia_smi((DATA / name).read_text())


def machine(version: str) -> Toolkit:
    major, minor = map(int, version.split("."))
    return Toolkit((major, minor), f"/usr/local/cuda-{version}/bin/nvcc", f"/usr/local/cuda-{version}", "machine")


def plan(name: str, *toolkits: str, registry=REGISTRY):
    return plan_build(gpus(name), tuple(machine(v) for v in toolkits), CPU, registry=registry)


def archs_arg(p) -> str:
    return next(a for a in p.cmake_args if a.startswith("-DCMAKE_CUDA_ARCHITECTURES="))


# ---- parsing and the driver table
def test_every_recorded_answer_parses():
    assert gpus("v100-driver535.csv") == (Gpu("Tesla V100-SXM2-16GB", "7.0", 16384, "535.183.01"),)
    assert [g.sm for g in gpus("v100-and-rtx3090.csv")] == [70, 86]
    assert [g.sm for g in gpus("a100-x2.csv")] == [80, 80]
    assert gpus("h100.csv")[0].memory_mib == 81559


def test_a_line_that_is_not_a_query_row_is_named():
    with pytest.raises(ValueError, match="couldn't communicate"):
        cudabuild.parse_nvidia_smi((DATA / "no-driver.txt").read_text())


@pytest.mark.parametrize("driver,cuda", [("535.183.01", (12, 2)), ("550.127.05", (12, 4)), ("570.172.08", (12, 8)),
                                         ("575.64.03", (12, 9)), ("580.65.06", (13, 0)), ("590.1", (13, 0)),
                                         ("418.87", None), ("", None)])
def test_driver_cuda(driver, cuda):
    assert cudabuild.driver_cuda(driver) == cuda


# ---- the decision, card by card
def test_v100_on_driver_535_with_only_cuda_13_needs_cuda_12():
    for p in (plan("v100-driver535.csv"), plan("v100-driver535.csv", "13.0")):
        assert not p.cuda and p.cmake_args == tuple(CPU)
        assert "Tesla V100-SXM2-16GB (sm_70) needs a CUDA 12.x toolkit" in p.reason
        assert "compute capability < 7.5" in p.reason and "install CUDA 12.x" in p.reason


def test_v100_on_driver_535_builds_with_the_machines_cuda_12():
    p = plan("v100-driver535.csv", "12.9", "13.0")       # 12.9 on a 12.2 driver: minor-version compatibility
    assert p.cuda and p.toolkit == machine("12.9") and p.install == ()
    assert p.cmake_args[:2] == ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=70")
    assert p.cmake_args[2:] == tuple(CPU)                # the safe CPU flags too
    assert dict(p.env) == {"CUDACXX": "/usr/local/cuda-12.9/bin/nvcc", "CUDAToolkit_ROOT": "/usr/local/cuda-12.9"}


def test_v100_on_driver_580_still_needs_cuda_12():
    p = plan("v100-driver580.csv")
    assert not p.cuda and "needs a CUDA 12.x toolkit" in p.reason
    p = plan("v100-driver580.csv", "12.4")
    assert p.cuda and archs_arg(p).endswith("=70") and p.toolkit.version == (12, 4)


def test_p40_sm61():
    assert not plan("p40.csv").cuda
    p = plan("p40.csv", "12.4")
    assert p.cuda and archs_arg(p).endswith("=61")


def test_t4_on_driver_580_gets_the_registry_toolkit():
    p = plan("t4.csv", "12.2")
    assert p.cuda and p.toolkit.source == "registry" and p.install == cudabuild.REGISTRY_WHEELS
    assert archs_arg(p).endswith("=75") and p.env == ()   # the env comes once the wheels are installed
    assert any(w.startswith("nvidia-cuda-nvcc==13.") for w in p.install)


def test_t4_on_an_old_driver_is_told_to_update_it_or_install_cuda_12():
    (t4,) = gpus("t4.csv")
    p = plan_build((Gpu(t4.name, t4.compute_cap, t4.memory_mib, "535.183.01"),), (), CPU, registry=REGISTRY)
    assert not p.cuda and "driver 535.183.01 runs CUDA 12.x" in p.reason and "≥ 580" in p.reason
    assert "install CUDA 12.x" in p.reason


def test_two_a100s_one_architecture():
    p = plan("a100-x2.csv")                  # driver 570: CUDA 12.8, too old for the registry's 13
    assert not p.cuda and "update the driver" in p.reason
    p = plan("a100-x2.csv", "12.8")
    assert p.cuda and archs_arg(p).endswith("=80") and "NVIDIA A100-SXM4-40GB (sm_80)" in p.reason


def test_rtx4090_needs_a_toolkit_that_knows_sm89():
    p = plan("rtx4090.csv", "11.7")          # 11.7 stops at sm_87; driver 575 is too old for CUDA 13
    assert not p.cuda and "update the driver, or install CUDA 12.x" in p.reason
    p = plan("rtx4090.csv", "11.7", registry=None)
    assert not p.cuda and "sm_89 needs CUDA ≥ 11.8" in p.reason
    p = plan("rtx4090.csv", "11.7", "11.8")
    assert p.cuda and p.toolkit.version == (11, 8) and archs_arg(p).endswith("=89")


def test_h100_on_driver_580_gets_the_registry_toolkit():
    p = plan("h100.csv")
    assert p.cuda and p.toolkit.source == "registry" and archs_arg(p).endswith("=90")


def test_two_different_cards_compile_for_both():
    p = plan("v100-and-rtx3090.csv", "12.9")
    assert p.cuda and archs_arg(p) == "-DCMAKE_CUDA_ARCHITECTURES=70;86" and p.toolkit.version == (12, 9)
    p = plan("v100-and-rtx3090.csv")         # the registry's CUDA 13 serves the 3090 but not the V100
    assert not p.cuda and "Tesla V100-PCIE-16GB (sm_70)" in p.reason and "RTX 3090" not in p.reason.split(":")[1]


def test_no_driver():
    p = plan_build((), (), CPU, detect_error="no nvidia-smi on PATH: no NVIDIA driver installed")
    assert not p.cuda and p.cmake_args == tuple(CPU) and "no NVIDIA driver installed" in p.reason


def test_the_registry_toolkit_once_installed(tmp_path):
    nvcc = tmp_path / cudabuild.REGISTRY_NVCC
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    tk = cudabuild.registry_toolkit(str(tmp_path))
    p = plan_build(gpus("t4.csv"), (), CPU, registry=tk)
    assert p.cuda and p.install == () and dict(p.env)["CUDACXX"] == str(nvcc)
    assert dict(p.env)["CUDAToolkit_ROOT"] == str(nvcc.parent.parent)


def test_the_plan_is_pure():
    assert plan("v100-and-rtx3090.csv", "12.9") == plan("v100-and-rtx3090.csv", "12.9")


def test_fallback_reason_is_one_line_and_names_the_stage():
    line = cudabuild.fallback_reason("load", "libcuda.so.1: cannot open shared object file\nmore", "CUDA build for X")
    assert "\n" not in line and "does not load here: libcuda.so.1" in line and "building for the CPU" in line
    with pytest.raises(ValueError, match="unknown stage"):
        cudabuild.fallback_reason("bake", "")


def test_link_runtime_links_what_is_missing(tmp_path):
    lib = tmp_path / "tk" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.13").write_text("")
    (lib / "libnvvm.so.4").write_text("")
    dest = tmp_path / "llama_cpp" / "lib"
    dest.mkdir(parents=True)
    made = cudabuild.link_runtime(str(tmp_path / "tk"), str(dest))
    assert [Path(m).name for m in made] == ["libcudart.so.13"] and (dest / "libcudart.so.13").resolve().is_file()
    assert cudabuild.link_runtime(str(tmp_path / "tk"), str(dest)) == []


# ---- detection through a stand-in nvidia-smi, and the shell's view of the plan
def fake_smi(tmp_path: Path, answer: str, status: int = 0) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat {shlex.quote(str(DATA / answer))}\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_detection_reads_the_answer(tmp_path, monkeypatch):
    monkeypatch.setenv(cudabuild.NVIDIA_SMI_ENV, fake_smi(tmp_path, "v100-and-rtx3090.csv"))
    found, why = cudabuild.detect_gpus()
    assert why == "" and [g.sm for g in found] == [70, 86]


def test_detection_says_why_there_is_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv(cudabuild.NVIDIA_SMI_ENV, fake_smi(tmp_path, "no-driver.txt", status=9))
    found, why = cudabuild.detect_gpus()
    assert found == () and "exit 9" in why and "communicate with the NVIDIA driver" in why


def fake_driver(tmp_path: Path) -> str:
    """A folder holding a file named libcuda.so.1: the driver's library is only looked for, never loaded, by the plan."""
    d = tmp_path / "driver"
    d.mkdir(exist_ok=True)
    (d / "libcuda.so.1").write_text("")
    return str(d)


def env_for(tmp_path, answer: str, driver: bool = True, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "V100LAB_GPU", "V100LAB_NATIVE")}
    env.update({cudabuild.NVIDIA_SMI_ENV: fake_smi(tmp_path, answer), cudabuild.TOOLKITS_ENV: "",
                cudabuild.DRIVER_DIRS_ENV: fake_driver(tmp_path) if driver else "",
                "PYTHONPATH": str(ROOT)}, **extra)
    return env


def test_cli_shell_assignments(tmp_path):
    out = subprocess.run([sys.executable, "-m", "v100lab.base.cudabuild", "--shell", "--prefix", str(tmp_path),
                          "--cpu-args", " ".join(CPU)], capture_output=True, text=True, check=True,
                         env=env_for(tmp_path, "t4.csv")).stdout
    got = dict(line.split("=", 1) for line in out.splitlines())
    assert got["cuda"] == "1" and "-DCMAKE_CUDA_ARCHITECTURES=75" in got["cuda_args"]
    assert "nvidia-cuda-nvcc==" in got["cuda_install"]


def setup_plan(tmp_path, answer: str, **extra) -> str:
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--plan"], capture_output=True, text=True,
                       env=env_for(tmp_path, answer, **extra), timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_setup_plan_on_a_t4_builds_for_the_card(tmp_path):
    out = setup_plan(tmp_path, "t4.csv")
    assert "build: cuda" in out and "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75 -DGGML_NATIVE=OFF" in out
    assert "toolkit wheels: nvidia-cuda-nvcc==" in out


def test_setup_plan_where_nvidia_smi_answers_but_the_driver_library_is_missing(tmp_path):
    """A container given only nvidia-smi (NVIDIA_DRIVER_CAPABILITIES=utility), or a recorded answer here: a CUDA
    build could not run, so setup says so at once instead of compiling for most of an hour; V100LAB_GPU=1
    compiles it anyway, without the VMM pool that links the driver."""
    out = setup_plan(tmp_path, "t4.csv", driver=False)
    assert "build: safe" in out and "Tesla T4 (sm_75), but the driver's libcuda.so.1 is not on this machine" in out
    anyway = setup_plan(tmp_path, "t4.csv", driver=False, V100LAB_GPU="1")
    assert "build: cuda" in anyway and "-DCMAKE_CUDA_ARCHITECTURES=75 -DGGML_CUDA_NO_VMM=ON " in anyway


def test_setup_plan_on_a_v100_without_cuda_12_says_so(tmp_path):
    out = setup_plan(tmp_path, "v100-driver580.csv")
    assert "build: safe" in out and "needs a CUDA 12.x toolkit" in out


def test_setup_plan_gpu_0_and_cmake_args_win(tmp_path):
    assert "build: safe" in setup_plan(tmp_path, "t4.csv", V100LAB_GPU="0")
    out = setup_plan(tmp_path, "t4.csv", CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=75")
    assert "build: user" in out and "cmake_args: -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=75\n" in out


def test_setup_dry_run_on_a_t4_falls_back_to_the_cpu_build_with_the_reason(tmp_path):
    """setup.sh's whole CUDA path on this machine, compiling nothing: the recorded T4 answer makes the plan
    CUDA; the GPU self-test then runs against the llama.cpp installed here (a CPU build), fails, and setup
    says why on one line and goes for the safe CPU build."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp has GPU offload: its self-test on the card is not a failure to show")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (scripts/setup.sh makes it)")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=600,
                       env=env_for(tmp_path, "t4.csv", V100LAB_SETUP_DRY_RUN="1"))
    assert p.returncode == 0, p.stderr
    err = p.stderr
    assert "(dry run) would install the CUDA toolkit wheels: nvidia-cuda-nvcc==" in err
    assert "would build and install llama.cpp with: -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75 " in err
    (line,) = [x for x in err.splitlines() if "building for the CPU instead" in x]
    assert line.startswith("setup: the CUDA build (CUDA build for Tesla T4 (sm_75)")
    assert "failed its self-test on the card: this llama.cpp was built without GPU offload" in line
    safe = subprocess.run([sys.executable, "-m", "v100lab.base.buildflags"], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout.strip()
    assert err.rstrip().endswith(f"(dry run) the build: safe: {safe}")


def test_setup_without_the_drivers_library_says_why_and_builds_for_the_cpu(tmp_path):
    """setup.sh with a recorded T4 answer on a machine without libcuda.so.1, compiling nothing: one line says why
    there is no CUDA build, and the CPU build is the one made."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (scripts/setup.sh makes it)")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=600,
                       env=env_for(tmp_path, "t4.csv", driver=False, V100LAB_SETUP_DRY_RUN="1"))
    assert p.returncode == 0, p.stderr
    (line,) = [x for x in p.stderr.splitlines() if "no CUDA build" in x]
    assert line.startswith("setup: no CUDA build: nvidia-smi lists Tesla T4 (sm_75), but the driver's libcuda.so.1")
    assert "would install the CUDA toolkit wheels" not in p.stderr
    assert "(dry run) the build: safe: " in p.stderr


def test_prepare_toolkit_gives_cmake_the_names_it_looks_for(tmp_path):
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libcudart.so.13", "libcublas.so.13", "libnvrtc-builtins.so.13.5"):
        (lib / name).write_text("")
    driver = fake_driver(tmp_path)
    made = cudabuild.prepare_toolkit(str(tmp_path / "cu13"), (str(tmp_path / "nowhere"), driver))
    assert sorted(Path(m).name for m in made) == ["libcublas.so", "libcuda.so", "libcudart.so"]
    assert os.readlink(lib / "libcudart.so") == "libcudart.so.13"
    assert (lib / "stubs" / "libcuda.so").resolve() == (Path(driver) / "libcuda.so.1").resolve()
    assert cudabuild.prepare_toolkit(str(tmp_path / "cu13"), (driver,)) == []   # idempotent
    # no driver here: no stub, and CMake will say that CUDA::cuda_driver is missing (the compile stage's fallback)
    other = tmp_path / "other" / "lib"
    other.mkdir(parents=True)
    assert cudabuild.prepare_toolkit(str(other.parent), (str(tmp_path / "nowhere"),)) == []


def test_without_the_drivers_library_there_is_no_cuda_build_unless_asked(tmp_path):
    """Without libcuda.so.1 a CUDA build cannot run: no plan, with the reason. Compiled anyway (a build machine),
    it goes without the VMM pool, since ggml-cuda links the driver (CUDA::cuda_driver) for it."""
    with_driver = plan_build(gpus("t4.csv"), (), CPU, registry=REGISTRY)
    none = plan_build(gpus("t4.csv"), (), CPU, registry=REGISTRY, driver_library=False)
    assert not none.cuda and none.args == " ".join(CPU) and "libcuda.so.1 is not on this machine" in none.reason
    anyway = plan_build(gpus("t4.csv"), (), CPU, registry=REGISTRY, driver_library=False, compile_anyway=True)
    assert "-DGGML_CUDA_NO_VMM=ON" not in with_driver.args and "-DGGML_CUDA_NO_VMM=ON" in anyway.args
    assert "no libcuda.so.1" in anyway.reason and "no libcuda.so.1" not in with_driver.reason
    assert cudabuild.driver_library((str(tmp_path),)) is None
    (tmp_path / "libcuda.so.1").write_text("")
    assert cudabuild.driver_library((str(tmp_path),)) == str(tmp_path / "libcuda.so.1")
