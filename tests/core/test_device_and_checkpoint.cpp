#include <ddp/checkpoint_file.h>
#include <ddp/runtime.h>
#include "runtime/launcher.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>

namespace {

using ddp_test::exists;
using ddp_test::host;
using ddp_test::read_all;

TEST(SelectDevice, CpuWhenCudaIsOffOrAbsent) {
  EXPECT_EQ(ddp::select_device(false, 4, 1, 2), torch::Device(torch::kCPU));
  EXPECT_EQ(ddp::select_device(true, 0, 1, 2), torch::Device(torch::kCPU));
}

TEST(SelectDevice, LocalRankPicksItsGpu) {
  EXPECT_EQ(ddp::select_device(true, 4, 3, 4), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(ddp::select_device(true, 4, 0, 2), torch::Device(torch::kCUDA, 0));
}

TEST(SelectDevice, MoreRanksThanGpusIsAClearError) {
  try {
    ddp::select_device(true, 1, 1, 2);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("2 ranks on this node but only 1 visible CUDA device"),
              std::string::npos)
        << e.what();
  }
}

// In a child process (its exit status returned, its id in `writer`): limits the files it writes
// to `limit` bytes, runs `write`, and exits 0 when that threw std::runtime_error. `on_limit`
// handles SIGXFSZ.
int write_limited(rlim_t limit, void (*on_limit)(int), const std::function<void()>& write,
                  pid_t* writer = nullptr) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGXFSZ, on_limit);
    rlimit files{};
    ::getrlimit(RLIMIT_FSIZE, &files);
    files.rlim_cur = limit;
    ::setrlimit(RLIMIT_FSIZE, &files);
    try {
      write();
    } catch (const std::runtime_error&) {
      ::_exit(0);
    }
    ::_exit(1);
  }
  if (writer) *writer = child;
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(WriteAtomically, ReplacesTheFileOnlyWhenTheWriteSucceeds) {
  const std::string dir = ddp_test::make_temp_dir("atomic");
  const std::string path = dir + "/state.txt";
  ddp::write_atomically(path, std::string("first"));
  EXPECT_EQ(read_all(path), "first");

  // A write that fails half-way (EFBIG past the limit, as a full disk fails it).
  const int status =
      write_limited(4, SIG_IGN, [&] { ddp::write_atomically(path, std::string("half done")); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(read_all(path), "first");
  EXPECT_EQ(ddp_test::run_command("ls '" + dir + "'"), "state.txt\n");  // no temporary left
}

TEST(WriteAtomically, UnwritableDirectoryNamesTheFile) {
  try {
    ddp::save_module(*torch::nn::Linear(2, 2), "/nonexistent-dir/model.pt");
    FAIL() << "no exception";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/model.pt"), std::string::npos)
        << e.what();
  }
}

// A process id that is certainly not running: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(WriteAtomically, BytesReplaceTheFileAndLeaveNoTemporary) {
  const std::string dir = ddp_test::make_temp_dir("atomic_bytes");
  const std::string path = dir + "/state.bin";
  ddp::write_atomically(path, std::string("first"));
  ddp::write_atomically(path, std::string("second\0binary", 13));
  EXPECT_EQ(read_all(path), std::string("second\0binary", 13));
  EXPECT_EQ(ddp_test::run_command("ls -a '" + dir + "'"), ".\n..\nstate.bin\n");
}

TEST(WriteAtomically, FailureNamesTheFileAndTheSystemsReason) {
  const std::string dir = ddp_test::make_temp_dir("atomic_fail");
  ddp::write_atomically(dir + "/file", std::string("x"));
  // A path under a regular file fails for root too.
  for (const std::string& path : {dir + "/file/model.pt", dir + "/missing/model.pt"}) {
    try {
      ddp::write_atomically(path, std::string("bytes"));
      ADD_FAILURE() << "no exception for " << path;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(path + ": cannot create " + path + ".tmp." + host() + ".", 0), 0u)
          << what;
      EXPECT_TRUE(what.find("Not a directory") != std::string::npos ||
                  what.find("No such file or directory") != std::string::npos)
          << what;
    }
  }
}

