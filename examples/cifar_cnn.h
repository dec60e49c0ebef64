#pragma once
// A small CIFAR-10 CNN in the spirit of the seed's ConvNetClassifier: three stages of two
// 3x3 convolutions with BatchNorm and ReLU, each halving the resolution (32 -> 16 -> 8 -> 4),
// then fc 2048 -> 256 -> 10 with dropout; 0.8 M parameters. Outputs log-probabilities.
// ddp::BatchNorm2d (not torch::nn's) so that --sync-batchnorm can convert it in place.

#include <ddp/sync_batch_norm.h>

#include <torch/torch.h>

struct ConvBnReluImpl : torch::nn::Module {
  ConvBnReluImpl(int64_t in, int64_t out)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)
                                                           .padding(1).bias(false)))),
        bn(register_module("bn", ddp::BatchNorm2d(out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  ddp::BatchNorm2d bn;
};
TORCH_MODULE(ConvBnRelu);

struct CifarCnnImpl : torch::nn::Module {
  CifarCnnImpl()
      : features(register_module("features", torch::nn::Sequential(
            ConvBnRelu(3, 32), ConvBnRelu(32, 32), torch::nn::MaxPool2d(2),
            ConvBnRelu(32, 64), ConvBnRelu(64, 64), torch::nn::MaxPool2d(2),
            ConvBnRelu(64, 128), ConvBnRelu(128, 128), torch::nn::MaxPool2d(2)))),
        fc1(register_module("fc1", torch::nn::Linear(128 * 4 * 4, 256))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))),
        fc2(register_module("fc2", torch::nn::Linear(256, 10))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = torch::flatten(features->forward(x), 1);
    out = dropout(torch::relu(fc1(out)));
    return torch::log_softmax(fc2(out), 1);
  }

  torch::nn::Sequential features;
  torch::nn::Linear fc1;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc2;
};
TORCH_MODULE(CifarCnn);
