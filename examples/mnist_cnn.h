#pragma once
// The seed scripts' MNIST CNN: conv 1->32->64, max-pool, dropout .25/.5, fc 9216->128->10,
// log-softmax.

#include <torch/torch.h>

struct MnistCnn : torch::nn::Module {
  MnistCnn()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)))),
        dropout1(register_module("dropout1", torch::nn::Dropout(0.25))),
        dropout2(register_module("dropout2", torch::nn::Dropout(0.5))),
        fc1(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = dropout1(torch::max_pool2d(x, 2));
    x = torch::relu(fc1(torch::flatten(x, 1)));
    x = fc2(dropout2(x));
    return torch::log_softmax(x, 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout dropout1, dropout2;
  torch::nn::Linear fc1, fc2;
};
