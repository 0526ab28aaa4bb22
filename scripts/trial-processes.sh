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
    p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1)
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
