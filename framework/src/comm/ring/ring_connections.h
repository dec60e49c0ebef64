#pragma once
// The TCP connections of ddp's socket ring (comm/ring/socket_ring.h): each rank is connected to the
// next rank, which it sends to, and accepted by the previous one, which it receives from.
//
// Connecting (the constructor, collective over `comm`): each rank listens on an ephemeral port of
// one IPv4 address, the ranks all-gather the addresses over MPI, each connects to the next rank
// and accepts the previous one. A connection opens with a 64-bit token that rank 0 drew for this
// ring and the connecting rank's number; anything else that connects is closed. The address: the
// first of `interfaces` (comma-separated names) this host has; without names, 127.0.0.1 when
// every rank runs on this host, else the first interface that is up with an IPv4 address and is
// not loopback or a container bridge (docker*, virbr*).
//
// Errors: std::runtime_error naming this rank, the peer rank and its address, and what went
// wrong (no such interface, unreachable peer, a peer that closed its connection: dead). A peer
// that stays connected but never sends blocks exchange(): the worker's watchdog ends the job
// then, as for any collective.
//
// Thread safety: none; one thread (the ring's worker) uses it.

#include "comm/ring/zero_frame.h"

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace ddp::detail {

// Whether every rank of `comm` runs on this host (collective; the same answer on every rank).
bool single_host(MPI_Comm comm);

class RingConnections {
 public:
  // Collective over `comm` (every rank must call it). `single_host`: every rank of `comm` runs
  // on this host (then loopback is used unless `interfaces` names one).
  RingConnections(MPI_Comm comm, const std::string& interfaces, bool single_host);
  RingConnections(const RingConnections&) = delete;
  RingConnections& operator=(const RingConnections&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Where `rank` listens, "a.b.c.d:port" (for messages and tests).
  const std::string& address(int rank) const { return addresses_[rank]; }

  // Sends `send_bytes` to the next rank while receiving `recv_bytes` from the previous one; the
  // thread sleeps in poll() while the kernel moves the bytes. No deadline: a peer that hangs is
  // the watchdog's to report.
  void exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes);
  // The same for frames (comm/ring/zero_frame.h): sends `out` while receiving one frame of
  // `count` elements of `item` bytes, straight into `in` when it comes as it is, else into
  // `packed` (grown to fit) and then unpacked into `in`. A frame that cannot hold them is the
  // peer's error: std::runtime_error naming this rank, the call and the peer.
  void exchange_frame(const Frame& out, void* in, size_t count, size_t item,
                      std::vector<char>& packed);
  // The collective the next exchanges belong to, for errors ("all_reduce").
  void set_call(const char* name) { call_ = name; }

 private:
  [[noreturn]] void peer_failed(int peer, const std::string& what) const;
  struct Span {
    char* data;
    size_t bytes;
  };
  // Sends `out`'s spans in order while receiving into the spans that next_span(k) gives, k = 0,
  // 1, ... (each asked for once the one before is full); one of no bytes ends the receiving.
  void transfer(const Span (&out)[2], const std::function<Span(int)>& next_span);

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
  Fd next_;                             // connected to rank_ + 1: this rank sends on it
  Fd prev_;                             // accepted from rank_ - 1: this rank receives on it
  std::vector<std::string> addresses_;  // every rank's "a.b.c.d:port"
  std::string call_ = "all_reduce";
};

}  // namespace ddp::detail
