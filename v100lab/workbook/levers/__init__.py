"""One function per step of the workbook: each returns tidy rows — predicted and measured — for one lever.

The notebooks hold no formulas and no loops: every cell calls one function here (or in
:mod:`v100lab.workbook.plots`) with the validated :class:`~v100lab.workbook.scenario.Scenario`. A function here

* resolves the scenario once (:func:`study`): the model studied (a GGUF path, URL or zoo alias, or a
  skeleton ``skeleton:ARCH:QUANT`` of a model nobody downloaded), the device the predictions are for, and
  the model that can be *measured on this machine* (``stand_in_model`` when set; none when the scenario
  says ``measure: false`` or the model has no weights here) — with the reason when nothing is measured;
* predicts with :mod:`v100lab.predict.memory` and :mod:`v100lab.predict.speed`, measures with :mod:`v100lab.measure.harness`,
  :mod:`v100lab.facts.loadlog` and :mod:`v100lab.measure.quality`, and returns one tidy frame
  (:func:`v100lab.facts.results.tidy_frame`) in which every plotted number lives, measured rows flagged when they
  exceed the ceiling of their model and device;
* never prints (logging only); failures of a *measurement* (a configuration llama.cpp refuses) are data:
  they are kept in ``frame.attrs["failures"]`` with llama.cpp's own reason, and the summaries report them.

The ``summary_*`` functions write each notebook's closing paragraph from the numbers of the frames they are
given — nothing in them is a canned conclusion — and escape every string that came from a model or a
parameter file (:mod:`v100lab.workbook.render`).

Measured rows are always for this machine (device ``host``) and carry the measured model's label, with
"(stand-in)" when the scenario measures a stand-in for its model.

Layout: :mod:`~v100lab.workbook.levers.steps` resolves the scenario and holds the row helpers every step shares;
one module per notebook holds that notebook's steps and its ``PARAMETERS`` (the scenario keys its
parameters cell holds): ``overview`` 00, ``triangle`` 01, ``ceiling`` 02, ``baseline`` 03, ``quantization``
04, ``gpu_layers`` 05, ``context`` 06, ``flash_attn`` 07, ``batch`` 08, ``threads`` 09, ``parallel`` 10,
``loading`` 11, ``final`` 12, ``spec_decode`` 13; :mod:`~v100lab.workbook.levers.course` lists them in reading order;
:mod:`~v100lab.workbook.levers.by_hand` holds what the by-hand cells use (:func:`agree`), :mod:`~v100lab.workbook.levers.exercises`
the "try it" answers (:func:`what_if`); ``summaries`` holds the ``summary_*`` paragraphs, ``captions`` the
``caption_*`` sentences under each plot (what to look at), ``text`` the words both share (picking rows, numbers,
a difference judged against the noise); every measured-vs-predicted figure in them comes from
:func:`v100lab.facts.results.compare`. The notebooks call everything through this package (``levers.baseline(sc)``),
so the names below are the workbook's API.
"""

from v100lab.gguf.skeleton import SKELETON_PREFIX
# stage_model: used by benchmarks/bench_notebooks.py (it builds the stage files ahead of a timed run)
from v100lab.workbook.levers.steps import (
    HOST, GIB, MIB, COMPONENTS, STUDY_PARAMETERS, spec_at_quant, Study, study, gpu_backend, gpu_host,
    predict_rows, measure_sweep, capture_load, stage_model, Target, beside, gpu_subject, conditions,
)
from v100lab.workbook.levers.by_hand import (
    agree, value_of, kv_layers, bytes_per_element, not_multiplied, expert_tensors, output_bytes, subject,
)
from v100lab.workbook.levers.overview import notebook_map, scenario_facts, staircase, seed_stage
from v100lab.workbook.levers.triangle import (
    kv_bytes_per_token, header_facts, memory_breakdown, quant_specs, fit_grid, largest_context, kv_cache_bytes,
)
from v100lab.workbook.levers.ceiling import ceilings, device_ceilings, catalog_ceilings, roofline, apple, flops_per_token
from v100lab.workbook.levers.baseline import (baseline, baseline_title, load_diagnosis, headline, headline_figures,
                                     headline_memory, headline_load, run_environment)
from v100lab.workbook.levers.quantization import quant_ladder, QUALITY_LADDER, quality_ladder, rung_spec, file_size
from v100lab.workbook.levers.gpu_layers import gpu_layers_sweep, spill_effect, offload_split
from v100lab.workbook.levers.context import kv_memory, depth_sweep, quantized_v, kv_read_per_token
from v100lab.workbook.levers.flash_attn import flash_attn_sweep, flash_attn_depth
from v100lab.workbook.levers.batch_size import batch_sweep, batch_prompt, prompt_weight_bytes
from v100lab.workbook.levers.threads import threads_sweep, thread_values
from v100lab.workbook.levers.parallel import (parallel_sweep, parallel_latency, one_user, slot_context, serving_sweep,
                                     aggregate_ceiling, context_per_slot)
