#pragma once
/// \file
/// Are the replicas still identical? DistributedDataParallel keeps parameters equal by
/// construction, but buffers computed locally (BatchNorm running statistics without buffer
/// broadcast), non-deterministic kernels or a bug can make replicas drift apart silently. These
/// checks find the first tensor that differs and the ranks that hold a different value.

#include <ddp/communicator.h>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

struct ReplicaMismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A 64-bit hash (XXH64) of a tensor's dtype, shape and bytes (any device; CPU copy when needed),
/// the same in every process and run on machines of the same byte order. Equal values with
/// different bits (-0.0 and 0.0, NaN payloads) hash differently: the check is bit for bit.
uint64_t tensor_hash(const torch::Tensor& tensor);

/// Collective. Compares every parameter and buffer of `module` (their names, dtypes, shapes and
/// bits) across the ranks of `comm` using one all-gather of per-tensor hashes; `comm` must take
/// CPU tensors (ProcessGroup::cpu()). Returns when all agree; otherwise throws
/// ReplicaMismatch on every rank with the same message, naming the first differing tensor
/// (parameters, then buffers, in registration order), the ranks whose value differs from rank
/// 0's and how (max abs difference, or the dtypes and shapes), e.g.
///   "replicas differ at step 120: buffer 'bn1.running_mean' differs from rank 0 on rank(s) 3
///    (max abs difference 0.0123)"
/// `context` ("at step 120") is put into the message. Modules with different numbers of
/// parameters or buffers are reported as such.
void check_replicas_in_sync(const torch::nn::Module& module, Communicator& comm,
                            const std::string& context = "");

/// One tensor (or other value) that differs between two state files.
struct TensorDifference {
  std::string name;  ///< the qualified name in the files ("fc1.weight")
  /// "max abs difference 0.0123 (3 of 16 elements differ)", "shape [3] vs [4]",
  /// "dtype Float vs Double", "missing in B", "missing in A"
  std::string what;
  /// 0 when not comparable (shape, dtype or presence differs) and when only the bits differ
  /// (-0.0 against 0.0, two NaNs); NaN when a NaN stands against a number.
  double max_abs_diff = 0;
};

/// Compares two files written by save_module() (or the model part of a training snapshot):
/// every tensor, by qualified name ("fc1.weight"), bit for bit. Sorted in file A's order, then
/// the names only in B. Empty result: identical. Throws std::runtime_error naming a file that
/// cannot be read.
std::vector<TensorDifference> compare_state_files(const std::string& a, const std::string& b);

}  // namespace ddp
