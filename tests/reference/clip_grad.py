"""torch.nn.utils.clip_grad_norm_ on fixed gradients.

Two parameters with closed-form gradients (the C++ test builds the same ones). For each
configuration, one line: max_norm norm_type : the returned total norm, then the clipped
gradients (float64 reprs of the float32 values). norm_type is printed as 1, 2 or inf.
"""
import torch

torch.set_num_threads(1)

CONFIGS = [(1.0, 2.0), (0.5, 1.0), (0.3, float("inf")), (100.0, 2.0), (2.0, 3.0)]

for max_norm, norm_type in CONFIGS:
    a = torch.zeros(3, 4, requires_grad=True)
    b = torch.zeros(5, requires_grad=True)
    c = torch.zeros(2, requires_grad=True)  # no gradient: skipped
    a.grad = (torch.sin(torch.arange(12, dtype=torch.float64) * 0.7) * 1.5).float().reshape(3, 4)
    b.grad = (torch.cos(torch.arange(5, dtype=torch.float64) * 1.1) * 0.8).float()
    total = torch.nn.utils.clip_grad_norm_([a, b, c], max_norm, norm_type)
    label = "inf" if norm_type == float("inf") else str(int(norm_type))
    values = [total.item()] + a.grad.flatten().tolist() + b.grad.tolist()
    print(max_norm, label, ":", " ".join(repr(v) for v in values))
