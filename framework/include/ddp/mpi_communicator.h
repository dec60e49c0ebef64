#pragma once
// Communicator backend over MPI, for CPU tensors (tensors on a GPU are staged through host
// memory: correct, not fast). It owns a duplicate of the communicator it is
// given, so its messages never match the application's own MPI traffic.

#include <ddp/communicator.h>

#include <mpi.h>

namespace ddp {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Supported dtypes: float32, float64, int32, int64, uint8, and float16/bfloat16 for Sum and
  // Avg (summed in float per element). Avg: floating point only.
  void all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  void barrier() override;

  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace ddp
