// Launcher detection and launch checks (launcher.h) on the environments real launchers leave.
// The Slurm and Open MPI environments are trimmed copies of what srun (Slurm 22.05, two nodes,
// two tasks each) and mpirun (Open MPI 4.1) set on the project's test machine.
#include "runtime/launcher.h"
#include "util/environment.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace {

using ddp_test::contains;

using ddp::Environment;
using ddp::Launcher;

// Task 3 of `srun -N 2 --ntasks-per-node 2 --gpus-per-node 2` (job 12), MpiDefault=pmix.
Environment srun_task3() {
  return {{"SLURM_JOB_ID", "12"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "3"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURMD_NODENAME", "n2"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_STEP_NUM_TASKS", "4"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_MPI_TYPE", "pmix"},
          {"PMIX_RANK", "3"},
          {"SLURM_GPUS_ON_NODE", "2"},
          {"SLURM_STEP_GPUS", "0,1"},
          {"CUDA_VISIBLE_DEVICES", "0,1"}};
}

TEST(DetectLaunch, SrunWithPmix) {
  const ddp::LaunchInfo info = ddp::detect_launch(srun_task3());
  EXPECT_EQ(info.launcher, Launcher::Slurm);
  EXPECT_EQ(info.description, "Slurm srun (PMIx), job 12");
  EXPECT_EQ(info.slurm_mpi, "pmix");
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 2);
  EXPECT_EQ(info.node_index, 1);
  EXPECT_EQ(info.slurm_node, "n2");
  EXPECT_TRUE(info.slurm_step);
}

TEST(DetectLaunch, UnevenSlurmTasksPerNode) {
  Environment env = srun_task3();
  env["SLURM_STEP_TASKS_PER_NODE"] = "3,1(x2)";  // node 1 has one task
  EXPECT_EQ(ddp::detect_launch(env).local_size, 1);
  env["SLURM_NODEID"] = "0";
  EXPECT_EQ(ddp::detect_launch(env).local_size, 3);
  env["SLURM_STEP_TASKS_PER_NODE"] = "garbage";
  EXPECT_EQ(ddp::detect_launch(env).local_size, -1);
}

TEST(DetectLaunch, SrunWithoutPmixIsAnErrorBeforeMpiInitForOpenMpi) {
  Environment env = srun_task3();
  env.erase("SLURM_MPI_TYPE");  // what srun --mpi=none leaves
  env.erase("PMIX_RANK");
  const ddp::LaunchInfo info = ddp::detect_launch(env);
  EXPECT_EQ(info.slurm_mpi, "none");
  EXPECT_EQ(info.description, "Slurm srun without PMI (--mpi=none), job 12");
  const std::string error = ddp::launch_error_before_mpi_init(info, /*open_mpi=*/true);
  EXPECT_TRUE(contains(error, "srun started this step (4 tasks) without PMIx")) << error;
  EXPECT_TRUE(contains(error, "srun --mpi=pmix")) << error;
  // MPICH on Slurm's PMI-1 library works with --mpi=none: no error before MPI_Init...
  EXPECT_EQ(ddp::launch_error_before_mpi_init(info, /*open_mpi=*/false), "");
  // ...but if MPI then sees a world of 1 in each task, that is the mistake.
  const std::string after = ddp::launch_error(info, 1);
  EXPECT_TRUE(contains(after, "started 4 processes but MPI sees a world of 1")) << after;
  EXPECT_TRUE(contains(after, "srun --mpi=pmix")) << after;
  EXPECT_EQ(ddp::launch_error(info, 4), "");
}

TEST(DetectLaunch, SrunWithPmixPassesTheChecks) {
  const ddp::LaunchInfo info = ddp::detect_launch(srun_task3());
  EXPECT_EQ(ddp::launch_error_before_mpi_init(info, true), "");
  EXPECT_EQ(ddp::launch_error(info, 4), "");
}

