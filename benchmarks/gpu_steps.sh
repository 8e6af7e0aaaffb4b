# Budgeted steps for the GPU scripts (sourced after gpu_env.sh, with G set to the script's folder):
#   DEADLINE from BUDGET_S (default $1 of `source`, else 470), `left` (seconds to it), and
#   `step NAME SECONDS_NEEDED CMD...`: run CMD once into $G/NAME.txt under the time left (marks itself
#   done in $G/done-NAME; a second call prints the first's output), skipped when the budget is short.
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-${1:-470}} ))
left() { echo $(( DEADLINE - $(date +%s) )); }
step() {
  local name=$1 need=$2; shift 2; [ -f $G/done-$name ] && { cat $G/$name.txt; return 0; }
  local t=$(( $(left) - 15 )); [ $t -lt $need ] && { echo "skip $name: ${t}s left, needs ${need}s" | tee -a $G/skipped.txt; return 1; }
  local s=$(date +%s)
  timeout -s INT -k 20 $t "$@" > $G/$name.txt 2>&1; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - s ))s" | tee -a $G/$name.txt $G/rc.txt
  cat $G/$name.txt
  [ $rc -ne 124 ] && [ $rc -ne 130 ] && touch $G/done-$name; return $rc
}
