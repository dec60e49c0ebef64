#include <ddp/train/replica_check.h>

#include "util/hash.h"
#include "util/tensor_description.h"

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace ddp {

namespace {

// The tensor's elements as bytes in row-major order. Lazy conjugate and negative views keep
// their sign in a flag, not in the bytes, so they are resolved first.
torch::Tensor host_bytes(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU).resolve_conj().resolve_neg().contiguous();
}

// Largest |a - b|, with equal values (also two NaNs, or the same infinity) counting 0 and a NaN
// against a number giving NaN.
double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto wide = a.is_complex() ? torch::kComplexDouble : torch::kDouble;
  const torch::Tensor x = a.to(wide), y = b.to(wide);
  const torch::Tensor same = x.eq(y).logical_or(x.isnan().logical_and(y.isnan()));
  const torch::Tensor diff = (x - y).abs().masked_fill(same, 0);
  return diff.numel() == 0 ? 0.0 : diff.max().item<double>();
}

std::string layout(const torch::Tensor& t) {
  std::ostringstream text;
  text << t.scalar_type() << " " << t.sizes();
  return text.str();
}

struct Entry {
  std::string label;  // "parameter 'fc1.weight'"
  torch::Tensor tensor;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// The max abs difference costs gathering the tensor (as double) from every rank: skipped beyond
// 256 MiB, where it could exhaust memory instead of reporting.
constexpr int64_t kMaxGatheredElements = int64_t{32} << 20;

// Why a buffer may differ in a correct run: check_replicas_in_sync(model) right after a step meets
// it.
constexpr const char* kBufferHint =
    "; a buffer (BatchNorm's running statistics) is each rank's own after a training forward, as "
    "in PyTorch, until DistributedDataParallel::prepare_forward() (or the wrapper's next training "
    "forward) broadcasts rank 0's: check after that call";

// The error path of check_replicas_in_sync, taken by every rank alike: `entry` differs from rank
// 0's on the ranks `differing`. Collective.
[[noreturn]] void throw_mismatch(Communicator& comm, const std::string& prefix, const Entry& entry,
                                 const std::vector<int>& differing) {
  const auto labels = all_gather_strings(comm, entry.label);
  const auto layouts = all_gather_strings(comm, layout(entry.tensor));
  std::ostringstream msg;
  msg << prefix << labels[0] << " differs from rank 0 on rank(s) " << join_ranks(differing);
  bool same_layout = true;
  for (int r : differing)
    same_layout = same_layout && labels[r] == labels[0] && layouts[r] == layouts[0];
  if (!same_layout) {
    msg << " (rank 0: " << labels[0] << " " << layouts[0];
    for (int r : differing) msg << "; rank " << r << ": " << labels[r] << " " << layouts[r];
    msg << ")";
  } else if (!entry.tensor.is_complex() &&  // MPI has no complex types
             entry.tensor.numel() * comm.size() <= kMaxGatheredElements) {
    const torch::Tensor all = comm.all_gather(host_bytes(entry.tensor).to(torch::kDouble));
    msg << " (max abs difference " << max_abs_difference(all.slice(0, 1), all[0]) << ")";
  }
  if (entry.label.rfind("buffer ", 0) == 0) msg << kBufferHint;
  throw ReplicaMismatch(msg.str());
}

using Leaves = std::vector<std::pair<std::string, c10::IValue>>;

// Module::save() nests one archive per submodule; its tensors get their qualified names.
void flatten(torch::serialize::InputArchive& archive, const std::string& prefix, Leaves& leaves) {
  for (const std::string& key : archive.keys()) {
    torch::serialize::InputArchive nested;
    if (archive.try_read(key, nested)) {
      flatten(nested, prefix + key + ".", leaves);
      continue;
    }
    c10::IValue value;
    archive.read(key, value);
    leaves.emplace_back(prefix + key, std::move(value));
  }
}

Leaves load_leaves(const std::string& path) {
  if (!std::ifstream(path)) {
    throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, torch::Device(torch::kCPU));
    Leaves leaves;
    flatten(archive, "", leaves);
    return leaves;
  } catch (const c10::Error& e) {
    throw std::runtime_error(path + ": not a LibTorch archive: " + e.what_without_backtrace());
  }
}

std::string describe(const c10::IValue& value) {
  if (value.isTensor()) return "tensor " + layout(value.toTensor());
  std::ostringstream text;
  text << value;
  return text.str();
}

