#!/usr/bin/env bash
# Runs the commands of docs/tutorial.md as a reader would paste them, and checks their output.
#
#   tutorial_check.sh BUILD_DIR [TUTORIAL.md]
#
# Every fenced block opened with ```sh is run, in order, in one bash shell (set -euo pipefail),
# so what a block exports, sources or defines is there for the next, as in a terminal. The
# shell starts in a scratch copy of the repository root: a directory of symbolic links to the
# source tree's entries, with build -> BUILD_DIR, so `build/examples/ddp_mnist` and
# `launch/ddprun` work as written and whatever the commands write (tutorial-out/) stays out of
# the source tree. Other fences (```text: output) are not run.
#
# HTML comments right before a ```sh block steer the check (docs/tutorial.md's first comment
# lists them too):
#   <!-- check: expect REGEX -->      a line of the block's output must match REGEX (grep -E)
#   <!-- check: needs root [CMD...] --> run only as root, in private PID and mount namespaces,
#                                     with every CMD on PATH; else skipped, with the reason
#   <!-- check: skip REASON -->       never run (needs real machines, or takes hours)
#
# As root the whole check runs in private PID and mount namespaces (unshare), with the scratch
# directory and /run/netns on private tmpfs: whatever the commands start (Slurm daemons,
# network namespaces, MPI ranks) ends with the check, even when ctest kills it. Fails on the
# first command that fails, naming the block and its line in the tutorial.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

