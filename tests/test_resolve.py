"""resolve.resolve: every way of naming a model → (path or None, ModelSpec); building is asked for explicitly."""

from __future__ import annotations

import pytest

from v100lab.models import zoo
from v100lab.base.errors import ConfigError, ModelNotFoundError
from v100lab.gguf.header import read_spec
from v100lab.models.resolve import ResolvedModel, resolve
from v100lab.gguf.skeleton import skeleton_spec


def test_alias_and_its_path_give_the_same_model(default_model):
    by_alias = resolve("default")
    assert isinstance(by_alias, ResolvedModel)
    assert by_alias.path == default_model
    assert resolve(default_model) == by_alias
    assert resolve(str(default_model)) == by_alias
    assert by_alias.spec == read_spec(default_model)


def test_file_object_and_skeleton_have_no_path(default_model):
    with open(default_model, "rb") as f:
        path, spec = resolve(f)
    assert path is None and spec == read_spec(default_model)
    path, spec = resolve("skeleton:qwen35-27b:q4_k_m")
    assert path is None
    assert spec == skeleton_spec("qwen35-27b", "Q4_K_M")
    assert spec.file_bytes is None


def test_skeleton_spelling_errors_are_one_line():
    with pytest.raises(ConfigError, match="skeleton:ARCH:QUANT"):
        resolve("skeleton:qwen35-27b")


def test_building_is_explicit(fresh_cache):
    """A synthetic rung that is not built: refused without build=True, built (and then found) with it."""
    with pytest.raises(ModelNotFoundError, match="v100lab models make synth-tiny:Q8_0"):
        resolve("synth-tiny:Q8_0")
    assert not [p for p in fresh_cache.iterdir() if p.suffix == ".gguf"]
    path, spec = resolve("synth-tiny:Q8_0", build=True)
    assert path.is_file() and path.parent == fresh_cache
    assert spec.file_type == "Q8_0"
    assert resolve("synth-tiny:Q8_0") == (path, spec)          # built now: found without building
    assert zoo.model_path("synth-tiny:Q8_0", build=False) == path


def test_unknown_names_are_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown model alias"):
        resolve("no-such-model")
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError):
        resolve(tmp_path)                                     # a directory is not a model file
