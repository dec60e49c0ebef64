"""The command line of the reference scripts that run PyTorch DDP over gloo: WORLD TMP.

store_from_argv() reads them, makes TMP, and returns (world, tmp, store): a fresh path for the
file store (torch.distributed.FileStore) that the script's processes share.
"""
import os
import sys


def store_from_argv():
    world, tmp = int(sys.argv[1]), sys.argv[2]
    os.makedirs(tmp, exist_ok=True)
    store = os.path.join(tmp, "gloo_store")
    if os.path.exists(store):
        os.remove(store)
    return world, tmp, store
