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
  *) fail "unknown scenario '$scenario'" ;;
esac
echo "PASS: netns $scenario"
