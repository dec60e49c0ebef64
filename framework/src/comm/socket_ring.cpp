#include "comm/socket_ring.h"

#include "comm/ring_sockets.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <utility>

namespace ddp {

using detail::Collective;
using detail::RingSockets;
using detail::ring_all_reduce;

struct SocketRing::State {
  detail::MpiWorker* worker = nullptr;  // outlives the calls queued on it
  std::string interfaces;
  std::function<void(const std::string&)> on_connected;
  std::unique_ptr<RingSockets> sockets;  // made by the first collective
  std::atomic<bool> connected{false};
  torch::Tensor scratch;    // the received segment of an all-reduce before it is reduced in
  std::string broken_call;  // a collective that threw half way: its bytes may be in flight

  // Runs `body` over the connections, connecting first; nothing to do on one rank.
  void call(const char* name, const std::function<void(RingSockets&)>& body) {
    if (worker->size() == 1) return;
    if (!sockets) {
      const MPI_Comm comm = worker->comm();
      const bool one_host = detail::single_host(comm);
      sockets = std::make_unique<RingSockets>(comm, interfaces, one_host);
      connected = true;
      if (on_connected) on_connected(sockets->address(sockets->rank()));
    }
    if (!broken_call.empty()) {
      throw std::runtime_error("rank " + std::to_string(sockets->rank()) + ": socket ring " +
                               name + ": an earlier " + broken_call +
                               " failed half way, so the ring's connections are out of step");
    }
    broken_call = name;  // until it completes
    sockets->set_call(name);
    body(*sockets);
    broken_call.clear();
  }
};

namespace detail {

void ring_all_reduce(RingSockets& ring, torch::Tensor& scratch, const torch::Tensor& tensor,
                     ReduceOp op) {
  const int rank = ring.rank(), size = ring.size();
  const torch::Tensor flat = tensor.view({-1});
  const int64_t n = flat.numel();
  if (n == 0) return;
  auto segment = [&](int i) {  // elements [i n / size, (i + 1) n / size)
    i = ((i % size) + size) % size;
    return flat.slice(0, n * i / size, n * (i + 1) / size);
  };
  const size_t item = flat.element_size();
  if (!scratch.defined() || scratch.scalar_type() != flat.scalar_type() ||
      scratch.numel() < n / size + 1) {
    scratch = torch::empty({n / size + 1}, flat.options());
  }
  // Reduce-scatter: after step s, segment r - s - 1 holds the sum of s + 2 ranks' values.
  for (int s = 0; s < size - 1; ++s) {
    const torch::Tensor out = segment(rank - s);
    torch::Tensor in = segment(rank - s - 1);
    const torch::Tensor got = scratch.slice(0, 0, in.numel());
    ring.exchange(out.data_ptr(), out.numel() * item, got.data_ptr(), got.numel() * item);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: in.add_(got); break;
      case ReduceOp::Min: torch::minimum_out(in, in, got); break;
      case ReduceOp::Max: torch::maximum_out(in, in, got); break;
    }
  }
  // All-gather: this rank now owns the reduced segment r + 1; pass the reduced segments round.
  for (int s = 0; s < size - 1; ++s) {
    const torch::Tensor out = segment(rank + 1 - s), in = segment(rank - s);
    ring.exchange(out.data_ptr(), out.numel() * item, in.data_ptr(), in.numel() * item);
  }
}

}  // namespace detail

namespace {

// `rows` [size, ...] contiguous, row rank() already this rank's: in size - 1 steps each rank
// passes on the row it received last.
void ring_all_gather(RingSockets& ring, const torch::Tensor& rows) {
  const int rank = ring.rank(), size = ring.size();
  const size_t bytes = rows.nbytes() / static_cast<size_t>(size);
  char* base = static_cast<char*>(rows.data_ptr());
  auto row = [&](int i) { return base + static_cast<size_t>(((i % size) + size) % size) * bytes; };
  for (int s = 0; s < size - 1; ++s) ring.exchange(row(rank - s), bytes, row(rank - s - 1), bytes);
}

// From `root` along the ring, in pieces, so that each rank forwards one piece while it
// receives the next.
void ring_broadcast(RingSockets& ring, const torch::Tensor& tensor, int root) {
  constexpr int64_t kPiece = 1 << 20;
  const int rank = ring.rank(), size = ring.size();
  const bool forwards = (rank + 1) % size != root;
  const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  char* data = static_cast<char*>(tensor.data_ptr());
  auto length = [&](int64_t k) { return static_cast<size_t>(std::min(kPiece, bytes - k * kPiece)); };
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
  return worker_->submit(
      std::move(call), [state = state_, run = std::move(run)] { run(*state); },
      std::move(target), std::move(host));
}

std::unique_ptr<Work> SocketRing::all_reduce_async(const torch::Tensor& tensor, ReduceOp op) {
  Collective call = Collective::all_reduce(rules_, tensor, op);
  const torch::Tensor host = detail::on_host(tensor);
  const int size = this->size();
  return submit(std::move(call), tensor, host, [host, op, size](State& s) {
    s.call("all_reduce", [&](RingSockets& ring) { ring_all_reduce(ring, s.scratch, host, op); });
    detail::finish_avg(host, op, size);
  });
}

void SocketRing::broadcast(const torch::Tensor& tensor, int root) {
  Collective call = Collective::broadcast(rules_, tensor, root, size());
  const torch::Tensor host = detail::on_host(tensor);
  submit(std::move(call), tensor, host, [host, root](State& s) {
    s.call("broadcast", [&](RingSockets& ring) { ring_broadcast(ring, host, root); });
  })->wait();
}

torch::Tensor SocketRing::all_gather(const torch::Tensor& tensor) {
  Collective call = Collective::all_gather(rules_, tensor);
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  const torch::Tensor host = tensor.to(torch::kCPU);
  torch::Tensor rows = torch::empty(shape, host.options());
  rows[rank()].copy_(host);
  submit(std::move(call), {}, {}, [rows](State& s) {
    s.call("all_gather", [&](RingSockets& ring) { ring_all_gather(ring, rows); });
  })->wait();
  return rows.to(tensor.device());
}

void SocketRing::barrier() {
  // One byte per rank: every segment of the all-reduce is one rank's, so no rank finishes before
  // every rank has started.
  const torch::Tensor token = torch::zeros({size()}, torch::kByte);
  submit(Collective::barrier(), {}, {}, [token](State& s) {
    s.call("barrier", [&](RingSockets& ring) { ring_all_reduce(ring, s.scratch, token, ReduceOp::Sum); });
  })->wait();
}

}  // namespace ddp
