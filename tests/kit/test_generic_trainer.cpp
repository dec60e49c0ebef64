// The Trainer with a task of one's own (task.h, issue 13): a regression with a two-input model and
// a struct batch, trained at 1, 2 and 4 ranks, equals one process stepping on the global batch;
// the task's metric sums are reduced over ranks (sums known in advance); a run stopped inside an
// epoch (a signal raised from the after_step testing hook) and resumed gives the uninterrupted
// run's model and metrics bit for bit; the same task reading its batches through LibTorch's
// DataLoader with worker threads trains the same model, and stops and resumes the same way; a task
// that breaks the metric contract is refused naming what is wrong.
#include <ddp/distributed_sampler.h>
#include <ddp/train/data_source.h>
#include <ddp/train/task.h>
#include <ddp/train/trainer.h>
#include <ddp/stop_signal.h>

#include "after_step_hook.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <csignal>
#include <cstdlib>
#include <fstream>

namespace test_generic_trainer {

ddp::Runtime& rt() { return ddp_test::runtime(); }
ddp::ProcessGroup& pg() { return ddp_test::group(); }

// Divisible by 1, 2 and 4 ranks x batch 4 x accumulate 2: every step has the same sample count,
// so the mean of the ranks' means is the global batch's mean.
constexpr int64_t kSamples = 96;
constexpr int64_t kBatch = 4;
constexpr int64_t kAccumulate = 2;

// Two inputs, one target: y = <a, x1> - <b, x2> + noise.
struct Sample {
  torch::Tensor x1, x2, y, index;
};

Sample make_data(int64_t n, int64_t seed) {
  torch::manual_seed(seed);
  Sample d;
  d.x1 = torch::randn({n, 3});
  d.x2 = torch::randn({n, 2});
  d.y = (d.x1 * torch::tensor({0.5, -1.0, 2.0})).sum(1, true) -
        (d.x2 * torch::tensor({1.5, 0.25})).sum(1, true) + 0.1 * torch::randn({n, 1});
  d.index = torch::arange(n, torch::kLong);
  return d;
}

struct TwoInputNet : torch::nn::Module {
  TwoInputNet()
      : a(register_module("a", torch::nn::Linear(3, 6))),
        b(register_module("b", torch::nn::Linear(2, 6))),
        out(register_module("out", torch::nn::Linear(6, 1))) {}
  torch::Tensor forward(const torch::Tensor& x1, const torch::Tensor& x2) {
    return out(torch::tanh(a(x1) + b(x2)));
  }
  torch::nn::Linear a, b, out;
};

std::shared_ptr<TwoInputNet> make_net() {
  torch::manual_seed(3);
  return std::make_shared<TwoInputNet>();
}

// MSE regression; train metrics: the absolute error, the sample indices (sum known: every sample
// once per epoch) and the rank + 1 per sample (sum known: each rank's shard size x its rank + 1).
class Regression : public ddp::Task<Sample> {
 public:
  Regression(std::shared_ptr<TwoInputNet> net, const Sample& train, const Sample& test, int rank)
      : net_(std::move(net)), train_(train), test_(test), rank_(rank) {}
  int64_t train_size() const override { return train_.y.size(0); }
  int64_t test_size() const override { return test_.y.size(0); }
  std::vector<std::string> train_metrics() const override {
    return {"abs_error", "index", "rank_plus_one"};
  }
  std::vector<std::string> test_metrics() const override { return {"abs_error"}; }
  Sample train_batch(const std::vector<int64_t>& indices, torch::Device device) override {
    return pick(train_, indices, device);
  }
  Sample test_batch(const std::vector<int64_t>& indices, torch::Device device) override {
    return pick(test_, indices, device);
  }
  ddp::StepOutput loss(Sample& batch) override {
    const torch::Tensor prediction = net_->forward(batch.x1, batch.x2);
    ddp::StepOutput out;
    out.loss = torch::mse_loss(prediction, batch.y);
    out.samples = batch.y.size(0);
    out.sums = {(prediction - batch.y).abs().sum(), batch.index.sum(),
                torch::tensor(static_cast<double>((rank_ + 1) * out.samples))};
    return out;
  }
  ddp::StepOutput evaluate(Sample& batch) override {
    const torch::Tensor prediction = net_->forward(batch.x1, batch.x2);
    ddp::StepOutput out;
    out.loss = torch::mse_loss(prediction, batch.y);
    out.samples = batch.y.size(0);
    out.sums = {(prediction - batch.y).abs().sum()};
    return out;
  }

