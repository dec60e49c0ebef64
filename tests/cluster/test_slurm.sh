#!/usr/bin/env bash
# Launch tests on a real Slurm cluster started on this machine by slurm_cluster.sh (Debian's
# slurm-wlm and munge; nodes with 4 CPUs and 4 fake GPUs each; Open MPI over PMIx).
#
#   test_slurm.sh SCENARIO DDP_MNIST REPLICA_CHECK
#
#   srun                    srun -N 2 --ntasks-per-node 2: ddp_mnist trains and evaluates;
#                           replica_check: 4 ranks on 2 nodes, Slurm's node and local ranks,
#                           identical replicas
#   sbatch                  on 4 nodes, with the CPU override --cpus-per-task=1: sbatch --wait
#                           of the 2-node script running ddp_mnist, and every slurm/*.sbatch
#                           script running replica_check; logs named by job id, the summary at
#                           the end
#   mpirun_in_allocation    salloc -N 2 --ntasks-per-node 2 mpirun: Open MPI's mpirun takes the
#                           allocation from Slurm; the banner names both, 4 ranks on 2 nodes
#   srun_without_pmix       srun --mpi=none: ddp's explanation, not Open MPI's
#   gpus_per_node_mismatch  srun -N 2 --gpus-per-node 2 without --ntasks-per-node (one task per
#                           node): one rank per node, rank 0's notice per node (2 GPUs, each
#                           rank uses one, start one task per GPU), and training still runs on
#                           the CPU
#   preempt                 sbatch of the 2-node script (ddp_mnist with --checkpoint-dir and
#                           --resume), then scancel --signal=USR1 (what --signal=USR1@120 does at
#                           the time limit) once training runs: the ranks stop with a snapshot,
#                           the job exits 75, requeues itself and its second run resumes from
#                           the snapshot and finishes
#   preempt_term            the same, with SIGTERM to the batch shell first (scancel --batch
#                           --signal=TERM, as the time limit signals it): the script's trap keeps
#                           the shell alive until srun returns 75, so it still requeues the job
#                           (issue 26: without the trap the shell died of it and the job was not
#                           requeued). Not SIGTERM to the ranks: with scancel --signal=TERM
#                           --full the step's tasks died of SIGKILL 0.2 s after the signal
#                           ("task 0: Killed", status 137; docs/reliability.md)
#   preempt_resize          preempt, and the requeued job is given 1 node instead of 2
#                           (scontrol update NumNodes=1-1, as sbatch -N 1-2 may get): its one rank
#                           resumes the 2 ranks' step snapshot (issue 25)
#   node_loss               the 2-node script, ddp_mnist with step snapshots: node n2 dies
#                           mid-epoch (its ranks, slurmstepd and slurmd killed; the step is
#                           cancelled at once, as when the survivors abort); Slurm marks n2
#                           down, the job lives on (--no-kill) and the script restarts on n1 (2
#                           ranks), which resume from the newest step snapshot with the same
#                           global batch; every sample of the epoch is trained once, and the test
#                           accuracy is within 1 point of an uninterrupted run's (issue 25)
#   dead_rank               a rank that dies ends the job, under the 2-node script (srun
#                           --wait=30): (1) task 2 crashes (SIGSEGV) before MPI_Init, where the
#                           others would wait in PMIx's start-up exchange for minutes; (2) rank 1
#                           of ddp_mnist killed (SIGKILL) after step 3. Each: srun names the task,
#                           the job ends non-zero within 90 s
#
# Exits 77 (ctest: skipped) with the reason when not root or Slurm, munge or unshare is missing.
# The cluster is stopped by its pid files in a trap, also on failure; and the whole test runs in
# its own PID namespace, so nothing it started outlives it even if it is killed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/common.sh"

