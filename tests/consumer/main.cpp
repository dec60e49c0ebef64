// Trains one step data-parallel and checks that the gradient is the average over ranks.
#include <ddp/ddp.h>

#include <torch/torch.h>

#include <iostream>

int main(int argc, const char* argv[]) {  // the const form many LibTorch programs use
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    torch::nn::Linear net(torch::nn::LinearOptions(1, 1).bias(false));
    ddp::DistributedDataParallel model(group, net.ptr());
    // d(w*x)/dw = x = rank + 1 on each rank, so the average is (world_size + 1) / 2.
    net->forward(torch::full({1, 1}, runtime.rank() + 1.0)).sum().backward();
    const double expected = (runtime.world_size() + 1) / 2.0;
    if (net->weight.grad().item<double>() != expected) {
      throw std::runtime_error("gradient " + std::to_string(net->weight.grad().item<double>()) +
                               ", expected " + std::to_string(expected));
    }
    if (runtime.is_main()) {
      std::cout << "consumer: ddp " << ddp::version() << " (headers " << DDP_VERSION << "), "
                << runtime.world_size() << " ranks, averaged gradient " << expected << " OK"
                << std::endl;
    }
  });
}
