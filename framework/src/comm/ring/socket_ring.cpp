#include "comm/ring/socket_ring.h"

#include "comm/ring/ring_connections.h"
#include "comm/ring/zero_frame.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace ddp {

using detail::Collective;
using detail::ring_all_reduce;
using detail::RingBuffers;
using detail::RingConnections;

struct SocketRing::State {
  detail::MpiWorker* worker = nullptr;  // outlives the calls queued on it
  std::string interfaces;
  std::function<void(const std::string&)> on_connected;
  std::unique_ptr<RingConnections> sockets;  // made by the first collective
  std::atomic<bool> connected{false};
  detail::RingBuffers buffers;
  // A collective that threw half way, and its error: its bytes may be in flight. Set on the
  // worker, read by the callers too (refuse), hence the lock.
  std::mutex broken_mutex;
  std::string broken_call, broken_error;

  // Throws when an earlier collective failed half way: `name` is refused (any thread). The
  // earlier error is repeated: a caller may meet this refusal before it waits for that call.
  void refuse_if_broken(const char* name) {
    std::lock_guard<std::mutex> lock(broken_mutex);
    if (broken_call.empty()) return;
    throw std::runtime_error("rank " + std::to_string(worker->rank()) + ": socket ring " + name +
                             ": an earlier " + broken_call +
                             " failed half way, so the ring's connections are out of step" +
                             (broken_error.empty() ? "" : " (" + broken_error + ")"));
  }
  void set_broken(const std::string& name, const std::string& error = "") {  // for good
    std::lock_guard<std::mutex> lock(broken_mutex);
    broken_call = name;
    broken_error = error;
  }

  // Runs `body` over the connections, connecting first; nothing to do on one rank.
  void call(const char* name, const std::function<void(RingConnections&)>& body) {
    if (worker->size() == 1) return;
    if (!sockets) {
      const MPI_Comm comm = worker->comm();
      const bool one_host = detail::single_host(comm);
      sockets = std::make_unique<RingConnections>(comm, interfaces, one_host);
      connected = true;
      if (on_connected) on_connected(sockets->address(sockets->rank()));
    }
    refuse_if_broken(name);
    sockets->set_call(name);
    try {
      body(*sockets);
    } catch (const std::exception& e) {
      set_broken(name, e.what());
      throw;
    } catch (...) {
      set_broken(name);
      throw;
    }
  }
};

namespace {

// The ring's segments of a flat tensor: segment i (any integer, taken modulo size) is elements
// [i n / size, (i + 1) n / size), so sizes that do not divide give segments one element apart.
struct Segments {
  torch::Tensor flat;
  int size;
  torch::Tensor operator()(int i) const {
    const int64_t n = flat.numel();
    i = ((i % size) + size) % size;
    return flat.slice(0, n * i / size, n * (i + 1) / size);
  }
};

// Sends `out` to the next rank while receiving the previous rank's segment into `in` (of the same
// dtype), both as frames.
void exchange_segments(RingConnections& ring, RingBuffers& buffers, const torch::Tensor& out,
                       const torch::Tensor& in) {
  const size_t item = out.element_size(), bytes = std::max(out.nbytes(), in.nbytes());
  const detail::Frame frame =
      buffers.fast_link ? detail::unpacked_frame(out.data_ptr(), out.nbytes())
                        : detail::pack_frame(out.data_ptr(), out.numel(), item, buffers.sent);
  const auto start = std::chrono::steady_clock::now();
  ring.exchange_frame(frame, in.data_ptr(), in.numel(), item, buffers.received);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  constexpr double kFastBytesPerSecond = 4e9 / 8;
  if (bytes >= (size_t{1} << 20)) buffers.fast_link = bytes > kFastBytesPerSecond * took.count();
}

// The reduce-scatter phase, in place: in size - 1 steps each rank sends a segment to the next
// rank and reduces the one it receives from the previous rank into its own; at the end this
// rank's segment rank + `owned` holds the reduction of every rank's values (`owned` 1: the
// all-reduce's order, kept as it was; 0: reduce_scatter's chunk rank()). Avg is the caller's.
void reduce_scatter_phase(RingConnections& ring, RingBuffers& buffers, const Segments& segment,
                          ReduceOp op, int owned) {
  const int rank = ring.rank(), size = ring.size();
  const int64_t n = segment.flat.numel();
  torch::Tensor& scratch = buffers.scratch;
  if (!scratch.defined() || scratch.scalar_type() != segment.flat.scalar_type() ||
      scratch.numel() < n / size + 1) {
    scratch = torch::empty({n / size + 1}, segment.flat.options());
  }
  // After step s, segment rank + owned - s - 2 holds the reduction of s + 2 ranks' values.
  for (int s = 0; s < size - 1; ++s) {
    const torch::Tensor out = segment(rank + owned - 1 - s);
    torch::Tensor in = segment(rank + owned - 2 - s);
    const torch::Tensor got = scratch.slice(0, 0, in.numel());
    exchange_segments(ring, buffers, out, got);
    detail::reduce_into(in, got, op);
  }
}

// The all-gather phase: this rank holds segment rank + `owned`; in size - 1 steps each rank
// passes on the segment it received last, so every rank ends with every segment.
void all_gather_phase(RingConnections& ring, RingBuffers& buffers, const Segments& segment,
                      int owned) {
  const int rank = ring.rank(), size = ring.size();
  for (int s = 0; s < size - 1; ++s) {
    exchange_segments(ring, buffers, segment(rank + owned - s), segment(rank + owned - s - 1));
  }
}

}  // namespace

