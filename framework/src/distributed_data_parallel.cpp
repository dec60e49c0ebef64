#include <ddp/distributed_data_parallel.h>

#include <torch/torch.h>

#include <algorithm>
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
                                                 std::shared_ptr<torch::nn::Module> module,
                                                 DDPOptions options)
    : module_(std::move(module)), options_(options) {
  if (!module_) throw std::invalid_argument("DistributedDataParallel: module is null");
  Communicator& comm = runtime.cpu_communicator();
  verify_same_structure(comm, *module_);
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : module_->parameters()) broadcast_from_rank0(comm, p);
    for (const auto& b : module_->buffers()) broadcast_from_rank0(comm, b);
  }
  if (runtime.world_size() == 1) return;  // one replica: its gradients are the average

  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& p : module_->named_parameters()) {
    names.push_back(p.key());
    params.push_back(p.value());
  }
  reducer_ = std::make_unique<Reducer>(runtime, std::move(params), std::move(names), options_);
}

}  // namespace ddp
