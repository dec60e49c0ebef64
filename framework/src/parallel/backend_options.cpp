#include "parallel/backend_options.h"

#include "runtime/phase_watchdog.h"
#include "runtime/runtime_internals.h"
#include "util/environment.h"
#include "util/testing_hooks.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

const char* const kSetupWhy =
    "every rank of the job must call it; a rank that has not got here is stopped, hung, or still "
    "loading its data";

std::chrono::seconds collective_timeout(std::chrono::seconds timeout) {
  if (timeout.count() > 0) return timeout;
  return std::chrono::seconds(collective_timeout_seconds(current_environment()));
}

CpuOptions cpu_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout) {
  const Environment env = current_environment();
  CpuOptions options;
  MpiOptions& mpi = options.mpi;
  mpi.timeout = collective_timeout(timeout);
  mpi.check_collectives = debug_detail(env);
  const Runtime* owner = &runtime;
  mpi.on_fatal_error = [owner](const std::string& message) { owner->abort(message); };
  if (const auto us = read_number(env, Setting::MpiSpin)) mpi.spin = std::chrono::microseconds(*us);
  if (const auto us = read_number(env, Setting::MpiMaxSleep))
    mpi.max_sleep = std::chrono::microseconds(*us);
  if (const auto kib = read_number(env, Setting::MpiBlocking))
    mpi.blocking_bytes = std::size_t(*kib) << 10;
  if (const auto mode = read_text(env, Setting::Sockets))
    options.sockets = parse_sockets(*mode, setting_info(Setting::Sockets).name);
  if (const auto kib = read_number(env, Setting::SocketThreshold))
    options.socket_bytes = std::size_t(*kib) << 10;
  if (const auto names = read_text(env, Setting::SocketInterfaces))
    options.socket_interfaces = *names;
  options.host_split = testing::hooks().host_split;
  return options;
}

std::unique_ptr<Communicator> make_cpu_communicator(const Runtime& runtime,
                                                    const ProcessGroupOptions& group,
                                                    detail::GroupChecks& shared,
                                                    const std::string& name) {
  CpuOptions options = cpu_options_from_environment(runtime, group.timeout);
  options.hierarchical = group.hierarchical;
  options.mpi.name = name;
  const auto phase = detail::setup_phase("creating a CPU communicator (MPI_Comm_dup)", kSetupWhy);
  MPI_Comm world = detail::RuntimeInternals::comm(runtime);
  if (!shared.inquiry) shared.inquiry = std::make_shared<detail::Inquiry>(world);
  options.mpi.inquiry = shared.inquiry;
  if (options.mpi.check_collectives) {
    if (!shared.check) shared.check = std::make_shared<detail::CollectiveCheck>(world);
    options.mpi.check = shared.check;
  }
  return make_cpu_communicator(detail::RuntimeInternals::comm(runtime), options);
}

#if DDP_WITH_CUDA && DDP_WITH_NCCL
NcclOptions nccl_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout) {
  NcclOptions options;
  options.timeout = timeout.count() > 0
                        ? timeout
                        : std::chrono::seconds(nccl_timeout_seconds(current_environment()));
  const Runtime* owner = &runtime;
  options.on_fatal_error = [owner](const std::string& message) { owner->abort(message); };
  return options;
}
#endif

}  // namespace ddp
