#include "comm/ring/ring_connections.h"

#include "comm/ring/zero_frame.h"

#include "util/mpi_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp::detail {

namespace {

using Clock = std::chrono::steady_clock;
// How long connecting to the next rank and being connected by the previous one may take: the
// peers are already listening (the addresses are exchanged after listen()), so only an address
// that does not route takes this long.
constexpr auto kConnectTimeout = std::chrono::seconds(30);

struct Hello {
  uint64_t token;
  int64_t rank;
};

std::string errno_text(int error) { return std::strerror(error); }

std::string ip_text(in_addr address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address, text, sizeof text);
  return text;
}

bool container_bridge(const std::string& name) {
  return name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0;
}

// This host's IPv4 address to listen on (see the header for the choice).
in_addr pick_address(const std::string& interfaces, bool single_host, int rank) {
  if (interfaces.empty() && single_host) {
    in_addr loopback{};
    loopback.s_addr = htonl(INADDR_LOOPBACK);
    return loopback;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    throw std::runtime_error("rank " + std::to_string(rank) +
                             ": socket ring: getifaddrs: " + errno_text(errno));
  }
  struct Interface {
    std::string name;
    in_addr address;
    bool loopback;
  };
  std::vector<Interface> found;  // up, IPv4, in the system's order
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    found.push_back({it->ifa_name, reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr,
                     (it->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);

  std::string seen;
  for (const Interface& i : found)
    seen += (seen.empty() ? "" : ", ") + i.name + " " + ip_text(i.address);
  if (!interfaces.empty()) {
    std::stringstream names(interfaces);
    std::string wanted;
    while (std::getline(names, wanted, ',')) {
      for (const Interface& i : found) {
        if (i.name == wanted) return i.address;
      }
    }
    throw std::runtime_error("rank " + std::to_string(rank) + ": DDP_SOCKET_IFNAME='" + interfaces +
                             "' (CpuOptions::socket_interfaces): no such interface up with an "
                             "IPv4 address on this host (it has: " +
                             seen + ")");
  }
  for (const Interface& i : found) {
    if (!i.loopback && !container_bridge(i.name)) return i.address;
  }
  throw std::runtime_error("rank " + std::to_string(rank) +
                           ": socket ring: no network interface up with an IPv4 address other "
                           "than loopback (this host has: " +
                           seen + "); name one in DDP_SOCKET_IFNAME, or set DDP_MPI_SOCKETS=never");
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Waits for `events` on `fd` until `deadline`; false when the deadline passed.
bool wait_until(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Reads or writes exactly `bytes` on a non-blocking socket before `deadline` (the hello).
bool transfer_all(int fd, void* data, size_t bytes, bool write, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    if (!wait_until(fd, write ? POLLOUT : POLLIN, deadline)) return false;
    const ssize_t n = write ? send(fd, p + done, bytes - done, MSG_NOSIGNAL)
                            : recv(fd, p + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool single_host(MPI_Comm comm) {
  int rank = 0, size = 1, local = 1;
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Comm node = MPI_COMM_NULL;
  DDP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  DDP_MPI_CHECK(MPI_Comm_size(node, &local));
  DDP_MPI_CHECK(MPI_Comm_free(&node));
  return local == size;
}

RingConnections::Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

RingConnections::Fd& RingConnections::Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RingConnections::RingConnections(MPI_Comm comm, const std::string& interfaces, bool single_host) {
  DDP_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(comm, &size_));
  const std::string me = "rank " + std::to_string(rank_) + ": socket ring: ";

  // Listen first, so every address all-gathered below already accepts connections. A failure
  // here is reported after the all-gather (address 0), so no rank is left waiting in it.
  std::string local_error;
  const Fd listening(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int listen_fd = listening.get();
  sockaddr_in self{};
  self.sin_family = AF_INET;
  try {
    self.sin_addr = pick_address(interfaces, single_host, rank_);
    socklen_t length = sizeof self;
    if (listen_fd < 0 || bind(listen_fd, reinterpret_cast<sockaddr*>(&self), sizeof self) != 0 ||
        listen(listen_fd, 16) != 0 ||
        getsockname(listen_fd, reinterpret_cast<sockaddr*>(&self), &length) != 0) {
      local_error = me + "cannot listen on " + ip_text(self.sin_addr) + ": " + errno_text(errno);
    }
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  uint64_t mine[2] = {local_error.empty() ? uint64_t(self.sin_addr.s_addr) : 0,
                      local_error.empty() ? uint64_t(ntohs(self.sin_port)) : 0};
  std::vector<uint64_t> all(2 * static_cast<size_t>(size_));
  DDP_MPI_CHECK(MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm));
  uint64_t token = 0;
  if (rank_ == 0) token = std::random_device{}() * 0x100000000ull + std::random_device{}();
  DDP_MPI_CHECK(MPI_Bcast(&token, 1, MPI_UINT64_T, 0, comm));
  for (int r = 0; r < size_; ++r) {
    in_addr a{};
    a.s_addr = static_cast<uint32_t>(all[2 * r]);
    addresses_.push_back(ip_text(a) + ":" + std::to_string(all[2 * r + 1]));
  }
  if (!local_error.empty()) throw std::runtime_error(local_error);
  std::string silent;  // every rank fails together when one could not listen
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r + 1] == 0) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!silent.empty()) {
    throw std::runtime_error(me + "rank(s) " + silent +
                             " could not listen (their own errors say why)");
  }
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;

  // Connect to the next rank (non-blocking, so an address that does not route fails in time).
  const auto deadline = Clock::now() + kConnectTimeout;
  std::string error;
  next_ = Fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int next_fd = next_.get();
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr.s_addr = static_cast<uint32_t>(all[2 * next]);
  peer.sin_port = htons(static_cast<uint16_t>(all[2 * next + 1]));
  set_nonblocking(next_fd);
  if (connect(next_fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) != 0 &&
      errno != EINPROGRESS) {
    error = errno_text(errno);
  } else if (!wait_until(next_fd, POLLOUT, deadline)) {
    error = "no connection within " + std::to_string(kConnectTimeout.count()) + " s";
  } else {
    int status = 0;
    socklen_t length = sizeof status;
    getsockopt(next_fd, SOL_SOCKET, SO_ERROR, &status, &length);
    if (status != 0) error = errno_text(status);
  }
  Hello hello{token, rank_};
  if (error.empty() && !transfer_all(next_fd, &hello, sizeof hello, true, deadline)) {
    error = "the connection closed before the greeting was sent";
  }
  if (!error.empty()) {
    throw std::runtime_error(me + "cannot connect to rank " + std::to_string(next) + " at " +
                             addresses_[next] + ": " + error +
                             " (the hosts must reach each other over TCP on that address; name "
                             "the interface to use in DDP_SOCKET_IFNAME, or set "
                             "DDP_MPI_SOCKETS=never)");
  }

  // Accept the previous rank; whatever else connects (a port scanner, a stale job) is closed.
  set_nonblocking(listen_fd);
  while (prev_.get() < 0) {
    if (!wait_until(listen_fd, POLLIN, deadline)) {
      throw std::runtime_error(me + "rank " + std::to_string(prev) + " (" + addresses_[prev] +
                               ") did not connect to " + addresses_[rank_] + " within " +
                               std::to_string(kConnectTimeout.count()) + " s");
    }
    Fd accepted(accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (accepted.get() < 0) continue;
    Hello theirs{};
    if (transfer_all(accepted.get(), &theirs, sizeof theirs, false, deadline) &&
        theirs.token == token && theirs.rank == prev) {
      prev_ = std::move(accepted);
    }
  }
  set_nodelay(next_.get());
  set_nodelay(prev_.get());
}

void RingConnections::peer_failed(int peer, const std::string& what) const {
  throw std::runtime_error("rank " + std::to_string(rank_) + ": socket ring " + call_ + ": " +
                           what + " rank " + std::to_string(peer) + " (" + addresses_[peer] +
                           "): that rank has ended or lost the network");
}

void RingConnections::exchange(const void* out, size_t send_bytes, void* in, size_t recv_bytes) {
  const Span spans[2] = {{static_cast<char*>(const_cast<void*>(out)), send_bytes}, {nullptr, 0}};
  transfer(spans, [&](int k) {
    return k == 0 ? Span{static_cast<char*>(in), recv_bytes} : Span{};
  });
}

void RingConnections::exchange_frame(const Frame& out, void* in, size_t count, size_t item,
                                     std::vector<char>& packed) {
  std::uint64_t header = out.header;
  const Span spans[2] = {
      {reinterpret_cast<char*>(&header), kFrameHeaderBytes},
      {static_cast<char*>(const_cast<void*>(out.payload)), payload_bytes(out.header)}};
  std::uint64_t got = 0;
  const int prev = (rank_ + size_ - 1) % size_;
  // A frame that cannot be what this rank expects: named with the peer that sent it.
  auto checked = [&](const auto& check) {
    try {
      check();
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("rank " + std::to_string(rank_) + ": socket ring " + call_ +
                               ": from rank " + std::to_string(prev) + " (" + addresses_[prev] +
                               "), " + e.what());
    }
  };
  transfer(spans, [&](int k) {
    if (k == 0) return Span{reinterpret_cast<char*>(&got), kFrameHeaderBytes};
    if (k > 1) return Span{};
    checked([&] { check_header(got, count, item); });
    if (!is_packed(got)) return Span{static_cast<char*>(in), payload_bytes(got)};
    // unpack_frame() may read one element past the payload.
    if (packed.size() < payload_bytes(got) + item) packed.resize(payload_bytes(got) + item);
    return Span{packed.data(), payload_bytes(got)};
  });
  if (is_packed(got)) {
    checked([&] { unpack_frame(packed.data(), payload_bytes(got), count, item, in); });
  }
}

void RingConnections::transfer(const Span (&out)[2], const std::function<Span(int)>& next_span) {
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  const size_t send_bytes = out[0].bytes + out[1].bytes;
  size_t sent = 0, got = 0;  // got: into the current receive span
  int k = 0;
  Span in = next_span(k);
  while (sent < send_bytes || in.bytes > 0) {
    pollfd p[2] = {{next_.get(), short(sent < send_bytes ? POLLOUT : 0), 0},
                   {prev_.get(), short(in.bytes > 0 ? POLLIN : 0), 0}};
    // The thread sleeps here while the kernel moves the bytes (see the header).
    if (poll(p, 2, 1000) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("rank " + std::to_string(rank_) +
                               ": socket ring: poll: " + errno_text(errno));
    }
    if (sent < send_bytes && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
      // What is left of the two spans, in one call.
      iovec left[2];
      int spans = 0;
      size_t skip = sent;
      for (const Span& s : out) {
        if (skip >= s.bytes) {
          skip -= s.bytes;
          continue;
        }
        left[spans++] = {s.data + skip, s.bytes - skip};
        skip = 0;
      }
      msghdr message{};
      message.msg_iov = left;
      message.msg_iovlen = spans;
      const ssize_t n = sendmsg(next_.get(), &message, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        peer_failed(next, "sending to (" + errno_text(errno) + ")");
      }
    }
    if (in.bytes > 0 && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
      const ssize_t n = recv(prev_.get(), in.data + got, in.bytes - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0) {
        peer_failed(prev, "connection closed by");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        peer_failed(prev, "receiving from (" + errno_text(errno) + ")");
      }
      if (got == in.bytes) {
        in = next_span(++k);
        got = 0;
      }
    }
  }
}

}  // namespace ddp::detail
