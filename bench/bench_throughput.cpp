// Training throughput of ddp on one model: samples/s over all ranks, the median of several
// timed windows after a warm-up, appended as one JSON line (rank 0) for bench/run_all.sh.
// The same measurement as bench/pytorch_ddp.py: same models, batch, synthetic data, launcher,
// mixed precision (--amp: autocast in bf16, or fp16 with the GradScaler, as torch.amp).
//   mpirun -np 2 bench_throughput --model cnn --batch-size 64 --out results.jsonl
#include "mnist_cnn.h"
#include "resnet.h"

#include <ddp/train/train.h>

#include <boost/program_options.hpp>
#include <torch/cuda.h>
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <unistd.h>

namespace po = boost::program_options;

namespace {

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(784, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::log_softmax(fc3(torch::relu(fc2(torch::relu(fc1(x))))), 1);
  }
  torch::nn::Linear fc1, fc2, fc3;
};

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<int64_t> input_shape;  // per sample
};

Model make_model(const std::string& name) {
  if (name == "cnn") {
    auto m = std::make_shared<MnistCnn>();
    return {m, [m](const torch::Tensor& x) { return m->forward(x); }, {1, 28, 28}};
  }
  if (name == "resnet18") {
    auto m = ResNet18().ptr();
    return {m, [m](const torch::Tensor& x) { return m->forward(x); }, {3, 32, 32}};
  }
  if (name == "mlp") {
    auto m = std::make_shared<Mlp>();
    return {m, [m](const torch::Tensor& x) { return m->forward(x); }, {784}};
  }
  throw std::invalid_argument("--model: unknown model '" + name + "' (cnn, resnet18, mlp)");
}

// The most GPU memory tensors held at once on `device` in this process, in MiB (PyTorch's
// torch.cuda.max_memory_allocated: the same caching allocator's count); -1 on the CPU.
double gpu_peak_mib(const torch::Device& device) {
#if DDP_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<double>(ddp::detail::cuda_memory_peak_bytes(device.index())) /
           (1024.0 * 1024.0);
  }
