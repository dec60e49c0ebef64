#!/usr/bin/env python3
"""mnist_subset.py SRC DST TRAIN TEST: the first TRAIN training and TEST test images of the
MNIST-format data set in SRC (gzipped IDX files) as raw IDX files in DST, for tests that train a
few steps (evaluating 10000 images would take most of their time)."""
import gzip
import struct
import sys

src, dst, train, test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name, keep in (("train", train), ("t10k", test)):
    for kind, item in (("images-idx3-ubyte", 28 * 28), ("labels-idx1-ubyte", 1)):
        with gzip.open(f"{src}/{name}-{kind}.gz") as f:
            raw = f.read()
        header = 16 if item > 1 else 8
        out = bytearray(raw[:header])
        struct.pack_into(">I", out, 4, keep)
        out += raw[header:header + keep * item]
        with open(f"{dst}/{name}-{kind}", "wb") as f:
            f.write(out)
