#include <ddp/distributed_data_parallel.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ddp {

namespace {

// One line per parameter and buffer: what must agree on every rank for the replicas and their
// collectives to line up.
std::vector<std::string> describe(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  auto add = [&](const char* kind, const std::string& name, const torch::Tensor& t) {
    std::ostringstream line;
    line << kind << " '" << name << "' " << t.scalar_type() << " " << t.sizes()
         << (t.requires_grad() ? "" : " frozen");
    lines.push_back(line.str());
  };
  for (const auto& p : module.named_parameters()) add("parameter", p.key(), p.value());
  for (const auto& b : module.named_buffers()) add("buffer", b.key(), b.value());
  return lines;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Gathers every rank's description (CPU collectives only) and throws the same message on every
// rank when any differs from rank 0's.
void verify_same_structure(Communicator& comm, const torch::nn::Module& module) {
  std::vector<std::vector<std::string>> per_rank;
  for (const auto& text : all_gather_strings(comm, join(describe(module)))) {
    per_rank.push_back(split(text));
  }
  const auto& reference = per_rank[0];
  size_t first = SIZE_MAX;
  for (const auto& lines : per_rank) {
    for (size_t i = 0; i < std::max(lines.size(), reference.size()); ++i) {
      if (i >= lines.size() || i >= reference.size() || lines[i] != reference[i]) {
        first = std::min(first, i);
        break;
      }
    }
  }
  if (first == SIZE_MAX) return;

  std::ostringstream msg;
  msg << "DistributedDataParallel: the model differs across ranks at entry " << first << ":";
  auto entry = [&](const std::vector<std::string>& lines) {
    return first < lines.size() ? lines[first]
                                : "(none: " + std::to_string(lines.size()) + " entries)";
  };
  msg << "\n  rank 0: " << entry(reference);
  std::vector<int> differing;
  for (int r = 1; r < comm.size(); ++r) {
    if (entry(per_rank[r]) != entry(reference)) {
      differing.push_back(r);
      msg << "\n  rank " << r << ": " << entry(per_rank[r]);
    }
  }
  msg << "\n  every rank must build the same model (ranks differing from rank 0:";
  for (int r : differing) msg << " " << r;
  msg << ")";
  throw std::runtime_error(msg.str());
}

void broadcast_from_rank0(Communicator& comm, const torch::Tensor& t) {
  if (t.is_contiguous()) {
    comm.broadcast(t, 0);
  } else {
    torch::Tensor staging = t.contiguous();
    comm.broadcast(staging, 0);
    t.copy_(staging);
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Runtime& runtime,
                                                 std::shared_ptr<torch::nn::Module> module)
    : module_(std::move(module)), comm_(runtime.cpu_communicator()) {
  if (!module_) throw std::invalid_argument("DistributedDataParallel: module is null");
  params_ = module_->parameters();
  verify_same_structure(comm_, *module_);

  torch::NoGradGuard no_grad;
  for (const auto& p : params_) broadcast_from_rank0(comm_, p);
  for (const auto& b : module_->buffers()) broadcast_from_rank0(comm_, b);

  if (comm_.size() == 1) return;  // nothing to average
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad()) continue;
    hooks_.emplace_back(i, params_[i].register_hook(
                               [this](const torch::Tensor& grad) { return average(grad); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (const auto& [index, handle] : hooks_) params_[index].remove_hook(handle);
}

torch::Tensor DistributedDataParallel::average(const torch::Tensor& grad) {
  const auto start = std::chrono::steady_clock::now();
  // A copy: autograd may hand the same gradient tensor to several inputs.
  torch::Tensor reduced = grad.clone(at::MemoryFormat::Contiguous);
  comm_.all_reduce(reduced, ReduceOp::Avg);
  sync_bytes_ += reduced.numel() * static_cast<int64_t>(reduced.element_size());
  sync_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return reduced;
}

}  // namespace ddp