fail() { echo "tutorial_check: FAIL: $*" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 2 ] || fail "usage: tutorial_check.sh BUILD_DIR [TUTORIAL.md]"
build=$(cd "$1" 2> /dev/null && pwd) || fail "no build directory $1"
tutorial=$(realpath "${2:-$root/docs/tutorial.md}")
[ -f "$tutorial" ] || fail "no tutorial $tutorial"
doc=${tutorial#"$root"/}  # for messages: docs/tutorial.md
[ -x "$build/examples/ddp_mnist" ] || fail "$build/examples/ddp_mnist not built"

# As root: start over inside new PID and mount namespaces (see above). Without them, the
# blocks that need root are skipped.
namespaces=0
if [ "$(id -u)" -eq 0 ]; then
  if [ -n "${DDP_TUTORIAL_IN_NAMESPACE:-}" ]; then
    namespaces=1
  elif unshare --pid --fork --mount-proc true 2> /dev/null; then
    DDP_TUTORIAL_IN_NAMESPACE=1 exec unshare --pid --fork --kill-child --mount-proc \
      --propagation private "$0" "$build" "$tutorial"
  fi
fi
no_root_reason=
if [ "$(id -u)" -ne 0 ]; then
  no_root_reason="not root"
elif [ $namespaces -eq 0 ]; then
  no_root_reason="cannot create PID and mount namespaces here (needs CAP_SYS_ADMIN)"
fi

start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-tutorial.XXXXXX")
if [ $namespaces -eq 1 ]; then
  mount -t tmpfs -o mode=755 ddp-tutorial "$work"
  mkdir -p /run/netns
  mount -t tmpfs -o mode=755 ddp-tutorial-netns /run/netns  # `ip netns add` names go here
else
  chmod 755 "$work"  # munged insists that its socket's directories are not private
fi
cleanup() {
  local status=$?
  cd /
  [ $namespaces -eq 0 ] || umount "$work" 2> /dev/null || true
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The scratch copy of the repository root.
repo=$work/repo
mkdir -p "$repo" "$work/check"
for entry in "$root"/* "$root"/.venv; do
  name=${entry##*/}
  [ -e "$entry" ] && [ "$name" != build ] && [ "$name" != tutorial-out ] || continue
  ln -s "$entry" "$repo/$name"
done
ln -s "$build" "$repo/build"

# The blocks, as one script. Each block runs as { commands } > its log, in this shell; the
# log is shown after it, and the EXIT trap shows it when a command of the block fails.
script=$work/check/tutorial.sh
cat > "$script" <<'HEAD'
set -euo pipefail
__tc_block=0 __tc_line=0 __tc_log=/dev/null
exec 3>&1 4>&2  # the check's own output, for the trap: a failing block's is its log
__tc_cleanup() {
  local status=$? conf
  set +e
  exec 1>&3 2>&4
  if [ $status -ne 0 ]; then
    echo "--- output of block $__tc_block ($__tc_doc line $__tc_line) so far:"
    cat "$__tc_log"
    echo "tutorial_check: FAIL: exit status $status in the block at $__tc_doc line $__tc_line" >&2
  fi
  # What the tutorial's own tear-down blocks would have done, had they run.
  ! declare -F netns_destroy > /dev/null || netns_destroy
  cd "$__tc_repo"
  for conf in $(find . -name slurm.conf 2> /dev/null); do
    tests/cluster/slurm_cluster.sh stop "$(dirname "$conf")"
  done
  exit $status
}
trap __tc_cleanup EXIT
__tc_expect() {  # __tc_expect PATTERN_FILE: a line of the block's output matches it
  grep -Eqf "$1" "$__tc_log" ||
    { echo "tutorial_check: FAIL: no line of the output of the block at $__tc_doc line $__tc_line matches: $(cat "$1")" >&2; exit 1; }
}
HEAD
echo "__tc_repo=$(printf %q "$repo") __tc_doc=$(printf %q "$doc")" >> "$script"

lineno=0 block=0 ran=0 skipped=0 in_sh=0 in_other=0 in_comment=0
expects=() needs= skip_reason= reason= skips_text=
fence='```'
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  trimmed=${line%"${line##*[![:space:]]}"}
  if [ $in_sh -eq 1 ]; then
    if [ "$trimmed" = "$fence" ]; then
      in_sh=0
      if [ -z "$reason" ]; then
        printf '} > "$__tc_log" 2>&1\n' >> "$script"
        printf 'cat "$__tc_log"\n' >> "$script"
        printf 'echo "=== block %d: $((SECONDS - __tc_start)) s"\n' "$block" >> "$script"
        for i in "${!expects[@]}"; do
          printf '%s\n' "${expects[i]}" > "$work/check/expect.$block.$i"
          printf '__tc_expect %q\n' "$work/check/expect.$block.$i" >> "$script"
        done
      fi
      expects=() needs= skip_reason=
    elif [ -z "$reason" ]; then
      printf '%s\n' "$line" >> "$script"
    fi
    continue
  fi
  if [ $in_other -eq 1 ]; then  # inside another fenced block (output): nothing to run
    [ "$trimmed" != "$fence" ] || in_other=0
    continue
  fi
  if [ $in_comment -eq 1 ]; then  # inside a comment of several lines
    [[ $trimmed != *'-->' ]] || in_comment=0
    continue
  fi
  if [[ $trimmed == '<!-- check: '*' -->' ]]; then
    body=${trimmed#'<!-- check: '}
    body=${body%' -->'}
    case ${body%% *} in
      expect) expects+=("${body#expect }") ;;
      needs) needs=${body#needs } ;;
      skip) skip_reason=${body#skip } ;;
      *) fail "$doc line $lineno: unknown check directive: $line" ;;
    esac
  elif [[ $trimmed == '<!-- check:'* ]]; then
    fail "$doc line $lineno: malformed check directive: $line"
  elif [ "$trimmed" = "${fence}sh" ]; then
    block=$((block + 1))
    in_sh=1
    reason=$skip_reason
    if [ -z "$reason" ] && [ -n "$needs" ]; then
      for need in $needs; do
        if [ "$need" = root ]; then
          [ -z "$no_root_reason" ] || { reason="needs root: $no_root_reason"; break; }
        elif ! command -v "$need" > /dev/null; then
          reason="needs $need, which is not installed"
          break
        fi
      done
    fi
    if [ -n "$reason" ]; then
      skipped=$((skipped + 1))
      skips_text+="  skipped: block $block (line $lineno): $reason"$'\n'
      printf 'echo %q\n' "=== block $block ($doc line $lineno): SKIPPED: $reason" >> "$script"
    else
      ran=$((ran + 1))
      printf '__tc_block=%d __tc_line=%d __tc_log=%q __tc_start=$SECONDS\n' "$block" "$lineno" "$work/check/block$block.log" >> "$script"
      printf 'echo %q\n' "=== block $block ($doc line $lineno)" >> "$script"
      printf '{\n' >> "$script"
    fi
  elif [[ $trimmed == "$fence"* ]]; then
    in_other=1
  elif [[ $trimmed == '<!--'* && $trimmed != *'-->'* ]]; then
    in_comment=1
  elif [ ${#expects[@]} -gt 0 ] || [ -n "$needs$skip_reason" ]; then
    [ -z "$trimmed" ] ||
      fail "$doc line $lineno: check directives must come right before a \`\`\`sh block"
  fi
done < "$tutorial"
[ $in_sh -eq 0 ] || fail "$doc: a \`\`\`sh block is not closed"
[ $block -gt 0 ] || fail "no \`\`\`sh blocks in $tutorial"

echo "tutorial_check: $block blocks in $tutorial; running $ran in $repo"
cd "$repo"
status=0
# A fresh shell: the reader's environment, not the test's (the blocks set what they need).
env -u OMP_NUM_THREADS -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
  -u SLURM_CONF -u DDP_TUTORIAL_IN_NAMESPACE bash "$script" || status=$?
[ $status -eq 0 ] || fail "see above (the check took $((SECONDS - start)) s)"
printf '%s' "$skips_text"
echo "tutorial_check: PASS: $ran blocks ran, $skipped skipped, in $((SECONDS - start)) s"
