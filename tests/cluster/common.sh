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
