#include <ddp/train/snapshot.h>

#include <ddp/runtime.h>

#include <ddp/checkpoint_file.h>

#include "train/snapshot_cuda.h"
#include "train/snapshot_format.h"
#include "train/snapshot_state.h"
#include "util/file_error.h"
#include "util/hash.h"

#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <sys/stat.h>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace ddp {

using detail::decode_settings;
using detail::encode_settings;
using detail::gather_ddp_states;
using detail::KeyedStates;
using detail::SavedWrapper;
using detail::well_formed;

namespace {

// The format's constants and checks: train/snapshot_format.h.
constexpr const char (&kMagic)[8] = kSnapshotMagic;

std::string first_difference(const std::string& expected, const std::string& found) {
  std::istringstream a(expected), b(found);
  std::string line_a, line_b;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, line_a));
    const bool more_b = static_cast<bool>(std::getline(b, line_b));
    if (!more_a && !more_b) return "";
    if (!more_a) line_a = "(nothing)";
    if (!more_b) line_b = "(nothing)";
    if (line_a != line_b) return "the model has " + line_a + ", the snapshot " + line_b;
  }
}

// The CUDA device the model computes on (its first parameter's or buffer's), if any.
std::optional<torch::Device> cuda_device_of(const torch::nn::Module& model) {
  std::vector<torch::Tensor> tensors = model.parameters();
  if (tensors.empty()) tensors = model.buffers();
  if (tensors.empty() || !tensors.front().is_cuda()) return std::nullopt;
  return tensors.front().device();
}

// The default generator of that device: what dropout and torch::rand on it draw from. Reached
// through ATen's context (its CUDA hooks), so this source builds against a CPU LibTorch too.
at::Generator cuda_generator(torch::Device device) {
  return at::globalContext().defaultGenerator(device);
}

// Every rank's CUDA generator state as rows, or undefined when every rank computes on the CPU.
// A run whose ranks disagree gets an error on every rank: the rows could not be told apart.
torch::Tensor gather_cuda_generator_states(Communicator& comm, const torch::Tensor& mine) {
  const torch::Tensor sizes =
      comm.all_gather(torch::tensor({mine.defined() ? mine.numel() : int64_t{0}}, torch::kLong))
          .reshape({-1});
  if (sizes.eq(0).all().item<bool>()) return {};
  if (!sizes.eq(sizes[0]).all().item<bool>()) {
    std::string list;
    for (int64_t r = 0; r < sizes.numel(); ++r) {
      list += (r ? ", " : "") + std::string("rank ") + std::to_string(r) +
              (sizes[r].item<int64_t>() ? " on CUDA" : " on the CPU");
    }
    throw std::runtime_error("save_snapshot: the ranks do not all compute on CUDA (" + list +
                             "), so their CUDA generator states cannot be saved together: put "
                             "every rank's model on its GPU, or every rank's on the CPU");
  }
  return comm.all_gather(mine.to(torch::kByte).contiguous().reshape({-1}));
}

// Rank 0's bytes of `path` on every rank; a failure to read is thrown on every rank. Rank 0
// checks the header against the file's size before it reads (and allocates) the payload.
std::string broadcast_file(const std::string& path, Communicator& comm) {
  std::string bytes, error;
  if (comm.rank() == 0) {
    try {
      struct stat info {};
      if (::stat(path.c_str(), &info) != 0) throw std::runtime_error(std::strerror(errno));
      if (const char* why = detail::not_regular(info.st_mode)) throw std::runtime_error(why);
      std::ifstream in(path, std::ios::binary);
      if (!in) throw std::runtime_error(std::strerror(errno));
      char head[kSnapshotHeaderBytes];
      in.read(head, sizeof head);
      // Throws naming the file; the message reaches every rank as it is.
      parse_snapshot_header(head, static_cast<size_t>(in.gcount()),
                            static_cast<uint64_t>(info.st_size), path);
      in.clear();
      in.seekg(0);
      bytes.resize(static_cast<size_t>(info.st_size));
      in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (in.gcount() != static_cast<std::streamsize>(bytes.size())) {
        throw std::runtime_error("read error: " + std::string(std::strerror(errno)));
      }
    } catch (const std::runtime_error& e) {
      error = e.what();
      bytes.clear();
    }
  }
  const std::string& payload = error.empty() ? bytes : error;
  torch::Tensor header =
      torch::tensor({error.empty() ? int64_t{1} : int64_t{0}, static_cast<int64_t>(payload.size())},
                    torch::kLong);
  comm.broadcast(header, 0);
  const bool ok = header[0].item<int64_t>() == 1;
  torch::Tensor data = torch::empty({header[1].item<int64_t>()}, torch::kByte);
  if (comm.rank() == 0) std::memcpy(data.data_ptr(), payload.data(), payload.size());
  if (data.numel() > 0) comm.broadcast(data, 0);
  std::string received(static_cast<const char*>(data.data_ptr()),
                       static_cast<size_t>(data.numel()));
  if (!ok) {
    // The header checks already name the file.
    if (received.compare(0, path.size() + 2, path + ": ") == 0) throw std::runtime_error(received);
    throw std::runtime_error(path + ": cannot read the snapshot: " + received);
  }
  return received;
}

}  // namespace

