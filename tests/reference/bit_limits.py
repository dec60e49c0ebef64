"""Where a LibTorch program stops being bit-identical to PyTorch, for ddp's README: nn.Linear on a
3-D input, the AdamW, Adam and SGD steps. Inputs from torch.randn after manual_seed(0), drawn in
the order the C++ test draws them. One line each, name : float32 values (exact as doubles):
inputs : the sums of w, b, x, p and the gradients (that both sides drew the same)
linear_3d : F.linear(x, w, b) on x [2, 16, 1024] (what nn.Linear computes)
<optimizer> : p after 10 steps with the gradients g[0..9]
"""
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
w = torch.randn(64, 1024)
b = torch.randn(64)
x = torch.randn(2, 16, 1024)
p0 = torch.randn(256)
g = torch.randn(10, 256)


def line(name, values):
    print(name, ":", " ".join(repr(v) for v in values))


line("inputs", [t.sum().item() for t in (w, b, x, p0, g)])
line("linear_3d", F.linear(x, w, b).flatten().tolist())
for name, make in [
    ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-2)),
    ("sgd", lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9)),
]:
    p = p0.clone().requires_grad_(True)
    optimizer = make([p])
    for k in range(10):
        p.grad = g[k].clone()
        optimizer.step()
    line(name, p.detach().tolist())
