#pragma once
// ResNet-18 for 32x32 inputs (CIFAR-style: 3x3 stem, no max-pool), as in the common PyTorch
// CIFAR reference implementations: 62 parameter tensors, 11.2 M parameters. Outputs
// log-probabilities.

#include <ddp/sync_batch_norm.h>

#include <torch/torch.h>

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, planes, 3)
                                                             .stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", ddp::BatchNorm2d(planes))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(planes, planes, 3)
                                                             .padding(1).bias(false)))),
        bn2(register_module("bn2", ddp::BatchNorm2d(planes))) {
    if (stride != 1 || in != planes) {
      shortcut = register_module(
          "shortcut",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, planes, 1).stride(stride).bias(false)),
              ddp::BatchNorm2d(planes)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    out += shortcut ? shortcut->forward(x) : x;
    return torch::relu(out);
  }

  torch::nn::Conv2d conv1;
  ddp::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  ddp::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(int64_t classes = 10)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3)
                                                             .padding(1).bias(false)))),
        bn1(register_module("bn1", ddp::BatchNorm2d(64))),
        layer1(register_module("layer1", stage(64, 64, 1))),
        layer2(register_module("layer2", stage(64, 128, 2))),
        layer3(register_module("layer3", stage(128, 256, 2))),
        layer4(register_module("layer4", stage(256, 512, 2))),
        fc(register_module("fc", torch::nn::Linear(512, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = torch::relu(bn1(conv1(x)));
    out = layer4->forward(layer3->forward(layer2->forward(layer1->forward(out))));
    out = torch::flatten(torch::adaptive_avg_pool2d(out, {1, 1}), 1);
    return torch::log_softmax(fc(out), 1);
  }

  static torch::nn::Sequential stage(int64_t in, int64_t planes, int64_t stride) {
    return torch::nn::Sequential(BasicBlock(in, planes, stride), BasicBlock(planes, planes, 1));
  }

  torch::nn::Conv2d conv1;
  ddp::BatchNorm2d bn1;
  torch::nn::Sequential layer1, layer2, layer3, layer4;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet18);
