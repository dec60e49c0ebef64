#include "comm/mpi/mpi_communicator.h"

#include "comm/mpi/mpi_types.h"
#include "util/mpi_check.h"

#include <torch/torch.h>

#include <climits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace ddp {

using detail::Collective;

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options)
    : options_(std::move(options)),
      rules_(detail::host_rules("MpiCommunicator::")),
      worker_(std::make_shared<detail::MpiWorker>(comm, options_)) {}

MpiCommunicator::~MpiCommunicator() = default;

std::unique_ptr<Work> MpiCommunicator::all_reduce_after_fill(const torch::Tensor& tensor,
                                                             std::function<void()> fill,
                                                             ReduceOp op) {
  Collective call = Collective::all_reduce(rules_, tensor, op);
  fill = detail::fill_on_worker(tensor, std::move(fill));
  const torch::Tensor host = detail::on_host(tensor);
  const MPI_Datatype type = detail::mpi_type(host.scalar_type());
  const MPI_Op reduce = detail::mpi_op(op, host.scalar_type());
  const int size = this->size();
  const bool blocking = host.nbytes() >= options_.blocking_bytes;
  detail::MpiWorker* worker = worker_.get();  // outlives the calls queued on it
  // The worker's agreement on the call (collective_check.h) has waited for every rank: the
  // blocking path needs no arrival barrier.
  auto run = [worker, fill, host, type, reduce, op, size, blocking] {
    if (fill) fill();
    detail::mpi_all_reduce(*worker, worker->comm(), host, type, reduce, blocking,
                           /*arrive_first=*/false);
    detail::finish_avg(host, op, size);
  };
  return worker_->submit(std::move(call), std::move(run), tensor, host);
}

void MpiCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  Collective call = Collective::broadcast(rules_, tensor, root, size());
  const torch::Tensor host = detail::on_host(tensor);
  const MPI_Datatype type = detail::mpi_type(host.scalar_type());
  detail::MpiWorker* worker = worker_.get();
  auto run = [worker, host, type, root] {
    detail::for_each_chunk(host, [&](void* data, int count) {
      MPI_Request request;
      DDP_MPI_CHECK(MPI_Ibcast(data, count, type, root, worker->comm(), &request));
      worker->wait(request);
    });
  };
  worker_->submit(std::move(call), std::move(run), tensor, host)->wait();
}

torch::Tensor MpiCommunicator::all_gather(const torch::Tensor& tensor) {
  Collective call = Collective::all_gather(rules_, tensor);
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  torch::Tensor out = torch::empty(shape, tensor.options().device(torch::kCPU));
  gather(std::move(call), out, tensor);
  return out.to(tensor.device());
}

void MpiCommunicator::all_gather_into(const torch::Tensor& output, const torch::Tensor& input) {
  gather(Collective::all_gather_into(rules_, output, input, size()), output, input);
}

void MpiCommunicator::gather(Collective call, const torch::Tensor& output,
                             const torch::Tensor& input) {
  if (input.numel() > INT_MAX) {
    throw std::invalid_argument("MpiCommunicator::" + std::string(detail::kind_name(call.kind)) +
                                ": more than INT_MAX elements per rank");
  }
  const torch::Tensor in = input.to(torch::kCPU), out = detail::on_host(output);
  detail::MpiWorker* worker = worker_.get();
  auto run = [worker, in, out] {
    const int count = static_cast<int>(in.numel());
    const MPI_Datatype type = detail::mpi_type(in.scalar_type());
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallgather(in.data_ptr(), count, type, out.data_ptr(), count, type,
                                 worker->comm(), &request));
    worker->wait(request);
  };
  worker_->submit(std::move(call), std::move(run), output, out)->wait();
}

void MpiCommunicator::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                     ReduceOp op) {
  Collective call = Collective::reduce_scatter(rules_, output, input, op, size());
  if (output.numel() > INT_MAX) {
    throw std::invalid_argument(
        "MpiCommunicator::reduce_scatter: more than INT_MAX elements per rank");
  }
  const torch::Tensor in = input.to(torch::kCPU), out = detail::on_host(output);
  const MPI_Datatype type = detail::mpi_type(in.scalar_type());
  const MPI_Op reduce = detail::mpi_op(op, in.scalar_type());
  const int size = this->size();
  detail::MpiWorker* worker = worker_.get();
  auto run = [worker, in, out, type, reduce, op, size] {
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(),
                                            static_cast<int>(out.numel()), type, reduce,
                                            worker->comm(), &request));
    worker->wait(request);
    detail::finish_avg(out, op, size);
  };
  worker_->submit(std::move(call), std::move(run), output, out)->wait();
}

void MpiCommunicator::barrier() {
  detail::MpiWorker* worker = worker_.get();
  worker_
      ->submit(Collective::barrier(),
               [worker] {
                 MPI_Request request;
                 DDP_MPI_CHECK(MPI_Ibarrier(worker->comm(), &request));
                 worker->wait(request);
               })
      ->wait();
}

namespace detail {

void mpi_all_reduce(const MpiWorker& worker, MPI_Comm comm, const torch::Tensor& t,
                    MPI_Datatype type, MPI_Op reduce, bool blocking, bool arrive_first) {
  if (arrive_first) {
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm, &request));
    worker.wait(request);
  }
  for_each_chunk(t, [&](void* data, int count) {
    if (blocking) {
      DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, reduce, comm));
      return;
    }
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, reduce, comm, &request));
    worker.wait(request);
  });
}

}  // namespace detail
}  // namespace ddp