TEST(DetectLaunch, SrunWithPmi2) {
  Environment env = srun_task3();
  env["SLURM_MPI_TYPE"] = "pmi2";
  env.erase("PMIX_RANK");
  env["PMI_FD"] = "5";
  const ddp::LaunchInfo info = ddp::detect_launch(env);
  EXPECT_EQ(info.slurm_mpi, "pmi2");
  EXPECT_EQ(ddp::launch_error_before_mpi_init(info, true), "");  // Open MPI built with PMI-2
}

TEST(DetectLaunch, OpenMpiMpirunEvenInsideASlurmJob) {
  Environment env = {{"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_RANK", "2"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"PMIX_RANK", "2"}};
  ddp::LaunchInfo info = ddp::detect_launch(env);
  EXPECT_EQ(info.launcher, Launcher::OpenMpi);
  EXPECT_EQ(info.description, "Open MPI mpirun");
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 2);
  // mpirun in a batch script starts its daemons with srun: the ranks inherit a step.
  env["SLURM_JOB_ID"] = "7";
  env["SLURM_STEP_ID"] = "0";
  info = ddp::detect_launch(env);
  EXPECT_EQ(info.launcher, Launcher::OpenMpi);
  EXPECT_EQ(info.description, "Open MPI mpirun, in Slurm job 7");
  EXPECT_EQ(ddp::launch_error_before_mpi_init(info, true), "");
}

TEST(DetectLaunch, ALauncherOfAnotherMpiGivesWorldsOfOne) {
  // MPICH's Hydra, from its documentation (there is no MPICH on the test machine).
  const Environment hydra = {{"PMI_RANK", "1"},
                             {"PMI_SIZE", "4"},
                             {"PMI_FD", "6"},
                             {"MPI_LOCALRANKID", "1"},
                             {"MPI_LOCALNRANKS", "4"}};
  const ddp::LaunchInfo info = ddp::detect_launch(hydra);
  EXPECT_EQ(info.launcher, Launcher::Hydra);
  EXPECT_EQ(info.description, "MPICH mpiexec (Hydra)");
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_size, 4);
  const std::string error = ddp::launch_error(info, 1);
  EXPECT_TRUE(contains(error, "another MPI library than this launcher's")) << error;
  EXPECT_EQ(ddp::launch_error(info, 4), "");
}

