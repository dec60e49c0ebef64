#include <ddp/train/checkpointer.h>

#include <ddp/checkpoint_file.h>
#include <ddp/communicator.h>
#include <ddp/train/divergence.h>

#include "train/directory_lock.h"
#include "train/reached_position.h"
#include "train/snapshot_state.h"
#include "util/clock.h"

#include <c10/util/Type.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <typeinfo>
#include <utility>
#include <vector>

namespace ddp {

namespace {

std::invalid_argument option_error(const std::string& field, const std::string& why) {
  return std::invalid_argument("CheckpointerOptions::" + field + " " + why);
}

// The optimizer's type, and each param group's options as serialised ("lr=0.01, momentum=0.9"),
// read back from the archive so that any optimizer's options are described.
std::string describe_optimizer(const torch::optim::Optimizer& optimizer) {
  std::string text = c10::demangle(typeid(optimizer).name());
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::OutputArchive out;
    groups[g].options().serialize(out);
    std::ostringstream bytes;
    out.save_to(bytes);
    const std::string saved = bytes.str();
    torch::serialize::InputArchive in;
    in.load_from(saved.data(), saved.size());
    std::vector<std::string> keys = in.keys();
    std::sort(keys.begin(), keys.end());
    text += g == 0 ? " (" : "; group " + std::to_string(g) + " (";
    for (size_t k = 0; k < keys.size(); ++k) {
      c10::IValue value;
      std::ostringstream item;  // 6 significant digits: 0.1, not 0.10000000000000001
      if (!in.try_read(keys[k], value)) continue;
      if (value.isDouble()) {
        item << value.toDouble();
      } else if (value.isBool()) {
        item << (value.toBool() ? "true" : "false");
      } else {
        item << value;
      }
      text += (k ? ", " : "") + keys[k] + "=" + item.str();
    }
    text += ")";
  }
  return text;
}

// Whether two runs' settings entry `name` reduce the gradients alike. "none" is one rank without
// a Reducer, where nothing is reduced; the default allreduce is the same arithmetic there (a sum
// over one rank, divided by one), so between the two only the world size differs, which resume()
// names. A stateful or compressing hook against "none" is a change: its arithmetic and its state
// are not used at one rank.
bool same_setting(const std::string& name, const std::string& now, const std::string& saved) {
  if (now == saved) return true;
  if (name != "comm hook") return false;
  return (now == "none" && saved == "allreduce") || (now == "allreduce" && saved == "none");
}

}  // namespace

Checkpointer::Checkpointer(ProcessGroup& group, torch::nn::Module& model,
                           torch::optim::Optimizer& optimizer, CheckpointerOptions options,
                           TrainingExtras extras)
    : Checkpointer(group, SnapshotParts{{{"", &model}}, {{"", &optimizer}}}, std::move(options),
                   extras) {}

Checkpointer::Checkpointer(ProcessGroup& group, SnapshotParts parts, CheckpointerOptions options,
                           TrainingExtras extras)
    : group_(group), parts_(std::move(parts)), options_(std::move(options)), extras_(extras) {
  check_snapshot_parts(parts_, "Checkpointer");
  for (const auto& [name, optimizer] : parts_.optimizers) {
    optimizer_settings_.emplace_back(name.empty() ? "optimizer" : "optimizer " + name,
                                     describe_optimizer(*optimizer));
  }
  const CheckpointerOptions& o = options_;
  for (const auto& [field, value] :
       {std::pair{"keep", o.keep}, {"batch_size", o.batch_size}, {"every_steps", o.every_steps}}) {
    if (value < 0) throw option_error(field, "must be >= 0 (got " + std::to_string(value) + ")");
  }
  if (o.every_steps > 0 && o.dir.empty()) {
    throw option_error("every_steps", "is " + std::to_string(o.every_steps) +
                                          " but dir is empty: there is nowhere to write");
  }
  if (!(o.every_seconds >= 0) || !std::isfinite(o.every_seconds)) {
    throw option_error("every_seconds",
                       "must be finite and >= 0 (got " + std::to_string(o.every_seconds) + ")");
  }
  if (o.every_seconds > 0 && o.dir.empty()) {
    throw option_error("every_seconds", "is " + std::to_string(o.every_seconds) +
                                            " but dir is empty: there is nowhere to write");
  }
  last_time_ = now();
  if (o.resume == "latest" && o.dir.empty()) {
    throw option_error("resume", "is \"latest\" but dir is empty: there is no directory to search");
  }
  if (!group_.is_main() || o.dir.empty()) return;
  // Now, not after the first epoch: an unwritable directory would waste the epoch.
  std::error_code exists_error;
  created_dir_ = !std::filesystem::exists(o.dir, exists_error) && !exists_error;
  try {
    check_writable_directory(o.dir, "checkpoint directory");
    // One job per directory (directory_lock.h); before the temporaries are removed, which
    // could be another live job's.
    detail::DirectoryLockResult taken = detail::DirectoryLock::take(o.dir);
    lock_ = std::move(taken.lock);
    if (!taken.unsupported.empty())
      std::fprintf(stderr, "Warning: %s\n", taken.unsupported.c_str());
    if (!taken.previous_holder.empty()) {
      std::printf("Took over %s, left by a job that is gone (%s)\n", lock_->path().c_str(),
                  taken.previous_holder.c_str());
    }
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("CheckpointerOptions::dir: " + std::string(e.what()));
  }
  // Temporary files of runs killed mid-write (never those of a live writer).
  for (const std::string& path : remove_stale_temporaries(o.dir)) {
    std::printf("Removed %s, left by an interrupted write of an earlier run\n", path.c_str());
  }
  std::fflush(stdout);
}

