# Progress for a long step of the setup scripts (sourced, not run):
#   run_with_progress LABEL EXPECTED_S LOG CMD...
# runs CMD with its output in LOG and, while it runs, says on stderr how long it has taken against the expected
# duration and, when the build prints its steps ("[123/456]", as CMake/ninja do), how many are done — on a terminal
# one line rewritten every 2 s, otherwise a line every 30 s; the time left comes from the steps' pace once ten are
# done. Returns CMD's status; a final line gives the time taken.
_fmt_s() { printf '%dm%02ds' $(( $1 / 60 )) $(( $1 % 60 )); }

run_with_progress() {
  local label="$1" expected="$2" log="$3"; shift 3
  local start pid rc step el every=30 tty=0 left next
  [ -t 2 ] && { tty=1; every=2; }
  next=$every
  start=$(date +%s)
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    el=$(( $(date +%s) - start ))
    [ "$el" -ge "$next" ] || continue
    next=$(( el + every ))
    step="$(grep -o '\[[0-9]\+/[0-9]\+\]' "$log" 2>/dev/null | tail -n 1 | tr -d '[]')"
    left=$(( expected > el ? expected - el : 0 ))
    # once the build has counted some of its steps, their pace says more than the expected duration
    if [ -n "$step" ] && [ "${step%/*}" -ge 10 ]; then left=$(( el * (${step#*/} - ${step%/*}) / ${step%/*} )); fi
    msg="$label: $(_fmt_s "$el") elapsed of ~$(_fmt_s "$expected") expected${step:+, step $step}"
    [ "$left" -gt 0 ] && msg="$msg (~$(_fmt_s "$left") left)"
    if [ "$tty" = 1 ]; then printf '\r\033[K%s' "$msg" >&2; else echo "$msg" >&2; fi
  done
  wait "$pid" && rc=0 || rc=$?
  [ "$tty" = 1 ] && printf '\r\033[K' >&2
  echo "$label: $( [ "$rc" = 0 ] && echo done || echo "failed (status $rc)") in $(_fmt_s $(( $(date +%s) - start )))" >&2
  return "$rc"
}
