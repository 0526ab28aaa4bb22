# Sourced by scripts/gpu-trial.sh and scripts/vllm-trial.sh (with WORK set
# to the trial's working directory): from_work lists the processes whose
# command line names $WORK/ (an earlier trial still running, or what this
# one left), one "pid command line" a line. Only looked at, never
# signalled. The calling script's own ancestors are left out: the shell
# that started it may name $WORK in its own command line.

# ancestors: this shell's process id and those of its ancestors.
ancestors() {
  local p=$$
  while [ "$p" -gt 1 ]; do
    echo "$p"
    # The parent is the second field after the command's closing ")",
    # which may itself hold spaces and parentheses.
    p=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $2}')
    [ -n "$p" ] || p=1
  done
}

from_work() {
  local mine
  mine=" $(ancestors | tr '\n' ' ') "
  { pgrep -f -- "$WORK/" || true; } | while read -r pid; do
    case "$mine" in *" $pid "*) continue ;; esac
    echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)"
  done
}
