#!/usr/bin/env bash
# ddprun --max-restarts / --min-nodes on a fake environment: a fake mpirun that fails as told
# and records each command line, and a fake ssh agent for which only the hosts in $ALIVE
# answer. Checks which failures restart, on which hosts and ranks, when ddprun gives up, what
# it says, that a signal to ddprun reaches mpirun and is not followed by a restart, and that the
# job ends when its ranks end: an mpirun still waiting 10 s after its ranks here ended (for a
# host it cannot reach, issue 60) is ended with the agent it started, status 1.
#
#   ddprun_restart_check.sh DDPRUN
set -euo pipefail
ddprun=$(realpath "${1:?usage: ddprun_restart_check.sh DDPRUN}")
work=$(mktemp -d /tmp/ddprun-restart.XXXXXX)
# The lingering fake mpiruns and agents, should ddprun leave them.
trap 'for pid in $(cat "$work/lingering" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null || true; done; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The fake mpirun: `--version` says Open MPI; otherwise it appends its arguments (and
# DDP_RESTART_COUNT) to $work/calls and exits with the next status of $work/statuses; "sleep"
# waits for a signal instead and exits 75 on SIGTERM, as ranks that saved a snapshot do;
# "linger" is Open MPI's mpirun after a network partition: its rank on this host (a child with
# OMPI_COMM_WORLD_RANK) ends, its agent to the other host (a child without) stays, and mpirun
# never ends; "rank_runs" runs a rank for 12 s, longer than ddprun's grace, and exits 0.
cat > "$work/mpirun" <<'FAKE'
#!/usr/bin/env bash
[ "$1" != --version ] || { echo "mpirun (Open MPI) 4.1.4"; exit 0; }
echo "restart=${DDP_RESTART_COUNT:-unset} $*" >> "$WORK/calls"
status=$(head -n 1 "$WORK/statuses"); sed -i 1d "$WORK/statuses"
if [ "$status" = sleep ]; then
  trap 'echo "mpirun got TERM" >> "$WORK/calls"; exit 75' TERM
  touch "$WORK/sleeping"; while :; do sleep 0.1; done
fi
if [ "$status" = linger ]; then
  OMPI_COMM_WORLD_RANK=0 sleep 3 &
  sleep 1000 &
  echo "$$ $!" >> "$WORK/lingering"
  while :; do sleep 0.1; done
fi
[ "$status" != rank_runs ] || { OMPI_COMM_WORLD_RANK=0 sleep 12; exit 0; }
exit "$status"
FAKE
cat > "$work/agent" <<'FAKE'
#!/bin/sh
while [ "${1#-}" != "$1" ]; do [ "$1" != -o ] || shift; shift; done  # ssh options
case " $ALIVE " in *" $1 "*) exit 0 ;; *) exit 255 ;; esac
FAKE
chmod +x "$work/mpirun" "$work/agent"
export WORK=$work OMPI_MCA_plm_rsh_agent=$work/agent

# run NAME "STATUSES" ALIVE ARGS...: ddprun with the fake mpirun; sets out, status, calls.
run() {
  local name=$1 statuses=$2
  export ALIVE=$3
  shift 3
  tr ' ' '\n' <<< "$statuses" > "$work/statuses"
  : > "$work/calls"
  status=0
  out=$(timeout 60 "$ddprun" --mpirun "$work/mpirun" "$@" /bin/true --resume 2>&1) || status=$?
  calls=$(cat "$work/calls")
  echo "--- $name: status $status"; echo "$out"; echo "$calls"
}
expect() { grep -qE -- "$2" <<< "$1" || fail "$3: no match for '$2'"; }
count() { [ "$(grep -c . <<< "$calls")" -eq "$1" ] || fail "$2: expected $1 mpirun call(s)"; }

# A host lost: the job starts again on the other one, with its ranks, told it is restart 1.
run lost_host "137 0" "a" -H a:2,b:2 --max-restarts 2
[ $status -eq 0 ] || fail "lost_host: status $status"
count 2 lost_host
expect "$(sed -n 1p <<< "$calls")" "^restart=0 -np 4 .*--host a:2,b:2 " "first start on both hosts"
expect "$(sed -n 2p <<< "$calls")" "^restart=1 -np 2 .*--host a:2 .*-x DDP_RESTART_COUNT .*/bin/true --resume$" "restart on a alone"
expect "$out" "^ddprun: the job failed \(status 137 after [0-9]+ s\); lost: b \(does not answer\)\. Restart 1 of 2 on a:2: 2 rank\(s\)$" "the restart line"

# Every host answers but the job keeps failing: K restarts, then it gives up with the status.
run gives_up "1 1 1 1" "a b" -H a:1,b:1 --max-restarts 2
[ $status -eq 1 ] || fail "gives_up: status $status"
count 3 gives_up
expect "$out" "every host answers\. Restart 2 of 2 on the same hosts: 2 rank\(s\)" "second restart"
expect "$out" "giving up after 2 restart\(s\) \(--max-restarts\)$" "giving up"

# A hostfile: the survivors go to mpirun as --host, each with its slots.
printf 'a slots=2\nb slots=3 # comment\n' > "$work/hostfile"
run hostfile "1 0" "b" --hostfile "$work/hostfile" --max-restarts 1
[ $status -eq 0 ] || fail "hostfile: status $status"
expect "$(sed -n 1p <<< "$calls")" "^restart=0 -np 5 .*--hostfile $work/hostfile " "first start from the hostfile"
expect "$(sed -n 2p <<< "$calls")" "^restart=1 -np 3 .*--host b:3 " "restart on b with its 3 slots"

