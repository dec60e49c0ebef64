#include "comm/compose/hierarchical_communicator.h"

#include "comm/mpi/mpi_types.h"
#include "comm/ring/ring_connections.h"
#include "comm/ring/socket_ring.h"
#include "util/mpi_check.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace ddp {

using detail::Collective;

namespace detail {

// An MPI communicator a HierarchicalCommunicator made, freed with it (unless MPI is already
// finalized).
struct OwnedComm {
  MPI_Comm comm = MPI_COMM_NULL;
  OwnedComm() = default;
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  ~OwnedComm() {
    if (!mpi_finalized() && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

}  // namespace detail

namespace {

int comm_size(MPI_Comm comm) {
  int size = 1;
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}

std::string join(const std::vector<int>& numbers) {
  std::string text;
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(numbers[i]);
  }
  return text;
}

// Ranks per host, hosts in the order of their lowest rank.
std::vector<int> ranks_per_host(const std::vector<int>& hosts) {
  std::map<int, int> count;
  for (int host : hosts) ++count[host];
  std::vector<int> counts;
  for (const auto& [host, n] : count) counts.push_back(n);
  return counts;
}

}  // namespace

namespace detail {

std::vector<int> host_of_each_rank(MPI_Comm comm, const std::vector<int>& host_split) {
  int rank = 0;
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const int size = comm_size(comm);
  std::vector<int> hosts(static_cast<size_t>(size));
  if (!host_split.empty()) {
    const int total = std::accumulate(host_split.begin(), host_split.end(), 0);
    const bool positive =
        std::all_of(host_split.begin(), host_split.end(), [](int n) { return n > 0; });
    if (!positive || total != size) {
      throw std::invalid_argument("CpuOptions::host_split '" + join(host_split) +
                                  "': expected ranks per host, each >= 1, adding up to the " +
                                  std::to_string(size) + " ranks of the communicator");
    }
    int first = 0;
    for (int n : host_split) {
      std::fill_n(hosts.begin() + first, n, first);
      first += n;
    }
    return hosts;
  }
  // The ranks that share memory; the host's lowest rank names it.
  OwnedComm node;
  DDP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node.comm));
  int lowest = rank;
  DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node.comm));
  DDP_MPI_CHECK(MPI_Allgather(&lowest, 1, MPI_INT, hosts.data(), 1, MPI_INT, comm));
  return hosts;
}

}  // namespace detail

bool hierarchical_wanted(HierarchicalAllReduce mode, const std::vector<int>& hosts) {
  if (hosts.size() <= 1 || mode == HierarchicalAllReduce::Off) return false;
  if (mode == HierarchicalAllReduce::On) return true;
  const std::vector<int> counts = ranks_per_host(hosts);
  return counts.size() > 1 && *std::max_element(counts.begin(), counts.end()) > 1;
}

struct HierarchicalCommunicator::State {
  detail::MpiWorker* worker = nullptr;  // flat_'s: outlives the calls queued on it
  detail::OwnedComm host;               // this rank's host's ranks; rank 0 is the leader
  detail::OwnedComm leaders;            // one rank per host (MPI_COMM_NULL on the others)
  int host_size = 1, leaders_size = 1, hosts = 1;
  bool leader = false;
  bool ring_wanted = false;  // the leaders' large all-reduces take the TCP ring
  std::size_t socket_bytes = 0, blocking_bytes = 0;
  std::string interfaces;
  std::unique_ptr<detail::RingConnections> ring;  // the leaders' ring, connected by its first call
  detail::RingBuffers buffers;                    // the ring's, reused between calls
  torch::Tensor received;                         // the leader's: a host rank's tensor (phase 1)
  bool ring_broken = false;  // a ring call threw half way: bytes may be in flight

  void leaders_ring(const torch::Tensor& t, ReduceOp op) {
    if (!ring) {
      ring = std::make_unique<detail::RingConnections>(leaders.comm, interfaces,
                                                       detail::single_host(leaders.comm));
      if (ring->rank() == 0) {
        std::fprintf(stderr,
                     "ddp: hierarchical all-reduce: the %d host leaders' all-reduces of %zu KiB "
                     "or more go over TCP (rank 0 at %s)\n",
                     leaders_size, socket_bytes >> 10, ring->address(0).c_str());
        std::fflush(stderr);
      }
    }
    if (ring_broken) {
      throw std::runtime_error(
          "hierarchical all-reduce: an earlier all-reduce of the host "
          "leaders' TCP ring failed half way, so the ring is out of step");
    }
    ring_broken = true;  // until it completes
    ring->set_call("all_reduce");
    detail::ring_all_reduce(*ring, buffers, t, op);
    ring_broken = false;
  }

  // Sends `t` to `peer` of the host, or receives it from `peer`, waited for by the worker
  // without its spin: the peer is busy (training, or its leader talking to the other hosts), and
  // with ranks sharing cores a spinning wait takes the core it needs (docs/records/performance.md).
  void transfer(const torch::Tensor& t, int peer, bool send) const {
    const MPI_Datatype type = detail::mpi_type(t.scalar_type());
    detail::for_each_chunk(t, [&](void* data, int count) {
      MPI_Request request;
      if (send) {
        DDP_MPI_CHECK(MPI_Isend(data, count, type, peer, 0, host.comm, &request));
      } else {
        DDP_MPI_CHECK(MPI_Irecv(data, count, type, peer, 0, host.comm, &request));
      }
      worker->wait(request, /*spin=*/false);
    });
  }

