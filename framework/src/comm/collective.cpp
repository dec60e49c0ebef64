#include "comm/collective.h"

#include "util/hash.h"

#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace ddp::detail {

const char* kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce:
      return "all_reduce";
    case CollectiveKind::Broadcast:
      return "broadcast";
    case CollectiveKind::AllGather:
      return "all_gather";
    case CollectiveKind::Barrier:
      return "barrier";
    case CollectiveKind::ReduceScatter:
      return "reduce_scatter";
  }
  return "collective";
}

const char* dtype_name(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat:
      return "float32";
    case torch::kDouble:
      return "float64";
    case torch::kHalf:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt:
      return "int32";
    case torch::kLong:
      return "int64";
    case torch::kShort:
      return "int16";
    case torch::kByte:
      return "uint8";
    case torch::kChar:
      return "int8";
    default:
      return c10::toString(type);
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

Rules host_rules(std::string prefix) {
  Rules rules;
  rules.prefix = std::move(prefix);
  rules.dtypes = {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                  torch::kInt,   torch::kLong,   torch::kByte};
  rules.half_sum_only = true;
  return rules;
}

namespace {

bool is_16bit_float(torch::ScalarType type) {
  return type == torch::kHalf || type == torch::kBFloat16;
}

// Checks what every call with a tensor needs; returns the call's description without its
// reduce op or root. `name`: the call's name in errors when it is not its kind's.
Collective checked(const Rules& rules, CollectiveKind kind, const torch::Tensor& tensor,
                   const char* name = nullptr) {
  const std::string where = rules.prefix + (name ? name : kind_name(kind));
  auto fail = [&](const std::string& what) { throw std::invalid_argument(where + ": " + what); };
  if (!tensor.defined()) fail("undefined tensor");
  if (!tensor.is_contiguous()) fail("tensor must be contiguous");
  if (rules.device && tensor.device() != *rules.device) {
    fail("the tensor is on " + tensor.device().str() + ", but " + rules.device_reason);
  }
  const torch::ScalarType type = tensor.scalar_type();
  if (!rules.dtypes.empty() &&
      std::find(rules.dtypes.begin(), rules.dtypes.end(), type) == rules.dtypes.end()) {
    std::string supported;
    for (torch::ScalarType t : rules.dtypes)
      supported += (supported.empty() ? "" : ", ") + std::string(dtype_name(t));
    fail(std::string("unsupported dtype ") + dtype_name(type) + " (" + supported + ")");
  }
  Collective call;
  call.kind = kind;
  call.dtype = static_cast<int64_t>(type);
  call.sizes = tensor.sizes().vec();
  return call;
}

// The reduce op's rules for `tensor`'s dtype; `where` ends ": ".
void check_op(const Rules& rules, const std::string& where, const torch::Tensor& tensor,
              ReduceOp op) {
  if (op == ReduceOp::Avg && !tensor.is_floating_point()) {
    throw std::invalid_argument(where + "Avg needs a floating-point tensor, got " +
                                dtype_name(tensor.scalar_type()));
  }
  if (rules.half_sum_only && is_16bit_float(tensor.scalar_type()) && op != ReduceOp::Sum &&
      op != ReduceOp::Avg) {
    throw std::invalid_argument(where + "float16/bfloat16 support Sum and Avg only");
  }
}

// `big` must hold `size` times the elements of `small`, of the same dtype, and not be `small`.
void check_chunks(const Rules& rules, const char* name, const torch::Tensor& big,
                  const char* big_name, const torch::Tensor& small, const char* small_name,
                  int size) {
  (void)checked(rules, CollectiveKind::AllGather, small,
                name);  // defined, contiguous, dtype, device
  const std::string where = rules.prefix + name + ": ";
  auto fail = [&](const std::string& what) { throw std::invalid_argument(where + what); };
  if (big.scalar_type() != small.scalar_type()) {
    fail(std::string(big_name) + " is " + dtype_name(big.scalar_type()) + " but " + small_name +
         " is " + dtype_name(small.scalar_type()));
  }
  if (big.device() != small.device()) {
    fail(std::string(big_name) + " is on " + big.device().str() + " but " + small_name + " on " +
         small.device().str());
  }
  if (big.numel() != small.numel() * size) {
    fail(std::string(big_name) + " has " + std::to_string(big.numel()) + " elements, not " +
         std::to_string(size) + " (ranks) x " + std::to_string(small.numel()) + " (" + small_name +
         "'s); pad it to a multiple of the ranks");
  }
  if (big.numel() > 0 && big.data_ptr() == small.data_ptr())
    fail("input and output are the same memory");
}

}  // namespace

Collective Collective::all_reduce(const Rules& rules, const torch::Tensor& tensor, ReduceOp op) {
  Collective call = checked(rules, CollectiveKind::AllReduce, tensor);
  check_op(rules, rules.prefix + "all_reduce: ", tensor, op);
  call.extra = static_cast<int64_t>(op);
  return call;
}

Collective Collective::reduce_scatter(const Rules& rules, const torch::Tensor& output,
                                      const torch::Tensor& input, ReduceOp op, int size) {
  Collective call = checked(rules, CollectiveKind::ReduceScatter, input);
  check_op(rules, rules.prefix + "reduce_scatter: ", input, op);
  check_chunks(rules, "reduce_scatter", input, "input", output, "output", size);
  call.extra = static_cast<int64_t>(op);
  return call;
}

Collective Collective::all_gather_into(const Rules& rules, const torch::Tensor& output,
                                       const torch::Tensor& input, int size) {
  Collective call = checked(rules, CollectiveKind::AllGather, input, "all_gather_into");
  check_chunks(rules, "all_gather_into", output, "output", input, "input", size);
  return call;
}

Collective Collective::broadcast(const Rules& rules, const torch::Tensor& tensor, int root,
                                 int size) {
  Collective call = checked(rules, CollectiveKind::Broadcast, tensor);
  if (root < 0 || root >= size) {
    throw std::invalid_argument(rules.prefix + "broadcast: root " + std::to_string(root) +
                                " is not a rank of " + std::to_string(size));
  }
  call.extra = root;
  return call;
}

Collective Collective::all_gather(const Rules& rules, const torch::Tensor& tensor) {
  return checked(rules, CollectiveKind::AllGather, tensor);
}

Collective Collective::barrier() { return Collective{}; }

Collective::Fingerprint Collective::fingerprint() const {
  Fingerprint f{};
  f[0] = static_cast<int64_t>(kind);
  f[1] = seq;
  f[2] = dtype;
  f[3] = extra;
  if (dtype >= 0) {
    f[4] = static_cast<int64_t>(sizes.size());
    f[5] = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      f[5] *= sizes[d];
      if (d < kShownDims) f[6 + d] = sizes[d];
    }
  }
  return f;
}

