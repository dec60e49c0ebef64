#pragma once
// How a tensor travels in MPI calls: its elements' MPI datatype, the MPI reduce operation, and
// the pieces of one call (MPI counts are int). Validation is not here: a Collective
// (comm/collective.h) was checked against the host rules before its tensor gets here.
//
// MPI has no 16-bit floating-point types: float16 and bfloat16 travel as 2-byte integers and are
// summed by user-defined operations that compute in float and round per element, as the hardware
// would (and as the TCP ring does).

#include <ddp/communicator.h>

#include <mpi.h>
#include <torch/types.h>

#include <algorithm>
#include <climits>
#include <cstdint>

namespace ddp::detail {

MPI_Datatype mpi_type(torch::ScalarType type);
// Sum and Avg (the caller divides) of any host dtype; Min and Max of all but the 16-bit floats.
MPI_Op mpi_op(ReduceOp op, torch::ScalarType type);

// Calls fn(data, count) on consecutive pieces of `t` of at most INT_MAX elements.
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

}  // namespace ddp::detail
