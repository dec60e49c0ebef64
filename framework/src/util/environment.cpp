#include "util/environment.h"

#include <array>
#include <cctype>
#include <cstring>
#include <stdexcept>

#include <unistd.h>  // environ (glibc declares it with _GNU_SOURCE, which g++ defines)

namespace ddp {

namespace {

using Kind = SettingInfo::Kind;
constexpr long kMaxKiB = 1L << 30;  // the largest size in KiB (1 TiB)

// Every DDP_* variable the core reads, in the order of `Setting`.
constexpr std::array<SettingInfo, 11> kSettings{{
    {Setting::Timeout, "DDP_TIMEOUT_SECONDS", Kind::Seconds, 0, nullptr, nullptr,
     "seconds a collective of either backend may take before its watchdog ends the job "
     "(ProcessGroupOptions::timeout wins; default 600)"},
    {Setting::NcclTimeout, "DDP_NCCL_TIMEOUT_SECONDS", Kind::Seconds, 0, nullptr, nullptr,
     "the same for NCCL alone (the older name; default: DDP_TIMEOUT_SECONDS)"},
    {Setting::Debug, "DDP_DEBUG", Kind::Choice, 0, "DETAIL|OFF",
     "DETAIL (check that every rank calls the same collectives) or OFF",
     "DETAIL: check before each collective of the MPI backend that every rank calls the same "
     "one (default OFF)"},
    {Setting::SkipLaunchChecks, "DDP_SKIP_LAUNCH_CHECKS", Kind::Flag, 0, nullptr, nullptr,
     "set (not 0): skip the checks that end a job launched in a way that cannot work"},
    {Setting::MpiSpin, "DDP_MPI_SPIN_US", Kind::Number, 1000000, nullptr, nullptr,
     "MpiOptions::spin in microseconds: busy-testing before sleeping"},
    {Setting::MpiMaxSleep, "DDP_MPI_MAX_SLEEP_US", Kind::Number, 1000000, nullptr, nullptr,
     "MpiOptions::max_sleep in microseconds; 0: never sleep"},
    {Setting::MpiBlocking, "DDP_MPI_BLOCKING_KIB", Kind::Number, kMaxKiB, nullptr, nullptr,
     "MpiOptions::blocking_bytes in KiB"},
    {Setting::Sockets, "DDP_MPI_SOCKETS", Kind::Choice, 0, "auto|never|always",
     "auto, never or always",
     "where large all-reduces take ddp's TCP ring instead of MPI (CpuOptions::sockets)"},
    {Setting::SocketThreshold, "DDP_MPI_SOCKET_KIB", Kind::Number, kMaxKiB, nullptr, nullptr,
     "CpuOptions::socket_bytes in KiB: the smallest all-reduce on the ring"},
    {Setting::SocketInterfaces, "DDP_SOCKET_IFNAME", Kind::Text, 0, nullptr, nullptr,
     "the interfaces the ring listens on, comma-separated, the first present wins "
     "(CpuOptions::socket_interfaces)"},
    {Setting::StartupTimeout, "DDP_STARTUP_TIMEOUT_SECONDS", Kind::Seconds, 0, nullptr, nullptr,
     "seconds MPI start-up (MPI_Init and the Runtime's first collectives) may take before the "
     "phase watchdog ends the job (default 600)"},
}};

constexpr bool in_setting_order() {
  for (size_t i = 0; i < kSettings.size(); ++i) {
    if (static_cast<size_t>(kSettings[i].setting) != i) return false;
  }
  return true;
}
static_assert(in_setting_order(), "kSettings lists the settings in the order of enum Setting");

std::string get(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

[[noreturn]] void bad_value(const SettingInfo& info, const std::string& value) {
  const std::string quoted = std::string(info.name) + "='" + value + "'";
  switch (info.kind) {
    case Kind::Seconds:
      throw std::invalid_argument(quoted + " is not a positive whole number of seconds");
    case Kind::Number:
      throw std::invalid_argument(quoted + ": expected an integer from 0 to " +
                                  std::to_string(info.max));
    case Kind::Choice:
      throw std::invalid_argument(quoted + ": expected " + info.expected);
    case Kind::Flag:
    case Kind::Text:
      break;
  }
  throw std::logic_error(quoted + ": not a value with a range");
}

void expect_kind(const SettingInfo& info, bool ok) {
  if (!ok) throw std::logic_error(std::string("ddp: ") + info.name + " read as the wrong kind");
}

}  // namespace

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string line(*entry);
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

const SettingInfo& setting_info(Setting setting) {
  return kSettings.at(static_cast<size_t>(setting));
}

std::optional<long> read_number(const Environment& env, Setting setting) {
  const SettingInfo& info = setting_info(setting);
  expect_kind(info, info.kind == Kind::Seconds || info.kind == Kind::Number);
  const std::string value = get(env, info.name);
  if (value.empty()) return std::nullopt;
  // Digits only; seconds have at most 9 (they become an int).
  const long max = info.kind == Kind::Seconds ? 999999999L : info.max;
  if (value.size() > 10) bad_value(info, value);
  for (char c : value) {
    if (!std::isdigit(static_cast<unsigned char>(c))) bad_value(info, value);
  }
  const long number = std::stol(value);
  if (number > max || (info.kind == Kind::Seconds && number == 0)) bad_value(info, value);
  return number;
}

std::optional<std::string> read_text(const Environment& env, Setting setting) {
  const SettingInfo& info = setting_info(setting);
  expect_kind(info, info.kind == Kind::Choice || info.kind == Kind::Text);
  const std::string value = get(env, info.name);
  if (value.empty()) return std::nullopt;
  if (info.kind == Kind::Choice) {
    const std::string choices = std::string("|") + info.choices + "|";
    if (value.find('|') != std::string::npos ||
        choices.find("|" + value + "|") == std::string::npos) {
      bad_value(info, value);
    }
  }
  return value;
}

bool read_flag(const Environment& env, Setting setting) {
  const SettingInfo& info = setting_info(setting);
  expect_kind(info, info.kind == Kind::Flag);
  const std::string value = get(env, info.name);
  return !value.empty() && value != "0";
}

int collective_timeout_seconds(const Environment& env) {
  return static_cast<int>(read_number(env, Setting::Timeout).value_or(600));
}

int startup_timeout_seconds(const Environment& env) {
  return static_cast<int>(read_number(env, Setting::StartupTimeout).value_or(600));
}

int nccl_timeout_seconds(const Environment& env) {
  const auto seconds = read_number(env, Setting::NcclTimeout);
  return seconds ? static_cast<int>(*seconds) : collective_timeout_seconds(env);
}

bool debug_detail(const Environment& env) {
  return read_text(env, Setting::Debug).value_or("OFF") == "DETAIL";
}

}  // namespace ddp
