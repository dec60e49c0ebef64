// One job per checkpoint directory (src/train/directory_lock.h): a second process is refused
// naming the holder, a lock of a process that is gone is taken over naming it, and the locks of
// one process share the file. The other processes are fork()ed children (flock is per open
// file, so a second process is the real case); tests/system/checkpoint_lock_check.sh runs two jobs.
#include "train/directory_lock.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

using ddp_test::exists;
using ddp_test::host;
using ddp_test::read_all;

using ddp::detail::DirectoryLock;

// A child process that takes the lock of `dir`, says so on a pipe, then either waits for the
// pipe's other end to close (and releases) or kills itself holding it.
struct Holder {
  pid_t pid = -1;
  int release_fd = -1;  // closing it lets a waiting child release and exit

  Holder(const std::string& dir, bool die_holding) {
    int ready[2], release[2];
    if (::pipe(ready) != 0 || ::pipe(release) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      ::close(release[1]);
      auto taken = DirectoryLock::take(dir);
      const char ok = taken.lock ? 'y' : 'n';
      if (::write(ready[1], &ok, 1) != 1) ::_exit(3);
      if (die_holding) ::raise(SIGKILL);
      char byte;
      while (::read(release[0], &byte, 1) > 0) {
      }
      taken.lock.reset();  // a clean release
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(release[0]);
    char ok = 0;
    if (::read(ready[0], &ok, 1) != 1 || ok != 'y')
      throw std::runtime_error("the child has no lock");
    ::close(ready[0]);
    release_fd = release[1];
  }
  // Lets the child release the lock and end; its exit status.
  int finish() {
    ::close(release_fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
};

TEST(DirectoryLock, HolderLineNamesHostPidStartAndSlurmJob) {
  EXPECT_EQ(ddp::detail::lock_holder_line("n1", 1234, 0, ""),
            "host n1, pid 1234, since 1970-01-01 00:00:00 UTC");
  EXPECT_EQ(ddp::detail::lock_holder_line("n1", 1234, 86400 + 3661, "77"),
            "host n1, pid 1234, since 1970-01-02 01:01:01 UTC, Slurm job 77");
}

TEST(DirectoryLock, OnlyLackOfSupportIsNotAnError) {
  for (int error : {ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL}) {
    EXPECT_TRUE(ddp::detail::flock_unsupported(error)) << error;
  }
  for (int error : {EWOULDBLOCK, EACCES, EBADF, EIO}) {
    EXPECT_FALSE(ddp::detail::flock_unsupported(error)) << error;
  }
}

TEST(DirectoryLock, ASecondProcessIsRefusedNamingTheHolder) {
  const std::string dir = ddp_test::make_temp_dir("lock_refused");
  const std::string path = dir + "/.ddp.lock";
  Holder holder(dir, /*die_holding=*/false);
  EXPECT_EQ(read_all(path).rfind(
                "host " + host() + ", pid " + std::to_string(holder.pid) + ", since ", 0),
            0u)
      << read_all(path);
  try {
    DirectoryLock::take(dir);
    ADD_FAILURE() << "a second process took the lock";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(dir + " is in use by another job (host " + host() + ", pid " +
                             std::to_string(holder.pid) + ", since ",
                         0),
              0u)
        << what;
    EXPECT_NE(what.find(" holds " + path + "): give each job a checkpoint directory of its own"),
              std::string::npos)
        << what;
  }
  // The holder is unaffected: it releases cleanly, removing the file.
  EXPECT_EQ(holder.finish(), 0);
  EXPECT_FALSE(exists(path));
  auto taken = DirectoryLock::take(dir);
  ASSERT_TRUE(taken.lock);
  EXPECT_EQ(taken.previous_holder, "");  // a clean release leaves nothing to take over
  EXPECT_EQ(read_all(path).rfind(
                "host " + host() + ", pid " + std::to_string(::getpid()) + ", since ", 0),
            0u);
  taken.lock.reset();
  EXPECT_FALSE(exists(path));
}

TEST(DirectoryLock, ALockOfAProcessThatIsGoneIsTakenOverNamingIt) {
  const std::string dir = ddp_test::make_temp_dir("lock_stale");
  const std::string path = dir + "/.ddp.lock";
  Holder holder(dir, /*die_holding=*/true);
  const int status = holder.finish();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ASSERT_TRUE(exists(path));  // kill -9: no clean release
  auto taken = DirectoryLock::take(dir);
  ASSERT_TRUE(taken.lock);
  EXPECT_EQ(taken.previous_holder.rfind(
                "host " + host() + ", pid " + std::to_string(holder.pid) + ", since ", 0),
            0u)
      << taken.previous_holder;
  EXPECT_EQ(taken.unsupported, "");
  EXPECT_EQ(read_all(path).find("pid " + std::to_string(holder.pid)), std::string::npos);
  EXPECT_NE(read_all(path).find("pid " + std::to_string(::getpid()) + ","), std::string::npos);
}

TEST(DirectoryLock, AnEmptyLockFileIsTakenWithoutANote) {
  const std::string dir = ddp_test::make_temp_dir("lock_empty");
  std::ofstream(dir + "/.ddp.lock").close();
  auto taken = DirectoryLock::take(dir);
  ASSERT_TRUE(taken.lock);
  EXPECT_EQ(taken.previous_holder, "");
}

// Two Checkpointers of one process (a resumed copy beside the first, a test) on one directory,
// however it is spelled: both hold it; the file goes with the last.
TEST(DirectoryLock, LocksOfOneProcessShareTheDirectory) {
  const std::string dir = ddp_test::make_temp_dir("lock_shared");
  const std::string path = dir + "/.ddp.lock";
  auto first = DirectoryLock::take(dir);
  auto second = DirectoryLock::take(dir + "/.");
  ASSERT_TRUE(first.lock && second.lock);
  EXPECT_EQ(second.previous_holder, "");
  first.lock.reset();
  EXPECT_TRUE(exists(path));
  // Still held for the process: another process's flock fails (util-linux flock(1): -n, exit
  // 1; a fork would share this process's open lock file, an exec does not: O_CLOEXEC).
  EXPECT_EQ(WEXITSTATUS(std::system(("flock -n '" + path + "' true").c_str())), 1);
  second.lock.reset();
  EXPECT_FALSE(exists(path));
}

TEST(DirectoryLock, AMissingDirectoryIsNamed) {
  const std::string dir = ddp_test::make_temp_dir("lock_missing") + "/nothing";
  try {
    DirectoryLock::take(dir);
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), dir + ": cannot use the directory: No such file or directory");
  }
}

}  // namespace
