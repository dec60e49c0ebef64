#!/usr/bin/env bash
# Downloads CIFAR-10's binary version and unpacks its six batch files into
# data/cifar-10-batches-bin (relative to the current directory, where the programs look by
# default) or into DIR. Idempotent: when the six files are there, complete, it only checks.
# Usage: scripts/download_cifar10.sh [DIR]
#   DDP_CIFAR10_URL overrides the download address (a mirror; the MD5 check still applies).
set -euo pipefail

url=${DDP_CIFAR10_URL:-https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz}
md5=c32a1d4ab5d03f1284b67883e8d87530
record_bytes=3073
batch_bytes=$((10000 * record_bytes))
files=(data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin
  test_batch.bin)

die() {
  echo "download_cifar10: $*" >&2
  exit 1
}

if [ $# -gt 1 ]; then
  echo "usage: scripts/download_cifar10.sh [DIR]   (default: data/cifar-10-batches-bin)" >&2
  exit 2
fi
dir=${1:-data/cifar-10-batches-bin}

complete=yes
for f in "${files[@]}"; do
  if [ ! -f "$dir/$f" ] || [ "$(wc -c <"$dir/$f")" -ne "$batch_bytes" ]; then
    complete=no
    break
  fi
done
if [ "$complete" = yes ]; then
  echo "download_cifar10: CIFAR-10 already in $dir"
  exit 0
fi

mkdir -p "$dir" || die "cannot create $dir"
# Download and unpack beside the target, so the final move is a rename on the same file system
# and an interrupted run leaves no partial batch files in $dir.
tmp=$(mktemp -d "$dir/.download.XXXXXX") || die "cannot create a temporary directory in $dir"
trap 'rm -rf "$tmp"' EXIT
archive=$tmp/cifar-10-binary.tar.gz

echo "download_cifar10: downloading $url (about 163 MB)"
if command -v curl >/dev/null; then
  curl -fL --retry 3 -o "$archive" "$url" || die "download failed: $url"
elif command -v wget >/dev/null; then
  wget -O "$archive" "$url" || die "download failed: $url"
else
  die "needs curl or wget to download $url"
fi

if command -v md5sum >/dev/null; then
  got=$(md5sum "$archive" | cut -d' ' -f1)
elif command -v md5 >/dev/null; then
  got=$(md5 -q "$archive")
else
  die "needs md5sum or md5 to verify the download"
fi
[ "$got" = "$md5" ] || die "$url: MD5 $got, expected $md5 (corrupt or wrong file; not unpacked)"

tar -xzf "$archive" -C "$tmp" || die "cannot unpack $archive"
for f in "${files[@]}"; do
  [ -f "$tmp/cifar-10-batches-bin/$f" ] || die "the archive has no cifar-10-batches-bin/$f"
done
for f in "${files[@]}" batches.meta.txt; do
  if [ -f "$tmp/cifar-10-batches-bin/$f" ]; then
    mv -f "$tmp/cifar-10-batches-bin/$f" "$dir/$f" || die "cannot move $f into $dir"
  fi
done
echo "download_cifar10: CIFAR-10 unpacked into $dir"
