// Bad input is refused before anything is allocated for it, naming the file or the option:
// the readers' header checks (also fuzzed, fuzz/), unreadable files, the kept fuzz corpus
// replayed through the real readers, the options' numeric checks and the batch memory check.
#include <ddp/train/cifar.h>
#include <ddp/train/mnist.h>
#include <ddp/train/adadelta.h>
#include <ddp/train/lr_scheduler.h>
#include "cli/memory_check.h"

#include "train/idx_format.h"
#include "train/snapshot_format.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <zlib.h>

#include <dirent.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace {

using ddp_test::Bytes;
using ddp_test::write_file;

std::string idx_header(const std::vector<uint32_t>& dims) {
  std::string b{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  return b;
}

// The message of the std::runtime_error `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part)                               \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "message: " << (text) << "\nmissing: " << (part)

TEST(IdxHeader, AbsurdSizesAreRefusedBeforeAllocatingNamingTheFile) {
  const std::string dir = ddp_test::make_temp_dir("idx_absurd");
  // The 45 bytes: the header promises 60000x512x512 bytes; read_idx allocated 16 GB.
  std::string promise = idx_header({60000, 512, 512}) + std::string(29, '\0');
  ASSERT_EQ(promise.size(), 45u);
  write_file(dir + "/promise", promise);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { ddp::read_idx(dir + "/promise"); });
  EXPECT_HAS(message, dir + "/promise: truncated: the header promises 15728640000 bytes");
  EXPECT_HAS(message, "the file has 29 after its 16-byte header");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  // Four dimensions of 2^32-1: the product overflows 64 bits, and is refused all the same.
  write_file(dir + "/overflow", idx_header({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}));
  EXPECT_HAS(error_of([&] { ddp::read_idx(dir + "/overflow"); }),
             dir + "/overflow: truncated: the header promises more than 18446744073709551615");

  // gzip: at most 1032 bytes per compressed byte.
  gzFile f = gzopen((dir + "/packed.gz").c_str(), "wb");
  const std::string packed = idx_header({0xffffffffu}) + "abc";
  gzwrite(f, packed.data(), static_cast<unsigned>(packed.size()));
  gzclose(f);
  const std::string gz_message = error_of([&] { ddp::read_idx(dir + "/packed"); });
  EXPECT_HAS(gz_message, dir + "/packed.gz: the header promises 4294967295 bytes");
  EXPECT_HAS(gz_message, "deflate expands at most 1032:1");

  // The pure check, directly: a zero dimension makes the product 0 even after an overflow.
  const std::string zero = idx_header({0xffffffffu, 0xffffffffu, 0xffffffffu, 0});
  const ddp::IdxHeader h = ddp::parse_idx_header(reinterpret_cast<const uint8_t*>(zero.data()),
                                                 zero.size(), zero.size(), false, "z");
  EXPECT_EQ(h.data_bytes, 0u);
  EXPECT_EQ(h.shape.back(), 0);
}

TEST(IdxHeader, DirectoryAndUnreadableFilesSaySo) {
  const std::string dir = ddp_test::make_temp_dir("idx_unreadable");
  ASSERT_EQ(::mkdir((dir + "/images").c_str(), 0755), 0);
  EXPECT_HAS(error_of([&] { ddp::read_idx(dir + "/images"); }),
             dir + "/images: not a regular file: it is a directory");
  EXPECT_HAS(error_of([&] { ddp::read_cifar10_file(dir + "/images"); }),
             dir + "/images: not a regular file: it is a directory");
  // A path through a regular file: ENOTDIR, which root gets too, is not "no such file".
  write_file(dir + "/plain", idx_header({1}) + "x");
  EXPECT_HAS(error_of([&] { ddp::read_idx(dir + "/plain/labels"); }), "Not a directory");
  EXPECT_HAS(error_of([&] { ddp::read_cifar10_file(dir + "/plain/data.bin"); }), "Not a directory");
}