TEST(DetectLaunch, SingletonAndTorchrunVariables) {
  ddp::LaunchInfo info = ddp::detect_launch({{"HOME", "/root"}});
  EXPECT_EQ(info.launcher, Launcher::Singleton);
  EXPECT_EQ(info.description, "singleton (no launcher)");
  EXPECT_EQ(ddp::launch_error(info, 1), "");

  info = ddp::detect_launch(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "localhost"}});
  const std::string error = ddp::launch_error(info, 1);
  EXPECT_TRUE(contains(error, "RANK=1 and WORLD_SIZE=4 are set (torchrun's variables)")) << error;
  EXPECT_TRUE(contains(error, "mpirun -np 4 <program>")) << error;
  EXPECT_TRUE(contains(error, "launch/ddprun -n 4")) << error;
  // Under a real MPI launcher the same variables are harmless.
  info = ddp::detect_launch({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(ddp::launch_error(info, 4), "");
  // WORLD_SIZE=1 trains alone on purpose.
  info = ddp::detect_launch({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(ddp::launch_error(info, 1), "");
}

TEST(DetectLaunch, BatchScriptWithoutSrun) {
  const Environment batch = {{"SLURM_JOB_ID", "9"},
                             {"SLURM_NTASKS", "4"},
                             {"SLURM_PROCID", "0"},
                             {"SLURMD_NODENAME", "n1"}};
  const ddp::LaunchInfo info = ddp::detect_launch(batch);
  EXPECT_EQ(info.launcher, Launcher::Singleton);
  EXPECT_EQ(info.description, "singleton in Slurm job 9 (outside srun)");
  const std::string error = ddp::launch_error(info, 1);
  EXPECT_TRUE(contains(error, "Slurm job 9 has 4 tasks but this program runs once")) << error;
  EXPECT_TRUE(contains(error, "srun --mpi=pmix <program>")) << error;
  // A one-task job may run the program directly.
  EXPECT_EQ(
      ddp::launch_error(ddp::detect_launch({{"SLURM_JOB_ID", "9"}, {"SLURM_NTASKS", "1"}}), 1), "");
}

TEST(GpusOnNode, SlurmFirstThenTheDeviceLists) {
  EXPECT_EQ(ddp::gpus_on_node(srun_task3()), 2);
  EXPECT_EQ(ddp::gpus_on_node({{"SLURM_STEP_GPUS", "0,1,2"}}), 3);
  EXPECT_EQ(ddp::gpus_on_node({{"CUDA_VISIBLE_DEVICES", "3"}}), 1);
  EXPECT_EQ(ddp::gpus_on_node({{"CUDA_VISIBLE_DEVICES", ""}}), 0);
  EXPECT_EQ(ddp::gpus_on_node({{"CUDA_VISIBLE_DEVICES", "NoDevFiles"}}), 0);
  EXPECT_EQ(ddp::gpus_on_node({}), -1);
}

TEST(GpuRankMismatch, OneTaskPerNodeUsesOneGpuAndSaysHowToUseAll) {
  // srun -N 2 --gpus-per-node 2 without --ntasks-per-node: one task per node, which uses one of
  // the GPUs it sees; the notice says how many, and to start one task per GPU.
  const std::string warning = ddp::gpu_rank_mismatch(2, 1, "n1", /*cuda_usable=*/false);
  EXPECT_TRUE(contains(warning, "node n1 has 2 GPUs but 1 rank, and ddp runs one rank per GPU"))
      << warning;
  EXPECT_TRUE(contains(warning, "each rank uses one GPU, so 1 GPU sits idle")) << warning;
  EXPECT_TRUE(contains(warning, "To use all 2, start one task per GPU")) << warning;
  EXPECT_TRUE(contains(warning, "srun --ntasks-per-node=2")) << warning;
  EXPECT_TRUE(contains(warning, "mpirun -np <GPUs of the job> --npernode 2")) << warning;
  EXPECT_TRUE(contains(warning, "the ranks train on the CPU")) << warning;
  EXPECT_TRUE(contains(ddp::gpu_rank_mismatch(8, 2, "n1", true), "so 6 GPUs sit idle"));
  EXPECT_FALSE(contains(ddp::gpu_rank_mismatch(2, 1, "n1", true), "CPU"));
  const std::string sharing = ddp::gpu_rank_mismatch(1, 2, "n2", false);
  EXPECT_TRUE(contains(sharing, "ranks would share GPUs")) << sharing;
}

TEST(GpuRankMismatch, SilentWhenTheyPairUpOrThereAreNoGpus) {
  EXPECT_EQ(ddp::gpu_rank_mismatch(2, 2, "n1", false), "");
  EXPECT_EQ(ddp::gpu_rank_mismatch(0, 4, "n1", false), "");
  EXPECT_EQ(ddp::gpu_rank_mismatch(-1, 4, "n1", false), "");
}

TEST(ChooseThreads, UserSettingWins) {
  const ddp::ThreadChoice c = ddp::choose_threads(
      {{"OMP_NUM_THREADS", "3"}, {"SLURM_JOB_ID", "1"}, {"SLURM_CPUS_PER_TASK", "8"}}, 16, 1);
  EXPECT_EQ(c.threads, 3);
  EXPECT_TRUE(c.from_user);
  EXPECT_EQ(c.reason, "OMP_NUM_THREADS=3");
  EXPECT_EQ(ddp::choose_threads({{"OMP_NUM_THREADS", "4,2"}}, 16, 1).threads, 4);  // nested list
}

TEST(ChooseThreads, SlurmCpusPerTaskInsideAJob) {
  const ddp::ThreadChoice c =
      ddp::choose_threads({{"SLURM_JOB_ID", "1"}, {"SLURM_CPUS_PER_TASK", "8"}}, 64, 8);
  EXPECT_EQ(c.threads, 8);
  EXPECT_FALSE(c.from_user);
  EXPECT_EQ(c.reason, "SLURM_CPUS_PER_TASK=8");
  // A leftover variable outside any job does not count.
  EXPECT_EQ(ddp::choose_threads({{"SLURM_CPUS_PER_TASK", "8"}}, 4, 1).threads, 4);
}

TEST(ChooseThreads, CpusetDividedByTheRanksSharingIt) {
  ddp::ThreadChoice c = ddp::choose_threads({}, 16, 4);  // unbound: 4 ranks share 16 CPUs
  EXPECT_EQ(c.threads, 4);
  EXPECT_EQ(c.reason, "16 CPUs shared by 4 ranks");
  c = ddp::choose_threads({}, 2, 1);  // bound to 2 cores of its own, or alone on the node
  EXPECT_EQ(c.threads, 2);
  EXPECT_EQ(c.reason, "2 CPUs in this rank's cpuset");
  EXPECT_EQ(ddp::choose_threads({}, 2, 4).threads, 1);  // oversubscribed: never 0
  EXPECT_EQ(ddp::choose_threads({{"OMP_NUM_THREADS", ""}}, 8, 2).threads, 4);  // empty: unset
}

TEST(DescribeJob, BannerNamesLauncherNodesDevicesAndThreads) {
  const ddp::LaunchInfo info = ddp::detect_launch(srun_task3());
  ddp::ThreadChoice threads;
  threads.threads = 1;
  threads.reason = "SLURM_CPUS_PER_TASK=1";
  const std::vector<ddp::RankPlace> ranks = {
      {0, 2, false, 1}, {0, 2, false, 1}, {1, 2, false, 1}, {1, 2, false, 1}};
  EXPECT_EQ(ddp::describe_job(info, ranks, threads),
            "ddp: Slurm srun (PMIx), job 12: 4 ranks on 2 nodes (2 per node), device cpu, "
            "1 thread per rank (SLURM_CPUS_PER_TASK=1)");

  const std::vector<ddp::RankPlace> uneven = {
      {0, 3, true, 2}, {0, 3, true, 2}, {0, 3, true, 2}, {1, 1, true, 4}};
  threads.threads = 2;
  threads.reason = "8 CPUs shared by 3 ranks";
  EXPECT_EQ(ddp::describe_job(ddp::detect_launch({}), uneven, threads),
            "ddp: singleton (no launcher): 4 ranks on 2 nodes (3+1), one GPU per rank, 2-4 "
            "threads per rank (rank 0: 8 CPUs shared by 3 ranks)");
}

TEST(DescribeJob, OneTaskPerNodeIsOneRankPerNode) {
  // srun -N 2 --gpus-per-node 2: one task per node, each on one of its node's GPUs (the notice
  // of gpu_rank_mismatch says the other sits idle).
  ddp::ThreadChoice threads;
  threads.threads = 8;
  threads.reason = "8 CPUs in this rank's cpuset";
  const std::vector<ddp::RankPlace> two_nodes = {{0, 1, true, 8}, {1, 1, true, 8}};
  EXPECT_EQ(ddp::describe_job(ddp::detect_launch(srun_task3()), two_nodes, threads),
            "ddp: Slurm srun (PMIx), job 12: 2 ranks on 2 nodes (1 per node), one GPU per rank, "
            "8 threads per rank (8 CPUs in this rank's cpuset)");
}

}  // namespace

TEST(YieldWhenIdle, OnlyWhenTheCommunicationThreadsOversubscribeTheNode) {
  const ddp::Environment one_thread{{"OMP_NUM_THREADS", "1"}};
  EXPECT_TRUE(ddp::yield_when_idle(one_thread, 2, 2));    // 2 ranks x 2 threads on 2 cores
  EXPECT_FALSE(ddp::yield_when_idle(one_thread, 1, 2));   // a core for each thread
  EXPECT_FALSE(ddp::yield_when_idle(one_thread, -1, 2));  // unknown local size: one rank
  EXPECT_TRUE(ddp::yield_when_idle({}, 1, 8));            // 8 intra-op threads fill the cores
  const ddp::Environment slurm{{"SLURM_JOB_ID", "7"}, {"SLURM_CPUS_PER_TASK", "4"}};
  EXPECT_FALSE(ddp::yield_when_idle(slurm, 2, 16));  // 2 x (4 + 1) of 16
  EXPECT_TRUE(ddp::yield_when_idle(slurm, 4, 16));   // 4 x (4 + 1) of 16
}

TEST(KeepFreedMemory, UnlessTheUserTunesMalloc) {
  EXPECT_TRUE(ddp::keep_freed_memory({}));
  EXPECT_TRUE(ddp::keep_freed_memory({{"GLIBC_TUNABLES", "glibc.rtld.nns=2"}}));
  EXPECT_TRUE(ddp::keep_freed_memory({{"MY_MALLOC_", "1"}}));
  EXPECT_FALSE(ddp::keep_freed_memory(
      {{"GLIBC_TUNABLES", "glibc.rtld.nns=2:glibc.malloc.trim_threshold=0"}}));
  EXPECT_FALSE(ddp::keep_freed_memory({{"MALLOC_TRIM_THRESHOLD_", "0"}}));
  EXPECT_FALSE(ddp::keep_freed_memory({{"MALLOC_ARENA_MAX", "2"}}));
}

namespace {

// The table of every DDP_* variable the core reads (util/environment.h).
constexpr int kSettings = static_cast<int>(ddp::Setting::StartupTimeout) + 1;

std::string setting_error(const ddp::Environment& env, ddp::Setting setting) {
  try {
    if (ddp::setting_info(setting).kind == ddp::SettingInfo::Kind::Choice) {
      ddp::read_text(env, setting);
    } else {
      ddp::read_number(env, setting);
    }
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Settings, OneRowPerVariableInTheOrderOfTheEnum) {
  for (int i = 0; i < kSettings; ++i) {
    const ddp::SettingInfo& info = ddp::setting_info(static_cast<ddp::Setting>(i));
    EXPECT_EQ(static_cast<int>(info.setting), i);
    EXPECT_EQ(std::string(info.name).rfind("DDP_", 0), 0u) << info.name;
    EXPECT_NE(std::string(info.meaning), "") << info.name;
    // Tests reach the library through util/testing_hooks.h, not through a user's environment.
    EXPECT_EQ(std::string(info.name).find("TEST"), std::string::npos) << info.name;
  }
  EXPECT_STREQ(ddp::setting_info(ddp::Setting::StartupTimeout).name, "DDP_STARTUP_TIMEOUT_SECONDS");
}

TEST(Settings, ABadValueNamesTheVariable) {
  using Kind = ddp::SettingInfo::Kind;
  int checked = 0;
  for (int i = 0; i < kSettings; ++i) {
    const ddp::SettingInfo& info = ddp::setting_info(static_cast<ddp::Setting>(i));
    if (info.kind == Kind::Flag || info.kind == Kind::Text) continue;
    for (const char* bad : {"ten", "-5", "1.5", " 5", "+5", "12345678901", "DETAIL|OFF"}) {
      const std::string message = setting_error({{info.name, bad}}, info.setting);
      EXPECT_EQ(message.rfind(std::string(info.name) + "='" + bad + "'", 0), 0u) << message;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9 * 7);  // every variable with a range
  EXPECT_EQ(setting_error({{"DDP_MPI_SPIN_US", "1000001"}}, ddp::Setting::MpiSpin),
            "DDP_MPI_SPIN_US='1000001': expected an integer from 0 to 1000000");
  EXPECT_EQ(setting_error({{"DDP_MPI_SOCKET_KIB", "1073741825"}}, ddp::Setting::SocketThreshold),
            "DDP_MPI_SOCKET_KIB='1073741825': expected an integer from 0 to 1073741824");
  EXPECT_EQ(setting_error({{"DDP_TIMEOUT_SECONDS", "0"}}, ddp::Setting::Timeout),
            "DDP_TIMEOUT_SECONDS='0' is not a positive whole number of seconds");
  EXPECT_EQ(setting_error({{"DDP_STARTUP_TIMEOUT_SECONDS", "0"}}, ddp::Setting::StartupTimeout),
            "DDP_STARTUP_TIMEOUT_SECONDS='0' is not a positive whole number of seconds");
  EXPECT_EQ(ddp::startup_timeout_seconds({}), 600);
  EXPECT_EQ(ddp::startup_timeout_seconds({{"DDP_STARTUP_TIMEOUT_SECONDS", "30"}}), 30);
  EXPECT_EQ(setting_error({{"DDP_DEBUG", "INFO"}}, ddp::Setting::Debug),
            "DDP_DEBUG='INFO': expected DETAIL (check that every rank calls the same collectives) "
            "or OFF");
}

TEST(Settings, UnsetOrEmptyIsTheDefaultAndGoodValuesPass) {
  EXPECT_EQ(ddp::read_number({}, ddp::Setting::MpiSpin), std::nullopt);
  EXPECT_EQ(ddp::read_number({{"DDP_MPI_SPIN_US", ""}}, ddp::Setting::MpiSpin), std::nullopt);
  EXPECT_EQ(ddp::read_number({{"DDP_MPI_SPIN_US", "0"}}, ddp::Setting::MpiSpin), 0);
  EXPECT_EQ(ddp::read_number({{"DDP_MPI_MAX_SLEEP_US", "1000000"}}, ddp::Setting::MpiMaxSleep),
            1000000);
  EXPECT_EQ(ddp::read_number({{"DDP_MPI_SOCKET_KIB", "1073741824"}}, ddp::Setting::SocketThreshold),
            1073741824);
  EXPECT_EQ(ddp::read_number({{"DDP_NCCL_TIMEOUT_SECONDS", "30"}}, ddp::Setting::NcclTimeout), 30);
  EXPECT_EQ(ddp::read_text({{"DDP_MPI_SOCKETS", "never"}}, ddp::Setting::Sockets), "never");
  EXPECT_EQ(ddp::read_text({{"DDP_SOCKET_IFNAME", "eth0,lo"}}, ddp::Setting::SocketInterfaces),
            "eth0,lo");
  EXPECT_EQ(ddp::read_text({{"DDP_SOCKET_IFNAME", ""}}, ddp::Setting::SocketInterfaces),
            std::nullopt);
  for (const char* off : {"", "0"}) {
    EXPECT_FALSE(ddp::read_flag({{"DDP_SKIP_LAUNCH_CHECKS", off}}, ddp::Setting::SkipLaunchChecks));
  }
  EXPECT_FALSE(ddp::read_flag({}, ddp::Setting::SkipLaunchChecks));
  EXPECT_TRUE(ddp::read_flag({{"DDP_SKIP_LAUNCH_CHECKS", "1"}}, ddp::Setting::SkipLaunchChecks));
  EXPECT_TRUE(ddp::read_flag({{"DDP_SKIP_LAUNCH_CHECKS", "yes"}}, ddp::Setting::SkipLaunchChecks));
  // Reading a variable as another kind than its row says is a bug in ddp, not a user's error.
  EXPECT_THROW(ddp::read_number({}, ddp::Setting::Debug), std::logic_error);
}

}  // namespace