std::string snapshot_path(const std::string& dir, int64_t epoch) {
  return dir + "/snapshot_epoch" + std::to_string(epoch) + ".pt";
}

std::string snapshot_path(const std::string& dir, int64_t epoch, int64_t batches_done) {
  return dir + "/snapshot_epoch" + std::to_string(epoch) + "_batch" + std::to_string(batches_done) +
         ".pt";
}

std::vector<std::string> list_snapshots(const std::string& dir) {
  // Sorted by position: (epochs finished, batches of the next one trained).
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> found;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return {};
  const std::string prefix = "snapshot_epoch", suffix = ".pt";
  while (const dirent* entry = readdir(d.get())) {
    const std::string name = entry->d_name;
    if (name.size() <= prefix.size() + suffix.size() ||
        name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string middle =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    const size_t batch_at = middle.find("_batch");
    const std::string epoch = middle.substr(0, batch_at);
    const std::string batch = batch_at == std::string::npos ? "" : middle.substr(batch_at + 6);
    auto number = [](const std::string& digits) {
      return !digits.empty() && digits.size() < 18 &&
             digits.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!number(epoch) || (batch_at != std::string::npos && !number(batch))) continue;
    const std::pair<int64_t, int64_t> position =
        batch_at == std::string::npos
            ? std::pair<int64_t, int64_t>(std::stoll(epoch), 0)
            : std::pair<int64_t, int64_t>(std::stoll(epoch) - 1, std::stoll(batch));
    found.emplace_back(position, dir + "/" + name);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> paths;
  for (const auto& f : found) paths.push_back(f.second);
  return paths;
}

void save_snapshot(const std::string& path, Communicator& comm, const SnapshotParts& parts,
                   const TrainingProgress& progress, const RankState& rank_state,
                   const TrainingExtras& extras) {
  check_snapshot_parts(parts, "save_snapshot");
  torch::Tensor cuda_state;
  if (const auto device = cuda_device_of(*parts.modules[0].second)) {
    at::Generator generator = cuda_generator(*device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    cuda_state = generator.get_state();
  }
  detail::save_snapshot_with(path, comm, parts, progress, rank_state, extras, cuda_state);
}

void detail::save_snapshot_with(const std::string& path, Communicator& comm,
                                const SnapshotParts& parts, const TrainingProgress& progress,
                                const RankState& rank_state, const TrainingExtras& extras,
                                const torch::Tensor& cuda_generator_state) {
  const torch::Tensor generators =
      comm.all_gather(at::globalContext().defaultGenerator(torch::kCPU).get_state());
  const torch::Tensor cuda_generators = gather_cuda_generator_states(comm, cuda_generator_state);
  // Every rank hands in the same kinds (the same code runs everywhere), so every rank takes part
  // in the same gathers.
  const torch::Tensor rank_generators = rank_state.generator.defined()
                                            ? comm.all_gather(rank_state.generator.contiguous())
                                            : torch::Tensor();
  const torch::Tensor rank_values =
      rank_state.values.defined()
          ? comm.all_gather(rank_state.values.to(torch::kDouble).contiguous())
          : torch::Tensor();
  // Every wrapper of the saved modules, found from them (each rank has the same ones).
  KeyedStates ddp_states;
  for (const SavedWrapper& wrapper : detail::wrappers_of(parts, "save_snapshot"))
    ddp_states.emplace_back(wrapper.key, gather_ddp_states(comm, *wrapper.ddp));
  // On every rank: an optimizer whose state is sharded (ZeroRedundancyOptimizer) gathers it to
  // rank 0 in save(), collectively. The archive holds references, not copies, until written.
  torch::serialize::OutputArchive optimizer_archive;
  detail::write_optimizers(optimizer_archive, parts);
  if (comm.rank() != 0) return;

  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  detail::write_modules(model_archive, parts);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("model_description", c10::IValue(detail::describe_parts(parts)));
  archive.write("optimizer_type", c10::IValue(detail::optimizer_types(parts)));
  archive.write("progress",
                torch::tensor({progress.epoch, progress.global_step, progress.seed,
                               static_cast<int64_t>(progress.world_size), progress.batches_done,
                               progress.batch_size, progress.samples_done},
                              torch::kLong));
  archive.write("cpu_generator_states", generators);
  // Empty tensors stand for "none": an archive has no optional entries.
  archive.write("rank_generator_states",
                rank_generators.defined() ? rank_generators : torch::empty({0}, torch::kByte));
  archive.write("rank_values",
                rank_values.defined() ? rank_values : torch::empty({0}, torch::kDouble));
  if (cuda_generators.defined()) archive.write("cuda_generator_states", cuda_generators);
  // Entries only when the run has them (load_snapshot checks both ways).
  if (extras.lr_schedule) {
    torch::serialize::OutputArchive schedule_archive;
    extras.lr_schedule->save(schedule_archive);
    archive.write("lr_schedule", schedule_archive);
  }
  if (extras.grad_scaler) {
    torch::serialize::OutputArchive scaler_archive;
    extras.grad_scaler->save(scaler_archive);
    archive.write("grad_scaler", scaler_archive);
  }
  if (!ddp_states.empty()) detail::write_wrapper_states(archive, ddp_states);
  archive.write("settings", c10::IValue(encode_settings(progress.settings)));

  std::ostringstream payload_stream;
  archive.save_to(payload_stream);
  const std::string payload = payload_stream.str();
  std::string file(kMagic, sizeof kMagic);
  put_le(file, payload.size(), 8);
  put_le(file, hash64(payload.data(), payload.size()), 8);
  file += payload;
  // The bytes go through write(2) ourselves, so a full disk is reported as such.
  WatchedPhase phase("writing the snapshot " + path);  // a file system can stall
  write_atomically(path, file);
}

TrainingProgress load_snapshot(const std::string& path, Communicator& comm,
                               const SnapshotParts& parts, torch::optim::LRScheduler* scheduler,
                               RankState* rank_state, const TrainingExtras& extras) {
  check_snapshot_parts(parts, "load_snapshot");
  const torch::nn::Module& model = *parts.modules[0].second;
  detail::SavedCudaGenerator saved;
  const TrainingProgress progress =
      detail::load_snapshot_with(path, comm, parts, scheduler, rank_state, extras, saved);
  const auto device = cuda_device_of(model);
  if (device && saved.state.defined()) {
    at::Generator generator = cuda_generator(*device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved.state);
    return progress;
  }
  // At another world size no generator is restored (the Checkpointer warns about that).
  if (progress.world_size != comm.size() || comm.rank() != 0) return progress;
  if (saved.in_file && !device) {
    std::fprintf(stderr,
                 "Warning: %s holds the CUDA generator states of a run on GPUs; this run computes "
                 "on the CPU, so they are not restored (the CPU generators are): random draws "
                 "differ from a run that continued on the GPUs\n",
                 path.c_str());
  } else if (!saved.in_file && device) {
    std::fprintf(stderr,
                 "Warning: %s holds no CUDA generator states (written by a run on the CPU, or by "
                 "an older ddp); the CUDA generator of %s keeps its state, so dropout on the GPU "
                 "draws differently from an uninterrupted run\n",
                 path.c_str(), device->str().c_str());
  }
  return progress;
}

TrainingProgress detail::load_snapshot_with(const std::string& path, Communicator& comm,
                                            const SnapshotParts& parts,
                                            torch::optim::LRScheduler* scheduler,
                                            RankState* rank_state, const TrainingExtras& extras,
                                            SavedCudaGenerator& cuda) {
  cuda = SavedCudaGenerator{};
  // Before any collective: every rank refuses alike a wrapper whose state the file cannot hold.
  const std::vector<SavedWrapper> wrappers = detail::wrappers_of(parts, "load_snapshot");
  const std::string bytes = broadcast_file(path, comm);
  auto fail = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error(path + ": " + why);
  };
  // Rank 0 checked the header before reading; every rank checks the bytes it received.
  const SnapshotHeader header =
      parse_snapshot_header(bytes.data(), bytes.size(), bytes.size(), path);
  const char* payload = bytes.data() + kSnapshotHeaderBytes;
  const size_t size = bytes.size() - kSnapshotHeaderBytes;
  check_snapshot_payload(header, payload, size, path);

  torch::serialize::InputArchive archive, model_archive, optimizer_archive, schedule_archive,
      scaler_archive;
  bool has_schedule = false, has_scaler = false, has_settings = false;
  c10::IValue description, optimizer_type, settings;
  KeyedStates ddp_states;
  torch::Tensor progress_values, generators, rank_generators, rank_values, cuda_generators;
  try {
    archive.load_from(payload, size);
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    archive.read("model_description", description);
    archive.read("optimizer_type", optimizer_type);
    archive.read("progress", progress_values);
    archive.read("cpu_generator_states", generators);
    archive.read("rank_generator_states", rank_generators);
    archive.read("rank_values", rank_values);
    has_schedule = archive.try_read("lr_schedule", schedule_archive);
    has_scaler = archive.try_read("grad_scaler", scaler_archive);
    cuda.in_file = archive.try_read("cuda_generator_states", cuda_generators);
    ddp_states = detail::read_wrapper_states(archive);
    has_settings = archive.try_read("settings", settings);
  } catch (const c10::Error& e) {
    throw fail(std::string("unreadable snapshot: ") + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw fail(std::string("unreadable snapshot: ") + e.what());
  }
  // Values of the right type and shape before they are used: an archive with a valid checksum
  // may still come from elsewhere.
  if (!description.isString() || !optimizer_type.isString() ||
      (has_settings && !settings.isString())) {
    throw fail(
        "unreadable snapshot: model_description, optimizer_type or settings is not a string");
  }
  if (progress_values.scalar_type() != torch::kLong || progress_values.dim() != 1) {
    throw fail("unreadable snapshot: progress is not a 1-dimensional int64 tensor");
  }
  progress_values = progress_values.contiguous();
  check_snapshot_progress(progress_values.data_ptr<int64_t>(),
                          static_cast<size_t>(progress_values.numel()), path);
  if (generators.dim() != 2 || generators.scalar_type() != torch::kByte || generators.size(0) < 1) {
    throw fail("unreadable snapshot: cpu_generator_states is not uint8 rows, one per rank");
  }
  const std::string difference =
      first_difference(detail::describe_parts(parts), description.toStringRef());
  if (!difference.empty()) throw fail("written for a different model: " + difference);
  const std::string optimizers = detail::optimizer_types(parts);
  if (optimizer_type.toStringRef() != optimizers) {
    throw fail("written for optimizer " + optimizer_type.toStringRef() + ", this run uses " +
               optimizers);
  }

  auto check_extra = [&](bool in_file, bool in_run, const std::string& what) {
    if (in_file && !in_run) {
      throw fail("holds the state of a " + what +
                 ", which this run does not use (resume with the "
                 "same training options)");
    }
    if (!in_file && in_run) {
      throw fail("holds no state of a " + what +
                 ", which this run uses: it was written by a "
                 "run without one (resume with the same training options)");
    }
  };
  check_extra(has_schedule, extras.lr_schedule != nullptr,
              "per-step learning-rate schedule (LRSchedule)");
  check_extra(has_scaler, extras.grad_scaler != nullptr,
              "loss scaler (GradScaler, fp16 mixed precision)");

  TrainingProgress progress;
  progress.epoch = progress_values[0].item<int64_t>();
  progress.global_step = progress_values[1].item<int64_t>();
  progress.seed = progress_values[2].item<int64_t>();
  progress.world_size = static_cast<int>(progress_values[3].item<int64_t>());
  if (progress_values.numel() >= 5) progress.batches_done = progress_values[4].item<int64_t>();
  if (progress_values.numel() >= 7) {  // else an older file: not recorded
    progress.batch_size = progress_values[5].item<int64_t>();
    progress.samples_done = progress_values[6].item<int64_t>();
  }
  if (progress.batches_done > 0 && progress.world_size != comm.size() &&
      progress.samples_done < 0) {
    throw fail("taken inside epoch " + std::to_string(progress.epoch + 1) + " (after " +
               std::to_string(progress.batches_done) + " batches) by " +
               std::to_string(progress.world_size) + " rank(s); this run has " +
               std::to_string(comm.size()) +
               ": a snapshot inside an epoch resumes only on as many ranks as wrote it (each "
               "rank's shard depends on the count); resume from an epoch-end snapshot instead");
  }
  if (has_settings) progress.settings = decode_settings(settings.toStringRef());
  // Checked before anything is restored: the rows are indexed by rank below.
  if (progress.world_size == comm.size() && generators.size(0) != comm.size()) {
    throw fail("unreadable snapshot: cpu_generator_states has " +
               std::to_string(generators.size(0)) + " rows for the " + std::to_string(comm.size()) +
               " ranks that wrote it");
  }
  for (const auto& [key, states] : ddp_states) {
    if (!well_formed(states, progress.world_size)) {
      throw fail("unreadable snapshot: the ddp_states of " + detail::wrapper_name(key) +
                 " are not uint8 rows, one for each of the " + std::to_string(progress.world_size) +
                 " ranks that wrote it");
    }
  }
  if (cuda.in_file &&
      (cuda_generators.dim() != 2 || cuda_generators.scalar_type() != torch::kByte ||
       cuda_generators.size(0) != progress.world_size)) {
    throw fail(
        "unreadable snapshot: cuda_generator_states is not uint8 rows, one for each of the " +
        std::to_string(progress.world_size) + " ranks that wrote it");
  }
  try {
    detail::read_parts(model_archive, optimizer_archive, parts, scheduler, progress.epoch);
    // After the optimizer: the schedule sets the rates of its position over the loaded ones.
    if (extras.lr_schedule) extras.lr_schedule->load(schedule_archive);
    if (extras.grad_scaler) extras.grad_scaler->load(scaler_archive);
    const std::vector<std::string> not_restored = detail::restore_wrappers(
        wrappers, ddp_states, progress.world_size, comm.rank(), comm.size());
    for (const std::string& line : not_restored) {
      if (comm.rank() == 0) std::fprintf(stderr, "Warning: %s: %s\n", path.c_str(), line.c_str());
    }
  } catch (const c10::Error& e) {
    throw fail(std::string("cannot restore the training state: ") + e.what_without_backtrace());
  } catch (const std::runtime_error& e) {
    throw fail(std::string("cannot restore the training state: ") + e.what());
  }
  if (progress.world_size == comm.size()) {
    // Shared, not a copy.
    at::Generator generator = at::globalContext().defaultGenerator(torch::kCPU);
    // A tensor of its own: set_state mishandled a row view (storage offset > 0), off rank 0.
    generator.set_state(generators[comm.rank()].clone());
    if (cuda.in_file) cuda.state = cuda_generators[comm.rank()].clone();
    if (rank_state) {
      *rank_state = RankState{};
      if (rank_generators.numel() > 0) rank_state->generator = rank_generators[comm.rank()].clone();
      if (rank_values.numel() > 0) rank_state->values = rank_values[comm.rank()].clone();
    }
  }
  return progress;
}

}  // namespace ddp