std::string Collective::describe(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f[0]);
  std::string text = std::string(kind_name(kind)) + " #" + std::to_string(f[1]);
  if (f[2] >= 0) {
    text += std::string(" ") + dtype_name(static_cast<torch::ScalarType>(f[2])) + "[";
    for (int64_t d = 0; d < f[4]; ++d) {
      if (d == kShownDims) {
        text += ",...";
        break;
      }
      if (d) text += ",";
      text += std::to_string(f[6 + d]);
    }
    text += "]";
  }
  if (kind == CollectiveKind::AllReduce || kind == CollectiveKind::ReduceScatter) {
    text += std::string(" (") + reduce_op_name(static_cast<ReduceOp>(f[3])) + ")";
  }
  if (kind == CollectiveKind::Broadcast) text += " (root " + std::to_string(f[3]) + ")";
  return text;
}

std::string Collective::describe() const { return describe(fingerprint()); }

int64_t Collective::agreement_key() const {
  std::vector<int64_t> words{static_cast<int64_t>(kind), seq, dtype, extra,
                             static_cast<int64_t>(sizes.size())};
  words.insert(words.end(), sizes.begin(), sizes.end());
  return static_cast<int64_t>(hash64(words.data(), words.size() * sizeof(int64_t)) >> 2);
}

void finish_avg(const torch::Tensor& reduced, ReduceOp op, int size) {
  if (op == ReduceOp::Avg) reduced.div_(size);
}

void reduce_into(torch::Tensor& into, const torch::Tensor& in, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      into.add_(in);
      break;  // 16-bit floats: in float, rounded per element
    case ReduceOp::Min:
      torch::minimum_out(into, into, in);
      break;
    case ReduceOp::Max:
      torch::maximum_out(into, into, in);
      break;
  }
}

}  // namespace ddp::detail