  // Phase 1: the leader receives each rank's tensor in host-rank order and combines it in.
  void reduce_on_host(const torch::Tensor& t, ReduceOp op) {
    if (!leader) return transfer(t, 0, /*send=*/true);
    if (!received.defined() || received.scalar_type() != t.scalar_type() ||
        received.numel() < t.numel()) {
      received = torch::empty({t.numel()}, t.options());
    }
    torch::Tensor in = received.slice(0, 0, t.numel()).view(t.sizes());
    torch::Tensor out = t;
    for (int r = 1; r < host_size; ++r) {
      transfer(in, r, /*send=*/false);
      detail::reduce_into(out, in, op);
    }
  }

  // Phase 3: the leader sends the result to each rank of the host.
  void broadcast_on_host(const torch::Tensor& t) {
    if (!leader) return transfer(t, 0, /*send=*/false);
    for (int r = 1; r < host_size; ++r) transfer(t, r, /*send=*/true);
  }

  // The three phases (the header's comment), in place on `t` (contiguous, on the CPU).
  void all_reduce(const torch::Tensor& t, ReduceOp op, int size) {
    if (host_size > 1) reduce_on_host(t, op);
    if (leader && leaders_size > 1) {
      if (ring_wanted && t.nbytes() >= socket_bytes) {
        leaders_ring(t, detail::without_avg(op));
      } else {
        const MPI_Datatype type = detail::mpi_type(t.scalar_type());
        const MPI_Op reduce = detail::mpi_op(op, t.scalar_type());  // Avg: the sum
        const bool blocking = t.nbytes() >= blocking_bytes;
        detail::mpi_all_reduce(*worker, leaders.comm, t, type, reduce, blocking, blocking);
      }
    }
    if (leader) detail::finish_avg(t, op, size);
    if (host_size > 1) broadcast_on_host(t);
  }
};

HierarchicalCommunicator::HierarchicalCommunicator(MPI_Comm comm, CpuOptions options,
                                                   std::vector<int> hosts)
    : flat_(comm, options.mpi) {
  auto state = std::make_unique<State>();
  const int rank = flat_.rank();
  if (hosts.size() != static_cast<size_t>(flat_.size())) {
    throw std::logic_error("HierarchicalCommunicator: a host for each of the " +
                           std::to_string(flat_.size()) + " ranks expected, got " +
                           std::to_string(hosts.size()));
  }
  const int my_host = hosts[static_cast<size_t>(rank)];
  state->worker = flat_.worker().get();
  state->leader = my_host == rank;  // a host is named by its lowest rank, its leader
  DDP_MPI_CHECK(MPI_Comm_split(comm, my_host, rank, &state->host.comm));
  DDP_MPI_CHECK(
      MPI_Comm_split(comm, state->leader ? 0 : MPI_UNDEFINED, rank, &state->leaders.comm));
  state->host_size = comm_size(state->host.comm);
  const std::vector<int> counts = ranks_per_host(hosts);
  state->hosts = static_cast<int>(counts.size());
  if (state->leader) {
    state->leaders_size = comm_size(state->leaders.comm);
    // Collective over the leaders alone: the same answer on each of them.
    state->ring_wanted = socket_ring_wanted(state->leaders.comm, options.sockets);
  }
  state->socket_bytes = options.socket_bytes;
  state->blocking_bytes = options.mpi.blocking_bytes;
  state->interfaces = options.socket_interfaces;
  int ring = state->ring_wanted ? 1 : 0;  // rank 0, a leader, tells the others for its message
  DDP_MPI_CHECK(MPI_Bcast(&ring, 1, MPI_INT, 0, comm));
  state->ring_wanted = state->leader && ring != 0;
  state_ = std::move(state);

  // Once per process: what the CPU all-reduces now do.
  static std::atomic<bool> told{false};
  if (rank == 0 && !told.exchange(true)) {
    const std::string note = state_->hosts == 1
                                 ? " (forced: with one host that is a reduce and a broadcast on it)"
                             : static_cast<int>(hosts.size()) == state_->hosts
                                 ? " (forced: with one rank per host that is the flat all-reduce)"
                                 : "";
    std::fprintf(stderr,
                 "ddp: hierarchical all-reduce: %d host(s), ranks per host %s: reduce on each "
                 "host, all-reduce among the leaders over %s, broadcast on each host%s "
                 "(ProcessGroupOptions::hierarchical)\n",
                 state_->hosts, join(counts).c_str(),
                 ring != 0 ? "TCP (large ones) and MPI" : "MPI", note.c_str());
    std::fflush(stderr);
  }
}

HierarchicalCommunicator::~HierarchicalCommunicator() = default;

int HierarchicalCommunicator::hosts() const { return state_->hosts; }
bool HierarchicalCommunicator::leader() const { return state_->leader; }
bool HierarchicalCommunicator::leaders_use_ring() const { return state_->ring_wanted; }

std::unique_ptr<Work> HierarchicalCommunicator::all_reduce_after_fill(const torch::Tensor& tensor,
                                                                      std::function<void()> fill,
                                                                      ReduceOp op) {
  // The MPI backend's checks and messages, whichever path: the same errors as without hierarchy.
  Collective call = Collective::all_reduce(detail::host_rules("MpiCommunicator::"), tensor, op);
  fill = detail::fill_on_worker(tensor, std::move(fill));
  const torch::Tensor host = detail::on_host(tensor);
  State* state = state_.get();
  const int size = this->size();
  auto run = [state, fill, host, op, size] {
    if (fill) fill();
    state->all_reduce(host, op, size);
  };
  return flat_.worker()->submit(std::move(call), std::move(run), tensor, host);
}

}  // namespace ddp