// Permission denied needs a user the permissions apply to: as root (CI) a child process drops
// to nobody (65534) first; the child reports the messages through a pipe.
TEST(IdxHeader, UnreadableFileSaysPermissionDenied) {
  const std::string dir = ddp_test::make_temp_dir("idx_denied");
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  write_file(dir + "/secret-idx1-ubyte", idx_header({1}) + "x");
  write_file(dir + "/secret.bin", std::string(3073, '\0'));
  ASSERT_EQ(::chmod((dir + "/secret-idx1-ubyte").c_str(), 0), 0);
  ASSERT_EQ(::chmod((dir + "/secret.bin").c_str(), 0), 0);
  // Every folder above must be searchable by nobody; where it is not, the test cannot run.
  if (::geteuid() == 0) {
    for (std::string up = dir; up.size() > 1; up = up.substr(0, up.rfind('/'))) {
      struct stat info {};
      if (::stat(up.c_str(), &info) != 0 || !(info.st_mode & S_IXOTH)) {
        GTEST_SKIP() << up << " is not searchable by other users";
      }
      if (up.rfind('/') == 0) break;
    }
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::geteuid() == 0 &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
         ::setresuid(65534, 65534, 65534) != 0)) {
      ::_exit(3);
    }
    const std::string text = error_of([&] { ddp::read_idx(dir + "/secret-idx1-ubyte"); }) + "\n" +
                             error_of([&] { ddp::read_cifar10_file(dir + "/secret.bin"); });
    if (::write(pipe_fds[1], text.data(), text.size()) < 0) ::_exit(4);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_HAS(text, dir + "/secret-idx1-ubyte: cannot open: Permission denied");
  EXPECT_HAS(text, dir + "/secret.bin: cannot open: Permission denied");
  EXPECT_EQ(text.find("no such file"), std::string::npos) << text;
}

TEST(LoadMnist, EmptySetAndWrongImageSizeAreErrorsNamingTheFile) {
  const std::string dir = ddp_test::make_temp_dir("mnist_empty");
  write_file(dir + "/t10k-images-idx3-ubyte", idx_header({0, 28, 28}));
  write_file(dir + "/t10k-labels-idx1-ubyte", idx_header({0}));
  EXPECT_HAS(error_of([&] { ddp::load_mnist(dir, ddp::MnistSplit::Test); }),
             dir + "/t10k-images-idx3-ubyte: no images: the data set is empty");
  write_file(dir + "/t10k-images-idx3-ubyte", idx_header({1, 3, 3}) + std::string(9, '\0'));
  write_file(dir + "/t10k-labels-idx1-ubyte", idx_header({1}) + std::string(1, '\0'));
  EXPECT_HAS(error_of([&] { ddp::load_mnist(dir, ddp::MnistSplit::Test); }),
             dir + "/t10k-images-idx3-ubyte: images are 3x3, MNIST's are 28x28");
}

// Every input kept in fuzz/corpus/<target>/ (seeds and inputs that found bugs) is read by the
// real reader: it is read, or refused with an error naming the file; never a crash, nor an
// allocation the file cannot back.
std::vector<std::string> corpus(const std::string& target) {
  const std::string dir = std::string(DDP_TEST_DIR) + "/../fuzz/corpus/" + target;
  std::vector<std::string> paths;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return paths;
  while (const dirent* e = readdir(d.get())) {
    if (e->d_name[0] != '.') paths.push_back(dir + "/" + e->d_name);
  }
  return paths;
}

TEST(FuzzCorpus, IdxInputsAreReadOrRefusedNamingTheFile) {
  const auto paths = corpus("idx");
  ASSERT_GE(paths.size(), 3u);
  int refused = 0;
  for (const auto& path : paths) {
    const std::string message = error_of([&] { ddp::read_idx(path); });
    if (!message.empty()) {
      ++refused;
      EXPECT_EQ(message.rfind(path, 0), 0u) << message;
    }
    if (path.find("/bug-") != std::string::npos) {
      EXPECT_FALSE(message.empty()) << path;
    }
  }
  EXPECT_GE(refused, 3);
}

TEST(FuzzCorpus, CifarInputsAreReadOrRefusedNamingTheFile) {
  const auto paths = corpus("cifar");
  ASSERT_GE(paths.size(), 2u);
  for (const auto& path : paths) {
    const std::string message = error_of([&] { ddp::read_cifar10_file(path); });
    if (!message.empty()) {
      EXPECT_EQ(message.rfind(path, 0), 0u) << message;
    }
    if (path.find("/seed-one-record") != std::string::npos) {
      EXPECT_EQ(message, "");
    }
  }
}