 private:
  static Sample pick(const Sample& d, const std::vector<int64_t>& indices, torch::Device device) {
    const torch::Tensor i = torch::tensor(indices, torch::kLong);
    return Sample{d.x1.index_select(0, i).to(device), d.x2.index_select(0, i).to(device),
                  d.y.index_select(0, i).to(device), d.index.index_select(0, i).to(device)};
  }
  std::shared_ptr<TwoInputNet> net_;
  const Sample& train_;
  const Sample& test_;
  int rank_;
};

ddp::TrainerOptions options() {
  ddp::TrainerOptions o;
  o.batch_size = kBatch;
  o.test_batch_size = 7;  // uneven evaluation batches
  o.report.log_interval = 0;
  o.report.progress = ddp::ProgressMode::None;
  o.seed = 11;
  o.accumulate = kAccumulate;
  return o;
}

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

torch::optim::SGD make_sgd(TwoInputNet& net) {
  return torch::optim::SGD(net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
}

TEST(GenericTrainer, RegressionEqualsOneProcessOnTheGlobalBatch) {
  const Sample train = make_data(kSamples, 1), test = make_data(30, 2);
  auto net = make_net();
  ddp::DistributedDataParallel model(pg(), net);
  torch::optim::SGD optimizer = make_sgd(*net);
  Regression task(net, train, test, rt().rank());
  ddp::Trainer trainer(pg(), *net, task, optimizer, options(), &model);
  const int64_t epochs = 2;
  const std::vector<ddp::EpochResult> results = trainer.fit(epochs);
  ASSERT_EQ(results.size(), 2u);

  // One process: each step on the union of every rank's micro-batches of that step.
  auto alone = make_net();
  torch::optim::SGD alone_optimizer = make_sgd(*alone);
  const int world = rt().world_size();
  double last_loss_sum = 0;
  for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
    std::vector<std::vector<int64_t>> shards;
    for (int r = 0; r < world; ++r) {
      ddp::DistributedSampler sampler(kSamples, world, r, true, options().seed);
      sampler.set_epoch(epoch);
      shards.push_back(sampler.indices());
    }
    const int64_t per_step = kBatch * kAccumulate;
    const int64_t shard = kSamples / world;
    last_loss_sum = 0;
    for (int64_t begin = 0; begin < shard; begin += per_step) {
      std::vector<int64_t> global;
      for (const auto& s : shards)
        global.insert(global.end(), s.begin() + begin, s.begin() + begin + per_step);
      const torch::Tensor i = torch::tensor(global, torch::kLong);
      alone_optimizer.zero_grad();
      const torch::Tensor loss =
          torch::mse_loss(alone->forward(train.x1.index_select(0, i), train.x2.index_select(0, i)),
                          train.y.index_select(0, i));
      loss.backward();
      alone_optimizer.step();
      last_loss_sum += loss.item<double>() * static_cast<double>(global.size());
    }
  }
  EXPECT_TRUE(torch::allclose(flat(*net), flat(*alone), 1e-4, 1e-6))
      << "max difference " << (flat(*net) - flat(*alone)).abs().max().item<double>();
  EXPECT_NEAR(results[1].train_loss, last_loss_sum / kSamples, 1e-5);
  EXPECT_EQ(results[1].samples, kSamples);
  EXPECT_TRUE(ddp_test::identical_on_all_ranks(flat(*net)));

  // Evaluation over all ranks equals one process's over the whole test set.
  torch::NoGradGuard no_grad;
  const torch::Tensor prediction = alone->forward(test.x1, test.x2);
  ASSERT_TRUE(results[1].test_loss.has_value());
  EXPECT_NEAR(*results[1].test_loss, torch::mse_loss(prediction, test.y).item<double>(), 1e-5);
  ASSERT_EQ(results[1].test_metrics.size(), 1u);
  EXPECT_EQ(results[1].test_metrics[0].samples, 30);
  EXPECT_NEAR(results[1].test_metrics[0].sum, (prediction - test.y).abs().sum().item<double>(),
              1e-4);
}

TEST(GenericTrainer, MetricSumsAreReducedOverRanksAndWritten) {
  const Sample train = make_data(kSamples, 1), test = make_data(30, 2);
  auto net = make_net();
  ddp::DistributedDataParallel model(pg(), net);
  torch::optim::SGD optimizer = make_sgd(*net);
  Regression task(net, train, test, rt().rank());
  // Every rank names rank 0's file; rank 0 writes it.
  const std::string dir = ddp::all_gather_strings(
      pg().cpu(), rt().is_main() ? ddp_test::make_temp_dir("generic_metrics") : std::string())[0];
  ddp::TrainerOptions o = options();
  o.report.metrics_file = dir + "/metrics.jsonl";
  ddp::Trainer trainer(pg(), *net, task, optimizer, o, &model);
  const std::vector<ddp::EpochResult> results = trainer.fit(2);
  ASSERT_EQ(results.size(), 2u);

  const int world = rt().world_size();
  double rank_sum = 0;  // each rank's shard is kSamples / world samples
  for (int r = 0; r < world; ++r) rank_sum += (r + 1) * static_cast<double>(kSamples / world);
  for (const ddp::EpochResult& r : results) {
    ASSERT_EQ(r.train_metrics.size(), 3u);
    EXPECT_EQ(r.train_metrics[0].name, "abs_error");
    EXPECT_GT(r.train_metrics[0].sum, 0);
    EXPECT_EQ(r.train_metrics[1].name, "index");
    EXPECT_EQ(r.train_metrics[1].sum, kSamples * (kSamples - 1) / 2);  // every sample once
    EXPECT_EQ(r.train_metrics[1].samples, kSamples);
    EXPECT_EQ(r.train_metrics[2].sum, rank_sum);
  }
  if (!rt().is_main()) return;
  std::ifstream in(o.report.metrics_file);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    const auto json = nlohmann::ordered_json::parse(line);
    ++lines;
    EXPECT_EQ(json["epoch"].get<int64_t>(), lines);
    EXPECT_DOUBLE_EQ(json["train_index"].get<double>(), (kSamples - 1) / 2.0);  // the mean
    EXPECT_DOUBLE_EQ(json["train_rank_plus_one"].get<double>(), rank_sum / kSamples);
    EXPECT_TRUE(json.contains("train_abs_error"));
    EXPECT_TRUE(json.contains("test_loss"));
    EXPECT_TRUE(json.contains("test_abs_error"));
    EXPECT_FALSE(json.contains("test_accuracy"));
    // The keys in order: the train set's, the test set's, then the timings.
    std::vector<std::string> keys;
    for (const auto& item : json.items()) keys.push_back(item.key());
    ASSERT_GE(keys.size(), 8u);
    EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 8),
              (std::vector<std::string>{"epoch", "train_loss", "train_abs_error", "train_index",
                                        "train_rank_plus_one", "test_loss", "test_abs_error",
                                        "samples_per_sec"}));
  }
  EXPECT_EQ(lines, 2);
}

