#include <ddp/stop_signal.h>

#include <gtest/gtest.h>

#include <csignal>

namespace {

volatile std::sig_atomic_t previous_handler_ran = 0;
extern "C" void previous_handler(int) { previous_handler_ran = 1; }

struct sigaction handler_of(int signal) {
  struct sigaction current {};
  sigaction(signal, nullptr, &current);
  return current;
}

TEST(StopSignal, HandlersRecordTheFirstSignalAndRestoreThePreviousOnes) {
  struct sigaction mine {};
  mine.sa_handler = previous_handler;
  sigemptyset(&mine.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGUSR1, &mine, &saved), 0);
  ddp::clear_stop_signal();
  {
    ddp::StopSignalHandlers outer;
    {
      ddp::StopSignalHandlers inner;  // nested: the outer one's stay when this one goes
    }
    EXPECT_NE(handler_of(SIGUSR1).sa_handler, previous_handler);
    EXPECT_EQ(ddp::stop_signal(), 0);
    EXPECT_LT(ddp::seconds_since_stop_signal(), 0);
    // The process survives SIGTERM and SIGUSR1/2: they only set the flag, the first one counts.
    std::raise(SIGUSR1);
    std::raise(SIGTERM);
    std::raise(SIGUSR2);
    EXPECT_EQ(ddp::stop_signal(), SIGUSR1);
    EXPECT_GE(ddp::seconds_since_stop_signal(), 0.0);
    EXPECT_LT(ddp::seconds_since_stop_signal(), 5.0);
    ddp::clear_stop_signal();
    std::raise(SIGTERM);
    EXPECT_EQ(ddp::stop_signal(), SIGTERM);
  }
  // The flag outlives the handlers; the program's own handler is back.
  EXPECT_EQ(ddp::stop_signal(), SIGTERM);
  EXPECT_EQ(handler_of(SIGUSR1).sa_handler, previous_handler);
  std::raise(SIGUSR1);
  EXPECT_EQ(previous_handler_ran, 1);
  EXPECT_EQ(ddp::stop_signal(), SIGTERM);
  ddp::clear_stop_signal();
  EXPECT_EQ(ddp::stop_signal(), 0);
  sigaction(SIGUSR1, &saved, nullptr);
}

TEST(StopSignal, NamesTheSignals) {
  EXPECT_STREQ(ddp::stop_signal_name(SIGTERM), "SIGTERM");
  EXPECT_STREQ(ddp::stop_signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_STREQ(ddp::stop_signal_name(SIGUSR2), "SIGUSR2");
  EXPECT_STREQ(ddp::stop_signal_name(9), "signal 9");
  EXPECT_EQ(ddp::kStoppedExitCode, 75);
}

}  // namespace