Checkpointer::Checkpointer(ProcessGroup& group, DistributedDataParallel& model,
                           torch::optim::Optimizer& optimizer, CheckpointerOptions options,
                           TrainingExtras extras)
    : Checkpointer(group, model.module(), optimizer, std::move(options), extras) {}

Settings Checkpointer::settings() const {
  Settings all = optimizer_settings_;
  for (const detail::SavedWrapper& wrapper : detail::wrappers_of(parts_, "Checkpointer")) {
    all.emplace_back(wrapper.key.empty() ? "comm hook" : "comm hook of " + wrapper.key,
                     wrapper.ddp->comm_hook_description());
  }
  all.insert(all.end(), options_.settings.begin(), options_.settings.end());
  return all;
}

void Checkpointer::say_changed_settings(const TrainingProgress& saved, bool scheduled) const {
  if (!group_.is_main()) return;
  const char* cost =
      "the run goes on, but no longer on the trajectory the snapshot's run would "
      "have followed";
  if (saved.world_size == group_.size() && saved.batch_size > 0 && options_.batch_size > 0 &&
      saved.batch_size != options_.batch_size) {
    std::printf(
        "Warning: the per-rank batch size is %lld, the snapshot's run had %lld: the epoch's "
        "sample order is kept, cut into other batches; %s\n",
        static_cast<long long>(options_.batch_size), static_cast<long long>(saved.batch_size),
        cost);
  }
  const Settings now = settings();
  for (size_t i = 0; i < now.size(); ++i) {
    const auto& [name, value] = now[i];
    const auto found = std::find_if(saved.settings.begin(), saved.settings.end(),
                                    [&](const auto& entry) { return entry.first == name; });
    if (found == saved.settings.end() || same_setting(name, value, found->second)) continue;
    // settings() lists the optimizers' first. Their options come back with their state
    // (Optimizer::load, as PyTorch's load_state_dict): this run's values are not used, but for a
    // rate that this run's schedule sets (read_parts, LRSchedule::load).
    const bool restored = i < optimizer_settings_.size();
    std::printf(
        "Warning: the %s is %s, the snapshot's run had %s: %s%s\n", name.c_str(), value.c_str(),
        found->second.c_str(),
        restored ? "the snapshot's settings are restored with its state, so this run's "
                   "are not used"
                 : cost,
        restored && scheduled ? ", except a learning rate that this run's schedule sets" : "");
  }
}

TrainingProgress Checkpointer::progress_at(int64_t epochs_done, int64_t batches_done, int64_t step,
                                           int64_t samples_done) const {
  TrainingProgress progress;
  progress.epoch = epochs_done;
  progress.batches_done = batches_done;
  progress.global_step = step;
  progress.seed = options_.seed;
  progress.world_size = group_.size();
  progress.batch_size = options_.batch_size;
  progress.samples_done = samples_done;
  progress.settings = settings();
  return progress;
}

