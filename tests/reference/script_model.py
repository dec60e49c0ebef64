"""Scripts a small model with BatchNorm (torch.jit.script) and saves it to the path given:
the TorchScript model test_torchscript.cpp loads with torch::jit::load and trains data-parallel."""
import sys
import warnings

import torch

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit.script is deprecated


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


torch.manual_seed(0)
torch.jit.script(Net()).save(sys.argv[1])
