"""PyTorch DDP (gloo) with register_comm_hook(PowerSGDState(...), powerSGD_hook), the reference of
tests/core/test_powersgd.cpp.

Usage: powersgd.py WORLD_SIZE TMP_DIR. Spawns WORLD_SIZE processes on one machine (gloo over a
file store in TMP_DIR) that train a small fixed MLP for STEPS plain SGD steps on fixed data, each
rank on its own slice of the batch, for each configuration. The model, the data and the
configurations are built from closed-form values so that the C++ test builds the identical ones.
Rank 0 prints, per configuration and step, one line:
  CONFIG STEP : the averaged gradients of every parameter (registration order, flattened)
and after the last step one line
  CONFIG weights : every parameter's values
as float64 reprs of the float32 values.
"""
import math

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from gloo_store import finish, store_from_argv

STEPS, BATCH, IN, HIDDEN, OUT = 6, 4, 32, 64, 3

# One bucket (the default caps): with several, PyTorch's hook chains its collectives in
# callbacks whose order differs between ranks, and gloo then fails with a size mismatch.
# name, rank, start_powerSGD_iter, min_compression_rate, use_error_feedback, warm_start, epsilon,
# random_seed
CONFIGS = [
    ("rank2_warm", 2, 3, 2.0, True, True, 0.0, 0),           # Gram-Schmidt
    ("rank4_cold", 4, 2, 2.0, True, False, 1e-8, 7),         # QR, new Qs every step
    ("rank1_rate30", 1, 2, 30.0, True, True, 0.0, 3),        # only the 64x32 and 32x64 compressed
    ("rank3_no_feedback", 3, 4, 2.0, False, True, 0.0, 5),   # QR without error feedback
]


def closed_form(rows, cols, phase, scale):
    k = torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols)
    return (torch.sin(k * 1.3 + phase) * scale).float()


def build_model():
    sizes = [(HIDDEN, IN), (IN, HIDDEN), (HIDDEN, IN), (OUT, HIDDEN)]
    layers = []
    for i, (o, n) in enumerate(sizes):
        linear = torch.nn.Linear(n, o)
        with torch.no_grad():
            linear.weight.copy_(closed_form(o, n, i, 0.9 / math.sqrt(n)))
            linear.bias.copy_(closed_form(1, o, i + 0.5, 0.1).reshape(-1))
        layers.append(linear)
        if i + 1 < len(sizes):
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def data(world):
    x = closed_form(STEPS * world * BATCH, IN, 0.25, 1.0).reshape(STEPS, world * BATCH, IN)
    y = closed_form(STEPS * world * BATCH, OUT, 0.75, 1.0).reshape(STEPS, world * BATCH, OUT)
    return x, y


def fmt(t):
    return " ".join(repr(v) for v in t.double().tolist())


def run(rank, world, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    x, y = data(world)
    for name, r, start, rate, feedback, warm, eps, seed in CONFIGS:
        model = build_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=r,
                                       start_powerSGD_iter=start, min_compression_rate=rate,
                                       use_error_feedback=feedback,
                                       warm_start=warm, orthogonalization_epsilon=eps,
                                       random_seed=seed)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            opt.zero_grad()
            mine = slice(rank * BATCH, (rank + 1) * BATCH)
            loss = ((ddp(x[step][mine]) - y[step][mine]) ** 2).mean()
            loss.backward()
            if rank == 0:
                grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                print(name, step, ":", fmt(grads), flush=True)
            opt.step()
        if rank == 0:
            weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            print(name, "weights :", fmt(weights), flush=True)
    finish()


if __name__ == "__main__":
    world, tmp, store = store_from_argv()
    mp.spawn(run, args=(world, store), nprocs=world, join=True)
