#!/usr/bin/env bash
# test_chat_tmux.sh - `dflash chat` on a terminal, as a user has it: tmux runs it
# in a detached session, send-keys types two turns, capture-pane reads the
# screen. Both answers must be on the screen exactly as a piped run prints them
# (greedy, so the same text), and the second turn's stats line must show the
# first turn's cache reused. Then Ctrl-C stops a long answer and the prompt
# returns with the chat still running, twice in a row; Ctrl-C at the prompt quits (130).
# The turns run on SmolLM2-135M-Instruct (make model), or on the built-in model
# without it; the Ctrl-C part needs SmolLM2 (the built-in model fills its 512 rows
# in milliseconds). Without tmux or SmolLM2: a skip (77), a failure under CI=true.
set -u
BIN=${DFLASH_BIN:?}
SRC=${DFLASH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
missing() {
  [ "${CI:-}" = true ] && { echo "FAIL: $* (CI=true)"; exit 1; }
  echo "SKIP: $*"; skipped=1
}
command -v tmux >/dev/null || { missing "tmux is not installed (scripts/deps.sh)"; exit 77; }

tmp=$(mktemp -d /tmp/dflash-chat-tmux-XXXXXX)
# Our own tmux server (socket in tmp, no user config): killing it ends only what it runs.
printf 'set -g remain-on-exit on\nset -g history-limit 10000\n' >"$tmp/tmux.conf"
T() { tmux -u -S "$tmp/sock" -f "$tmp/tmux.conf" "$@"; }
trap 'T kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
export LC_ALL=C.UTF-8   # the answers' UTF-8 goes through the terminal unchanged

LIMIT_S=60   # per wait: a model load or an answer on a busy machine
screen() { T capture-pane -p -J -S - -t "$1"; }   # -J: wrapped lines joined
dead() { [ "$(T display-message -p -t "$1" '#{pane_dead}')" = 1 ]; }
# wait_for SESSION CMD...: polls until CMD (given the screen on stdin) succeeds.
wait_for() {
  local s=$1 i; shift
  for i in $(seq 1 $((LIMIT_S * 10))); do
    screen "$s" | "$@" && return 0
    dead "$s" && return 1
    sleep 0.1
  done
  return 1
}
# run SESSION ARGS...: the chat in its own tmux session, under a shell that
# writes its exit status to $tmp/status.SESSION. tmux's own record of a dead
# pane (remain-on-exit) sometimes vanished with the session under a loaded CI
# machine, so the status comes from this file. The shell ignores SIGINT (a
# Ctrl-C reaches the whole foreground group); the chat installs its own handler.
run() {
  local s=$1; shift
  T new-session -d -s "$s" -x 200 -y 50 sh -c 'trap "" INT; "$@"; echo $? >"$0"' \
    "$tmp/status.$s" "$@"
}
# exit_status SESSION: waits for the chat to end; prints its exit status.
exit_status() {
  local i
  for i in $(seq 1 $((LIMIT_S * 10))); do
    [ -s "$tmp/status.$1" ] && { cat "$tmp/status.$1"; return; }
    sleep 0.1
  done
  echo "none (still running)"
}
stats_lines() { grep -c '^\[[0-9]* prompt tokens'; }
has_stats() { [ "$(stats_lines)" -ge "$1" ]; }
at_prompt() { [ "$(sed 's/ *$//' | grep -v '^$' | tail -1)" = ">" ]; }   # the last line: "> "
type_line() { T send-keys -t "$1" -l "$2" && T send-keys -t "$1" Enter; }

smol=$SRC/build/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$smol" ]; then
  model=(-m "$smol" --draft "$SRC/models/smollm2-135m-dflash")
else
  missing "no $smol (make model): the turns run on the built-in model, the Ctrl-C part is left out"
  model=()
fi
chat=("$BIN" chat "${model[@]}" -t 1)

# ---- two turns; the answers a piped run prints, turn by turn -------------------------
q1="What is the capital of France?" q2="And of Italy?"
printf '%s\n/exit\n' "$q1" | "${chat[@]}" -n 24 -q >"$tmp/one.txt" 2>"$tmp/one.err" &&
  printf '%s\n%s\n/exit\n' "$q1" "$q2" | "${chat[@]}" -n 24 -q >"$tmp/two.txt" 2>>"$tmp/one.err" ||
  { cat "$tmp/one.err"; echo "FAIL: the piped chat failed"; exit 1; }
a1=$(<"$tmp/one.txt") both=$(<"$tmp/two.txt")
a2=${both#"$a1"$'\n'}
[ -n "$a1" ] && [ "$a2" != "$both" ] && [ -n "$a2" ] && ok || bad "piped answers: '$a1' / '$both'"

run turns "${chat[@]}" -n 24
wait_for turns at_prompt || bad "no '> ' prompt after loading: $(screen turns | tail -5)"
type_line turns "$q1"
wait_for turns has_stats 1 || bad "no answer to turn 1: $(screen turns | tail -5)"
wait_for turns at_prompt || bad "no prompt after turn 1"
type_line turns "$q2"
wait_for turns has_stats 2 || bad "no answer to turn 2: $(screen turns | tail -5)"
wait_for turns at_prompt || bad "no prompt after turn 2"
scr=$(screen turns)
[[ "$scr" == *"> $q1"$'\n'"$a1"$'\n['* ]] && ok || bad "turn 1's answer is not on the screen: want '$a1'; screen: $scr"
[[ "$scr" == *"> $q2"$'\n'"$a2"$'\n['* ]] && ok || bad "turn 2's answer is not on the screen: want '$a2'; screen: $scr"
# [P prompt tokens, R of them reused; ...]: turn 2 reuses at least turn 1's whole prompt
read -r p1 r1 p2 r2 < <(sed -n 's/^\[\([0-9]*\) prompt tokens, \([0-9]*\) of them reused.*/\1 \2/p' <<<"$scr" | tr '\n' ' ')
[ "${r1:-x}" = 0 ] && [ "${r2:-0}" -ge "${p1:-999999}" ] && [ "${p2:-0}" -gt "${r2:-0}" ] && ok ||
  bad "cache reuse: turn 1 '$p1 prompt, $r1 reused', turn 2 '$p2 prompt, $r2 reused'"
type_line turns /exit
st=$(exit_status turns)
[ "$st" = 0 ] && ok || bad "/exit did not end the chat with status 0 (status $st)"

# ---- Ctrl-C stops a long answer and the prompt returns, every time; at the prompt it quits
if [ -f "$smol" ]; then
  run int "${chat[@]}" -n 100000 --ignore-eos -c 8192
  wait_for int at_prompt || bad "no '> ' prompt after loading (Ctrl-C part)"
  for k in 1 2; do   # twice: the handler must outlive its first call
    q="Tell me a long story about lighthouse number $k."
    type_line int "$q"
    # the answer has begun: text on the line after the turn
    answering() { grep -A1 -F -- "> $q" | tail -1 | grep -q '[[:alnum:]]'; }
    wait_for int answering || bad "long answer $k did not start: $(screen int | tail -3)"
    T send-keys -t int C-c
    stopped() { [ "$(grep -c '^\[.*; stopped\]$')" -ge "$k" ]; }
    wait_for int stopped || bad "Ctrl-C did not stop answer $k: $(screen int | tail -3)"
    wait_for int at_prompt && ! dead int && ok ||
      bad "no prompt after Ctrl-C $k, or the chat ended: $(screen int | tail -3)"
    before=$(screen int); sleep 1
    [ "$(screen int)" = "$before" ] && ok || bad "answer $k went on after Ctrl-C"
  done
  T send-keys -t int C-c
  st=$(exit_status int)
  [ "$st" = 130 ] && ok || bad "Ctrl-C at the prompt did not quit with status 130 (status $st): $(screen int | tail -4)"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ] || exit 1
[ -z "${skipped:-}" ] || exit 77  # ctest SKIP_RETURN_CODE