// Fills `d` and returns true when the tensors differ in any bit.
bool compare_tensors(const torch::Tensor& a, const torch::Tensor& b, TensorDifference& d) {
  std::vector<std::string> parts;
  if (a.scalar_type() != b.scalar_type()) {
    parts.push_back(std::string("dtype ") + c10::toString(a.scalar_type()) + " vs " +
                    c10::toString(b.scalar_type()));
  }
  if (a.sizes() != b.sizes()) {
    std::ostringstream text;
    text << "shape " << a.sizes() << " vs " << b.sizes();
    parts.push_back(text.str());
  }
  if (!parts.empty()) {
    d.what = parts[0] + (parts.size() > 1 ? ", " + parts[1] : "");
    return true;
  }
  // Element by element on the raw bytes: values that compare equal but differ in bits count.
  const torch::Tensor x = host_bytes(a), y = host_bytes(b);
  const int64_t n = x.numel(), width = static_cast<int64_t>(x.element_size());
  const int64_t differing = n == 0
                                ? 0
                                : torch::from_blob(x.data_ptr(), {n, width}, torch::kByte)
                                      .ne(torch::from_blob(y.data_ptr(), {n, width}, torch::kByte))
                                      .any(1)
                                      .sum()
                                      .item<int64_t>();
  if (differing == 0) return false;
  d.max_abs_diff = max_abs_difference(x, y);
  std::ostringstream text;
  text << "max abs difference " << d.max_abs_diff << " (" << differing << " of " << n
       << " elements differ)";
  d.what = text.str();
  return true;
}

}  // namespace

uint64_t tensor_hash(const torch::Tensor& tensor) {
  if (!tensor.defined()) {
    const int64_t undefined = -1;
    return hash64(&undefined, sizeof undefined, 0);
  }
  std::vector<int64_t> header{static_cast<int64_t>(tensor.scalar_type()), tensor.dim()};
  header.insert(header.end(), tensor.sizes().begin(), tensor.sizes().end());
  const uint64_t seed = hash64(header.data(), header.size() * sizeof(int64_t), 0);
  const torch::Tensor bytes = host_bytes(tensor);
  return hash64(bytes.data_ptr(), bytes.numel() * bytes.element_size(), seed);
}

void check_replicas_in_sync(const torch::nn::Module& module, Communicator& comm,
                            const std::string& context) {
  const std::string prefix = "replicas differ" + (context.empty() ? "" : " " + context) + ": ";
  std::vector<Entry> entries;
  for (const auto& p : module.named_parameters())
    entries.push_back({"parameter '" + p.key() + "'", p.value()});
  const int64_t parameters = static_cast<int64_t>(entries.size());
  for (const auto& b : module.named_buffers())
    entries.push_back({"buffer '" + b.key() + "'", b.value()});
  const int64_t buffers = static_cast<int64_t>(entries.size()) - parameters;

  // Counts first: hash vectors of different lengths cannot be gathered.
  const torch::Tensor counts = comm.all_gather(torch::tensor({parameters, buffers}, torch::kLong));
  if (!torch::equal(counts, counts[0].expand_as(counts))) {
    std::ostringstream msg;
    msg << prefix << "the modules differ in structure:";
    const auto c = counts.accessor<int64_t, 2>();
    for (int r = 0; r < comm.size(); ++r) {
      if (r == 0 || c[r][0] != c[0][0] || c[r][1] != c[0][1]) {
        msg << (r == 0 ? " " : ", ") << "rank " << r << " has " << c[r][0] << " parameters and "
            << c[r][1] << " buffers";
      }
    }
    throw ReplicaMismatch(msg.str());
  }

  // The label goes into each hash so that a renamed or reordered tensor counts as a difference.
  torch::Tensor hashes = torch::empty({static_cast<int64_t>(entries.size())}, torch::kLong);
  int64_t* hash = hashes.data_ptr<int64_t>();
  for (const Entry& e : entries) {
    *hash++ = static_cast<int64_t>(hash64(e.label.data(), e.label.size(), tensor_hash(e.tensor)));
  }
  const torch::Tensor all = comm.all_gather(hashes);
  const auto h = all.accessor<int64_t, 2>();
  for (size_t i = 0; i < entries.size(); ++i) {
    std::vector<int> differing;
    for (int r = 1; r < comm.size(); ++r) {
      if (h[r][static_cast<int64_t>(i)] != h[0][static_cast<int64_t>(i)]) differing.push_back(r);
    }
    if (!differing.empty()) throw_mismatch(comm, prefix, entries[i], differing);
  }
}

std::vector<TensorDifference> compare_state_files(const std::string& a, const std::string& b) {
  const Leaves in_a = load_leaves(a), in_b = load_leaves(b);
  std::unordered_map<std::string, const c10::IValue*> by_name_b, by_name_a;
  for (const auto& [name, value] : in_b) by_name_b.emplace(name, &value);
  for (const auto& [name, value] : in_a) by_name_a.emplace(name, &value);

  std::vector<TensorDifference> differences;
  for (const auto& [name, value] : in_a) {
    TensorDifference d{name, "", 0};
    const auto other = by_name_b.find(name);
    if (other == by_name_b.end()) {
      d.what = "missing in B";
    } else if (value.isTensor() && other->second->isTensor()) {
      if (!compare_tensors(value.toTensor(), other->second->toTensor(), d)) continue;
    } else if (value.isTensor() || other->second->isTensor() || !(value == *other->second)) {
      d.what = "value " + describe(value) + " vs " + describe(*other->second);
    } else {
      continue;
    }
    differences.push_back(std::move(d));
  }
  for (const auto& [name, value] : in_b) {
    if (by_name_a.count(name) == 0) differences.push_back({name, "missing in A", 0});
  }
  return differences;
}

}  // namespace ddp