ResumePoint Checkpointer::resume(torch::optim::LRScheduler* scheduler) {
  const CheckpointerOptions& o = options_;
  ResumePoint start;
  start.seed = o.seed;
  last_time_ = now();  // the timer counts from the start of training
  // Local, alike on every rank: a hook whose state no snapshot could hold fails now, not at the
  // first save.
  detail::wrappers_of(parts_, "Checkpointer");
  if (o.resume.empty()) return start;
  Communicator& comm = group_.cpu();
  const bool latest = o.resume == "latest";
  // Rank 0 looks for the files and names them; load_snapshot sends each rank the bytes, so only
  // rank 0 needs to see the checkpoint directory.
  std::string names;
  if (group_.is_main()) {
    for (const auto& path : latest ? list_snapshots(o.dir) : std::vector<std::string>{o.resume}) {
      names += path + "\n";
    }
  }
  std::vector<std::string> candidates;
  std::istringstream lines(all_gather_strings(comm, names)[0]);
  for (std::string line; std::getline(lines, line);) candidates.push_back(line);
  if (candidates.empty()) {
    // A first run under a requeue script is the expected case, a mistyped folder the one to
    // catch: the line names the folder and what it holds.
    if (group_.is_main()) {
      int64_t files = 0;
      std::error_code error;
      for (std::filesystem::directory_iterator it(o.dir, error), end; !error && it != end;
           it.increment(error)) {
        const std::string name = it->path().filename().string();
        files += name != detail::kLockFileName && name != detail::kReachedFileName;
      }
      const std::string what = created_dir_ ? "the folder did not exist (created now)"
                               : files == 0 ? "the folder is empty"
                                            : "none of its " + std::to_string(files) +
                                                  " file(s) is a snapshot_epoch*.pt";
      std::printf("No snapshot in %s: %s; training starts from scratch at epoch 1\n", o.dir.c_str(),
                  what.c_str());
      std::fflush(stdout);
    }
    return start;
  }
  for (size_t i = 0;; ++i) {
    const std::string& path = candidates[i];
    TrainingProgress p;
    try {
      p = load_snapshot(path, comm, parts_, scheduler, &start.rank_state, extras_);
    } catch (const std::runtime_error& e) {
      if (!(latest && o.fallback) || i + 1 == candidates.size()) throw;
      if (group_.is_main())
        std::fprintf(stderr, "Warning: %s; trying the previous snapshot\n", e.what());
      continue;
    }
    start.position = TrainingPosition{p.epoch + 1, p.batches_done, p.global_step, p.samples_done};
    start.path = path;
    start.seed = p.seed;
    start.world_size = p.world_size;
    start.batch_size = p.batch_size;
    last_step_ = p.global_step;
    if (group_.is_main()) {
      if (p.batches_done > 0) {
        std::printf("Resumed from %s: epoch %lld done, %lld batches of epoch %lld, step %lld\n",
                    path.c_str(), static_cast<long long>(p.epoch),
                    static_cast<long long>(p.batches_done), static_cast<long long>(p.epoch + 1),
                    static_cast<long long>(p.global_step));
      } else {
        std::printf("Resumed from %s: epoch %lld done, step %lld\n", path.c_str(),
                    static_cast<long long>(p.epoch), static_cast<long long>(p.global_step));
      }
      if (!o.dir.empty()) {
        // A run that died between snapshots (a killed rank, a lost host) left how far it got.
        const auto reached = detail::read_reached(o.dir);
        const std::string lost = reached ? detail::lost_work_line(*reached, p.global_step) : "";
        if (!lost.empty()) std::printf("%s\n", lost.c_str());
      }
      if (p.world_size != group_.size() && p.batches_done > 0) {
        std::printf(
            "Warning: the snapshot was written by %d rank(s), this run has %d: the rest "
            "of epoch %lld (from sample %lld of its order) is re-sharded over the %d "
            "ranks; each rank's random generators and epoch metrics so far are not "
            "restored (they are per rank), so epoch %lld's metrics cover only its rest\n",
            p.world_size, group_.size(), static_cast<long long>(p.epoch + 1),
            static_cast<long long>(p.samples_done), group_.size(),
            static_cast<long long>(p.epoch + 1));
      } else if (p.world_size != group_.size()) {
        std::printf(
            "Warning: the snapshot was written by %d rank(s), this run has %d: the data "
            "order differs from an uninterrupted run, and each rank's random generators "
            "are not restored (they are per rank)\n",
            p.world_size, group_.size());
      }
      say_changed_settings(p, scheduler != nullptr || extras_.lr_schedule != nullptr);
      if (p.seed != o.seed) {
        std::printf(
            "Warning: continuing with the snapshot's seed %lld (not %lld) so the data "
            "order continues as it was\n",
            static_cast<long long>(p.seed), static_cast<long long>(o.seed));
      }
      std::fflush(stdout);
    }
    return start;
  }
}

std::string Checkpointer::at_boundary(bool stopping, const TrainingPosition& at,
                                      const std::function<RankState()>& rank_state, bool time_due) {
  if (group_.is_main() && !options_.dir.empty()) {
    // Opened at the first step, not at construction: resume() reads what the last run left.
    if (!reached_) reached_ = std::make_shared<detail::ReachedRecord>(options_.dir);
    reached_->write({at.epoch, at.batch, at.step, options_.batch_size * group_.size()});
  }
  if (!stopping && !due(at, time_due)) return "";
  return save_step(at, rank_state ? rank_state() : RankState{});
}

bool Checkpointer::due(const TrainingPosition& at, bool time_due) const {
  const int64_t every = options_.every_steps;
  return !options_.dir.empty() && at.step > last_step_ &&
         ((every > 0 && at.step % every == 0) || time_due);
}

