"""The course: the workbook's notebooks in reading order, the question each answers, and the scenario keys
each reads (its parameters cell holds exactly those).

Each notebook has one module in :mod:`v100lab.workbook.levers` whose ``PARAMETERS`` lists the keys its steps read
(:func:`v100lab.workbook.levers.steps.parameters`: the study's own keys and the notebook's); a notebook's parameters
cell is ``v100lab.workbook.scenario.parameters_cell_source(keys_of(notebook))`` and ``tests/test_notebooks.py``
checks it is. A notebook not in the course (a test notebook) gets every key.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from v100lab.workbook.scenario import keys


@dataclass(frozen=True)
class Lesson:
    notebook: str          # file stem in notebooks/ (NN_name)
    question: str          # what it shows, one line (00's map)
    step_module: str       # the module in v100lab.workbook.levers holding its steps and its PARAMETERS

    @property
    def module(self) -> ModuleType:
        # by name: the package re-exports functions under some module names (levers.baseline is a function)
        return importlib.import_module(f"v100lab.workbook.levers.{self.step_module}")

    @property
    def parameters(self) -> tuple[str, ...]:
        return self.module.PARAMETERS


LESSONS = (
    Lesson("00_overview", "The story, this map, and the seed's staircase: claimed vs predicted vs measured.",
           "overview"),
    Lesson("01_vram_triangle", "Model size × context × card memory: what fits, and the largest context.", "triangle"),
    Lesson("02_bandwidth_ceiling", "tok/s ≤ bandwidth / bytes per token: the ceiling per quant and device, the "
                                   "roofline with this machine's calibration, published Apple Silicon rows.",
           "ceiling"),
    Lesson("03_baseline", "A real run with llama.cpp's defaults; what the load log says; measured vs predicted.",
           "baseline"),
    Lesson("04_quantization", "The quant ladder: speed and file size measured vs predicted; perplexity and KL "
                              "divergence.", "quantization"),
    Lesson("05_gpu_layers", "-ngl: predicted for the device; the spill step when layers stop fitting.", "offload"),
    Lesson("06_context_and_kv_cache", "Context and cache types: KV memory, decode speed vs depth, quantized V needs "
                                      "flash attention.", "context"),
    Lesson("07_flash_attention", "-fa off vs on at depth: what flash attention changes, measured vs predicted.",
           "flash_attention"),
    Lesson("08_batch_size", "-b/-ub: prompt processing over the micro-batch size, with a prompt longer than the "
                            "largest.", "batch_size"),
    Lesson("09_threads", "-t: prompt processing and decode over CPU threads.", "threads"),
    Lesson("10_parallel_slots", "--parallel: llama-server's slots under load, total vs per-stream decode, latency "
                                "percentiles, one user, the context per slot.", "parallel"),
    Lesson("11_model_loading", "mmap, --no-mmap, --mlock: the load modes this llama.cpp build accepts, load time "
                               "and first token.", "loading"),
    Lesson("12_final_config", "The tuned configuration, its predicted and measured speed, the llama-server command.",
           "final"),
    Lesson("13_speculative_decoding", "Speculative decoding: a draft checked in one pass, measured acceptance and "
                                      "tok/s vs predicted over the draft length; the seed's V100 with MTP.",
           "spec_decode"),
    Lesson("14_build", "The build: this CPU's SIMD level and repacked types, de-quantization cost per weight type vs "
                       "the bandwidth, the measured quant ladder; the CUDA architecture and toolkit for the card.",
           "build"),
)

_BY_NAME = {lesson.notebook: lesson for lesson in LESSONS}


def lesson(notebook: str | os.PathLike) -> Lesson | None:
    """The lesson of a notebook (a stem, a file name or a path; .ipynb or its .py pair), None if not in the course."""
    return _BY_NAME.get(Path(os.fspath(notebook)).stem)


def keys_of(notebook: str | os.PathLike) -> tuple[str, ...]:
    """The scenario keys a notebook's parameters cell holds: its lesson's ``PARAMETERS``, every key for a
    notebook outside the course."""
    found = lesson(notebook)
    return found.parameters if found else keys()
