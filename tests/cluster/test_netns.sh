#!/usr/bin/env bash
# mpirun across several hosts, emulated on this machine: network namespaces h1 and h2, each with
# its own address (192.0.2.0/24, the documentation range, only inside these namespaces),
# hostname and hosts file, wired by veth pairs to a bridge in a third namespace. Logged in on
# h1, ddprun starts the job with a hostfile; Open MPI reaches h2 through netns_agent.sh, which
# plays ssh (fresh environment included).
#
#   test_netns.sh SCENARIO DDP_MNIST REPLICA_CHECK
#
#   two_hosts   2 hosts x 2 ranks: the banner and topology (2 nodes, hosts h1 and h2),
#               ddp_mnist trains and evaluates through the hierarchical all-reduce (chosen
#               automatically; its leaders on the TCP ring) and with --hierarchical off (the flat
#               ring), replica_check finds identical replicas, and the byte counters of h1's link
#               show the gradients crossed it
#   lost_host   2 hosts x 2 ranks under ddprun --max-restarts, ddp_mnist with step snapshots:
#               h2 dies mid-epoch (its processes killed, its namespace deleted); ddprun restarts
#               the job on h1 alone (2 ranks), which resumes from the newest step snapshot with
#               the same global batch; every sample of the epoch is trained once, step for step
#               as in an uninterrupted run, and the test accuracy is within 1 point of its
#               (issue 25)
#   partition   2 hosts x 1 rank under ddprun --max-restarts 1, ddp_mnist with step snapshots and
#               --timeout 10: a 5 s blip of h2's link is survived (training goes on, no
#               restart); then the link goes down for good. Rank 0's watchdog ends the ranks, and
#               the job ends when its ranks end: the first mpirun and every rank are gone within
#               --timeout + 15 s of the fault (the seconds printed), though Open MPI's mpirun
#               would wait for h2's daemon as long as TCP retries; ddprun says it ended mpirun,
#               restarts the job on h1 alone (h2 does not answer), and it resumes and finishes
#               (issue 60)
#
# Exits 77 (ctest: skipped) with the reason when not root or namespaces, veth or bridges are
# unavailable. The namespaces are deleted in a trap, also on failure, after the processes in
# them are stopped; the test runs in its own PID namespace, so nothing it started outlives it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/common.sh"

