#pragma once
// The backends' options, for every communicator ProcessGroup creates, from the group's options
// and the environment (util/environment.h), with Runtime::abort for a watchdog that fires.

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

// timeout 0: collective_timeout(). The variables are util/environment.h's table's; a bad value
// throws std::invalid_argument naming it.
CpuOptions cpu_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);

// A collective's timeout: `timeout` (ProcessGroupOptions::timeout) when > 0, else
// DDP_TIMEOUT_SECONDS, else 600 s; ProcessGroup makes it the phase timeout too.
std::chrono::seconds collective_timeout(std::chrono::seconds timeout);

// Why a communicator's creation waits, for the phase watchdog's message.
extern const char* const kSetupWhy;

// A new communicator for CPU tensors over every rank of `runtime` (cpu_communicator.h).
// Collective. A group's communicators share `shared`'s parts, made here with the first: the
// Inquiry (inquiry.h) and, in the debug mode, the check of every call (collective_check.h).
// Messages name the communicator `name`.
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