[ $# -eq 3 ] || fail "usage: test_slurm.sh SCENARIO DDP_MNIST REPLICA_CHECK"
scenario=$1
ddp_mnist=$(realpath "$2")
replica_check=$(realpath "$3")

[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmctld, slurmd and munged (CI runs as root)"
require_tools "install slurm-wlm and munge: scripts/setup.sh" \
  munged mungekey slurmctld slurmd srun sbatch salloc sinfo scancel unshare ss
enter_private_namespaces "$@"

work=$(scratch_dir slurm)
cleanup() {
  local status=$?
  "$here/slurm_cluster.sh" stop "$work/cluster" || true
  if [ $status -ne 0 ] && [ $status -ne 77 ]; then
    for log in "$work"/cluster/slurmctld.log "$work"/cluster/n*/slurmd.log; do
      [ -f "$log" ] && { echo "--- last lines of $log"; tail -n 15 "$log"; }
    done
  fi
  remove_scratch_dir "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 1' INT TERM

nodes=2
[ "$scenario" != sbatch ] || nodes=4  # the 4-node script needs four
# A lost node is noticed within seconds, not Slurm's default 5 minutes.
[ "$scenario" != node_loss ] || export DDP_TEST_SLURMD_TIMEOUT=6
"$here/slurm_cluster.sh" start "$work/cluster" "$nodes"
export SLURM_CONF=$work/cluster/slurm.conf
cd "$work"
# The ranks choose their own thread counts; a developer's setting must not decide the test.
unset OMP_NUM_THREADS
short_run=(--no-cuda --epochs 1 --limit-train-batches 3 --log-interval 0)

# expect_topology LOG: replica_check's lines for 4 ranks, 2 per node: ranks 0 and 1 share a
# Slurm node, ranks 2 and 3 share another, local ranks 0, 1, 0, 1 (replica_check itself checked
# every rank against SLURM_NODEID and SLURM_LOCALID).
expect_topology() {
  local r node=()
  for r in 0 1 2 3; do
    expect "$1" "^rank $r/4 local $((r % 2))/2 node $((r / 2))/2 .* slurm-node n[0-9]$" "rank $r"
    node[r]=$(sed -n "s|^rank $r/4 .* slurm-node \(n[0-9]\)$|\1|p" "$1")
  done
  [ "${node[0]}" = "${node[1]}" ] && [ "${node[2]}" = "${node[3]}" ] &&
    [ "${node[0]}" != "${node[2]}" ] || fail "ranks on Slurm nodes ${node[*]}: want 2 per node"
}

case "$scenario" in
  srun)
    run mnist.log srun -N 2 --ntasks-per-node 2 "$ddp_mnist" "${short_run[@]}" --show-topology
    expect mnist.log "^ddp: Slurm srun \(PMIx\), job [0-9]+: 4 ranks on 2 nodes \(2 per node\), device cpu, [0-9]+ threads? per rank \([0-9]+ CPUs? shared by 2 ranks\)$" "banner"
    for r in 0 1 2 3; do
      expect mnist.log "^rank $r/4 local $((r % 2))/2 node $((r / 2))/2 " "ddp_mnist topology of rank $r"
    done
    expect mnist.log "^Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000" "evaluation"
    run check.log srun -N 2 --ntasks-per-node 2 "$replica_check"
    expect_topology check.log
    expect check.log "replicas identical: 4 ranks on 2 nodes" "replicas"
    ;;

  sbatch)
    # log_of SCRIPT ID: the log the script names after the job (--output=%x-%j.out).
    log_of() {
      local name=ddp-${1#ddp_}
      echo "${name%.sbatch}-$2.out"
    }
    # check_job SCRIPT ID: the job's log exists under its id and ends in a successful summary.
    check_job() {
      local out
      out=$(log_of "$1" "$2")
      [ -f "$out" ] || fail "$1: no log $out named by the job id $2"
      echo "--- $out"
      cat "$out"
      expect "$out" "^== job $2 \(ddp-.*\): .* exit status 0$" "$1: summary line"
    }
    # Every script runs replica_check, then the multi-node script trains ddp_mnist under
    # sbatch --wait. One job after another (--dependency=afterany): Open MPI 4.1.4 jobs
    # starting together on these emulated nodes (all on 127.0.0.1) now and then lose a rank to
    # SIGSEGV in MPI_Init (btl/tcp, a fragment for a handler not yet registered); a plain C MPI
    # program does the same (docs/launching.md, "The test cluster"). --cpus-per-task=1
    # overrides the scripts' 4 CPUs per rank (these nodes have 4 CPUs).
    declare -A ids
    after=()
    for script in ddp_1N1G.sbatch ddp_1N4G.sbatch ddp_2N4G.sbatch ddp_4N4G.sbatch; do
      ids[$script]=$(sbatch --parsable --cpus-per-task=1 "${after[@]}" "$root/slurm/$script" "$replica_check")
      after=(--dependency=afterany:${ids[$script]})
    done
    echo "+ sbatch --wait --cpus-per-task=1 ${after[*]} slurm/ddp_2N4G.sbatch ddp_mnist ..."
    status=0
    sbatch --wait --cpus-per-task=1 "${after[@]}" "$root/slurm/ddp_2N4G.sbatch" "$ddp_mnist" "${short_run[@]}" \
      --show-topology --metrics-file metrics.jsonl > submit.log 2>&1 || status=$?
    cat submit.log
    id=$(sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p' submit.log)
    check_job ddp_2N4G.sbatch "$id"
    [ $status -eq 0 ] || fail "sbatch --wait: exit status $status"
    mnist=$(log_of ddp_2N4G.sbatch "$id")
    expect "$mnist" "^ddp: Slurm srun \(PMIx\), job $id: 4 ranks on 2 nodes \(2 per node\), device cpu, 1 thread per rank \(OMP_NUM_THREADS=1\)$" "2N4G banner"
    for r in 0 1 2 3; do
      expect "$mnist" "^rank $r/4 local $((r % 2))/2 node $((r / 2))/2 " "2N4G topology of rank $r"
    done
    expect "$mnist" "^Test set: Average loss: [0-9.]+, Accuracy: [0-9]+/10000" "2N4G evaluation"
    expect "$mnist" "^== last epoch \(metrics.jsonl\): \{\"epoch\": ?1," "2N4G metrics in the summary"

    for i in $(seq 480); do  # the replica_check jobs: wait up to 4 minutes (13 ranks on 2 cores)
      [ -n "$(squeue -h -o %i -t PENDING,RUNNING,COMPLETING -j "$(IFS=,; echo "${ids[*]}")" 2> /dev/null)" ] || break
      sleep 0.5
    done
    for script in "${!ids[@]}"; do check_job "$script" "${ids[$script]}"; done
    out=$(log_of ddp_2N4G.sbatch "${ids[ddp_2N4G.sbatch]}")
    expect_topology "$out"
    expect "$out" "replicas identical: 4 ranks on 2 nodes" "2N4G replicas"
    out=$(log_of ddp_4N4G.sbatch "${ids[ddp_4N4G.sbatch]}")
    for r in 0 1 2 3; do
      expect "$out" "^rank $r/4 local 0/1 node $r/4 .* slurm-node n$((r + 1))$" "4N4G rank $r"
    done
    expect "$out" "replicas identical: 4 ranks on 4 nodes" "4N4G replicas"
    out=$(log_of ddp_1N4G.sbatch "${ids[ddp_1N4G.sbatch]}")
    for r in 0 1 2 3; do
      expect "$out" "^rank $r/4 local $r/4 node 0/1 " "1N4G rank $r"
    done
    expect "$out" "replicas identical: 4 ranks on 1 node" "1N4G replicas"
    out=$(log_of ddp_1N1G.sbatch "${ids[ddp_1N1G.sbatch]}")
    expect "$out" "replicas identical: 1 rank on 1 node" "1N1G"
    ;;

  mpirun_in_allocation)
    run mpirun.log salloc -N 2 --ntasks-per-node 2 env OMPI_ALLOW_RUN_AS_ROOT=1 \
      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun "$replica_check"
    expect mpirun.log "^ddp: Open MPI mpirun, in Slurm job [0-9]+: 4 ranks on 2 nodes \(2 per node\)" "banner"
    expect_topology mpirun.log
    expect mpirun.log "replicas identical: 4 ranks on 2 nodes" "replicas"
    ;;

  srun_without_pmix)
    run_failing nopmix.log srun -N 2 --ntasks-per-node 2 --mpi=none "$ddp_mnist" "${short_run[@]}"
    expect nopmix.log "^ddp: rank 0 \(n1\): srun started this step \(4 tasks\) without PMIx .* Start the step with \`srun --mpi=pmix" "the explanation"
    if grep -q "The application appears to have been direct launched" nopmix.log; then
      fail "Open MPI's misleading message appeared: ddp must stop before MPI_Init"
    fi
    ;;

  gpus_per_node_mismatch)
    run mismatch.log srun -N 2 --gpus-per-node 2 "$replica_check"
    expect mismatch.log "^ddp: Slurm srun \(PMIx\), job [0-9]+: 2 ranks on 2 nodes \(1 per node\)" "banner"
    expect mismatch.log "^ddp: warning: node n1 has 2 GPUs but 1 rank, and ddp runs one rank per GPU: each rank uses one GPU, so 1 GPU sits idle\. To use all 2, start one task per GPU: \`srun --ntasks-per-node=2\`.*\`mpirun -np .*the ranks train on the CPU" "notice for n1"
    expect mismatch.log "^ddp: warning: node n2 has 2 GPUs but 1 rank" "notice for n2"
    expect mismatch.log "replicas identical: 2 ranks on 2 nodes" "training still runs"
    [ "$(grep -c "^ddp: warning:" mismatch.log)" -eq 2 ] || fail "one notice per node, printed once (by rank 0)"
    ;;

  dead_rank)
    # job_must_fail LOG WHAT PROGRAM [ARGS...]: the 2-node script runs PROGRAM; the job must end
    # with a non-zero status within 90 s, srun naming WHAT ("task 2: Segmentation fault").
    job_must_fail() {
      local out=$1 what=$2 start=$SECONDS status=0
      shift 2
      sbatch --wait --cpus-per-task=1 --output="$out" "$root/slurm/ddp_2N4G.sbatch" "$@" \
        > submit.log 2>&1 || status=$?
      local elapsed=$((SECONDS - start))
      cat submit.log "$out"
      [ $status -ne 0 ] || fail "sbatch --wait: the job succeeded, but it must fail ($what)"
      expect "$out" "$what" "srun names the task"
      expect "$out" "^== job [0-9]+ \(ddp-2N4G\): .* exit status [1-9][0-9]*$" "the summary's non-zero status"
      [ $elapsed -lt 90 ] || fail "the job took $elapsed s to end ($what; want < 90 s)"
      echo "$what: the job ended $elapsed s after it was submitted"
    }
    # (1) A crash before MPI_Init (where an Open MPI or PMIx fault would strike): the script's
    # srun --wait=30 ends the others, which wait in PMIx's start-up exchange.
    cat > crash_task2.sh <<SCRIPT
