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
    from v100lab import zoo

    return zoo.resolve("default")


@pytest.fixture(scope="session")
def gemma_model():
    from v100lab import zoo
    from v100lab.errors import ModelNotFoundError

    try:
        return zoo.resolve("gemma3-270m")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_f16():
    """The smallest synthetic model (F16), built once per cache."""
    from v100lab import zoo

    return zoo.resolve("synth-tiny")


def have(binary: str) -> bool:
    return shutil.which(binary) is not None