// The same rows as a torch::data dataset, for LibTorch's DataLoader: a batch is the rows of the
// indices the sampler hands the loader, as Regression::train_batch gathers them.
class Rows : public torch::data::datasets::BatchDataset<Rows, Sample, std::vector<size_t>> {
 public:
  explicit Rows(const Sample& data) : data_(data) {}
  Sample get_batch(std::vector<size_t> request) override {
    const torch::Tensor i =
        torch::tensor(std::vector<int64_t>(request.begin(), request.end()), torch::kLong);
    return Sample{data_.x1.index_select(0, i), data_.x2.index_select(0, i),
                  data_.y.index_select(0, i), data_.index.index_select(0, i)};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(data_.y.size(0)); }

 private:
  Sample data_;  // tensors: copies share the storage, as each worker's copy of the dataset does
};

// Regression whose training batches come from a DataLoader with 2 worker threads.
class LoaderRegression : public Regression {
 public:
  LoaderRegression(std::shared_ptr<TwoInputNet> net, const Sample& train, const Sample& test,
                   int rank)
      : Regression(std::move(net), train, test, rank), rows_(train) {}
  std::unique_ptr<ddp::DataSource<Sample>> train_source() override {
    return std::make_unique<ddp::DataLoaderSource<Rows>>(rows_, /*workers=*/2);
  }

 private:
  Rows rows_;
};

template <typename TaskType>
struct TrainingRun {
  std::shared_ptr<TwoInputNet> net = make_net();
  ddp::DistributedDataParallel model{pg(), net};
  torch::optim::SGD optimizer = make_sgd(*net);
  TaskType task;
  TrainingRun(const Sample& train, const Sample& test) : task(net, train, test, rt().rank()) {}
};

