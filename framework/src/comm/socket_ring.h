#pragma once
// The MPI backend's TCP ring: large all-reduces between hosts over plain sockets (internal to
// MpiCommunicator; not installed).
//
// Why it exists: Open MPI's TCP transport moves bytes only while a thread polls it inside an
// MPI call, so its all-reduce crosses a link at the speed the polling thread gets a core; with
// training on every core it reached 55-70% of a 100 Mbit/s link where gloo's sockets reached
// 90% (docs/performance.md). Here the kernel moves the bytes while the thread sleeps in poll():
// no core is spent waiting. It does not replace MPI where MPI has a faster transport than TCP
// (shared memory on one host, InfiniBand): MpiOptions::sockets decides where it is used.
//
// The all-reduce is the ring of reduce-scatter then all-gather (as gloo's and NCCL's): the
// tensor is cut into size() segments by element; in size()-1 steps each rank sends one segment
// to the next rank and adds the one it receives from the previous rank, then in size()-1 more
// steps the reduced segments go round. Each rank sends and receives 2(n-1)/n of the tensor.
// Invariants: every element is reduced in the same order on every rank and then copied, so all
// ranks hold bitwise the same result, run after run; 16-bit floats are added in float and
// rounded per element, as the MPI path does.
//
// Connections (made by the constructor, collective over `comm`): each rank listens on an
// ephemeral port of one IPv4 address, the ranks all-gather the addresses over MPI, each
// connects to the next rank and accepts the previous one. A connection opens with a 64-bit
// token that rank 0 drew for this ring and the connecting rank's number; anything else that
// connects is closed. The address: the first of `interfaces` (comma-separated names) this host
// has; without names, 127.0.0.1 when every rank runs on this host, else the first interface
// that is up with an IPv4 address and is not loopback or a container bridge (docker*, virbr*).
//
// Errors: std::runtime_error naming this rank, the peer rank and its address, and what went
// wrong (no such interface, unreachable peer, a peer that closed its connection: dead). A peer
// that stays connected but never sends blocks all_reduce(): the MPI backend's watchdog ends the
// job then, as for any collective.
//
// After an all_reduce that threw, the ring refuses further calls (bytes of the failed one may
// still be on the wire). Thread safety: none; one thread (MpiCommunicator's worker) uses a ring.

#include <ddp/communicator.h>

#include <mpi.h>
#include <torch/torch.h>

#include <string>

namespace ddp::detail {

class SocketRing {
 public:
  // Collective over `comm` (every rank must call it). `single_host`: every rank of `comm` runs
  // on this host (then loopback is used unless `interfaces` names one).
  SocketRing(MPI_Comm comm, const std::string& interfaces, bool single_host);
  SocketRing(const SocketRing&) = delete;
  SocketRing& operator=(const SocketRing&) = delete;

  // In place, over every rank of the ring; `tensor` is contiguous and on the CPU. Avg is left to
  // the caller (divide the sum). Blocks until done.
  void all_reduce(const torch::Tensor& tensor, ReduceOp op);

  // Where this rank listens, "a.b.c.d:port" (for messages and tests).
  const std::string& address() const { return addresses_[rank_]; }

 private:
  // Sends `send_bytes` to the next rank while receiving `recv_bytes` from the previous one.
  void exchange(const char* send, size_t send_bytes, char* recv, size_t recv_bytes);
  [[noreturn]] void peer_failed(int peer, const std::string& what) const;

  // A socket, closed when it goes (also when the constructor throws half way).
  class Fd {
   public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd();
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd& operator=(Fd&& other) noexcept;
    int get() const { return fd_; }

   private:
    int fd_;
  };

  int rank_ = 0;
  int size_ = 1;
  Fd next_;  // connected to rank_ + 1: this rank sends on it
  Fd prev_;  // accepted from rank_ - 1: this rank receives on it
  std::vector<std::string> addresses_;  // every rank's "a.b.c.d:port"
  torch::Tensor scratch_;  // the received segment before it is reduced in
  bool broken_ = false;    // an all_reduce threw half way: bytes of it may still be in flight
};

}  // namespace ddp::detail
