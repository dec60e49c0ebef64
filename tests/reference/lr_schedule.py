"""Per-step learning rates of torch's scheduler classes, for ddp::LRSchedule.

Warmup is LinearLR, the decay CosineAnnealingLR or StepLR (or none), chained by SequentialLR with
the milestone at the end of the warmup; stepped after every optimizer step. Two parameter groups
(base rates 0.1 and 0.02, times the linear scaling factor). One line per configuration:
name : the rates of steps 0..STEPS-1, group 0 then group 1 for each step.
"""
import torch
from torch.optim import lr_scheduler as L

torch.set_num_threads(1)
STEPS = 40

# name, warmup steps, start factor, decay, decay_steps/step_size, min_lr/gamma, lr scale
CONFIGS = [
    ("warmup_cosine", 5, 0.1, "cosine", 20, 0.001, 1.0),
    ("warmup_step", 4, 0.25, "step", 7, 0.5, 1.0),
    ("cosine_only", 0, 0.1, "cosine", 30, 0.0, 1.0),
    ("warmup_constant_scaled", 6, 0.01, "constant", 0, 0.0, 4.0),
    ("warmup_cosine_scaled", 3, 0.5, "cosine", 10, 0.0001, 2.0),
]

for name, warmup, start, decay, n, x, scale in CONFIGS:
    w1 = torch.zeros(1, requires_grad=True)
    w2 = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [w1], "lr": 0.1 * scale}, {"params": [w2], "lr": 0.02 * scale}])
    scheds = []
    if warmup > 0:
        scheds.append(L.LinearLR(opt, start_factor=start, end_factor=1.0, total_iters=warmup))
    if decay == "cosine":
        scheds.append(L.CosineAnnealingLR(opt, T_max=n, eta_min=x))
    elif decay == "step":
        scheds.append(L.StepLR(opt, step_size=n, gamma=x))
    else:
        scheds.append(L.LambdaLR(opt, lambda step: 1.0))
    sched = scheds[0] if len(scheds) == 1 else L.SequentialLR(opt, scheds, milestones=[warmup])
    lrs = []
    for _ in range(STEPS):
        lrs += [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
    print(name, ":", " ".join(repr(v) for v in lrs))
