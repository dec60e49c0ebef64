#include <ddp/runtime.h>

#include "mpi_check.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace ddp {

namespace {

// Returns true when this call initialised MPI (and so must finalise it).
bool init_mpi(int* argc, char*** argv, int* provided) {
  int initialized = 0;
  DDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) {
    DDP_MPI_CHECK(MPI_Query_thread(provided));
    return false;
  }
  // MULTIPLE lets a communication thread and the training thread both call MPI.
  DDP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, provided));
  return true;
}

}  // namespace

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options)
    : uncaught_at_construction_(std::uncaught_exceptions()) {
  owns_mpi_ = init_mpi(&argc, &argv, &thread_level_);
  init_topology(options);
}

Runtime::Runtime(RuntimeOptions options)
    : uncaught_at_construction_(std::uncaught_exceptions()) {
  owns_mpi_ = init_mpi(nullptr, nullptr, &thread_level_);
  init_topology(options);
}

void Runtime::init_topology(RuntimeOptions options) {
  cpu_comm_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  MPI_Comm world = cpu_comm_->comm();
  rank_ = cpu_comm_->rank();
  world_size_ = cpu_comm_->size();

  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  DDP_MPI_CHECK(MPI_Get_processor_name(name, &length));
  hostname_.assign(name, length);

  // Ranks that share memory are on one node: that is what "local" means, whatever the
  // launcher's environment variables say.
  MPI_Comm node_comm;
  DDP_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                                    &node_comm));
  DDP_MPI_CHECK(MPI_Comm_rank(node_comm, &local_rank_));
  DDP_MPI_CHECK(MPI_Comm_size(node_comm, &local_size_));

  // Node numbers: rank the node leaders (local rank 0) among themselves, then share the
  // leader's number with its node.
  MPI_Comm leaders;
  DDP_MPI_CHECK(MPI_Comm_split(world, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
  if (leaders != MPI_COMM_NULL) {
    DDP_MPI_CHECK(MPI_Comm_rank(leaders, &node_rank_));
    DDP_MPI_CHECK(MPI_Comm_size(leaders, &num_nodes_));
    DDP_MPI_CHECK(MPI_Comm_free(&leaders));
  }
  int node_info[2] = {node_rank_, num_nodes_};
  DDP_MPI_CHECK(MPI_Bcast(node_info, 2, MPI_INT, 0, node_comm));
  node_rank_ = node_info[0];
  num_nodes_ = node_info[1];
  DDP_MPI_CHECK(MPI_Comm_free(&node_comm));

  const int visible = options.use_cuda && torch::cuda::is_available()
                          ? static_cast<int>(torch::cuda::device_count())
                          : 0;
  try {
    device_ = select_device(options.use_cuda, visible, local_rank_, local_size_);
  } catch (const std::exception& e) {
    abort(e.what());  // a placement error on every rank: end the job with the reason
  }
}

Runtime::~Runtime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > uncaught_at_construction_) {
    abort("an exception is unwinding past ddp::Runtime; ending the job (catch it, or use "
          "ddp::run_or_abort to print it first)");
  }
  cpu_comm_.reset();
  if (owns_mpi_) MPI_Finalize();
}

std::string Runtime::summary() const {
  std::ostringstream out;
  out << "rank " << rank_ << "/" << world_size_ << " local " << local_rank_ << "/"
      << local_size_ << " node " << node_rank_ << "/" << num_nodes_ << " host " << hostname_
      << " device " << device_;
  return out.str();
}

void Runtime::abort(const std::string& message, int exit_code) const {
  std::cerr << "ddp: rank " << rank_ << " (" << hostname_ << "): " << message << std::endl;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

int run_or_abort(const Runtime& runtime, const std::function<void()>& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    runtime.abort(e.what_without_backtrace());  // LibTorch's message without its stack dump
  } catch (const std::exception& e) {
    runtime.abort(e.what());
  } catch (...) {
    runtime.abort("unknown exception");
  }
}

torch::Device select_device(bool use_cuda, int visible_cuda_devices, int local_rank,
                            int local_size) {
  if (!use_cuda || visible_cuda_devices == 0) return torch::Device(torch::kCPU);
  if (local_size > visible_cuda_devices) {
    throw std::runtime_error(
        std::to_string(local_size) + " ranks on this node but only " +
        std::to_string(visible_cuda_devices) +
        " visible CUDA device(s): start at most one rank per GPU, or pass --no-cuda");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace ddp
