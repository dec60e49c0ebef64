#include "parallel/backend_options.h"

#include "runtime/phase_watchdog.h"
#include "runtime/runtime_internals.h"
#include "util/environment.h"

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {

const char* const kSetupWhy =
    "every rank of the job must call it; a rank that has not got here is stopped, hung, or still "
    "loading its data";

namespace {

// DDP_TEST_HOST_SPLIT's "2,2": ranks per host; a bad list throws naming the variable.
std::vector<int> host_split(const std::string& text) {
  std::vector<int> split;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const bool digits = !item.empty() && item.size() <= 6 &&
                        item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(item) == 0) {
      throw std::invalid_argument(std::string(setting_info(Setting::TestHostSplit).name) + "='" +
                                  text + "': expected ranks per host, e.g. 2,2");
    }
    split.push_back(std::stoi(item));
  }
  return split;
}

}  // namespace

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
  if (const auto us = read_number(env, Setting::MpiMaxSleep)) mpi.max_sleep = std::chrono::microseconds(*us);
  if (const auto kib = read_number(env, Setting::MpiBlocking)) mpi.blocking_bytes = std::size_t(*kib) << 10;
  if (const auto kib = read_number(env, Setting::MpiMessage)) mpi.max_message_bytes = std::size_t(*kib) << 10;
  if (const auto mode = read_text(env, Setting::Sockets)) options.sockets = parse_sockets(*mode, setting_info(Setting::Sockets).name);
  if (const auto kib = read_number(env, Setting::SocketThreshold)) options.socket_bytes = std::size_t(*kib) << 10;
  if (const auto names = read_text(env, Setting::SocketInterfaces)) options.socket_interfaces = *names;
  if (const auto split = read_text(env, Setting::TestHostSplit)) options.host_split = host_split(*split);
  return options;
}

std::unique_ptr<Communicator> make_cpu_communicator(
    const Runtime& runtime, const ProcessGroupOptions& group,
    std::shared_ptr<detail::CollectiveCheck>* check, const std::string& name) {
  CpuOptions options = cpu_options_from_environment(runtime, group.timeout);
  options.hierarchical = group.hierarchical;
  const auto phase = detail::setup_phase("creating a CPU communicator (MPI_Comm_dup)", kSetupWhy);
  if (options.mpi.check_collectives && check) {
    if (!*check) {
      *check = std::make_shared<detail::CollectiveCheck>(detail::RuntimeInternals::comm(runtime));
    }
    options.mpi.check = *check;
    options.mpi.check_name = name;
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
