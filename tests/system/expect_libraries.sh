#!/usr/bin/env bash
# Usage: expect_libraries.sh BINARY NAME=FOLDER...
# Passes when the dynamic loader resolves every library of BINARY (ldd says "not found" for
# none) and each NAME (a soname such as libnccl.so.2) resolves to a file in FOLDER: the installed
# libddp.so must load the LibTorch, CUDA runtime and NCCL it was built with, through its RPATH,
# without LD_LIBRARY_PATH.
set -u
binary=$1
shift
listing=$(env -u LD_LIBRARY_PATH ldd "$binary" 2>&1) || { echo "$listing"; exit 1; }
status=0
if grep -q "not found" <<< "$listing"; then
  echo "expect_libraries: $binary: unresolved libraries:" >&2
  grep "not found" <<< "$listing" >&2
  status=1
fi
for pair in "$@"; do
  name=${pair%%=*}
  folder=$(cd "${pair#*=}" && pwd -P)
  path=$(awk -v n="$name" '$1 == n && $2 == "=>" {print $3}' <<< "$listing")
  if [ -z "$path" ]; then
    echo "expect_libraries: $binary does not load $name" >&2
    status=1
  elif [ "$(cd "$(dirname "$path")" && pwd -P)" != "$folder" ]; then
    echo "expect_libraries: $name resolves to $path, expected a file in $folder" >&2
    status=1
  else
    echo "$name => $path"
  fi
done
exit $status