TEST(SnapshotFormat, HeaderIsCheckedAgainstTheFileSize) {
  std::string head(ddp::kSnapshotMagic, 8);
  for (int i = 0; i < 8; ++i) head.push_back(i == 7 ? '\x80' : '\0');  // 2^63 bytes promised
  head += std::string(8, '\0');
  EXPECT_HAS(error_of([&] { ddp::parse_snapshot_header(head.data(), head.size(), 1000, "s.pt"); }),
             "s.pt: truncated or padded: the header promises 9223372036854775808 bytes of payload, "
             "the file holds 976");
  EXPECT_HAS(error_of([&] { ddp::parse_snapshot_header(head.data(), 10, 10, "s.pt"); }),
             "s.pt: not a ddp training snapshot");
  const int64_t good[] = {3, 120, 1, 2}, negative[] = {-1, 0, 1, 1}, no_ranks[] = {1, 1, 1, 0};
  EXPECT_NO_THROW(ddp::check_snapshot_progress(good, 4, "s.pt"));
  EXPECT_HAS(error_of([&] { ddp::check_snapshot_progress(good, 3, "s.pt"); }),
             "has 3 values, fewer than 4");
  EXPECT_HAS(error_of([&] { ddp::check_snapshot_progress(negative, 4, "s.pt"); }), "epoch -1");
  EXPECT_HAS(error_of([&] { ddp::check_snapshot_progress(no_ranks, 4, "s.pt"); }), "world size 0");
  // The later values (batches done, batch size, samples done), when present.
  const int64_t later[] = {1, 2, 3, 4, 5, 16, -1};
  EXPECT_NO_THROW(ddp::check_snapshot_progress(later, 7, "s.pt"));
  const int64_t bad_samples[] = {1, 2, 3, 4, 5, 16, -2};
  EXPECT_HAS(error_of([&] { ddp::check_snapshot_progress(bad_samples, 7, "s.pt"); }),
             "samples done -2");
  const int64_t bad_batch[] = {1, 2, 3, 4, 5, -16, 0};
  EXPECT_HAS(error_of([&] { ddp::check_snapshot_progress(bad_batch, 7, "s.pt"); }),
             "batch size -16");
}

// Issue 38: a snapshot of a newer ddp is not "not a ddp training snapshot": its version and this
// build's are named. At the exact header size and shorter (a newer header may be longer or
// shorter than this one's), and not for a digit that is not newer.
TEST(SnapshotFormat, NewerFormatNamesItsVersionAndThisBuilds) {
  for (const std::string& tail : {std::string(16, '\0'), std::string()}) {
    const std::string head = "DDPSNAP4" + tail;
    EXPECT_EQ(error_of([&] { ddp::parse_snapshot_header(head.data(), head.size(), 5000, "s.pt"); }),
              "s.pt: a snapshot of format 4 (DDPSNAP4), written by a newer ddp; this build reads "
              "format 3 (DDPSNAP3): resume with the ddp that wrote it (or a newer one), or start "
              "the run afresh");
  }
  const std::string nine = "DDPSNAP9" + std::string(16, '\0');
  EXPECT_HAS(error_of([&] { ddp::parse_snapshot_header(nine.data(), nine.size(), 5000, "s.pt"); }),
             "s.pt: a snapshot of format 9 (DDPSNAP9), written by a newer ddp");
  for (const char* magic : {"DDPSNAP0", "DDPSNAPX", "DDPSNAP:"}) {
    const std::string head = magic + std::string(16, '\0');
    EXPECT_HAS(
        error_of([&] { ddp::parse_snapshot_header(head.data(), head.size(), 5000, "s.pt"); }),
        "s.pt: not a ddp training snapshot (no DDPSNAP3 header");
  }
}

