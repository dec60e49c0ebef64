#include <ddp/mpi_communicator.h>

#include "mpi_check.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace ddp {

namespace {

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT32_T;
    case torch::kLong: return MPI_INT64_T;
    case torch::kByte: return MPI_UINT8_T;
    default:
      throw std::invalid_argument(std::string("MpiCommunicator: unsupported dtype ") +
                                  std::string(c10::toString(t.scalar_type())));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  throw std::invalid_argument("MpiCommunicator: unknown ReduceOp");
}

void check_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + ": undefined tensor");
  if (!t.is_contiguous()) {
    throw std::invalid_argument(std::string(what) + ": tensor must be contiguous");
  }
}

// MPI counts are int: larger tensors go in chunks of at most INT_MAX elements.
template <typename Fn>
void for_each_chunk(const torch::Tensor& t, Fn fn) {
  const int64_t n = t.numel();
  const int64_t element_size = static_cast<int64_t>(t.element_size());
  char* base = static_cast<char*>(t.data_ptr());
  for (int64_t offset = 0; offset < n; offset += INT_MAX) {
    const int count = static_cast<int>(std::min<int64_t>(INT_MAX, n - offset));
    fn(base + offset * element_size, count);
  }
}

// MPI reads and writes host memory: a tensor elsewhere (a GPU) goes through a host copy, which
// `finish` copies back. Slow but correct; CUDA tensors belong on the NCCL backend.
struct HostStaging {
  explicit HostStaging(const torch::Tensor& t) : target(t), host(t.is_cpu() ? t : t.to(torch::kCPU)) {}
  void finish() const {
    if (!target.is_cpu()) target.copy_(host);
  }
  torch::Tensor target, host;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  DDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  // Errors come back as codes, so DDP_MPI_CHECK can report them with MPI's message.
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  DDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  check_contiguous(tensor, "MpiCommunicator::all_reduce");
  if (op == ReduceOp::Avg && !tensor.is_floating_point()) {
    throw std::invalid_argument("MpiCommunicator::all_reduce: Avg needs a floating-point tensor");
  }
  const MPI_Datatype type = mpi_type(tensor);
  const HostStaging staging(tensor);
  for_each_chunk(staging.host, [&](void* data, int count) {
    DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_op(op), comm_));
  });
  if (op == ReduceOp::Avg) staging.host.div_(size_);
  staging.finish();
}

void MpiCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  check_contiguous(tensor, "MpiCommunicator::broadcast");
  const MPI_Datatype type = mpi_type(tensor);
  const HostStaging staging(tensor);
  for_each_chunk(staging.host, [&](void* data, int count) {
    DDP_MPI_CHECK(MPI_Bcast(data, count, type, root, comm_));
  });
  staging.finish();
}

torch::Tensor MpiCommunicator::all_gather(const torch::Tensor& tensor) {
  check_contiguous(tensor, "MpiCommunicator::all_gather");
  if (tensor.numel() > INT_MAX) {
    throw std::invalid_argument("MpiCommunicator::all_gather: more than INT_MAX elements");
  }
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  const torch::Tensor host = tensor.to(torch::kCPU);
  torch::Tensor out = torch::empty(shape, host.options());
  const int count = static_cast<int>(host.numel());
  const MPI_Datatype type = mpi_type(host);
  DDP_MPI_CHECK(MPI_Allgather(host.data_ptr(), count, type, out.data_ptr(), count, type, comm_));
  return out.to(tensor.device());
}

void MpiCommunicator::barrier() { DDP_MPI_CHECK(MPI_Barrier(comm_)); }

}  // namespace ddp
