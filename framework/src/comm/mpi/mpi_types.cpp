#include "comm/mpi/mpi_types.h"

#include "util/mpi_check.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <stdexcept>
#include <string>

namespace ddp::detail {

namespace {

template <typename T>
void sum_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
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

}  // namespace

MPI_Datatype mpi_type(torch::ScalarType type) {
  switch (type) {
    case torch::kHalf:
    case torch::kBFloat16:
      return MPI_UINT16_T;
    case torch::kFloat:
      return MPI_FLOAT;
    case torch::kDouble:
      return MPI_DOUBLE;
    case torch::kInt:
      return MPI_INT32_T;
    case torch::kLong:
      return MPI_INT64_T;
    case torch::kByte:
      return MPI_UINT8_T;
    default:
      throw std::logic_error(std::string("ddp: no MPI datatype for ") + c10::toString(type) +
                             " (the host rules should have refused it)");
  }
}

MPI_Op mpi_op(ReduceOp op, torch::ScalarType type) {
  if (type == torch::kHalf || type == torch::kBFloat16) return sum_op_16bit(type);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Max:
      return MPI_MAX;
  }
  throw std::invalid_argument("MpiCommunicator: unknown ReduceOp");
}

}  // namespace ddp::detail
