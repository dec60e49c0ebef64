#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference benchmark, run with the torch wheel that ddp is
built against (.venv, from scripts/setup.sh).

Launched by Open MPI exactly like the C++ benchmark, e.g.
    mpirun -np 2 .venv/bin/python bench/pytorch_ddp.py --model cnn --batch-size 64 \
        --warmup-steps 5 --window-steps 20 --windows 5 --out results.jsonl

Rank and world size come from Open MPI's environment; the process group is gloo (NCCL with
--device cuda) over TCP at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500). Every step
trains on the same synthetic batch, so the numbers measure the training step (forward,
backward with gradient all-reduce, optimizer), not data loading. The models match the C++ benchmark's layer for layer.
"""

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class MnistCnn(nn.Module):
    """The seed MNIST CNN (examples/mnist_cnn.h)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        x = self.fc2(self.dropout2(x))
        return F.log_softmax(x, dim=1)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18 for 32x32 inputs: 3x3 stem, no max-pool (examples/resnet.h)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        # Two BasicBlocks per layer; the first one of layers 2-4 downsamples.
        self.layer1 = nn.Sequential(BasicBlock(64, 64, 1), BasicBlock(64, 64, 1))
        self.layer2 = nn.Sequential(BasicBlock(64, 128, 2), BasicBlock(128, 128, 1))
        self.layer3 = nn.Sequential(BasicBlock(128, 256, 2), BasicBlock(256, 256, 1))
        self.layer4 = nn.Sequential(BasicBlock(256, 512, 2), BasicBlock(512, 512, 1))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return F.log_softmax(self.fc(out), dim=1)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


# model name -> (constructor, shape of one input sample)
MODELS = {
    "cnn": (MnistCnn, (1, 28, 28)),
    "resnet18": (ResNet18, (3, 32, 32)),
    "mlp": (Mlp, (784,)),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the rank's GPU (local rank), NCCL instead of gloo")
    p.add_argument("--batch-size", type=int, required=True, help="samples per rank per step")
    p.add_argument("--warmup-steps", type=int, required=True)
    p.add_argument("--window-steps", type=int, required=True)
    p.add_argument("--windows", type=int, required=True)
    p.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                   help="mixed precision of forward and loss: torch.autocast in bf16, or in fp16 "
                        "with torch.amp.GradScaler")
    p.add_argument("--label", help="the \"impl\" value in the output "
                                   "(default pytorch-ddp[-<amp>])")
    p.add_argument("--out", help="append one JSON line here (rank 0 only)")
    p.add_argument("--optimizer", choices=("sgd", "adadelta"), default="sgd",
                   help="sgd (lr 0.01, momentum 0.9, as bench_throughput) or adadelta (lr 1.0, "
                   "the seed's, as ddp_mnist)")
    p.add_argument("--bucket-cap-mb", type=float,
                   help="DDP's bucket_cap_mb, given: then the first bucket has that cap too")
    p.add_argument("--link", default="", help="tag for emulated-host runs, e.g. 1gbit")
    p.add_argument("--comm-hook", choices=("allreduce", "bf16", "fp16", "powersgd"),
                   default="allreduce",
                   help="torch's bf16_compress_hook, fp16_compress_hook or powerSGD_hook (as "
                        "ddp's --comm-hook of the same name)")
    p.add_argument("--powersgd-rank", type=int, default=1,
                   help="PowerSGDState's matrix_approximation_rank")
    p.add_argument("--powersgd-start-iter", type=int, default=2,
                   help="PowerSGDState's start_powerSGD_iter (at least 2)")
    p.add_argument("--phases", action="store_true",
                   help="each rank prints the median of its measured steps' forward, backward "
                        "(with DDP's wait for the all-reduces) and optimizer times, as "
                        "bench/timeline_split.py does for ddp's timelines (CPU only)")
    args = p.parse_args()
    for name in ("batch_size", "window_steps", "windows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_steps < 0:
        p.error("--warmup-steps must not be negative")
    if args.label is None:
        args.label = "pytorch-ddp" + ("" if args.amp == "off" else "-" + args.amp)
    return args


def main():
    args = parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)

    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", "29500")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"pytorch_ddp.py: --device cuda, but rank {rank} sees no CUDA device")
        device = torch.device("cuda", int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)

    # Seeds as in bench/bench_throughput.cpp: one for the weights, one per rank for the data.
    make_model, sample_shape = MODELS[args.model]
    torch.manual_seed(1)
    model = make_model().to(device)
    if args.model == "resnet18":
        n = len(list(model.parameters()))
        assert n == 62, f"ResNet-18 has {n} parameter tensors, expected 62"
    # DDP also at world size 1, so that this is the code path users run.
    device_ids = [device] if device.type == "cuda" else None
    caps = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **caps)
    if args.comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start_iter)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif args.comm_hook in ("bf16", "fp16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, getattr(default_hooks, args.comm_hook + "_compress_hook"))
    if args.optimizer == "adadelta":
        optimizer = torch.optim.Adadelta(ddp.parameters(), lr=1.0)
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1234 + rank)
    inputs = torch.randn(args.batch_size, *sample_shape).to(device)
    targets = torch.randint(0, 10, (args.batch_size,)).to(device)

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")  # else a pass-through

    phases = []  # (forward, backward, optimizer) seconds of each measured step

    def step(measured=False):
        optimizer.zero_grad()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.nll_loss(ddp(inputs), targets)
        t1 = time.perf_counter()
        scaler.scale(loss).backward()
        t2 = time.perf_counter()
        scaler.step(optimizer)
        scaler.update()
        if measured and args.phases:
            phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))

    for _ in range(args.warmup_steps):
        step()

    windows = []
    for _ in range(args.windows):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.window_steps):
            step(measured=True)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the host runs ahead of the GPU
        dist.barrier()
        dt = time.perf_counter() - t0
        windows.append(world * args.batch_size * args.window_steps / dt)

    if rank == 0:
        # The upper median for an even count, as the C++ benchmark takes sorted[n / 2].
        median = statistics.median_high(windows)
        result = {
            "impl": args.label,
            "model": args.model,
            "device": args.device,
            "amp": args.amp,
            "world": world,
            "batch": args.batch_size,
            "threads": threads,
            "samples_per_sec": median,
            "step_ms": 1000.0 * world * args.batch_size / median,
            "windows": windows,
            "host": socket.gethostname(),
        }
        if device.type == "cuda":  # what bench_throughput's gpu_peak_mb counts, the same allocator
            result["gpu_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        if args.link:
            result["link"] = args.link
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
        print(f"{args.label} {args.model}: world {world}, batch {args.batch_size}/rank, "
              f"{threads} thread(s): {median:.1f} samples/s, {result['step_ms']:.2f} ms/step "
              f"(median of {len(windows)} windows)"
              + (f", GPU peak {result['gpu_peak_mb']:.1f} MiB" if "gpu_peak_mb" in result else ""),
              flush=True)

    if phases:
        forward, backward, optim = (1000 * statistics.median(column) for column in zip(*phases))
        print(f"{args.label} phases, rank {rank}: forward {forward:.1f} ms, backward {backward:.1f} "
              f"ms (with the all-reduce wait), optimizer {optim:.1f} ms (median of {len(phases)} "
              f"steps)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