#!/bin/bash
[ "\$SLURM_PROCID" != 2 ] || kill -SEGV \$\$
exec "$replica_check"
SCRIPT
    chmod +x crash_task2.sh
    job_must_fail early.out "task 2: Segmentation fault" ./crash_task2.sh
    # (2) A rank killed while training: PMIx sees it and Slurm cancels the step. The ddp_mnist
    # that kills rank 1 after step 3 is its test build (tests/system/signal_at_step.cpp).
    job_must_fail killed.out "task 1: Killed" "$(realpath "$DDP_MNIST_SIGNAL_AT_STEP")" \
      --signal-at-step=3:1:KILL --no-cuda --epochs 1 --limit-train-batches 50 --log-interval 0
    expect killed.out "^signal_at_step: rank 1 raises signal 9 after step 3$" "the kill"
    ;;
  preempt|preempt_term|preempt_resize)
    log=ddp-2N4G-$scenario.out
    shell_signal=()
    [ "$scenario" != preempt_term ] || shell_signal=(--batch --signal=TERM)
    id=$(sbatch --parsable --cpus-per-task=1 --ntasks-per-node=1 --gpus-per-node=1 \
      --output="$log" "$root/slurm/ddp_2N4G.sbatch" "$ddp_mnist" --no-cuda --epochs 1 \
      --limit-train-batches 60 --log-interval 1 --progress log --checkpoint-dir ckpt --resume)
    echo "+ sbatch slurm/ddp_2N4G.sbatch ... (job $id); ${shell_signal[*]:+scancel ${shell_signal[*]}, then }scancel --signal=USR1 once it trains"
    for i in $(seq 600); do  # up to 60 s to start and load the data
      grep -q "^Train Epoch: 1 " "$log" 2> /dev/null && break
      sleep 0.1
    done
    grep -q "^Train Epoch: 1 " "$log" || { cat "$log" 2> /dev/null; fail "job $id did not start training"; }
    if [ ${#shell_signal[@]} -gt 0 ]; then
      scancel "${shell_signal[@]}" "$id"
      sleep 1  # the shell has it (its trap waits for srun) before the ranks stop
    fi
    # 60 batches (about 4 s here) leave the signal time to land inside the epoch: one in its last
    # step stops the ranks only at the next epoch, and this run has one.
    scancel --signal=USR1 "$id"
    # Slurm holds a requeued job back for a while (PENDING, reason BeginTime: over 2 minutes
    # here); while it waits so, let it start now. Asked too early, while the first run's batch
    # step is still being cleaned up, the launch is refused and the hold starts again: so ask
    # every 3 s. Wait up to 3 minutes for the second run to end.
    for i in $(seq 1800); do
      if [ $((i % 30)) -eq 0 ] && squeue -h -j "$id" -o "%T %r" 2> /dev/null | grep -q "PENDING BeginTime"; then
        if [ "$scenario" = preempt_resize ] && [ -z "${resized:-}" ]; then
          echo "+ scontrol update JobId=$id NumNodes=1-1 NumTasks=1 NumCPUs=1 (the requeued job gets 1 node, not 2)"
          scontrol update JobId="$id" NumNodes=1-1 NumTasks=1 NumCPUs=1 && resized=1
        fi
        echo "+ scontrol update JobId=$id StartTime=now (requeued, held back by BeginTime)"
        scontrol update JobId="$id" StartTime=now || true
      fi
      grep -q "^== job $id (ddp-2N4G): .* exit status 0$" "$log" && break
      sleep 0.1
    done
    cat "$log"
    expect "$log" "^Stopped by SIGUSR1 \(rank [01]\) before batch [0-9]+ of epoch 1 \(step [0-9]+\): wrote ckpt/snapshot_epoch1_batch[0-9]+.pt" "the stop with a snapshot"
    expect "$log" "^== job $id \(ddp-2N4G\): 2 ranks on 2 node\(s\) .* exit status 75$" "the first run's exit status"
    expect "$log" "^== job $id stopped with a snapshot: requeueing it to resume$" "the requeue"
    [ "$scenario" != preempt_term ] ||
      expect "$log" "^== job $id: the batch shell got SIGTERM; the ranks stop and save$" "the shell's trap"
    expect "$log" "^Resumed from ckpt/snapshot_epoch1_batch[0-9]+.pt: epoch 0 done, [0-9]+ batches of epoch 1" "the resume"
    if [ "$scenario" = preempt_resize ]; then
      expect "$log" "^== job $id \(ddp-2N4G\): 1 ranks on 1 node\(s\) .* exit status 0$" "the second run, on 1 node"
    else
      expect "$log" "^== job $id \(ddp-2N4G\): 2 ranks on 2 node\(s\) .* exit status 0$" "the second run's exit status"
    fi
    [ -f ckpt/snapshot_epoch1.pt ] || fail "the resumed run did not finish the epoch"
    ;;

  node_loss)
    # The test build of ddp_mnist: DDP_TEST_SAMPLE_LOG (tests/system/testing_hooks_from_env.cpp).
    ddp_mnist=$(realpath "$DDP_MNIST_SIGNAL_AT_STEP")
    # 2 nodes x 2 ranks under the 2-node script; node n2 dies mid-epoch: its ranks, their
    # slurmstepd and its slurmd are killed. Slurm marks n2 down (SlurmdTimeout 6 s here) and
    # ends the step, the job lives on (--no-kill), and the script starts the program again on
    # n1 with its 2 ranks, which resume from the newest step snapshot at 2 x 32.
    mkdir -p ref/samples samples
    DDP_TEST_SAMPLE_LOG="$work/ref/samples" sbatch --wait --cpus-per-task=1 --chdir=ref \
      --output="$work/ref.out" "$root/slurm/ddp_2N4G.sbatch" "$ddp_mnist" "${elastic_run[@]}" > /dev/null
    cat ref.out
    expect ref.out "^== job [0-9]+ \(ddp-2N4G\): 4 ranks on 2 node\(s\) .* exit status 0$" "the uninterrupted run"
    id=$(DDP_TEST_SAMPLE_LOG="$work/samples" sbatch --parsable --cpus-per-task=1 \
      --output=lost.out "$root/slurm/ddp_2N4G.sbatch" "$ddp_mnist" "${elastic_run[@]}")
    wait_for_snapshot ckpt 12 180
    # n2's processes: the ranks Slurm started there (SLURMD_NODENAME in their environment),
    # their slurmstepd, and n2's slurmd.
    victims=$(cat cluster/n2/slurmd.pid)
    for pid in $(pgrep -f "$ddp_mnist"); do
      if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx SLURMD_NODENAME=n2; then
        victims+=" $pid $(ps -o ppid= -p "$pid")"
      fi
    done
    # The step ends at once too, before Slurm marks n2 down: as when n1's ranks notice the lost
    # peer first (the socket ring does: "connection closed by rank 1") and MPI_Abort, which
    # makes srun cancel the step. Slurm then still counts the step on n1's CPUs until n2 is
    # cleared, and the restart must start beside it (the script's srun --overlap).
    lost_at=$(date +%s.%N)
    kill -KILL $victims
    scancel "$id.0"
    echo "+ n2 is gone: kill -KILL $victims (ranks, slurmstepd, slurmd); scancel $id.0"
    back_at=
    for i in $(seq 1800); do  # up to 3 minutes to train again
      if grep -A1000 "^Resumed from " lost.out 2> /dev/null | grep -q "^Train Epoch: 1 "; then
        back_at=$(date +%s.%N); break
      fi
      sleep 0.1
    done
    for i in $(seq 1800); do
      grep -q "^== job $id (ddp-2N4G): " lost.out && break
      sleep 0.1
    done
    cat lost.out
    [ -n "$back_at" ] || fail "the job did not train again after n2 was lost"
    echo "n2 lost -> training again on n1: $(awk -v a="$lost_at" -v b="$back_at" 'BEGIN { printf "%.1f", b - a }') s"
    expect lost.out "^srun: error: Node failure on n2$" "Slurm's node failure"
    expect lost.out "^== job $id: the step failed \(exit status [0-9]+\); lost: n2\. Restart 1 of 2 on n1: 2 ranks$" "the script's restart line"
    expect lost.out "^Resumed from ckpt/snapshot_epoch1_batch[0-9]+\.pt" "the resume"
    expect lost.out "^== job $id \(ddp-2N4G\): 2 ranks on 1 node\(s\) \(n1\), [0-9]+ s, exit status 0$" "the job's end"
    snapshot_step=$(sed -n 's/^Resumed from .*, step \([0-9]*\)$/\1/p' lost.out | tail -n 1)
    check_samples_once samples ref/samples "$snapshot_step" 4 || fail "the samples trained"
    check_accuracy lost.out ref.out
    ;;
  *) fail "unknown scenario '$scenario'" ;;
esac
echo "PASS: slurm $scenario"
