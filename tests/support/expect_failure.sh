#!/usr/bin/env bash
# Usage: expect_failure.sh REGEX COMMAND...
# Passes when COMMAND exits non-zero and its output (stdout + stderr) matches REGEX.
set -u
regex=$1
shift
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output" | tail -n 30
if [ "$status" -eq 0 ]; then
  echo "expect_failure: the command succeeded, a failure was expected" >&2
  exit 1
fi
if ! printf '%s\n' "$output" | grep -Eq -- "$regex"; then
  echo "expect_failure: exit status $status, but the output does not match: $regex" >&2
  exit 1
fi
echo "expect_failure: exit status $status and the expected message"