TEST(OptionChecks, NonFiniteAndOutOfRangeValuesNameTheField) {
  torch::Tensor w = torch::zeros({2}, torch::requires_grad());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto adadelta_error = [&](ddp::AdadeltaOptions options) {
    try {
      ddp::Adadelta optimizer({w}, options);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(adadelta_error(ddp::AdadeltaOptions(nan)), "AdadeltaOptions::lr must be finite");
  EXPECT_HAS(adadelta_error(ddp::AdadeltaOptions(1.0).rho(nan)), "AdadeltaOptions::rho");
  EXPECT_HAS(adadelta_error(ddp::AdadeltaOptions(1.0).eps(-1)), "AdadeltaOptions::eps");
  EXPECT_EQ(adadelta_error(ddp::AdadeltaOptions(1.0)), "");
  ddp::Adadelta optimizer({w}, ddp::AdadeltaOptions(1.0));
  EXPECT_THROW(ddp::StepLR(optimizer, 1, nan), std::invalid_argument);
  EXPECT_THROW(ddp::StepLR(optimizer, 0, 0.5), std::invalid_argument);
  EXPECT_THROW(ddp::CosineAnnealingLR(optimizer, -1), std::invalid_argument);
  EXPECT_THROW(ddp::CosineAnnealingLR(optimizer, 5, nan), std::invalid_argument);
  EXPECT_NO_THROW(ddp::StepLR(optimizer, 1, 0.7));
}

// A fake /proc and /sys/fs/cgroup under a temporary root.
std::string fake_root(const std::string& name, const std::string& cgroup_line) {
  const std::string root = ddp_test::make_temp_dir(name);
  ddp_test::run_command("mkdir -p '" + root + "/proc/self' '" + root + "/sys/fs/cgroup/job' '" +
                        root + "/sys/fs/cgroup/memory/job'");
  write_file(root + "/proc/meminfo",
             "MemTotal: 8000000 kB\nMemFree: 100 kB\nMemAvailable: 4000000 kB\n");
  write_file(root + "/proc/self/cgroup", cgroup_line);
  return root;
}

TEST(MemoryCheck, AvailableMemoryIsTheLowerOfMeminfoAndTheCgroupLimit) {
  std::string root = fake_root("mem_v2", "0::/job\n");
  write_file(root + "/sys/fs/cgroup/job/memory.max", "max\n");
  ddp::HostMemory m = ddp::host_memory_available(root);
  EXPECT_EQ(m.available_bytes, 4000000ull * 1024);
  EXPECT_EQ(m.source, "MemAvailable in /proc/meminfo");

  write_file(root + "/sys/fs/cgroup/job/memory.max", "1000000000\n");
  write_file(root + "/sys/fs/cgroup/job/memory.current", "400000000\n");
  m = ddp::host_memory_available(root);
  EXPECT_EQ(m.available_bytes, 600000000u);
  EXPECT_HAS(m.source, "cgroup /job");

  root = fake_root("mem_v1", "12:cpu:/other\n7:memory:/job\n");
  write_file(root + "/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "500000000\n");
  write_file(root + "/sys/fs/cgroup/memory/job/memory.usage_in_bytes", "100000000\n");
  EXPECT_EQ(ddp::host_memory_available(root).available_bytes, 400000000u);

  EXPECT_THROW(ddp::host_memory_available("/no/such/root"), std::runtime_error);
  EXPECT_GT(ddp::host_memory_available().available_bytes, 0u);  // this machine's
}

TEST(MemoryCheck, BatchThatCannotFitIsRefusedWithTheNumbers) {
  const ddp::HostMemory memory{8000000000ull, "MemAvailable in /proc/meminfo"};
  EXPECT_NO_THROW(ddp::require_batch_fits("--batch-size 64", 64, 1000000, 2, memory));
  const std::string message = error_of(
      [&] { ddp::require_batch_fits("--batch-size 1000000000", 1000000000, 500000, 2, memory); });
  EXPECT_HAS(message,
             "--batch-size 1000000000 cannot fit in memory: a training step needs at "
             "least 1.0 PB (2 rank(s) on this node x 1000000000 samples x 500.0 KB");
  EXPECT_HAS(message,
             "but 8.0 GB is available (MemAvailable in /proc/meminfo); at most about "
             "8000 samples per rank fit");
}

TEST(MemoryCheck, ProbeMeasuresWhatForwardKeepsAndChangesNothing) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)),
                            torch::nn::ReLU(), torch::nn::Dropout(0.5), torch::nn::Flatten(),
                            torch::nn::Linear(32 * 26 * 26, 10));
  net->train();
  const torch::Tensor before = net->parameters()[0].clone();
  const torch::Tensor rng = torch::globalContext().defaultGenerator(torch::kCPU).get_state();
  const uint64_t per_sample = ddp::training_bytes_per_sample(
      *net, [&](const torch::Tensor& x) { return net->forward(x); }, {1, 28, 28});
  // At least the pixels (5 bytes each) and the conv output kept for backward (32x26x26 floats).
  EXPECT_GE(per_sample, 784u * 5 + 32u * 26 * 26 * 4);
  EXPECT_LT(per_sample, 10000000u);
  EXPECT_TRUE(net->is_training());
  EXPECT_TRUE(torch::equal(net->parameters()[0], before));
  EXPECT_TRUE(torch::equal(torch::globalContext().defaultGenerator(torch::kCPU).get_state(), rng));
}

}  // namespace
