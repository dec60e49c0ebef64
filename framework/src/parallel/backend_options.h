#pragma once
// The backends' options as the group's options and the environment set them, for every
// communicator ProcessGroup creates: the timeout
// (ProcessGroupOptions::timeout, else DDP_TIMEOUT_SECONDS, else 600 s), the debug mode, the MPI
// tuning and the TCP ring's variables (read through util/environment.h's table), and
// Runtime::abort for a watchdog that fires.

#include "comm/compose/cpu_communicator.h"
#include <ddp/communicator.h>
#include <ddp/config.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

#include <chrono>
#include <memory>
#include <string>

namespace ddp {

// timeout 0: DDP_TIMEOUT_SECONDS, else 600 s. The variables, as util/environment.h names them:
//   DDP_DEBUG             MpiOptions::check_collectives (DETAIL)
//   DDP_MPI_SPIN_US       MpiOptions::spin in microseconds (busy-testing before sleeping)
//   DDP_MPI_MAX_SLEEP_US  MpiOptions::max_sleep in microseconds (0: never sleep)
//   DDP_MPI_BLOCKING_KIB  MpiOptions::blocking_bytes in KiB
//   DDP_MPI_SOCKETS       CpuOptions::sockets: auto | never | always
//   DDP_MPI_SOCKET_KIB    CpuOptions::socket_bytes in KiB
//   DDP_SOCKET_IFNAME     CpuOptions::socket_interfaces (comma-separated interface names)
// A bad value throws std::invalid_argument naming the variable. CpuOptions::host_split is
// util/testing_hooks.h's (tests emulate hosts on one machine).
CpuOptions cpu_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);

// A collective's timeout: `timeout` (ProcessGroupOptions::timeout) when > 0, else
// DDP_TIMEOUT_SECONDS, else 600 s. ProcessGroup also makes it the phase timeout
// (<ddp/runtime.h>: set_phase_timeout), so the waits outside collectives are as long.
std::chrono::seconds collective_timeout(std::chrono::seconds timeout);

// Why a communicator's creation waits, for the phase watchdog's message.
extern const char* const kSetupWhy;

// A new communicator for CPU tensors over every rank of `runtime` (comm/compose/cpu_communicator.h:
// MPI, with the TCP ring for large all-reduces where that policy says, through one leader per
// host where ProcessGroupOptions::hierarchical says). Collective. A group's communicators share
// `shared`'s parts, made here with the first: the Inquiry that names what each rank is in when
// a collective fails or hangs (comm/mpi/inquiry.h), and under DDP_DEBUG=DETAIL the check of every
// call (comm/mpi/collective_check.h). Messages name the communicator `name`.
namespace detail {
// What the MPI communicators of one ProcessGroup share.
struct GroupChecks {
  std::shared_ptr<Inquiry> inquiry;
  std::shared_ptr<CollectiveCheck> check;  // under DDP_DEBUG=DETAIL
};
}  // namespace detail

std::unique_ptr<Communicator> make_cpu_communicator(const Runtime& runtime,
                                                    const ProcessGroupOptions& group,
                                                    detail::GroupChecks& shared,
                                                    const std::string& name);

#if DDP_WITH_CUDA && DDP_WITH_NCCL
// timeout 0: DDP_NCCL_TIMEOUT_SECONDS, else DDP_TIMEOUT_SECONDS, else 600 s.
NcclOptions nccl_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);
#endif

}  // namespace ddp