std::string Checkpointer::save_step(const TrainingPosition& at, const RankState& rank_state) {
  if (options_.dir.empty()) return "";
  const TrainingProgress progress = progress_at(at.epoch - 1, at.batch, at.step, at.samples);
  const std::string path = snapshot_path(options_.dir, at.epoch, at.batch);
  refuse_nonfinite(path, at.epoch, at.step);
  create_directory();
  timed(false, [&] { save_snapshot(path, group_.cpu(), parts_, progress, rank_state, extras_); });
  if (group_.is_main()) remove_older_step_snapshots(path);
  last_step_ = at.step;
  last_written_ = path;
  return path;
}

void Checkpointer::save_epoch(int64_t epoch, int64_t step) {
  const CheckpointerOptions& o = options_;
  if (o.dir.empty()) return;
  const std::vector<std::string> weights = weights_paths("with_epoch", epoch);
  refuse_nonfinite(weights[0], epoch, step);  // so nothing is rotated out either
  create_directory();
  for (size_t i = 0; i < weights.size() && group_.is_main(); ++i) {
    save_module(*parts_.modules[i].second, weights[i]);
  }
  // samples_done 0: the next epoch starts at its beginning.
  const TrainingProgress progress = progress_at(epoch, 0, step, 0);
  const std::string path = snapshot_path(o.dir, epoch);
  timed(true, [&] { save_snapshot(path, group_.cpu(), parts_, progress, {}, extras_); });
  last_step_ = step;
  last_written_ = path;
  if (!group_.is_main()) return;
  remove_older_step_snapshots(path);
  if (o.keep > 0 && epoch > o.keep) {
    // Only after the new files are complete; removing what is absent is fine.
    std::remove(snapshot_path(o.dir, epoch - o.keep).c_str());
    for (const std::string& old : weights_paths("with_epoch", epoch - o.keep))
      std::remove(old.c_str());
  }
}

std::string Checkpointer::save_unfinished_epoch(const TrainingPosition& at,
                                                const RankState& rank_state) {
  if (options_.dir.empty()) return "";
  const std::vector<std::string> weights = weights_paths("at_step", at.step);
  refuse_nonfinite(weights[0], at.epoch, at.step);
  create_directory();
  for (size_t i = 0; i < weights.size() && group_.is_main(); ++i) {
    save_module(*parts_.modules[i].second, weights[i]);
  }
  return save_step(at, rank_state);
}

bool Checkpointer::time_due() const {
  return options_.every_seconds > 0 && now() - last_time_ >= options_.every_seconds;
}

double Checkpointer::now() const {
  return options_.clock ? options_.clock() : seconds_since(Clock::time_point{});
}

void Checkpointer::timed(bool epoch_end, const std::function<void()>& save) {
  const auto start = Clock::now();
  save();
  const double seconds = seconds_since(start);
  ++cost_.written;
  if (epoch_end) ++cost_.at_epoch_end;
  cost_.seconds += seconds;
  cost_.max_seconds = std::max(cost_.max_seconds, seconds);
  last_time_ = now();  // after the write: a slow write does not make the next one due at once
}

std::vector<std::string> Checkpointer::weights_paths(const char* what, int64_t n) const {
  std::vector<std::string> paths;
  for (const auto& named : parts_.modules) {
    paths.push_back(options_.dir + "/" + (named.first.empty() ? "model" : named.first) + "_" +
                    what + std::to_string(n) + ".pt");
  }
  return paths;
}

void Checkpointer::refuse_nonfinite(const std::string& path, int64_t epoch, int64_t step) const {
  // The replicas are identical, so every rank refuses alike (before any collective of the save).
  std::string tensor;
  for (size_t i = 0; i < parts_.modules.size() && tensor.empty(); ++i) {
    tensor = first_nonfinite_tensor(*parts_.modules[i].second);
    if (!tensor.empty() && !parts_.modules[i].first.empty())
      tensor = parts_.modules[i].first + "'s " + tensor;
  }
  if (tensor.empty()) return;
  throw TrainingDiverged("Checkpointer: refusing to write " + path + " at step " +
                             std::to_string(step) + ": the model's " + tensor +
                             " is not finite (NaN or inf), so training diverged; the earlier "
                             "checkpoints are kept",
                         step, epoch);
}

void Checkpointer::create_directory() const {
  if (!group_.is_main()) return;
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  if (error) {
    throw std::runtime_error(options_.dir +
                             ": cannot create the checkpoint directory: " + error.message());
  }
}

void Checkpointer::remove_older_step_snapshots(const std::string& newest) const {
  // list_snapshots: newest position first, so everything after `newest` is older.
  bool older = false;
  for (const std::string& path : list_snapshots(options_.dir)) {
    if (path == newest) {
      older = true;
    } else if (older && path.find("_batch") != std::string::npos) {
      std::remove(path.c_str());
    }
  }
}

}  // namespace ddp
