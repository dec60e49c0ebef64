"""torch.optim.Adadelta with StepLR on a fixed least-squares problem.

The problem is built from closed-form values so the C++ test builds the identical one. Prints,
for each configuration, one line: lr rho eps weight_decay gamma : the final weight and bias
values as float64 reprs of the float32 results.
"""
import torch

torch.set_num_threads(1)

CONFIGS = [  # lr, rho, eps, weight_decay, StepLR gamma
    (1.0, 0.9, 1e-6, 0.0, 0.7),
    (0.5, 0.95, 1e-4, 0.01, 0.5),
]
STEPS_PER_EPOCH, EPOCHS = 5, 3


def problem():
    i = torch.arange(8 * 4, dtype=torch.float64).reshape(8, 4)
    x = torch.sin(i * 0.37).float()
    j = torch.arange(8 * 3, dtype=torch.float64).reshape(8, 3)
    y = torch.cos(j * 0.11).float()
    k = torch.arange(3 * 4, dtype=torch.float64).reshape(3, 4)
    w = (torch.sin(k * 1.3) * 0.5).float().requires_grad_()
    b = (torch.cos(torch.arange(3, dtype=torch.float64)) * 0.1).float().requires_grad_()
    return x, y, w, b


for lr, rho, eps, wd, gamma in CONFIGS:
    x, y, w, b = problem()
    opt = torch.optim.Adadelta([w, b], lr=lr, rho=rho, eps=eps, weight_decay=wd)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    for _ in range(EPOCHS):
        for _ in range(STEPS_PER_EPOCH):
            opt.zero_grad()
            loss = ((x @ w.t() + b - y) ** 2).mean()
            loss.backward()
            opt.step()
        sched.step()
    values = w.detach().flatten().tolist() + b.detach().tolist()
    print(lr, rho, eps, wd, gamma, ":", " ".join(repr(v) for v in values))
