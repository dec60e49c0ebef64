"""dtypes under torch.autocast("cpu", dtype=torch.bfloat16), for ddp::Autocast.

A Linear(4, 3) with closed-form weights on a closed-form input (the C++ test builds the same).
Prints "name dtype" for each result, then "linear :" with the Linear's output values.
"""
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
NAMES = {torch.bfloat16: "BFloat16", torch.float32: "Float", torch.float16: "Half"}

lin = torch.nn.Linear(4, 3)
with torch.no_grad():
    lin.weight.copy_((torch.sin(torch.arange(12, dtype=torch.float64) * 0.9) * 0.5).float().reshape(3, 4))
    lin.bias.copy_((torch.cos(torch.arange(3, dtype=torch.float64)) * 0.1).float())
x = (torch.sin(torch.arange(8, dtype=torch.float64) * 0.37)).float().reshape(2, 4)
target = torch.zeros(2, 3)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = lin(x)
    results = {
        "linear": y,
        "relu": torch.relu(y),
        "matmul": torch.matmul(x, x.t()),
        "log_softmax": F.log_softmax(y, dim=1),
        "mse_loss": F.mse_loss(y, target),
        "add_fp32": y + target,
    }
    with torch.autocast("cpu", enabled=False):
        results["nested_disabled_linear"] = lin(x)
results["after_linear"] = lin(x)
for name, value in results.items():
    print(name, NAMES[value.dtype])
print("linear :", " ".join(repr(v) for v in y.float().flatten().tolist()))