#endif
  (void)device;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name, device_name, grad_sync, comm_hook, label, out, link, timeline_path;
  std::string hierarchical, amp_name;
  int64_t batch, warmup, window_steps, windows;
  double bucket_mb;
  bool bucket_view = false, reducer_at_one_rank = false, overlap_step = false;
  po::options_description options("bench_throughput options");
  // One flag a line (clang-format would pack the chain).
  // clang-format off
  options.add_options()
    ("help,h", "print this help")
    ("model", po::value(&model_name)->default_value("cnn"), "cnn, resnet18 or mlp")
    ("device", po::value(&device_name)->default_value("cpu"), "cpu, or cuda (the rank's GPU)")
    ("batch-size", po::value(&batch)->default_value(64), "per rank")
    ("warmup-steps", po::value(&warmup)->default_value(5), "untimed steps first")
    ("window-steps", po::value(&window_steps)->default_value(10), "steps per timed window")
    ("windows", po::value(&windows)->default_value(5), "timed windows; the median is reported")
    ("grad-sync", po::value(&grad_sync)->default_value("bucketed"), "bucketed (--bucket-mb), or per-parameter (a bucket per parameter: the baseline)")
    ("comm-hook", po::value(&comm_hook)->default_value("allreduce"), "allreduce, fp16 or bf16 (the average sent as half or bfloat16)")
    ("bucket-mb", po::value(&bucket_mb)->default_value(25.0), "bucket cap in MiB")
    ("gradient-as-bucket-view", po::bool_switch(&bucket_view), "grads are views into the buckets (zeroed in place instead of reset)")
    ("overlap-step", po::bool_switch(&overlap_step), "the optimizer steps each bucket inside backward as its all-reduce completes (hook_then_optimizer)")
    ("amp", po::value(&amp_name)->default_value("off"), "mixed precision of forward and loss: off, bf16 (autocast), or fp16 (autocast and the GradScaler)")
    ("reducer-at-one-rank", po::bool_switch(&reducer_at_one_rank), "run the bucket path at one rank too, as PyTorch's DDP does")
    ("hierarchical", po::value(&hierarchical)->default_value("auto"), "CPU all-reduces through one leader per host: auto, on or off (ProcessGroupOptions::hierarchical)")
    ("label", po::value(&label)->default_value(""), "impl name in the output (default ddp-<grad-sync>[-<fp16|bf16>][-view][-hier][-overlap])")
    ("link", po::value(&link)->default_value(""), "tag for emulated-host runs, e.g. 1gbit")
    ("timeline", po::value(&timeline_path)->default_value(""), "also write a timeline of the timed steps")
    ("out", po::value(&out)->default_value(""), "append the JSON result line to this file");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, options), vm);
  po::notify(vm);

  ddp::RuntimeOptions runtime_options;
  runtime_options.use_cuda = device_name == "cuda";
  ddp::Runtime runtime(argc, argv, runtime_options);
  if (vm.count("help")) {
    if (runtime.is_main()) std::cout << options << "\n";
    return 0;
  }
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroupOptions group_options;
    if (hierarchical == "on")
      group_options.hierarchical = ddp::HierarchicalAllReduce::On;
    else if (hierarchical == "off")
      group_options.hierarchical = ddp::HierarchicalAllReduce::Off;
    else if (hierarchical != "auto")
      throw std::invalid_argument("--hierarchical: '" + hierarchical +
                                  "' is not one of: auto, on, off");
    ddp::ProcessGroup group(runtime, group_options);
    const bool hier = group.cpu().backend() == "mpi-hierarchical";
    if (device_name != "cpu" && device_name != "cuda") {
      throw std::invalid_argument("--device: unknown device '" + device_name + "' (cpu, cuda)");
    }
    const ddp::AmpMode amp = [&] {
      try {
        return ddp::parse_amp_mode(amp_name);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string("--amp: ") + e.what());
      }
    }();
    if (amp == ddp::AmpMode::Fp16 && overlap_step) {
      // The GradScaler steps only after seeing every gradient (unscale, then the inf check).
      throw std::invalid_argument(
          "--overlap-step with --amp fp16: the GradScaler needs every gradient before the step");
    }
    const torch::Device device = runtime.device();
    if (device_name == "cuda" && !device.is_cuda()) {
      throw std::runtime_error("--device cuda: rank " + std::to_string(runtime.rank()) +
                               " has no CUDA device (" + runtime.summary() + ")");
    }
    std::unique_ptr<ddp::Timeline> timeline;
    if (!timeline_path.empty()) timeline = std::make_unique<ddp::Timeline>(group.cpu());
    torch::manual_seed(1);
    Model model = make_model(model_name);
    model.module->to(device);
    ddp::DDPOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_mb;
    if (grad_sync == "per-parameter") {
      // The baseline: caps below every parameter's size, so each parameter is a bucket of its
      // own, in registration order throughout (a rebuild would only reorder them).
      ddp_options.bucket_cap_mb = ddp_options.first_bucket_mb = 1e-9;
      ddp_options.rebuild_buckets = false;
    } else if (grad_sync != "bucketed") {
      throw std::invalid_argument("--grad-sync '" + grad_sync +
                                  "': expected bucketed or per-parameter");
    }
    ddp_options.timeline = timeline.get();
    ddp_options.gradient_as_bucket_view = bucket_view;
    ddp_options.reducer_at_one_rank = reducer_at_one_rank;
    ddp::DistributedDataParallel ddp_model(group, model.module, ddp_options);
    torch::optim::SGD optimizer(model.module->parameters(),
                                torch::optim::SGDOptions(0.01).momentum(0.9));
    ddp::CommHook hook = ddp::allreduce_hook();
    if (comm_hook == "fp16")
      hook = ddp::fp16_compress_hook();
    else if (comm_hook == "bf16")
      hook = ddp::bf16_compress_hook();
    else if (comm_hook != "allreduce")
      throw std::invalid_argument("--comm-hook: '" + comm_hook +
                                  "' is not one of: allreduce, fp16, bf16");
    if (overlap_step) hook = ddp::hook_then_optimizer(std::move(hook), optimizer);
    ddp_model.register_comm_hook(std::move(hook));
    // Null at one rank without a Reducer: then the step stays after backward.
    const bool overlapped = ddp_model.backward_steps_optimizer() != nullptr;
    ddp::GradScalerOptions scaler_options;
    scaler_options.enabled = amp == ddp::AmpMode::Fp16;  // else a pass-through
    ddp::GradScaler scaler(&group.cpu(), scaler_options);

    torch::manual_seed(1234 + runtime.rank());
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), model.input_shape.begin(), model.input_shape.end());
    const torch::Tensor inputs = torch::randn(shape).to(device);
    const torch::Tensor targets = torch::randint(0, 10, {batch}, torch::kLong).to(device);

    auto step = [&] {
      using Clock = ddp::Timeline::Clock;
      auto t = Clock::now();
      optimizer.zero_grad(!bucket_view);  // views stay views when zeroed in place
      // What a user's step does, and PyTorch DDP's forward: the buffer broadcast (ResNet's
      // BatchNorm statistics) and the hook check before the forward.
      ddp_model.prepare_forward();
      torch::Tensor loss;
      {
        std::optional<ddp::Autocast> autocast;
        if (amp != ddp::AmpMode::Off) {
          autocast.emplace(device.type(),
                           amp == ddp::AmpMode::Fp16 ? torch::kHalf : torch::kBFloat16);
        }
        loss = torch::nll_loss(model.forward(inputs), targets);
      }
      if (timeline) timeline->span("forward", "step", t, Clock::now());
      t = Clock::now();
      scaler.scale(loss).backward();
      if (timeline) timeline->span("backward", "step", t, Clock::now());
      t = Clock::now();
      if (!overlapped) {
        scaler.step(optimizer);
        scaler.update();
      }
      if (timeline) timeline->span("optimizer", "step", t, Clock::now());
    };
    for (int64_t i = 0; i < warmup; ++i) step();

    ddp::Communicator& comm = group.cpu();
    std::vector<double> rates;
    for (int64_t w = 0; w < windows; ++w) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < window_steps; ++i) step();
      if (device.is_cuda()) torch::cuda::synchronize();  // the host runs ahead of the GPU
      comm.barrier();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      rates.push_back(static_cast<double>(runtime.world_size() * batch * window_steps) / seconds);
    }
    if (timeline) timeline->write(timeline_path);
    // Peak resident memory of the largest rank (the whole process: LibTorch, MPI, data, model).
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    torch::Tensor peak =
        torch::tensor({static_cast<double>(usage.ru_maxrss) / 1024.0}, torch::kDouble);
    comm.all_reduce(peak, ddp::ReduceOp::Max);
    const double peak_rss_mb = peak.item<double>();
    const double gpu_peak = gpu_peak_mib(device);  // rank 0's
    if (!runtime.is_main()) return;

    std::vector<double> sorted = rates;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    if (label.empty()) {
      label = "ddp-" + grad_sync + (comm_hook == "allreduce" ? "" : "-" + comm_hook) +
              (bucket_view ? "-view" : "") + (hier ? "-hier" : "") +
              (overlapped ? "-overlap" : "") + (amp == ddp::AmpMode::Off ? "" : "-" + amp_name);
    }
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    std::ostringstream json;
    json << "{\"impl\": \"" << label << "\", \"model\": \"" << model_name << "\", \"device\": \""
         << device_name << "\", \"amp\": \"" << amp_name
         << "\", \"world\": " << runtime.world_size() << ", \"batch\": " << batch
         << ", \"threads\": " << torch::get_num_threads() << ", \"samples_per_sec\": " << median
         << ", \"step_ms\": " << 1000.0 * runtime.world_size() * batch / median
         << ", \"windows\": [";
    for (size_t i = 0; i < rates.size(); ++i) json << (i ? ", " : "") << rates[i];
    json << "], \"peak_rss_mb\": " << peak_rss_mb;
    if (gpu_peak >= 0) json << ", \"gpu_peak_mb\": " << gpu_peak;
    json << ", \"host\": \"" << host << "\"";
    if (!link.empty()) json << ", \"link\": \"" << link << "\"";
    json << "}";
    std::printf("%-22s %-9s world %d batch %lld: %9.1f samples/s (%.1f ms/step), peak RSS %.1f MiB",
                label.c_str(), model_name.c_str(), runtime.world_size(),
                static_cast<long long>(batch), median,
                1000.0 * runtime.world_size() * batch / median, peak_rss_mb);
    if (gpu_peak >= 0) std::printf(", GPU peak %.1f MiB", gpu_peak);
    std::printf("\n");
    if (!out.empty()) {
      std::ofstream file(out, std::ios::app);
      file << json.str() << "\n";
      if (!file) throw std::runtime_error(out + ": cannot append the result");
    }
  });
}
