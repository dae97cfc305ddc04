"""One function per step of the workbook: each returns tidy rows — predicted and measured — for one lever.

The notebooks hold no formulas and no loops: every cell calls one function here (or in
:mod:`v100lab.plots`) with the validated :class:`~v100lab.scenario.Scenario`. A function here

* resolves the scenario once (:func:`study`): the model studied (a GGUF path, URL or zoo alias, or a
  skeleton ``skeleton:ARCH:QUANT`` of a model nobody downloaded), the device the predictions are for, and
  the model that can be *measured on this machine* (``stand_in_model`` when set; none when the scenario
  says ``measure: false`` or the model has no weights here) — with the reason when nothing is measured;
* predicts with :mod:`v100lab.memory` and :mod:`v100lab.speed`, measures with :mod:`v100lab.bench`,
  :mod:`v100lab.loadlog` and :mod:`v100lab.quality`, and returns one tidy frame
  (:func:`v100lab.results.tidy_frame`) in which every plotted number lives, measured rows flagged when they
  exceed the ceiling of their model and device;
* never prints (logging only); failures of a *measurement* (a configuration llama.cpp refuses) are data:
  they are kept in ``frame.attrs["failures"]`` with llama.cpp's own reason, and the summaries report them.

The ``summary_*`` functions write each notebook's closing paragraph from the numbers of the frames they are
given — nothing in them is a canned conclusion — and escape every string that came from a model or a
parameter file (:mod:`v100lab.render`).

Measured rows are always for this machine (device ``host``) and carry the measured model's label, with
"(stand-in)" when the scenario measures a stand-in for its model.

Layout: :mod:`~v100lab.levers._study` resolves the scenario and holds the row helpers every step shares;
one module per notebook holds that notebook's steps (``overview`` 00, ``triangle`` 01, ``ceiling`` 02,
``baseline`` 03, ``quantization`` 04, ``gpu_layers`` 05, ``context`` 06, ``serving`` 07, ``final`` 08);
``summaries`` holds the ``summary_*`` paragraphs. The notebooks call everything through this package
(``levers.baseline(sc)``), so the names below are the workbook's API.
"""

from v100lab.skeleton import SKELETON_PREFIX, load_spec
# _stage_model: used by benchmarks/bench_notebooks.py (it builds the stage files ahead of a timed run)
from v100lab.levers._study import (
    HOST, GIB, MIB, COMPONENTS, arch_of, spec_at_quant, Study, study, gpu_backend, gpu_host, predict_rows,
    measure_sweep, capture_load, _stage_model,
)
from v100lab.levers.overview import NOTEBOOKS, notebook_map, scenario_facts, staircase
from v100lab.levers.triangle import (
    kv_bytes_per_token, header_facts, memory_breakdown, quant_specs, fit_grid, largest_context,
)
from v100lab.levers.ceiling import ceilings, device_ceilings, catalog_ceilings, roofline, apple
from v100lab.levers.baseline import baseline, load_diagnosis, headline
from v100lab.levers.quantization import quant_ladder, QUALITY_LADDER, quality_ladder
from v100lab.levers.gpu_layers import gpu_layers_sweep, spill_effect
from v100lab.levers.context import kv_memory, depth_sweep, quantized_v
from v100lab.levers.serving import batch_sweep, flash_attn_sweep, parallel_sweep, mmap_mlock, threads_sweep
from v100lab.levers.final import final_config, command_reasons, tuned_command, own_staircase, seed_verdict_table
from v100lab.levers.summaries import (
    summary_overview, summary_triangle, summary_ceiling, summary_baseline, summary_quantization,
    summary_gpu_layers, summary_context, METRIC_NAMES, summary_levers, summary_final,
)

__all__ = [
    'SKELETON_PREFIX', 'load_spec', 'HOST', 'GIB', 'MIB', 'COMPONENTS', 'arch_of', 'spec_at_quant', 'Study',
    'study', 'gpu_backend', 'gpu_host', 'predict_rows', 'measure_sweep', 'capture_load', '_stage_model',
    'NOTEBOOKS', 'notebook_map', 'scenario_facts', 'staircase', 'kv_bytes_per_token', 'header_facts',
    'memory_breakdown', 'quant_specs', 'fit_grid', 'largest_context', 'ceilings', 'device_ceilings',
    'catalog_ceilings', 'roofline', 'apple', 'baseline', 'load_diagnosis', 'headline', 'quant_ladder',
    'QUALITY_LADDER', 'quality_ladder', 'gpu_layers_sweep', 'spill_effect', 'kv_memory', 'depth_sweep',
    'quantized_v', 'batch_sweep', 'flash_attn_sweep', 'parallel_sweep', 'mmap_mlock', 'threads_sweep',
    'final_config', 'command_reasons', 'tuned_command', 'own_staircase', 'seed_verdict_table',
    'summary_overview', 'summary_triangle', 'summary_ceiling', 'summary_baseline', 'summary_quantization',
    'summary_gpu_layers', 'summary_context', 'METRIC_NAMES', 'summary_levers', 'summary_final',
]
