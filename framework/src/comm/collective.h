#pragma once
// One call of a collective, as every backend (MPI, the TCP ring, NCCL) describes it: its kind,
// dtype and shape, reduce op or root, and number on its communicator. The factories below check
// the arguments against the backend's Rules first, so a Collective exists only for a call the
// backend can make; errors are std::invalid_argument naming the call as the backend does
// ("MpiCommunicator::all_reduce: tensor must be contiguous"). The same description names the call
// in errors, in the watchdog's message and in the debug mode's fingerprint.

#include <ddp/communicator.h>

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::detail {

// The numbers travel between ranks (fingerprints, the watchdog's answers): keep them.
enum class CollectiveKind : int64_t {
  AllReduce = 1,
  Broadcast = 2,
  AllGather = 3,
  Barrier = 4,
  ReduceScatter = 5
};

const char* kind_name(CollectiveKind kind);  // "all_reduce", ...; "collective" for another number
const char* dtype_name(torch::ScalarType type);  // "float32", "int64", ...
const char* reduce_op_name(ReduceOp op);         // "sum", "avg", "min", "max"

// What a backend accepts, and how its errors name a call.
struct Rules {
  // Prefix of a call's name in errors: "MpiCommunicator::" gives "MpiCommunicator::all_reduce".
  std::string prefix;
  // The dtypes it moves; empty: any.
  std::vector<torch::ScalarType> dtypes;
  // float16 and bfloat16 reduce with Sum and Avg only (MPI and the ring add them in float).
  bool half_sum_only = false;
  // Where tensors must live; unset: anywhere (the host backends stage a GPU tensor through host
  // memory). `device_reason` ends "the tensor is on X, but ...".
  std::optional<torch::Device> device;
  std::string device_reason;
};

// MPI's and the TCP ring's: float32/64, int32/64, uint8, and float16/bfloat16 for Sum and Avg.
Rules host_rules(std::string prefix);

struct Collective {
  // Each checks the arguments against `rules` (throws std::invalid_argument) and describes the
  // call. `size`: the communicator's, for the root's range.
  static Collective all_reduce(const Rules& rules, const torch::Tensor& tensor, ReduceOp op);
  static Collective broadcast(const Rules& rules, const torch::Tensor& tensor, int root, int size);
  static Collective all_gather(const Rules& rules, const torch::Tensor& tensor);
  // The flat collectives in equal chunks (communicator.h): both tensors checked, `input` (of
  // reduce_scatter) size() times `output`'s elements, `output` (of all_gather_into) size() times
  // `input`'s. Described by the tensor whose every element each rank sends: reduce_scatter by
  // `input` ("reduce_scatter #5 float32[8] (avg)"), all_gather_into as all_gather of `input`.
  static Collective reduce_scatter(const Rules& rules, const torch::Tensor& output,
                                   const torch::Tensor& input, ReduceOp op, int size);
  static Collective all_gather_into(const Rules& rules, const torch::Tensor& output,
                                    const torch::Tensor& input, int size);
  static Collective barrier();

  // "all_reduce #12 float32[10] (sum)", "broadcast #3 int64[2,3] (root 0)", "barrier #4".
  std::string describe() const;

  // The fingerprint the debug mode all-gathers: kind, sequence number, dtype (-1: none), reduce
  // op or root (-1: none), number of dimensions, elements, the first kShownDims sizes.
  static constexpr int kShownDims = 6;
  static constexpr int kFingerprint = 6 + kShownDims;
  using Fingerprint = std::array<int64_t, kFingerprint>;
  Fingerprint fingerprint() const;
  static std::string describe(const Fingerprint& fingerprint);

  // What every rank must agree on, as one 62-bit number (so that its negation fits an int64):
  // kind, sequence number, dtype, reduce op or root, and the whole shape. Equal on two ranks
  // exactly when their calls match, but for a hash collision (XXH64: about 2^-62 a pair).
  int64_t agreement_key() const;

  CollectiveKind kind = CollectiveKind::Barrier;
  int64_t seq = 0;     // its number on its communicator, 1 for the first (set when queued)
  int64_t dtype = -1;  // torch::ScalarType of the tensor, -1 without one
  std::vector<int64_t> sizes;
  int64_t extra = -1;  // ReduceOp of an all-reduce or reduce-scatter, root of a broadcast, else -1
};

// Avg without a native average: reduce with without_avg(op), then finish_avg(result, op, size).
inline ReduceOp without_avg(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }
void finish_avg(const torch::Tensor& reduced, ReduceOp op, int size);
// The host backends' reduction of one rank's values into another's: into = op(into, in)
// elementwise (Avg: the sum).
void reduce_into(torch::Tensor& into, const torch::Tensor& in, ReduceOp op);

}  // namespace ddp::detail
