#include "comm/hierarchical_communicator.h"

#include "comm/mpi_types.h"
#include "comm/ring_sockets.h"
#include "comm/socket_ring.h"
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

namespace {

// An MPI communicator this file made, freed with it (unless MPI is already finalized).
struct OwnedComm {
  MPI_Comm comm = MPI_COMM_NULL;
  OwnedComm() = default;
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;
  ~OwnedComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

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
    const bool positive = std::all_of(host_split.begin(), host_split.end(), [](int n) { return n > 0; });
    if (!positive || total != size) {
      throw std::invalid_argument(
          "CpuOptions::host_split (DDP_TEST_HOST_SPLIT) '" + join(host_split) +
          "': expected ranks per host, each >= 1, adding up to the " + std::to_string(size) +
          " ranks of the communicator");
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
  OwnedComm host;                       // this rank's host's ranks; rank 0 is the leader
  OwnedComm leaders;                    // one rank per host (MPI_COMM_NULL on the others)
  int host_size = 1, leaders_size = 1, hosts = 1;
  bool leader = false;
  bool ring_wanted = false;             // the leaders' large all-reduces take the TCP ring
  std::size_t socket_bytes = 0, blocking_bytes = 0, max_message_bytes = 0;
  std::string interfaces;
  std::unique_ptr<detail::RingSockets> ring;  // the leaders' ring, connected by its first call
  torch::Tensor scratch;                      // the ring's received segment
  bool ring_broken = false;                   // a ring call threw half way: bytes may be in flight

  // Sleeps until every rank of `comm` has arrived (before a blocking call, see the header).
  void wait_for_all(MPI_Comm comm) const {
    MPI_Request request;
    DDP_MPI_CHECK(MPI_Ibarrier(comm, &request));
    worker->wait(request);
  }

  // One MPI collective per piece of `t`: blocking (after wait_for_all) or non-blocking and waited
  // for by the worker; `start` makes it, with a request for the non-blocking one, else null.
  void each_piece(MPI_Comm comm, const torch::Tensor& t, bool blocking,
                  const std::function<void(void*, int, MPI_Request*)>& start) const {
    if (blocking) wait_for_all(comm);
    detail::for_each_chunk(t, max_message_bytes, [&](void* data, int count) {
      if (blocking) return start(data, count, nullptr);
      MPI_Request request;
      start(data, count, &request);
      worker->wait(request);
    });
  }

  void leaders_ring(const torch::Tensor& t, ReduceOp op) {
    if (!ring) {
      ring = std::make_unique<detail::RingSockets>(leaders.comm, interfaces,
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
      throw std::runtime_error("hierarchical all-reduce: an earlier all-reduce of the host "
                               "leaders' TCP ring failed half way, so the ring is out of step");
    }
    ring_broken = true;  // until it completes
    ring->set_call("all_reduce");
    detail::ring_all_reduce(*ring, scratch, t, op);
    ring_broken = false;
  }

  // The three phases (the header's comment), in place on `t` (contiguous, on the CPU).
  void all_reduce(const torch::Tensor& t, ReduceOp op, int size) {
    const MPI_Datatype type = detail::mpi_type(t.scalar_type());
    const MPI_Op reduce = detail::mpi_op(op, t.scalar_type());  // Avg: the sum
    const bool blocking = t.nbytes() >= blocking_bytes;
    if (host_size > 1) {
      each_piece(host.comm, t, blocking, [&](void* data, int count, MPI_Request* request) {
        void* send = leader ? MPI_IN_PLACE : data;
        if (request) {
          DDP_MPI_CHECK(MPI_Ireduce(send, data, count, type, reduce, 0, host.comm, request));
        } else {
          DDP_MPI_CHECK(MPI_Reduce(send, data, count, type, reduce, 0, host.comm));
        }
      });
    }
    if (leader && leaders_size > 1) {
      if (ring_wanted && t.nbytes() >= socket_bytes) {
        leaders_ring(t, detail::without_avg(op));
      } else {
        each_piece(leaders.comm, t, blocking, [&](void* data, int count, MPI_Request* request) {
          if (request) {
            DDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, reduce, leaders.comm, request));
          } else {
            DDP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, reduce, leaders.comm));
          }
        });
      }
    }
    if (leader) detail::finish_avg(t, op, size);
    if (host_size > 1) {
      each_piece(host.comm, t, blocking, [&](void* data, int count, MPI_Request* request) {
        if (request) {
          DDP_MPI_CHECK(MPI_Ibcast(data, count, type, 0, host.comm, request));
        } else {
          DDP_MPI_CHECK(MPI_Bcast(data, count, type, 0, host.comm));
        }
      });
    }
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
  DDP_MPI_CHECK(MPI_Comm_split(comm, state->leader ? 0 : MPI_UNDEFINED, rank, &state->leaders.comm));
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
  state->max_message_bytes = options.mpi.max_message_bytes;
  state->interfaces = options.socket_interfaces;
  int ring = state->ring_wanted ? 1 : 0;  // rank 0, a leader, tells the others for its message
  DDP_MPI_CHECK(MPI_Bcast(&ring, 1, MPI_INT, 0, comm));
  state->ring_wanted = state->leader && ring != 0;
  state_ = std::move(state);

  // Once per process: what the CPU all-reduces now do.
  static std::atomic<bool> told{false};
  if (rank == 0 && !told.exchange(true)) {
    const std::string note =
        state_->hosts == 1 ? " (forced: with one host that is a reduce and a broadcast on it)"
        : static_cast<int>(hosts.size()) == state_->hosts ? " (forced: with one rank per host that is the flat all-reduce)"
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

std::unique_ptr<Work> HierarchicalCommunicator::all_reduce_async(const torch::Tensor& tensor,
                                                                 ReduceOp op) {
  // The MPI backend's checks and messages, whichever path: the same errors as without hierarchy.
  Collective call = Collective::all_reduce(detail::host_rules("MpiCommunicator::"), tensor, op);
  const torch::Tensor host = detail::on_host(tensor);
  State* state = state_.get();
  const int size = this->size();
  return flat_.worker()->submit(
      std::move(call), [state, host, op, size] { state->all_reduce(host, op, size); }, tensor,
      host);
}

}  // namespace ddp