# Too few hosts left for --min-nodes: no restart.
run min_nodes "137" "a" -H a:2,b:2 --max-restarts 3 --min-nodes 2
[ $status -eq 137 ] || fail "min_nodes: status $status"
count 1 min_nodes
expect "$out" "1 host\(s\) answer \(a:2; lost: b\): giving up, --min-nodes is 2$" "min-nodes message"

# Stopped (75), bad input (2), diverged (3): not restarted.
for s in 75 2 3; do
  run "status_$s" "$s 0" "a" -H a:1 --max-restarts 2
  [ $status -eq "$s" ] || fail "status_$s: status $status"
  count 1 "status_$s"
done
# A stop says what mpirun's "aborted" lines mean, with or without restarts.
run stopped "75" "a" -H a:1
[ $status -eq 75 ] || fail "stopped: status $status"
expect "$out" "^ddprun: the job stopped \(status 75\): its ranks saved where they were and exited 75, which mpirun reports as \"the job has been aborted\"; run the same command with --resume to continue$" "the stop line"

# The job ends when its ranks end: mpirun still waiting 10 s after its rank here ended is ended,
# with its agent, status 1, and the host it waited for is named; with --max-restarts the job
# starts again on the hosts that answer.
: > "$work/lingering"
started=$SECONDS
run linger "linger" "a" -H a:1,b:1
lasted=$((SECONDS - started))
[ $status -eq 1 ] || fail "linger: status $status, not 1 (124: ddprun waited for the lingering mpirun)"
expect "$out" "^ddprun: the job's ranks on this host have ended, but 10 s later mpirun still waits, for a host it cannot reach: ending it \(status 1\)$" "the line ending mpirun"
expect "$out" "^ddprun: the job failed \(status 1 after [0-9]+ s\); lost: b \(does not answer\)$" "the lost host named"
[ $lasted -le 17 ] || fail "linger: ddprun ended $lasted s after the start, not within 3 + 10 s of grace (+ polling)"
read -ra lingering <<< "$(tr '\n' ' ' < "$work/lingering")"
for pid in "${lingering[@]}"; do  # gone, or a zombie that init has yet to reap
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2> /dev/null | cut -d' ' -f1) || state=
  [ -z "$state" ] || [ "$state" = Z ] || fail "linger: process $pid (the fake mpirun or its agent) outlived ddprun"
done
echo "linger: ddprun ended $lasted s after the start"
run linger_restart "linger 0" "a" -H a:1,b:1 --max-restarts 1
[ $status -eq 0 ] || fail "linger_restart: status $status"
count 2 linger_restart
expect "$out" "^ddprun: the job failed \(status 1 after [0-9]+ s\); lost: b \(does not answer\)\. Restart 1 of 1 on a:1: 1 rank\(s\)$" "the restart after ending mpirun"
# A rank that runs longer than the grace is not cut.
run rank_runs "rank_runs" "a" -H a:1
[ $status -eq 0 ] || fail "rank_runs: status $status"
! grep -q "ending it" <<< "$out" || fail "rank_runs: ddprun ended an mpirun whose rank was running"

# On this machine alone: the same rank count again.
run local "1 0" "" -n 2 --oversubscribe --max-restarts 1
[ $status -eq 0 ] || fail "local: status $status"
expect "$(sed -n 2p <<< "$calls")" "^restart=1 -np 2 " "local restart"
expect "$out" "Restart 1 of 1 on this machine: 2 rank\(s\)$" "local restart line"

# SIGTERM to ddprun reaches mpirun; the job's 75 is ddprun's, and there is no restart (ddprun
# is mpirun's parent with or without --max-restarts).
export ALIVE=a
for restarts in 2 0; do
  printf 'sleep\n0\n' > "$work/statuses"
  : > "$work/calls"
  rm -f "$work/sleeping"
  "$ddprun" --mpirun "$work/mpirun" -H a:1 --max-restarts $restarts /bin/true > "$work/term.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -e "$work/sleeping" ] && break; sleep 0.1; done
  [ -e "$work/sleeping" ] || fail "term: the fake mpirun did not start"
  kill -TERM $pid
  status=0; wait $pid || status=$?
  echo "--- term, --max-restarts $restarts"; cat "$work/calls" "$work/term.out"
  [ $status -eq 75 ] || fail "term: status $status, not mpirun's 75"
  grep -q "mpirun got TERM" "$work/calls" || fail "term: mpirun did not get the SIGTERM"
  [ "$(grep -c '^restart=' "$work/calls")" -eq 1 ] || fail "term: the job was restarted"
done

# Bad values are refused before anything starts.
for bad in "--max-restarts -1" "--max-restarts x" "--min-nodes 0" "-H a:1 --min-nodes 2"; do
  status=0
  # shellcheck disable=SC2086
  out=$("$ddprun" --mpirun "$work/mpirun" $bad /bin/true 2>&1) || status=$?
  echo "--- $bad: status $status: $out"
  [ $status -eq 2 ] || fail "'$bad' gave status $status, not 2"
  expect "$out" "^ddprun: --(max-restarts|min-nodes)" "'$bad' names the flag"
done
echo "PASS: ddprun restarts"