from v100lab.workbook.levers.loading import load_modes, mmap_mlock
from v100lab.workbook.levers.final import (final_config, command_reasons, tuned_command, own_staircase, seed_verdict_table,
                                  measured_candidates, judge_flags, flag_checks, gpu_command)
from v100lab.workbook.levers.spec_decode import (spec_sweep, what_if as spec_what_if, seed_mtp, best_draft_rows,
                                        median_error as spec_median_error, caption_speculative, verify_ratios,
                                        summary_speculative, spec_ceiling, caption_spec_what_if)
from v100lab.predict.speculative import tokens_per_pass, alpha_from_rate
from v100lab.workbook.levers.summaries import (
    summary_overview, summary_triangle, summary_ceiling, summary_baseline, summary_quantization,
    summary_gpu_layers, summary_context, summary_flash_attn, summary_batch, summary_threads, summary_parallel,
    summary_loading, METRIC_NAMES, summary_final,
)
from v100lab.workbook.levers.course import LESSONS, Lesson, keys_of, lesson
from v100lab.workbook.levers.exercises import what_if
from v100lab.workbook.levers.captions import (
    caption_staircase, caption_memory, caption_fit, caption_ceilings, caption_catalog, caption_roofline,
    caption_apple, caption_baseline, caption_ladder, caption_file_sizes, caption_quality, caption_gpu_layers,
    caption_spill, caption_kv, caption_depth, caption_flash_attn, caption_batch, caption_threads, caption_parallel,
    caption_parallel_latency, caption_one_user, caption_slot_context, caption_load, caption_own_staircase,
)

__all__ = [
    'SKELETON_PREFIX', 'HOST', 'GIB', 'MIB', 'COMPONENTS', 'STUDY_PARAMETERS',
    'spec_at_quant', 'Study', 'study', 'gpu_backend', 'gpu_host', 'predict_rows', 'measure_sweep', 'capture_load',
    'stage_model', 'agree', 'value_of', 'kv_layers', 'bytes_per_element', 'not_multiplied', 'expert_tensors', 'output_bytes',
    'subject', 'notebook_map', 'scenario_facts', 'staircase', 'seed_stage', 'kv_bytes_per_token', 'header_facts',
    'memory_breakdown', 'quant_specs', 'fit_grid', 'largest_context', 'kv_cache_bytes', 'ceilings',
    'device_ceilings', 'catalog_ceilings', 'roofline', 'apple', 'flops_per_token', 'baseline', 'load_diagnosis', 'run_environment',
    'headline', 'headline_figures', 'headline_memory', 'headline_load', 'baseline_title',
    'quant_ladder', 'QUALITY_LADDER', 'quality_ladder', 'rung_spec', 'file_size', 'gpu_layers_sweep',
    'spill_effect', 'offload_split', 'kv_memory', 'depth_sweep', 'quantized_v', 'kv_read_per_token',
    'flash_attn_sweep', 'flash_attn_depth', 'batch_sweep', 'batch_prompt', 'prompt_weight_bytes', 'threads_sweep',
    'thread_values', 'parallel_sweep', 'parallel_latency', 'one_user', 'slot_context', 'serving_sweep',
    'aggregate_ceiling', 'context_per_slot', 'load_modes', 'mmap_mlock', 'final_config',
    'command_reasons', 'tuned_command', 'measured_candidates', 'judge_flags', 'flag_checks', 'gpu_command',
    'own_staircase', 'seed_verdict_table', 'summary_overview',
    'summary_triangle', 'summary_ceiling', 'summary_baseline', 'summary_quantization', 'summary_gpu_layers',
    'summary_context', 'summary_flash_attn', 'summary_batch', 'summary_threads', 'summary_parallel',
    'summary_loading', 'METRIC_NAMES', 'summary_final', 'LESSONS', 'Lesson', 'keys_of', 'lesson', 'what_if',
    'Target', 'beside', 'gpu_subject', 'conditions', 'caption_staircase', 'caption_memory', 'caption_fit',
    'caption_ceilings', 'caption_catalog', 'caption_roofline', 'caption_apple', 'caption_baseline', 'caption_ladder',
    'caption_file_sizes', 'caption_quality', 'caption_gpu_layers', 'caption_spill', 'caption_kv', 'caption_depth',
    'caption_flash_attn', 'caption_batch', 'caption_threads', 'caption_parallel', 'caption_parallel_latency',
    'caption_one_user', 'caption_slot_context', 'caption_load',
    'caption_own_staircase', 'spec_sweep', 'spec_what_if', 'seed_mtp', 'best_draft_rows', 'spec_median_error',
    'caption_speculative', 'verify_ratios', 'summary_speculative', 'spec_ceiling', 'caption_spec_what_if',
    'tokens_per_pass', 'alpha_from_rate',
]