// Trains one epoch as `TaskType` reads its batches: uninterrupted; then stopped by SIGUSR1 on the
// last rank right after optimizer step 2 (raised from the after_step testing hook) and resumed from
// the snapshot the stop wrote. Both must equal `reference` (the index-gathering task's
// uninterrupted run) bit for bit: the model, the loss, every metric sum.
template <typename TaskType>
void expect_stop_and_resume_bit_identical(const std::string& name, const Sample& train,
                                          const Sample& test,
                                          const torch::Tensor& reference_weights,
                                          const ddp::EpochResult& reference) {
  SCOPED_TRACE(name);
  auto expect_same = [&](TrainingRun<TaskType>& run, const std::vector<ddp::EpochResult>& results) {
    ASSERT_EQ(results.size(), 1u);
    EXPECT_TRUE(torch::equal(flat(*run.net), reference_weights));
    EXPECT_EQ(results[0].train_loss, reference.train_loss);
    ASSERT_EQ(results[0].train_metrics.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(results[0].train_metrics[i].sum, reference.train_metrics[i].sum)
          << results[0].train_metrics[i].name;
    }
    EXPECT_EQ(*results[0].test_loss, *reference.test_loss);
  };
  {
    TrainingRun<TaskType> whole(train, test);
    ddp::Trainer trainer(pg(), *whole.net, whole.task, whole.optimizer, options(), &whole.model);
    expect_same(whole, trainer.fit(1));
  }
  const std::string dir = ddp::all_gather_strings(
      pg().cpu(),
      rt().is_main() ? ddp_test::make_temp_dir("generic_resume_" + name) : std::string())[0];
  ddp::TrainerOptions o = options();
  o.checkpoint.dir = dir;
  std::string snapshot;
  {
    TrainingRun<TaskType> stopped(train, test);
    const int last = rt().world_size() - 1;
    int64_t steps_seen = 0;
    ddp_test::AfterStep hook([&](int64_t step, int rank) {
      steps_seen = step;
      if (step == 1 && rank == last) std::raise(SIGUSR1);  // agreed at the boundary after step 2
    });
    ddp::Trainer trainer(pg(), *stopped.net, stopped.task, stopped.optimizer, o, &stopped.model);
    EXPECT_TRUE(trainer.fit(1).empty());
    EXPECT_EQ(trainer.stopped_by(), SIGUSR1);
    EXPECT_EQ(steps_seen, 2) << "every rank stops before step 3";
    EXPECT_EQ(trainer.global_step(), 2);
    snapshot = trainer.stop_snapshot();
    // Step 2 ends with batch 4 (accumulate 2): the snapshot is before batch 4 of epoch 1.
    EXPECT_EQ(snapshot, ddp::snapshot_path(dir, 1, 4));
  }
  ddp::clear_stop_signal();
  TrainingRun<TaskType> resumed(train, test);
  o.checkpoint.resume = snapshot;
  ddp::Trainer trainer(pg(), *resumed.net, resumed.task, resumed.optimizer, o, &resumed.model);
  expect_same(resumed, trainer.fit(1));
}

TEST(GenericTrainer, StoppedInsideAnEpochAndResumedIsBitIdenticalWithEitherDataSource) {
  const Sample train = make_data(kSamples, 1), test = make_data(30, 2);
  TrainingRun<Regression> reference(train, test);
  std::vector<ddp::EpochResult> results;
  {
    ddp::Trainer trainer(pg(), *reference.net, reference.task, reference.optimizer, options(),
                         &reference.model);
    results = trainer.fit(1);
  }
  ASSERT_EQ(results.size(), 1u);
  const torch::Tensor weights = flat(*reference.net).clone();
  expect_stop_and_resume_bit_identical<Regression>("index", train, test, weights, results[0]);
  expect_stop_and_resume_bit_identical<LoaderRegression>("loader", train, test, weights,
                                                         results[0]);
}

// A task that says it has a metric its loss() does not return, or a bad metric name.
class Broken : public Regression {
 public:
  using Regression::Regression;
  std::vector<std::string> names = {"abs_error", "index", "rank_plus_one", "extra"};
  std::vector<std::string> train_metrics() const override { return names; }
};

TEST(GenericTrainer, TaskBreakingTheMetricContractIsRefusedSayingWhy) {
  const Sample train = make_data(kSamples, 1), test = make_data(30, 2);
  auto net = make_net();
  ddp::DistributedDataParallel model(pg(), net);
  torch::optim::SGD optimizer = make_sgd(*net);
  Broken task(net, train, test, rt().rank());
  {
    ddp::Trainer trainer(pg(), *net, task, optimizer, options(), &model);
    try {
      trainer.train_epoch(1);
      ADD_FAILURE() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "the task's loss() returned 3 metric sum(s) for the 4 name(s) of its "
                    "train_metrics()"),
                std::string::npos)
          << e.what();
    }
  }
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"Loss"}, std::vector<std::string>{"a", "a"},
        std::vector<std::string>{""}}) {
    task.names = bad;
    try {
      ddp::Trainer trainer(pg(), *net, task, optimizer, options(), &model);
      ADD_FAILURE() << "no error for " << bad[0];
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("the task's train_metrics() has \"" + bad.back() + "\""),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace test_generic_trainer