namespace detail {

void ring_all_reduce(RingConnections& ring, RingBuffers& buffers, const torch::Tensor& tensor,
                     ReduceOp op) {
  const Segments segment{tensor.view({-1}), ring.size()};
  if (segment.flat.numel() == 0) return;
  reduce_scatter_phase(ring, buffers, segment, op, 1);
  all_gather_phase(ring, buffers, segment, 1);
}

}  // namespace detail

namespace {

// From `root` along the ring, in pieces, so that each rank forwards one piece while it
// receives the next.
void ring_broadcast(RingConnections& ring, const torch::Tensor& tensor, int root) {
  constexpr int64_t kPiece = 1 << 20;
  const int rank = ring.rank(), size = ring.size();
  const bool forwards = (rank + 1) % size != root;
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  char* data = static_cast<char*>(tensor.data_ptr());
  auto length = [&](int64_t k) {
    return static_cast<size_t>(std::min(kPiece, bytes - k * kPiece));
  };
  for (int64_t k = 0; k <= pieces; ++k) {
    const int64_t out = rank == root ? k : k - 1;  // the piece sent now
    const int64_t in = rank == root ? -1 : k;      // the piece received now
    const bool sends = forwards && out >= 0 && out < pieces, receives = in >= 0 && in < pieces;
    ring.exchange(sends ? data + out * kPiece : nullptr, sends ? length(out) : 0,
                  receives ? data + in * kPiece : nullptr, receives ? length(in) : 0);
  }
}

}  // namespace

SocketRing::SocketRing(MPI_Comm comm, SocketRingOptions options)
    : SocketRing(std::make_shared<detail::MpiWorker>(comm, options), options) {}

SocketRing::SocketRing(std::shared_ptr<detail::MpiWorker> worker, SocketRingOptions options)
    : worker_(std::move(worker)),
      rules_(detail::host_rules("SocketRing::")),
      state_(std::make_shared<State>()) {
  state_->worker = worker_.get();
  state_->interfaces = std::move(options.interfaces);
  state_->on_connected = std::move(options.on_connected);
}

SocketRing::~SocketRing() = default;

bool SocketRing::connected() const { return state_->connected; }

std::unique_ptr<Work> SocketRing::submit(Collective call, torch::Tensor target, torch::Tensor host,
                                         std::function<void(State&)> run) {
  // Refused at once, not after the ranks agree on the call: a rank whose ring broke is leaving.
  state_->refuse_if_broken(detail::kind_name(call.kind));
  return worker_->submit(
      std::move(call), [state = state_, run = std::move(run)] { run(*state); }, std::move(target),
      std::move(host));
}

std::unique_ptr<Work> SocketRing::all_reduce_after_fill(const torch::Tensor& tensor,
                                                        std::function<void()> fill, ReduceOp op) {
  Collective call = Collective::all_reduce(rules_, tensor, op);
  fill = detail::fill_on_worker(tensor, std::move(fill));
  const torch::Tensor host = detail::on_host(tensor);
  const int size = this->size();
  return submit(std::move(call), tensor, host, [fill, host, op, size](State& s) {
    if (fill) fill();
    s.call("all_reduce",
           [&](RingConnections& ring) { ring_all_reduce(ring, s.buffers, host, op); });
    detail::finish_avg(host, op, size);
  });
}

void SocketRing::broadcast(const torch::Tensor& tensor, int root) {
  Collective call = Collective::broadcast(rules_, tensor, root, size());
  const torch::Tensor host = detail::on_host(tensor);
  submit(std::move(call), tensor, host, [host, root](State& s) {
    s.call("broadcast", [&](RingConnections& ring) { ring_broadcast(ring, host, root); });
  })->wait();
}

torch::Tensor SocketRing::all_gather(const torch::Tensor& tensor) {
  Collective call = Collective::all_gather(rules_, tensor);
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  const torch::Tensor host = tensor.to(torch::kCPU);
  torch::Tensor rows = torch::empty(shape, host.options());
  gather(std::move(call), rows, host);
  return rows.to(tensor.device());
}

void SocketRing::all_gather_into(const torch::Tensor& output, const torch::Tensor& input) {
  Collective call = Collective::all_gather_into(rules_, output, input, size());
  const torch::Tensor host = detail::on_host(output);
  gather(std::move(call), host, input.to(torch::kCPU));
  if (!host.is_same(output)) output.copy_(host);
}

void SocketRing::gather(Collective call, const torch::Tensor& output, const torch::Tensor& input) {
  const Segments segment{output.view({-1}), size()};
  segment(rank()).copy_(input.view({-1}));
  submit(std::move(call), {}, {}, [segment](State& s) {
    s.call("all_gather",
           [&](RingConnections& ring) { all_gather_phase(ring, s.buffers, segment, 0); });
  })->wait();
}

void SocketRing::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                ReduceOp op) {
  Collective call = Collective::reduce_scatter(rules_, output, input, op, size());
  // The phase reduces in place: on a copy of the input, which the caller keeps unchanged.
  const Segments segment{input.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).view({-1}),
                         size()};
  const torch::Tensor host = detail::on_host(output);
  const int rank = this->rank(), size = this->size();
  submit(std::move(call), output, host, [segment, host, op, rank, size](State& s) {
    s.call("reduce_scatter",
           [&](RingConnections& ring) { reduce_scatter_phase(ring, s.buffers, segment, op, 0); });
    host.view({-1}).copy_(segment(rank));
    detail::finish_avg(host, op, size);
  })->wait();
}

void SocketRing::barrier() {
  // One byte per rank: every segment of the all-reduce is one rank's, so no rank finishes before
  // every rank has started.
  const torch::Tensor token = torch::zeros({size()}, torch::kByte);
  submit(Collective::barrier(), {}, {}, [token](State& s) {
    s.call("barrier",
           [&](RingConnections& ring) { ring_all_reduce(ring, s.buffers, token, ReduceOp::Sum); });
  })->wait();
}

}  // namespace ddp
