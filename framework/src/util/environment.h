#pragma once
// The process environment, and every DDP_* variable the core reads: one table (kSettings in
// environment.cpp) gives each one's name, meaning and values, and the readers below are the only
// code that parses them. The backends read no environment: ProcessGroup gives them options.
//
// A variable is read when the part that uses it starts, so a bad DDP_NCCL_TIMEOUT_SECONDS does
// not stop a CPU job. Unset and empty are the same (the default). A bad value is
// std::invalid_argument naming the variable and the value, e.g. "DDP_MPI_SPIN_US='fast':
// expected an integer from 0 to 1000000". Numbers are whole decimal numbers, digits only.
//
// No variable here is for tests alone: a test's way into the library is util/testing_hooks.h.

#include <map>
#include <optional>
#include <string>

namespace ddp {

using Environment = std::map<std::string, std::string>;

// A copy of this process's environment.
Environment current_environment();

enum class Setting {
  Timeout,           // DDP_TIMEOUT_SECONDS
  NcclTimeout,       // DDP_NCCL_TIMEOUT_SECONDS
  Debug,             // DDP_DEBUG
  SkipLaunchChecks,  // DDP_SKIP_LAUNCH_CHECKS
  MpiSpin,           // DDP_MPI_SPIN_US
  MpiMaxSleep,       // DDP_MPI_MAX_SLEEP_US
  MpiBlocking,       // DDP_MPI_BLOCKING_KIB
  Sockets,           // DDP_MPI_SOCKETS
  SocketThreshold,   // DDP_MPI_SOCKET_KIB
  SocketInterfaces,  // DDP_SOCKET_IFNAME
  StartupTimeout,    // DDP_STARTUP_TIMEOUT_SECONDS
};

// One row of the table.
struct SettingInfo {
  enum class Kind {
    Seconds,  // a whole number of seconds > 0
    Number,   // a whole number from 0 to `max`
    Choice,   // one of `choices` ("|"-separated)
    Flag,     // set (to anything but "0") or not
    Text,     // any text
  };
  Setting setting;
  const char* name;
  Kind kind;
  long max;              // Number only
  const char* choices;   // Choice only
  const char* expected;  // Choice only: the choices as an error message says them
  const char* meaning;   // what it sets (the option it fills, whose comment gives its default)
};

// The row of `setting`.
const SettingInfo& setting_info(Setting setting);

// The value of a Seconds or Number variable; nullopt when unset or empty.
std::optional<long> read_number(const Environment& env, Setting setting);
// The value of a Choice variable (one of its choices) or a Text variable; nullopt when unset
// or empty.
std::optional<std::string> read_text(const Environment& env, Setting setting);
// Whether a Flag variable is set (not unset, empty or "0").
bool read_flag(const Environment& env, Setting setting);

// Seconds a collective of either backend may take before the communicator's watchdog ends the
// job: DDP_TIMEOUT_SECONDS, or 600 (PyTorch's default) when it is unset or empty.
int collective_timeout_seconds(const Environment& env);

// Seconds MPI start-up may take before the phase watchdog ends the job (<ddp/runtime.h>:
// WatchedPhase): DDP_STARTUP_TIMEOUT_SECONDS, or 600 when it is unset or empty.
int startup_timeout_seconds(const Environment& env);

// The same for NCCL alone: DDP_NCCL_TIMEOUT_SECONDS when it is set (the older, NCCL-only name),
// else collective_timeout_seconds(env).
int nccl_timeout_seconds(const Environment& env);

// The debug mode (DDP_DEBUG, as PyTorch's TORCH_DISTRIBUTED_DEBUG): true for DETAIL (every
// collective of the MPI backend is first checked to be the same on every rank), false when
// unset, empty or OFF.
bool debug_detail(const Environment& env);

}  // namespace ddp
