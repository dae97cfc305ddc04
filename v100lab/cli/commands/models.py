"""``v100lab models [make ALIAS...]``: list the zoo, or build synthetic models and quant ladders."""

from __future__ import annotations

import json
import sys

from tqdm.auto import tqdm

from v100lab.models import zoo
from v100lab.base.errors import V100labError
from v100lab.gguf.header import read_spec
from v100lab.workbook.render import term_text

NAME = "models"
HELP = "list the model zoo (aliases, files, types, sizes), or build models with `models make`"


def add_arguments(p):
    p.add_argument("action", nargs="?", choices=["list", "make"], default="list")
    p.add_argument("targets", nargs="*", metavar="ALIAS",
                   help="for make: synth-* or default, optionally ALIAS:QUANT, or 'gemma3-270m'")
    p.add_argument("--ladder", action="store_true",
                   help=f"for make: build every quant of the ladder ({', '.join(zoo.LADDER)})")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _file_type(path) -> str | None:
    try:
        return read_spec(path).file_type
    except V100labError:
        return None


def _list(args) -> int:
    rows = []
    for e in zoo.entries():
        rows.append({"alias": e.alias, "path": str(e.path) if e.path else None, "present": e.present,
                     "file_type": _file_type(e.path) if e.present else None,
                     "size_bytes": e.path.stat().st_size if e.present else None,
                     "description": e.description})
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"cache: {term_text(zoo.cache_dir())}  (set ${zoo.CACHE_ENV} to move it)")
    print(f"{'alias':<28} {'type':<8} {'size':>10}  {'present':<7}  path")
    for r in rows:
        size = f"{r['size_bytes'] / 2**20:.1f} MiB" if r["size_bytes"] else "-"
        print(f"{r['alias']:<28} {r['file_type'] or '-':<8} {size:>10}  {'yes' if r['present'] else 'no':<7}  "
              f"{term_text(r['path'] or '(package not installed)')}")
    return 0


def _check_target(target: str) -> None:
    """A ``models make`` target is an alias this command builds, with a known quant: refused (one line)
    before any file is written (a wrong quant must not cost a 258 MiB F16 build first)."""
    base, sep, quant = target.partition(":")
    known = (zoo.GEMMA_ALIAS, zoo.DEFAULT_ALIAS, *zoo.synth_presets())
    if base not in known:
        raise V100labError(f"models make: '{term_text(base, limit=80)}' is not an alias it builds "
                           f"(known: {', '.join(known)})")
    if base == zoo.GEMMA_ALIAS and sep:
        raise V100labError(f"models make: '{zoo.GEMMA_ALIAS}' has no quant ladder; drop ':{term_text(quant, limit=20)}'")
    if sep:
        if not quant:
            raise V100labError(f"models make: '{term_text(target, limit=80)}' names no quant after ':'")
        zoo.ftype_of(quant)   # V100labError naming the known quants


def _make(args) -> int:
    if not args.targets:
        raise V100labError("models make: name at least one alias, e.g. `v100lab models make synth-tiny --ladder`")
    for target in args.targets:   # every name and quant checked before anything is built
        _check_target(target)
    made = {}
    for target in args.targets:
        base, _, quant = target.partition(":")
        if base == zoo.GEMMA_ALIAS:
            made[target] = str(zoo.gemma_model_path())
            continue
        if base == zoo.DEFAULT_ALIAS:
            quants = ["F16", *zoo.LADDER] if args.ladder else ([quant] if quant else [])
            for q in tqdm(quants, desc="default ladder", unit="quant", disable=args.json or not quants, file=sys.stderr):
                made[f"default:{q.upper()}"] = str(zoo.default_ladder_path(q))
            continue
        if base not in zoo.synth_presets():
            raise V100labError(f"models make: '{base}' is not a synthetic alias "
                               f"(known: {', '.join(zoo.synth_presets())})")
        with tqdm(total=1, desc=f"{base} F16", unit="tensor", disable=args.json, file=sys.stderr) as bar:
            def progress(done, total):
                bar.total = total
                bar.n = done
                bar.refresh()
            f16 = zoo.synthetic_path(zoo.synth_presets()[base], progress)
        made[base] = str(f16)
        quants = list(zoo.LADDER) if args.ladder else ([quant] if quant and quant.upper() != "F16" else [])
        for q in tqdm(quants, desc=f"{base} ladder", unit="quant", disable=args.json or not quants, file=sys.stderr):
            made[f"{base}:{q.upper()}"] = str(zoo.quantized_path(f16, q))
    if args.json:
        json.dump(made, sys.stdout, indent=2)
        print()
    else:
        for alias, path in made.items():
            print(f"{term_text(alias):<28} {term_text(path)}")
    return 0


def run(args) -> int:
    return _make(args) if args.action == "make" else _list(args)
