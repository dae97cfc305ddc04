"""``v100lab plan MODEL --device D [llama.cpp flags] [--depth N] [--n-prompt N] [--json]``.

Where llama.cpp will put every byte — weights, KV cache, recurrent state, compute and output buffers,
runtime overhead — on each device, whether it fits, and the largest context that would. "Fits" is
:func:`v100lab.predict.memory.feasibility`, the rule ``tune`` chooses by: every device (each GPU and the host's RAM)
holds its part with a margin, and llama.cpp's limits hold (sequences, context, threads); each blocker says
what would have to change. Nothing is
loaded: MODEL is read as a header only (path, http(s) URL, zoo alias) or is a skeleton
(``skeleton:ARCH:QUANT``, e.g. ``skeleton:qwen35-27b:Q4_K_M``).

JSON keys (a contract): devices (name → weights_bytes, kv_cache_bytes, recurrent_bytes, compute_bytes,
output_bytes, overhead_bytes, total_bytes, capacity_bytes), fits, offloaded_layers, n_layer_total,
max_ctx, warnings; plus model, quant, device, n_ctx, n_ctx_seq, n_ubatch, flash_attn, config, feasibility
(fits, blockers, smallest_blocker, margin_bytes), within_capacity (every device within its capacity,
without the margin). With ``--spec-type``: speculative (spec_type, draft_max, the draft model's memory per
device and the totals with it, and :class:`v100lab.predict.speculative.SpecPrediction`'s figures at ``--alpha``, or
an assumed α said as such).
"""

from __future__ import annotations

import json
import sys

from v100lab.facts import config as config_mod
from v100lab.predict import speculative, speed
from v100lab.facts.devices import get_device
from v100lab.base.errors import ConfigError
from v100lab.predict.memory import feasibility, fmt_bytes, max_ctx, plan
from v100lab.models.resolve import resolve
from v100lab.base.safeio import json_safe, term_lines

NAME = "plan"
HELP = "predict llama.cpp's memory per device (weights, KV, compute, output), whether it fits, and the largest context"

def add_arguments(p):
    p.add_argument("model", metavar="MODEL",
                   help="path, http(s) URL, alias (default, gemma3-270m, synth-tiny:Q4_0) or skeleton:ARCH:QUANT")
    p.add_argument("--device", "-d", action="append", metavar="D", required=True,
                   help="catalog id (v100-16gb, t4, apple-m2-max, ...), 'host', or a YAML/JSON device file; "
                        "repeat for several GPUs (layers split by --tensor-split)")
    config_mod.add_flag_arguments(p)
    p.add_argument("--depth", type=int, default=0, help="tokens already in the context (for the speed prediction)")
    p.add_argument("--n-prompt", type=int, default=512, help="prompt tokens (for the speed prediction)")
    p.add_argument("--alpha", type=float, default=None,
                   help="per-token acceptance of drafted tokens for --spec-type (default: an assumed value, said)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def build_document(spec, devices, cfg, mplan, args) -> dict:
    """The JSON document. Other predictions (speed) are added to it as extra keys by their own code."""
    doc = mplan.as_dict()
    doc.update({"model": spec.name, "quant": spec.file_type, "device": [d.id for d in devices],
                "n_ctx": mplan.n_ctx, "n_ctx_seq": mplan.n_ctx_seq, "n_ubatch": mplan.n_ubatch,
                "flash_attn": mplan.flash_attn, "config": cfg.as_dict()})
    return doc


def _predicted(spec, devices, cfg, mplan, args) -> dict:
    """The speed model's prediction for the same placement (v100lab.predict.speed): "predicted"."""
    pred = speed.predict(spec, devices, cfg, depth=args.depth, n_prompt=max(1, args.n_prompt),
                         placement=speed.placement_from_plan(mplan, devices))
    return pred.as_dict()


def _human(doc: dict) -> str:
    gib = 2**30
    lines = [f"{doc['model']} ({doc['quant']}) on {' + '.join(doc['device'])}: n_ctx {doc['n_ctx']} "
             f"(per sequence {doc['n_ctx_seq']}), n_ubatch {doc['n_ubatch']}, flash attention "
             f"{'on' if doc['flash_attn'] else 'off'}",
             f"layers on the GPU: {doc['offloaded_layers']}/{doc['n_layer_total']}", "",
             f"{'device':<16}{'weights':>9}{'KV':>9}{'recur.':>9}{'compute':>9}{'output':>9}{'overhd':>9}"
             f"{'total':>9}{'capacity':>10}  (GiB)"]
    for name, d in doc["devices"].items():
        lines.append(f"{name:<16}" + "".join(f"{d[k] / gib:>9.2f}" for k in (
            "weights_bytes", "kv_cache_bytes", "recurrent_bytes", "compute_bytes", "output_bytes", "overhead_bytes",
            "total_bytes")) + f"{d['capacity_bytes'] / gib:>10.2f}")
    margins = doc["feasibility"]["margin_bytes"]
    kept = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in margins.items())
    lines += ["", f"fits: {'yes' if doc['fits'] else 'NO'} (keeping {kept} free)    "
                  f"largest context that fits: {doc['max_ctx']}"]
    lines += [f"blocked: {b['line']}" for b in doc["feasibility"]["blockers"]]
    lines += [f"warning: {w}" for w in doc["warnings"]]
    p = doc.get("predicted")
    if p:
        # the ceiling a prediction cannot exceed is the physical one (the bytes each token reads); the seed's
        # (bandwidth / the weights placed) can be beaten when a token reads less (one row of an untied
        # token_embd, the active experts of a MoE)
        lines.append(f"speed at depth {p['depth']}: tg {p['tg_tps']} tok/s ({p['bound']}-bound; ceiling "
                     f"{p['physical_ceiling_tg_tps']} for the bytes a token reads, the seed's {p['weights_ceiling_tg_tps']} for "
                     f"the weights), pp{p['n_prompt']} {p['pp_tps']} tok/s")
        lines += [f"note: {n}" for n in p.get("notes", [])]
    if doc.get("speculative"):
        lines += _human_speculative(doc["speculative"])
    return "\n".join(lines)


