"""torch.amp.GradScaler("cpu") on a fixed sequence of losses, some overflowing, for ddp::GradScaler.

loss_t = sum(w * c_t) with c_t closed-form (the C++ test builds the same); c_t holds an inf at step
2, a NaN at step 5, and is 1e36 at steps 8 and 9: finite, and scaled by 256 (step 8) it still
fits float32, scaled by 512 (step 9) it overflows. SGD(lr=0.01). One line per step:
t stepped scale_after_update growth_tracker; then "w :" with the final weights.
"""
import math

import torch

torch.set_num_threads(1)
STEPS = 14


def coefficients(t):
    c = torch.cos(torch.arange(4, dtype=torch.float64) * 0.3 + t).float()
    if t == 2:
        c[1] = math.inf
    if t == 5:
        c[0] = math.nan
    if t in (8, 9):
        c = c * 1e36
    return c


w = (torch.sin(torch.arange(4, dtype=torch.float64)) * 0.5).float().requires_grad_()
opt = torch.optim.SGD([w], lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                              growth_interval=3)
for t in range(STEPS):
    opt.zero_grad()
    loss = (w * coefficients(t)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    state = scaler._per_optimizer_states[id(opt)]
    found = sum(v.item() for v in state["found_inf_per_device"].values())
    scaler.update()
    print(t, 0 if found else 1, repr(scaler.get_scale()), scaler._get_growth_tracker())
print("w :", " ".join(repr(v) for v in w.detach().tolist()))