// A writer killed (SIGKILL) in the middle of a write: the previous file is intact, the
// temporary file is left, and remove_stale_temporaries removes it once the writer is gone.
TEST(WriteAtomically, KillMidWriteLeavesThePreviousFileAndAStaleTemporary) {
  const std::string dir = ddp_test::make_temp_dir("atomic_kill");
  const std::string path = dir + "/snapshot.pt";
  ddp::write_atomically(path, std::string("previous"));
  // Killed when its write goes past 15 bytes: the first write() stops at the limit, the next
  // raises SIGXFSZ, whose handler kills the writer.
  pid_t child = 0;
  const int status = write_limited(
      15, [](int) { ::raise(SIGKILL); },
      [&] { ddp::write_atomically(path, std::string("half of the new file")); }, &child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(read_all(path), "previous");
  const std::string tmp = path + ".tmp." + host() + "." + std::to_string(child);
  EXPECT_EQ(read_all(tmp), "half of the new");
  EXPECT_EQ(ddp::remove_stale_temporaries(dir), std::vector<std::string>{tmp});
  EXPECT_FALSE(exists(tmp));
  EXPECT_EQ(read_all(path), "previous");
}

TEST(RemoveStaleTemporaries, OnlyOurNamesOfWritersThatAreGone) {
  const std::string dir = ddp_test::make_temp_dir("stale");
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(::getpid());
  const std::string parent = std::to_string(::getppid());  // alive, not this process
  auto touch = [&](const std::string& name) {
    std::ofstream(dir + "/" + name) << "bytes";
    return dir + "/" + name;
  };
  const std::string dead_here = touch("model_with_epoch2.pt.tmp." + host() + "." + dead);
  const std::string dead_legacy = touch("snapshot_epoch2.pt.tmp." + dead);
  const std::string old_elsewhere = touch("snapshot_epoch3.pt.tmp.other-node.01.42");
  const std::vector<std::string> kept = {touch("model_with_epoch1.pt"),
                                         touch("notes.tmp.txt"),
                                         touch(".tmp.123"),
                                         touch("a.pt.tmp." + host() + "." + alive),
                                         touch("b.pt.tmp." + host() + "." + parent),
                                         touch("c.pt.tmp." + parent),
                                         touch("d.pt.tmp.other-node.01.42")};  // fresh: may be live
  // Another host's file nobody has written for two hours.
  const struct timespec times[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old_elsewhere.c_str(), times, 0), 0);
  ASSERT_EQ(::mkdir((dir + "/e.pt.tmp." + dead).c_str(), 0755), 0);  // not a file: kept

  std::vector<std::string> removed = ddp::remove_stale_temporaries(dir);
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected = {dead_here, dead_legacy, old_elsewhere};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(removed, expected);
  for (const auto& path : expected) EXPECT_FALSE(exists(path)) << path;
  for (const auto& path : kept) EXPECT_TRUE(exists(path)) << path;
  EXPECT_TRUE(exists(dir + "/e.pt.tmp." + dead));
  EXPECT_TRUE(ddp::remove_stale_temporaries(dir + "/no-such-dir").empty());
}

TEST(CheckWritableDirectory, CreatesAMissingDirectoryAndLeavesNothingInIt) {
  const std::string dir = ddp_test::make_temp_dir("writable") + "/a/b";
  ddp::check_writable_directory(dir, "checkpoint directory");
  EXPECT_EQ(ddp_test::run_command("ls -a '" + dir + "'"), ".\n..\n");
}

TEST(CheckWritableDirectory, NamesTheDirectoryAndTheReason) {
  const std::string base = ddp_test::make_temp_dir("unwritable");
  std::ofstream(base + "/file") << "x";
  try {
    ddp::check_writable_directory(base + "/file/checkpoints", "checkpoint directory");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), base +
                                         "/file/checkpoints: cannot create the checkpoint "
                                         "directory: Not a directory");
  }
}

TEST(SaveModule, RoundTripsThroughTorchLoad) {
  const std::string path = ddp_test::make_temp_dir("save_module") + "/linear.pt";
  torch::nn::Linear saved(3, 2), loaded(3, 2);
  ddp::save_module(*saved, path);
  torch::load(loaded, path);
  EXPECT_TRUE(torch::equal(saved->weight, loaded->weight));
  EXPECT_TRUE(torch::equal(saved->bias, loaded->bias));
}

}  // namespace
