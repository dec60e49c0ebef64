#pragma once
// Collective operations on tensors, one interface for every backend (MPI for CPU tensors,
// NCCL for CUDA tensors). Every rank of the communicator must call the same collectives in the
// same order with tensors of the same shape and dtype; that is the caller's invariant, as in MPI.

#include <torch/types.h>

#include <string>
#include <vector>

namespace ddp {

enum class ReduceOp { Sum, Avg, Min, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual std::string backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Reduces `tensor` over all ranks, in place: afterwards every rank holds the result.
  // The tensor must be contiguous and live where the backend can reach it.
  virtual void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;

  // Overwrites `tensor` on every rank with root's values, in place.
  virtual void broadcast(const torch::Tensor& tensor, int root = 0) = 0;

  // Returns a new tensor of shape [size(), tensor.sizes()...] holding every rank's tensor in
  // rank order.
  virtual torch::Tensor all_gather(const torch::Tensor& tensor) = 0;

  virtual void barrier() = 0;
};

// Every rank's string, in rank order (collective; uses only all_reduce and all_gather).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

}  // namespace ddp
