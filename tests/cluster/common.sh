# Sourced by the cluster tests (test_slurm.sh, test_netns.sh): skipping, a private namespace to
# run in, a scratch directory, and output checks.

# ctest reports exit code 77 as "skipped" (SKIP_RETURN_CODE in CMakeLists.txt).
skip() {
  echo "SKIPPED: $*"
  exit 77
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Re-runs the calling script inside new PID and mount namespaces, once the caller has checked
# that it may (root, tools present). Everything the test starts then lives in that PID
# namespace: when the script ends, or is killed (--kill-child), the kernel ends it all, even
# what a trap missed. Mounts (network namespace handles, bind mounts) stay private to it too.
enter_private_namespaces() {
  [ -z "${DDP_TEST_IN_NAMESPACE:-}" ] || return 0
  unshare --pid --fork --mount-proc true 2> /dev/null ||
    skip "cannot create PID and mount namespaces here (needs CAP_SYS_ADMIN)"
  DDP_TEST_IN_NAMESPACE=1 exec unshare --pid --fork --kill-child --mount-proc \
    --propagation private "$0" "$@"
}

# scratch_dir NAME: a new directory under $TMPDIR (or /tmp), on a tmpfs private to this test's
# mount namespace: should the test be killed before its trap removes it, its contents vanish
# with the namespace. Open to all (munged insists on that for its socket's directory).
scratch_dir() {
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/ddp-$1.XXXXXX")
  mount -t tmpfs -o mode=755 "ddp-$1" "$dir"
  echo "$dir"
}

# remove_scratch_dir DIR
remove_scratch_dir() {
  cd /  # not inside the mount
  umount "$1" 2> /dev/null || true
  rm -rf "$1"
}

# require_tools REASON TOOL...: skip unless every tool is on PATH.
require_tools() {
  local reason=$1 tool
  shift
  for tool in "$@"; do
    command -v "$tool" > /dev/null || skip "$tool not found: $reason"
  done
}

# expect FILE REGEX WHAT: fail unless a line of FILE matches the extended regex.
expect() {
  grep -Eq -- "$2" "$1" || fail "$3: no line of $1 matches: $2"
}

# run LOG COMMAND...: runs the command, shows its output and keeps it in LOG; fails the test
# when the command fails.
run() {
  local log=$1 status=0
  shift
  echo "+ $*"
  "$@" > "$log" 2>&1 || status=$?
  cat "$log"
  [ $status -eq 0 ] || fail "exit status $status from: $*"
}

# run_failing LOG COMMAND...: the command must fail; its output is kept in LOG.
run_failing() {
  local log=$1 status=0
  shift
  echo "+ $* (must fail)"
  "$@" > "$log" 2>&1 || status=$?
  cat "$log"
  [ $status -ne 0 ] || fail "succeeded, but it must fail: $*"
}

# --- Losing a host mid-epoch (test_slurm.sh node_loss, test_netns.sh lost_host) ---
# The training both run: ddp_mnist, 4 ranks, one epoch cut to 40 steps of 4 x 16 samples, a
# step snapshot every 4 steps, resuming with the same global batch at whatever size it restarts.
# Without dropout: its masks come from each rank's generator, which cannot carry over to another
# world size, and would make the accuracy a matter of chance. DDP_TEST_SAMPLE_LOG makes every
# rank log the sample indices it trains on.
elastic_run=(--no-cuda --epochs 1 --batch-size 16 --limit-train-batches 40 --log-interval 1
             --progress log --checkpoint-dir ckpt --checkpoint-every-steps 4 --resume
             --keep-global-batch --no-dropout)

# wait_for_snapshot DIR BATCHES SECONDS: until DIR holds a step snapshot after >= BATCHES batches.
wait_for_snapshot() {
  local dir=$1 want=$2 i f b
  for i in $(seq $(($3 * 10))); do
    for f in "$dir"/snapshot_epoch1_batch*.pt; do
      [ -e "$f" ] || continue
      b=${f##*_batch}; b=${b%.pt}
      [ "$b" -lt "$want" ] || return 0
    done
    sleep 0.1
  done
  fail "no step snapshot after $want batches in $dir within $3 s"
}

# accuracy_of LOG: the test accuracy in percent that ddp_mnist printed last (from its counts).
accuracy_of() {
  sed -n 's/^Test set: .*Accuracy: \([0-9]*\)\/\([0-9]*\) .*/\1 \2/p' "$1" | tail -n 1 |
    awk '{ printf "%.2f", 100 * $1 / $2 }'
}

# check_accuracy LOG REFERENCE_LOG: within 1 point of the uninterrupted run's.
check_accuracy() {
  local got want
  got=$(accuracy_of "$1"); want=$(accuracy_of "$2")
  [ -n "$got" ] && [ -n "$want" ] || fail "no test accuracy in $1 or $2"
  echo "test accuracy: $got% after losing a host, $want% uninterrupted"
  awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d <= 1 && d >= -1) }' ||
    fail "accuracy $got% is not within 1 point of the uninterrupted $want%"
}

# check_samples_once LOST_DIR REFERENCE_DIR SNAPSHOT_STEP FIRST_RANKS: the sample logs
# (DDP_TEST_SAMPLE_LOG: "<epoch> <step> <index>" per line in rank<R>of<N>.txt) of a job that
# lost a host and restarted on fewer ranks, against those of the uninterrupted run. The model's
# history is the first run (its FIRST_RANKS ranks' files) up to the snapshot's step and the whole
# restart (the other files): step for step it must train exactly the samples the uninterrupted
# run trained, each once, so the epoch's samples once. The first run's steps after the snapshot
# were lost (trained again by the restart).
check_samples_once() {
  python3 - "$@" <<'PY'
import collections, glob, os, re, sys
lost_dir, ref_dir, snapshot_step, first_ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def lines(path):
    return [tuple(map(int, l.split())) for l in open(path) if l.strip()]
ref = collections.defaultdict(list)
for path in glob.glob(os.path.join(ref_dir, "rank*.txt")):
    for epoch, step, index in lines(path):
        ref[step].append(index)
history = collections.defaultdict(list)
lost_steps = set()
for path in glob.glob(os.path.join(lost_dir, "rank*.txt")):
    first = re.search(r"of(\d+)\.txt$", path).group(1) == first_ranks
    for epoch, step, index in lines(path):
        if not first or step <= snapshot_step: history[step].append(index)
        else: lost_steps.add(step)
bad = [s for s in sorted(ref) if sorted(history.get(s, [])) != sorted(ref[s])]
extra = sorted(set(history) - set(ref))
every = [i for s in history for i in history[s]]
if bad or extra or len(every) != len(set(every)):
    sys.exit(f"FAIL: samples: steps {bad[:5]} differ from the uninterrupted run, extra steps "
             f"{extra[:5]}, {len(every) - len(set(every))} samples trained twice")
print(f"samples: {len(every)} samples in {len(history)} steps, each once, step for step those of "
      f"the uninterrupted run; lost and trained again: the first run's steps "
      f"{sorted(lost_steps) or 'none'}")
PY
}
