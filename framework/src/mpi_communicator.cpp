#include <ddp/mpi_communicator.h>

#include "mpi_check.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

namespace ddp {

namespace {

// MPI has no 16-bit floating-point types: they travel as 2-byte integers and are summed by a
// user-defined operation that computes in float, as the hardware would.
template <typename T>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

MPI_Op sum_op_16bit(torch::ScalarType type) {
  // Created once per process on first use; MPI_Finalize releases them.
  static MPI_Op half_sum = [] {
    MPI_Op op;
    DDP_MPI_CHECK(MPI_Op_create(&sum_16bit<c10::Half>, /*commute=*/1, &op));
    return op;
  }();
  static MPI_Op bf16_sum = [] {
    MPI_Op op;
    DDP_MPI_CHECK(MPI_Op_create(&sum_16bit<c10::BFloat16>, /*commute=*/1, &op));
    return op;
  }();
  return type == torch::kHalf ? half_sum : bf16_sum;
}

bool is_16bit_float(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kHalf:
    case torch::kBFloat16: return MPI_UINT16_T;
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
  MPI_Op mpi_reduce_op = MPI_OP_NULL;
  if (is_16bit_float(tensor)) {
    if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
      throw std::invalid_argument("MpiCommunicator::all_reduce: float16/bfloat16 support Sum and Avg only");
    }
    mpi_reduce_op = sum_op_16bit(tensor.scalar_type());
  } else {
    mpi_reduce_op = mpi_op(op);
  }
  const HostStaging staging(tensor);
  for_each_chunk(staging.host, [&](void* data, int count) {
    DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_reduce_op, comm_));
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