[ $# -eq 3 ] || fail "usage: test_netns.sh SCENARIO DDP_MNIST REPLICA_CHECK"
scenario=$1
ddp_mnist=$(realpath "$2")
replica_check=$(realpath "$3")

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (CI runs as root)"
require_tools "install iproute2 and util-linux: scripts/setup.sh" ip unshare mpirun
enter_private_namespaces "$@"

work=$(scratch_dir netns)
prefix=ddp-${work##*.}-  # namespace names: unique per run
. "$here/netns_hosts.sh"
cleanup() {
  local status=$?
  netns_destroy
  remove_scratch_dir "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 1' INT TERM
netns_create "$work" "$prefix" 2 h1 h2 || skip "$NETNS_ERROR"
export DDP_NETNS_PREFIX=$prefix DDP_NETNS_HOSTS=$work/hosts

# on_h1 LOG COMMAND...: runs the command logged in on h1 (through the agent, as ssh would).
on_h1() {
  local log=$1 line
  shift
  printf -v line '%q ' "$@"
  run "$log" "$here/netns_agent.sh" h1 "cd $(printf %q "$work") && $line"
}

# What the ranks need from the login shell: Open MPI's agent settings, TCP over eth0 only (the
# link between the hosts), the thread choice left to ddp.
mpi_env=(env OMPI_MCA_plm_rsh_agent="$here/netns_agent.sh" OMPI_MCA_plm_rsh_no_tree_spawn=1
         DDP_NETNS_PREFIX="$prefix" DDP_NETNS_HOSTS="$work/hosts")
ddprun=("$root/launch/ddprun" --hostfile "$work/hostfile" --iface eth0)

case "$scenario" in
  two_hosts)
    before=$(netns_bytes h1)
    on_h1 mnist.log "${mpi_env[@]}" "${ddprun[@]}" "$ddp_mnist" --no-cuda --epochs 1 \
      --limit-train-batches 3 --log-interval 0 --show-topology
    crossed=$(( $(netns_bytes h1) - before ))
    expect mnist.log "^ddp: Open MPI mpirun: 4 ranks on 2 nodes \(2 per node\), device cpu, [0-9]+ threads? per rank \([0-9]+ CPUs? shared by 2 ranks\)$" "banner"
    expect mnist.log "^rank 0/4 local 0/2 node 0/2 host h1 " "rank 0 on h1"
    expect mnist.log "^rank 1/4 local 1/2 node 0/2 host h1 " "rank 1 on h1"
    expect mnist.log "^rank 2/4 local 0/2 node 1/2 host h2 " "rank 2 on h2"
    expect mnist.log "^rank 3/4 local 1/2 node 1/2 host h2 " "rank 3 on h2"
    expect mnist.log "^Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000" "evaluation"
    # 2 hosts x 2 ranks: the all-reduces go through one leader per host (hierarchical, chosen
    # automatically), and between hosts without InfiniBand the leaders' large ones take ddp's
    # TCP ring, on the interface ddprun --iface names.
    expect mnist.log "^ddp: hierarchical all-reduce: 2 host\(s\), ranks per host 2,2: reduce on each host, all-reduce among the leaders over TCP" "hierarchical all-reduce"
    expect mnist.log "^ddp: hierarchical all-reduce: the 2 host leaders' all-reduces of 64 KiB or more go over TCP \(rank 0 at 192\.0\.2\.1:[0-9]+\)" "leaders' ring on eth0"
    # Each of the 3 steps averages the CNN's 1,199,882 float gradients: every byte of one host's
    # sum has to reach the other, so at least 3 x 4,799,528 bytes cross the link (each way).
    echo "bytes through h1's link during ddp_mnist: $crossed"
    [ "$crossed" -ge $((2 * 3 * 4799528)) ] ||
      fail "only $crossed bytes crossed h1's link: the gradients did not go between the hosts"

    # --hierarchical off: the flat ring over the 4 ranks.
    on_h1 flat.log "${mpi_env[@]}" "${ddprun[@]}" "$ddp_mnist" --no-cuda --epochs 1 \
      --limit-train-batches 3 --log-interval 0 --hierarchical off
    expect flat.log "^ddp: socket ring: all-reduces of 64 KiB or more go over TCP between the 4 ranks \(rank 0 at 192\.0\.2\.1:[0-9]+;" "socket ring on eth0"
    expect flat.log "^Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000" "evaluation (flat)"

    on_h1 check.log "${mpi_env[@]}" "${ddprun[@]}" "$replica_check"
    expect check.log "^rank 0/4 local 0/2 node 0/2 host h1 " "rank 0 on h1"
    expect check.log "^rank 3/4 local 1/2 node 1/2 host h2 " "rank 3 on h2"
    expect check.log "replicas identical: 4 ranks on 2 nodes" "replicas"
    ;;
  lost_host)
    # The test build of ddp_mnist: DDP_TEST_SAMPLE_LOG (tests/system/testing_hooks_from_env.cpp).
    ddp_mnist=$(realpath "$DDP_MNIST_SIGNAL_AT_STEP")
    # h2 dies mid-epoch: every process in it is killed and its namespace deleted, so the agent
    # (ssh) cannot reach it any more. ddprun --max-restarts finds h1 alone answering and starts
    # the job there with its 2 ranks, which resume from the newest step snapshot at 2 x 32.
    # in_h1 DIR LOG COMMAND...: the command logged in on h1, in DIR, in the background (its pid
    # in job_pid); DIR/samples gets the ranks' sample logs.
    in_h1() {
      local dir=$1 log=$2 line
      shift 2
      mkdir -p "$work/$dir/samples"
      printf -v line '%q ' "${mpi_env[@]}" DDP_TEST_SAMPLE_LOG="$work/$dir/samples" "$@"
      "$here/netns_agent.sh" h1 "cd $(printf %q "$work/$dir") && $line" > "$log" 2>&1 &
      job_pid=$!
    }
    cd "$work"
    in_h1 ref ref.log "${ddprun[@]}" "$ddp_mnist" "${elastic_run[@]}"
    wait "$job_pid" || { cat ref.log; fail "the uninterrupted run failed"; }
    in_h1 lost lost.log "${ddprun[@]}" --max-restarts 2 "$ddp_mnist" "${elastic_run[@]}"
    wait_for_snapshot lost/ckpt 12 180
    lost_at=$(date +%s.%N)
    for pid in $(ip netns pids "${prefix}h2"); do kill -KILL "$pid" 2> /dev/null || true; done
    ip netns del "${prefix}h2"
    echo "+ h2 is gone (its processes killed, its namespace deleted)"
    back_at=
    for i in $(seq 1800); do  # up to 3 minutes to train again
      if grep -q "^Resumed from " lost.log && grep -A1000 "^Resumed from " lost.log | grep -q "^Train Epoch: 1 "; then
        back_at=$(date +%s.%N); break
      fi
      kill -0 "$job_pid" 2> /dev/null || break
      sleep 0.1
    done
    status=0; wait "$job_pid" || status=$?
    cat lost.log
    [ $status -eq 0 ] || fail "ddprun --max-restarts: exit status $status"
    [ -n "$back_at" ] || fail "the job did not train again after h2 was lost"
    echo "h2 lost -> training again on h1: $(awk -v a="$lost_at" -v b="$back_at" 'BEGIN { printf "%.1f", b - a }') s"
    expect lost.log "^ddprun: the job failed \(status [0-9]+ after [0-9]+ s\); lost: h2 \(does not answer\)\. Restart 1 of 2 on h1:2: 2 rank\(s\)$" "ddprun's restart line"
    expect lost.log "^ddp: Open MPI mpirun: 2 ranks on 1 node" "the second start's banner"
    expect lost.log "^Resumed from ckpt/snapshot_epoch1_batch[0-9]+\.pt" "the resume"
    snapshot_step=$(sed -n 's/^Resumed from .*, step \([0-9]*\)$/\1/p' lost.log | tail -n 1)
    check_samples_once lost/samples ref/samples "$snapshot_step" 4 || fail "the samples trained"
    check_accuracy lost.log ref.log
    ;;
  partition)
    timeout=10
    cd "$work"
    mkdir part
    printf -v line '%q ' "${mpi_env[@]}" "$root/launch/ddprun" -H h1,h2 --iface eth0 \
      --max-restarts 1 "$ddp_mnist" "${elastic_run[@]}" --timeout $timeout
    "$here/netns_agent.sh" h1 "cd $(printf %q "$work/part") && $line" > part.log 2>&1 &
    job_pid=$!
    # procs HOST NAME: the pids of the processes named NAME (comm) on HOST.
    procs() {
      local pid
      for pid in $(ip netns pids "$prefix$1"); do
        [ "$(cat "/proc/$pid/comm" 2> /dev/null)" != "$2" ] || echo "$pid"
      done
    }
    # running PID...: whether any of them still runs (a zombie has ended).
    running() {
      local pid state
      for pid in "$@"; do
        state=$(sed 's/.*) //' "/proc/$pid/stat" 2> /dev/null | cut -d' ' -f1) || state=
        [ -z "$state" ] || [ "$state" = Z ] || return 0
      done
      return 1
    }
    link() { ip -n "${prefix}h2" link set eth0 "$1"; echo "+ h2's link $1 ($(date +%T.%N | cut -c1-12))"; }
    (wait_for_snapshot part/ckpt 4 180) || { cat part.log; fail "the job did not train"; }
    link down
    sleep 5
    link up
    (wait_for_snapshot part/ckpt 12 120) || { cat part.log; fail "the job did not train after the blip"; }
    grep -q "^ddprun:" part.log && { cat part.log; fail "the 5 s blip ended the job"; }
    echo "the 5 s blip of h2's link: survived, training went on to a snapshot after 12 batches"
    read -ra first_mpirun <<< "$(procs h1 mpirun)"
    read -ra ranks_h1 <<< "$(procs h1 ddp_mnist)"
    read -ra ranks_h2 <<< "$(procs h2 ddp_mnist)"
    if [ ${#first_mpirun[@]} -ne 1 ] || [ ${#ranks_h1[@]} -ne 1 ] || [ ${#ranks_h2[@]} -ne 1 ]; then
      cat part.log
      fail "not one mpirun and one rank on h1 and one rank on h2 before the partition: mpirun ${first_mpirun[*]}, ranks ${ranks_h1[*]} and ${ranks_h2[*]}"
    fi
    down_at=$(date +%s.%N)
    link down
    since() { awk -v a="$down_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
    gone_h1='' gone_h2='' gone_mpirun=''
    for _ in $(seq 600); do  # up to 60 s
      [ -n "$gone_h2" ] || running "${ranks_h2[@]}" || gone_h2=$(since)
      [ -n "$gone_h1" ] || running "${ranks_h1[@]}" || gone_h1=$(since)
      [ -n "$gone_mpirun" ] || running "${first_mpirun[@]}" || gone_mpirun=$(since)
      [ -z "$gone_h1" ] || [ -z "$gone_h2" ] || [ -z "$gone_mpirun" ] || break
      sleep 0.1
    done
    echo "h2's link down for good: rank 1 (h2) gone after ${gone_h2:-more than 60} s, rank 0 (h1) after ${gone_h1:-more than 60} s, the first mpirun after ${gone_mpirun:-more than 60} s (bound: --timeout $timeout + 15 s)"
    echo "h2's orted: $(procs h2 orted | wc -w) left (it waits for the link)"
    bound=$((timeout + 15))
    for t in "$gone_h2" "$gone_h1" "$gone_mpirun"; do
      if [ -z "$t" ] || ! awk -v t="$t" -v b="$bound" 'BEGIN { exit !(t <= b) }'; then
        cat part.log
        fail "a process of the first job outlived the bound of $bound s after the partition"
      fi
    done
    status=0; wait "$job_pid" || status=$?
    cat part.log
    [ $status -eq 0 ] || fail "ddprun --max-restarts 1: exit status $status"
    expect part.log "^ddp: rank 0 \(h1\): MPI watchdog on rank 0: .* unfinished $timeout s after rank 0 entered it" "rank 0's watchdog"
    expect part.log "^ddprun: the job's ranks on this host have ended, but 10 s later mpirun still waits, for a host it cannot reach: ending it \(status 1\)$" "ddprun ending mpirun"
    expect part.log "^ddprun: the job failed \(status 1 after [0-9]+ s\); lost: h2 \(does not answer\)\. Restart 1 of 1 on h1:1: 1 rank\(s\)$" "ddprun's restart line"
    expect part.log "^Resumed from ckpt/snapshot_epoch1_batch[0-9]+\.pt" "the resume"
    expect part.log "^Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000" "the evaluation"
    ;;
  *) fail "unknown scenario '$scenario'" ;;
esac
echo "PASS: netns $scenario"
