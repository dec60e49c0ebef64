"""PyTorch DDP (gloo, CPU) training a small CNN with BatchNorm: the reference of
tests/core/test_cnn_batchnorm_reference.cpp, which must match it bit for bit.

Usage: cnn_batchnorm.py WORLD_SIZE TMP_DIR. Spawns WORLD_SIZE processes on one machine (gloo over
a file store in TMP_DIR), one intra-op thread each, that train conv(1->4, 3x3, pad 1) ->
BatchNorm2d(4) -> relu -> max_pool(2) -> linear(64 -> 3) for STEPS steps of SGD with momentum,
cross-entropy, each rank on its own BATCH samples of the step's global batch, with DDP's defaults
(buffers broadcast from rank 0 before every forward). The weights and the data are closed-form
values, so that the C++ test builds the identical ones. Rank R writes TMP_DIR/rank<R>.txt, per
step (0-based) the lines
  STEP loss : its loss
  STEP params : every parameter after the optimizer step (registration order, flattened)
  STEP buffers : its BatchNorm running_mean, running_var, then num_batches_tracked
as float64 reprs of the float32 values (exact both ways).
"""
import math
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from gloo_store import finish, store_from_argv

STEPS, BATCH, CHANNELS, SIDE, CLASSES = 20, 4, 4, 8, 3
LR, MOMENTUM = 0.1, 0.9


def closed_form(count, phase, scale):
    k = torch.arange(count, dtype=torch.float64)
    return (torch.sin(k * 1.3 + phase) * scale).float()


def build_model():
    conv = torch.nn.Conv2d(1, CHANNELS, 3, padding=1)
    bn = torch.nn.BatchNorm2d(CHANNELS)
    linear = torch.nn.Linear(CHANNELS * (SIDE // 2) ** 2, CLASSES)
    with torch.no_grad():
        conv.weight.copy_(closed_form(conv.weight.numel(), 0.0, 1.0 / 3).reshape(conv.weight.shape))
        conv.bias.copy_(closed_form(CHANNELS, 0.5, 0.1))
        bn.weight.copy_(1 + closed_form(CHANNELS, 1.0, 0.2))
        bn.bias.copy_(closed_form(CHANNELS, 1.5, 0.1))
        linear.weight.copy_(closed_form(linear.weight.numel(), 2.0, 1.0 / 8).reshape(linear.weight.shape))
        linear.bias.copy_(closed_form(CLASSES, 2.5, 0.1))
    return torch.nn.Sequential(conv, bn, torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               linear)


def data(world):
    n = STEPS * world * BATCH
    x = closed_form(n * SIDE * SIDE, 0.25, 1.0).reshape(STEPS, world * BATCH, 1, SIDE, SIDE)
    # Per-sample offsets, so that the ranks' batch statistics differ.
    x = x + closed_form(n, 0.75, 0.5).reshape(STEPS, world * BATCH, 1, 1, 1)
    y = (torch.arange(n) * 7 % CLASSES).reshape(STEPS, world * BATCH)
    return x, y


def fmt(t):
    return " ".join(repr(v) for v in t.double().reshape(-1).tolist())


def run(rank, world, tmp, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    x, y = data(world)
    model = build_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    bn = model[1]
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    with open(os.path.join(tmp, "rank%d.txt" % rank), "w") as out:
        for step in range(STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x[step][mine]), y[step][mine])
            loss.backward()
            opt.step()
            params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            out.write("%d loss : %s\n" % (step, fmt(loss.detach())))
            out.write("%d params : %s\n" % (step, fmt(params)))
            out.write("%d buffers : %s %s %d\n" % (step, fmt(bn.running_mean), fmt(bn.running_var),
                                                   bn.num_batches_tracked.item()))
    finish()


if __name__ == "__main__":
    world, tmp, store = store_from_argv()
    mp.spawn(run, args=(world, tmp, store), nprocs=world, join=True)
