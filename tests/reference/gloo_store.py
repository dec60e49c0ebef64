"""The command line of the reference scripts that run PyTorch DDP over gloo: WORLD TMP.

store_from_argv() reads them, makes TMP, and returns (world, tmp, store): a fresh path for the
file store (torch.distributed.FileStore) that the script's processes share. finish() ends a
spawned process once its output is written.
"""
import os
import sys

import torch.distributed as dist


def store_from_argv():
    world, tmp = int(sys.argv[1]), sys.argv[2]
    os.makedirs(tmp, exist_ok=True)
    store = os.path.join(tmp, "gloo_store")
    if os.path.exists(store):
        os.remove(store)
    return world, tmp, store


def finish():
    """Waits for every process, then leaves without tearing gloo down.

    A spawned process sometimes aborts after its last line was written ("terminate called without
    an active exception", SIGABRT; seen in CI for join.py and powersgd.py): past the barrier only
    gloo's teardown and the interpreter's exit remain, so the process leaves at once instead.
    """
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
