#!/usr/bin/env bash
# Usage: expect_no_exports.sh LIBRARY PATTERN
# Passes when LIBRARY's dynamic symbol table defines ddp's API (some symbol naming ddp::) and no
# symbol whose demangled name matches PATTERN (grep -E, case-insensitive): what a shared library
# keeps to itself, such as the protobuf its TensorBoard writer uses.
set -u
library=$1
pattern=$2
symbols=$(nm -DC --defined-only "$library") || { echo "expect_no_exports: nm $library failed" >&2; exit 1; }
if ! grep -q 'ddp::' <<< "$symbols"; then
  echo "expect_no_exports: $library defines no ddp:: symbol: not the library expected" >&2
  exit 1
fi
leaked=$(grep -Ei -- "$pattern" <<< "$symbols")
if [ -n "$leaked" ]; then
  echo "expect_no_exports: $library exports $(wc -l <<< "$leaked") symbols matching '$pattern':" >&2
  head -n 20 <<< "$leaked" >&2
  exit 1
fi
echo "expect_no_exports: $library: $(wc -l <<< "$symbols") symbols, none matching '$pattern'"