# common/common.h common_params_speculative: the draft length each --spec-type drafts when none is given
DEFAULT_DRAFT = {"ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48, "ngram-mod": 64, "ngram-cache": 8}
DEFAULT_DRAFT_MODEL_N = 3


def speculative_document(spec, devices, cfg, mplan, args) -> dict | None:
    """Speculative decoding's part of the plan: the draft model's memory (it shares -c and -np with the target,
    its KV cache f16, common_base_params_to_speculative) per device and the totals with it, and the speed."""
    if cfg.spec_type == "none":
        return None
    draft_spec = resolve(cfg.draft_model, build=True).spec if cfg.draft_model else None
    n = cfg.draft_max or DEFAULT_DRAFT.get(cfg.spec_type, DEFAULT_DRAFT_MODEL_N)
    doc: dict = {"spec_type": cfg.spec_type, "draft_max": n, "draft_model": cfg.draft_model or None}
    if draft_spec is not None:
        dcfg = cfg.with_(spec_type="none", draft_max=0, draft_min=0, draft_p_min=0.0, draft_model="",
                         ngram_size_n=0, cache_type_k="f16", cache_type_v="f16")
        dplan = plan(draft_spec, devices, dcfg, with_max_ctx=False)
        doc["draft_devices"] = {k: {"weights_bytes": d.weights_bytes, "kv_cache_bytes": d.kv_cache_bytes,
                                    "total_bytes": d.total_bytes} for k, d in dplan.devices.items()}
        doc["total_with_draft_bytes"] = {k: d.total_bytes + (dplan.devices[k].total_bytes if k in dplan.devices else 0)
                                         for k, d in mplan.devices.items()}
        doc["fits_with_draft"] = all(doc["total_with_draft_bytes"][k] <= d.capacity_bytes
                                     for k, d in mplan.devices.items())
    elif cfg.spec_type.startswith("draft-") and spec.nextn_layers:
        doc["mtp_layers"] = spec.nextn_layers      # in the model file: already among its weights
    pred = speculative.predict(spec, devices, cfg, spec_type=cfg.spec_type, n_draft=n, alpha=args.alpha,
                               draft_spec=draft_spec, depth=args.depth)
    doc["predicted"] = pred.as_dict()
    return doc


def _human_speculative(s: dict) -> list[str]:
    gib = 2**30
    p = s["predicted"]
    lines = ["", f"speculative decoding: --spec-type {s['spec_type']}, {s['draft_max']} drafted per pass, "
                 f"α {p['alpha']} ({p['alpha_source']})"]
    for name, d in (s.get("draft_devices") or {}).items():
        lines.append(f"  draft model on {name}: weights {d['weights_bytes'] / gib:.2f} GiB + KV "
                     f"{d['kv_cache_bytes'] / gib:.2f} GiB = {d['total_bytes'] / gib:.2f} GiB; with the target "
                     f"{s['total_with_draft_bytes'][name] / gib:.2f} GiB")
    if "fits_with_draft" in s:
        lines.append(f"  fits with the draft model: {'yes' if s['fits_with_draft'] else 'NO'}")
    lines.append(f"  predicted: {p['tps']} tok/s vs {p['plain_tps']} without ({p['speedup']}×), "
                 f"{p['tokens_per_pass']} tokens per pass; best draft length {p['best_draft_max']} "
                 f"({p['best_tps']} tok/s); ceiling for speculative decode {p['ceiling_tps']} tok/s")
    lines += [f"  note: {n}" for n in p["notes"]]
    return lines


def largest_context(spec, devices, cfg, feas) -> int:
    """The largest context that fits by the same rule as ``fits`` (every device, with its margin), up to the
    training context or the context asked for; 0 when a limit no context lifts blocks (sequences, threads)."""
    if any(b.kind in ("parallel", "threads") for b in feas.blockers):
        return 0
    return max_ctx(spec, devices, cfg, limit=max(cfg.n_ctx, spec.n_ctx_train), margin=True)


def run(args) -> int:
    if args.depth < 0 or args.n_prompt < 0:
        raise ConfigError("--depth and --n-prompt must be >= 0")
    if args.depth + args.n_prompt > config_mod.MAX_POSITIONS:
        raise ConfigError(f"--depth {args.depth} + --n-prompt {args.n_prompt} is beyond any context: llama.cpp "
                          f"holds at most {config_mod.MAX_POSITIONS:,} positions (llama_pos is 32-bit)")
    cfg = config_mod.from_flag_args(args)
    spec = resolve(args.model, build=True).spec
    devices = [get_device(d) for d in args.device]
    mplan = plan(spec, devices, cfg, with_max_ctx=False)
    feas = feasibility(spec, devices, cfg, mplan, detail=True)
    doc = build_document(spec, devices, cfg, mplan, args)
    doc.update({"fits": feas.fits, "within_capacity": mplan.fits, "max_ctx": largest_context(spec, devices, cfg, feas),
                "feasibility": feas.as_dict()})
    if args.depth + args.n_prompt > mplan.n_ctx_seq:
        doc["warnings"].append(f"depth {args.depth} + n_prompt {args.n_prompt} exceeds the context per sequence "
                               f"({mplan.n_ctx_seq})")
    doc["predicted"] = _predicted(spec, devices, cfg, mplan, args)
    # a device file without a field that moves this prediction by more than 10 %: say which, so it gets added
    doc["warnings"] += speed.assumption_warnings(spec, speed.placement_from_plan(mplan, devices), cfg,
                                                 depth=args.depth, n_prompt=max(1, args.n_prompt))
    if args.alpha is not None and cfg.spec_type == "none":
        raise ConfigError("--alpha is the acceptance of drafted tokens: it needs --spec-type")
    spec_doc = speculative_document(spec, devices, cfg, mplan, args)
    if spec_doc is not None:
        doc["speculative"] = spec_doc
        if spec_doc.get("fits_with_draft") is False:
            doc["fits"] = False
            doc["warnings"].append("the draft model does not fit beside the target: -ngld to keep it off the GPU")
    if args.json:
        json.dump(json_safe(doc), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(term_lines(_human(doc)))   # model names and notes come from files: escape them
    return 0
