#include "comm/compose/cpu_communicator.h"

#include "comm/compose/hierarchical_communicator.h"
#include "comm/ring/ring_connections.h"
#include "util/mpi_check.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <utility>

namespace ddp {

namespace {

// A network device that MPI can use faster than TCP: InfiniBand/RoCE (verbs, UCX) or HPE
// Slingshot (libfabric cxi).
bool fast_network_device() {
  namespace fs = std::filesystem;
  std::error_code error;
  for (const char* dir : {"/sys/class/infiniband", "/sys/class/cxi"}) {
    if (fs::is_directory(dir, error) && !fs::is_empty(dir, error)) return true;
  }
  return false;
}

SocketRingOptions ring_options(const CpuOptions& options, int rank, int size) {
  SocketRingOptions ring;
  ring.interfaces = options.socket_interfaces;
  if (rank == 0) {  // once per communicator: where the gradients now travel
    const std::size_t kib = options.socket_bytes >> 10;
    ring.on_connected = [kib, size](const std::string& address) {
      std::fprintf(stderr,
                   "ddp: socket ring: all-reduces of %zu KiB or more go over TCP between the %d "
                   "ranks (rank 0 at %s; DDP_MPI_SOCKETS=never keeps them on MPI)\n",
                   kib, size, address.c_str());
      std::fflush(stderr);
    };
  }
  return ring;
}

}  // namespace

CpuOptions::Sockets parse_sockets(const std::string& name, const std::string& what) {
  for (auto sockets :
       {CpuOptions::Sockets::Auto, CpuOptions::Sockets::Never, CpuOptions::Sockets::Always}) {
    if (name == to_string(sockets)) return sockets;
  }
  throw std::invalid_argument(what + "='" + name + "': expected auto, never or always");
}

const char* to_string(CpuOptions::Sockets sockets) {
  switch (sockets) {
    case CpuOptions::Sockets::Auto:
      return "auto";
    case CpuOptions::Sockets::Never:
      return "never";
    case CpuOptions::Sockets::Always:
      return "always";
  }
  return "?";
}

bool socket_ring_wanted(MPI_Comm comm, CpuOptions::Sockets sockets) {
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size == 1 || sockets == CpuOptions::Sockets::Never) return false;
  const bool one_host = detail::single_host(comm);  // collective: before any early answer
  if (sockets == CpuOptions::Sockets::Always) return true;
  if (one_host) return false;
  int fast = fast_network_device() ? 1 : 0;  // one rank with such a device keeps MPI for all
  DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &fast, 1, MPI_INT, MPI_MAX, comm));
  return fast == 0;
}

std::unique_ptr<Communicator> make_cpu_communicator(MPI_Comm comm, CpuOptions options) {
  if (options.hierarchical != HierarchicalAllReduce::Off) {
    std::vector<int> hosts = detail::host_of_each_rank(comm, options.host_split);
    if (hierarchical_wanted(options.hierarchical, hosts)) {
      return std::make_unique<HierarchicalCommunicator>(comm, std::move(options), std::move(hosts));
    }
  }
  if (!socket_ring_wanted(comm, options.sockets)) {
    return std::make_unique<MpiCommunicator>(comm, std::move(options.mpi));
  }
  return std::make_unique<SizeRoutedCommunicator>(comm, std::move(options));
}

SizeRoutedCommunicator::SizeRoutedCommunicator(MPI_Comm comm, CpuOptions options)
    : socket_bytes_(options.socket_bytes),
      mpi_(comm, options.mpi),
      ring_(mpi_.worker(), ring_options(options, mpi_.rank(), mpi_.size())) {}

SizeRoutedCommunicator::~SizeRoutedCommunicator() = default;

Communicator& SizeRoutedCommunicator::route(const torch::Tensor& tensor) {
  if (tensor.defined() && tensor.nbytes() >= socket_bytes_) return ring_;
  return mpi_;
}

std::unique_ptr<Work> SizeRoutedCommunicator::all_reduce_after_fill(const torch::Tensor& tensor,
                                                                    std::function<void()> fill,
                                                                    ReduceOp op) {
  // Checked as MPI checks it, whichever path it takes: the same errors for every size.
  (void)detail::Collective::all_reduce(detail::host_rules("MpiCommunicator::"), tensor, op);
  return route(tensor).all_reduce_after_fill(tensor, std::move(fill), op);
}

void SizeRoutedCommunicator::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                            ReduceOp op) {
  // Checked as MPI checks it, whichever path it takes (as all_reduce_async).
  (void)detail::Collective::reduce_scatter(detail::host_rules("MpiCommunicator::"), output, input,
                                           op, size());
  route(input).reduce_scatter(output, input, op);
}

void SizeRoutedCommunicator::all_gather_into(const torch::Tensor& output,
                                             const torch::Tensor& input) {
  (void)detail::Collective::all_gather_into(detail::host_rules("MpiCommunicator::"), output, input,
                                            size());
  route(output).all_gather_into(output, input);
}

}  // namespace ddp
