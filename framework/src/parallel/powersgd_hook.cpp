// PowerSGD (Vogels et al. 2019) as PyTorch's powerSGD_hook (not batched_powerSGD_hook): its
// algorithm, order of operations and state, so that on the same gradients and state it gives the
// same results up to the order of float sums (tests/reference/powersgd.py compares). The comments
// name the PyTorch steps each part reproduces. Per bucket, once `iter` has reached
// start_powerSGD_iter (before: allreduce_hook()):
//  1. error feedback: the bucket gets the error of its previous compression added;
//  2. each gradient is viewed as a matrix [dim 0, rest]; those with (rows + cols) * rank *
//     min_compression_rate < rows * cols are compressed, the others all-reduced as one flat tensor;
//  3. per compressed M (grouped by shape): Q is random normal on the first step (every step
//     without warm_start), else the previous Q, orthogonalised; P = M Q summed over the ranks and
//     orthogonalised; Q = M^T P averaged over the ranks; M = P Q^T;
//  4. error feedback: the bucket's error is its input minus its result.
// `iter` grows at the last bucket. The random Qs follow numpy's RandomState(random_seed): each
// bucket that needs new Qs seeds a CPU generator with its next draw and fills them with randn.

#include <ddp/comm_hook.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

namespace {

// numpy's legacy RandomState.randint(1_000_000_000): 32-bit MT19937 outputs masked to the
// smallest covering power of two (2^30 - 1), drawn again while above the range's top.
int64_t numpy_randint_1e9(std::mt19937& rng) {
  constexpr uint32_t top = 999'999'999, mask = (1u << 30) - 1;
  for (;;) {
    const uint32_t value = static_cast<uint32_t>(rng()) & mask;
    if (value <= top) return value;
  }
}

// _orthogonalize_gram_schmidt: `matrices` is [batch, rows, cols], orthonormalised column by column
// in place.
void gram_schmidt(const torch::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    torch::Tensor col = matrices.narrow(2, i, 1);
    torch::Tensor norm = torch::linalg_vector_norm(col, 2, {1}, /*keepdim=*/true);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      torch::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(torch::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// _orthogonalize: Gram-Schmidt for rank <= 2 or half precision, QR otherwise.
void orthogonalize(const torch::Tensor& matrices, double epsilon) {
  const auto dtype = matrices.scalar_type();
  if (matrices.size(2) <= 2 || dtype == torch::kHalf || dtype == torch::kBFloat16) {
    gram_schmidt(matrices, epsilon);
  } else {
    matrices.copy_(std::get<0>(torch::linalg_qr(matrices)));
  }
}

void maybe_increase_iter(PowerSGDState& state, const GradBucket& bucket) {
  if (bucket.is_last) ++state.iter;
}

void check(const PowerSGDState& state) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("powersgd_hook: PowerSGDState::" + what);
  };
  if (state.matrix_approximation_rank < 1) {
    fail("matrix_approximation_rank must be >= 1 (got " +
         std::to_string(state.matrix_approximation_rank) + ")");
  }
  if (!(state.min_compression_rate > 0)) {
    fail("min_compression_rate must be > 0 (got " + std::to_string(state.min_compression_rate) +
         ")");
  }
  if ((state.use_error_feedback || state.warm_start) && state.start_powerSGD_iter <= 1) {
    fail("start_powerSGD_iter must be > 1 with use_error_feedback or warm_start (got " +
         std::to_string(state.start_powerSGD_iter) +
         "): the buckets are rebuilt after the first step, which would mix up their state");
  }
}

// The per-bucket work after the hook returns: what PyTorch chains as
// unpack_uncompressed_tensors_and_allreduce_ps, compute_qs and decompress.
struct PendingBucket {
  std::shared_ptr<PowerSGDState> state;
  GradBucket bucket;
  torch::Tensor input_copy;  // error feedback: the input before compression
  std::vector<torch::Tensor> uncompressed;
  torch::Tensor uncompressed_memory;
  torch::Tensor p_memory, q_memory;  // the state's, held: without warm_start it drops them
  std::vector<torch::Tensor> matrices, ps, qs;  // [1, n, m], [1, n, r], [1, m, r]
  std::unique_ptr<Work> q_sum;                  // the all-reduce of q_memory, started by the hook
};

// What a PowerSGD run keeps between steps (PowerSGDState's second half), for snapshots. Tensors
// are saved on the CPU and moved to the bucket's device when next used (on_device), so a
// snapshot loads on any device.
class SavedPowerSGD final : public CommHookState {
 public:
  explicit SavedPowerSGD(std::shared_ptr<PowerSGDState> state) : state_(std::move(state)) {}

  void save(torch::serialize::OutputArchive& archive) const override {
    const PowerSGDState& s = *state_;
    archive.write("counters", torch::tensor({s.iter, s.total_numel_before_compression,
                                             s.total_numel_after_compression},
                                            torch::kLong));
    std::ostringstream rng;
    rng << s.rng;  // the standard's text form of the engine's whole state
    const std::string text = rng.str();
    archive.write("rng",
                  torch::tensor(std::vector<uint8_t>(text.begin(), text.end()), torch::kByte));
    write_dict(archive, "error", s.error_dict);
    write_dict(archive, "p", s.p_memory_dict);
    write_dict(archive, "q", s.q_memory_dict);
  }

  void load(torch::serialize::InputArchive& archive) override {
    PowerSGDState& s = *state_;
    torch::Tensor counters, rng;
    archive.read("counters", counters);
    archive.read("rng", rng);
    if (counters.scalar_type() != torch::kLong || counters.numel() != 3 ||
        rng.scalar_type() != torch::kByte) {
      throw std::runtime_error("powersgd_hook: the saved state is not PowerSGD's");
    }
    rng = rng.contiguous();
    std::istringstream text(
        std::string(rng.data_ptr<uint8_t>(), rng.data_ptr<uint8_t>() + rng.numel()));
    std::mt19937 engine;
    if (!(text >> engine))
      throw std::runtime_error("powersgd_hook: the saved random generator is unreadable");
    s.iter = counters[0].item<int64_t>();
    s.total_numel_before_compression = counters[1].item<int64_t>();
    s.total_numel_after_compression = counters[2].item<int64_t>();
    s.rng = engine;
    s.error_dict = read_dict(archive, "error");
    s.p_memory_dict = read_dict(archive, "p");
    s.q_memory_dict = read_dict(archive, "q");
  }

 private:
  static void write_dict(torch::serialize::OutputArchive& archive, const std::string& name,
                         const std::map<size_t, torch::Tensor>& dict) {
    torch::serialize::OutputArchive entries;
    std::vector<int64_t> keys;
    for (const auto& [index, tensor] : dict) {
      keys.push_back(static_cast<int64_t>(index));
      entries.write(std::to_string(index), tensor.cpu());
    }
    entries.write("buckets", torch::tensor(keys, torch::kLong));
    archive.write(name, entries);
  }
  static std::map<size_t, torch::Tensor> read_dict(torch::serialize::InputArchive& archive,
                                                   const std::string& name) {
    torch::serialize::InputArchive entries;
    archive.read(name, entries);
    torch::Tensor keys;
    entries.read("buckets", keys);
    std::map<size_t, torch::Tensor> dict;
    keys = keys.to(torch::kLong).contiguous();
    for (int64_t i = 0; i < keys.numel(); ++i) {
      const int64_t index = keys.data_ptr<int64_t>()[i];
      torch::Tensor tensor;
      entries.read(std::to_string(index), tensor);
      dict[static_cast<size_t>(index)] = tensor;
    }
    return dict;
  }

  std::shared_ptr<PowerSGDState> state_;
};

std::string describe(const PowerSGDState& s) {
  std::ostringstream text;
  text << "powersgd(matrix_approximation_rank=" << s.matrix_approximation_rank
       << ", start_powerSGD_iter=" << s.start_powerSGD_iter
       << ", min_compression_rate=" << s.min_compression_rate
       << ", use_error_feedback=" << s.use_error_feedback << ", warm_start=" << s.warm_start
       << ", orthogonalization_epsilon=" << s.orthogonalization_epsilon
       << ", random_seed=" << s.random_seed << ")";
  return text.str();
}

// A saved tensor comes back on the CPU: on the bucket's device from its first use on.
torch::Tensor& on_device(torch::Tensor& tensor, const torch::Device& device) {
  if (tensor.device() != device) tensor = tensor.to(device);
  return tensor;
}

}  // namespace

CommHook powersgd_hook(std::shared_ptr<PowerSGDState> state) {
  if (!state) throw std::invalid_argument("powersgd_hook: the state is null");
  check(*state);
  state->rng.seed(state->random_seed);
  auto hook = [state](Communicator& comm, GradBucket& bucket) -> BucketFuture {
    PowerSGDState& s = *state;
    const int64_t world = comm.size();
    torch::Tensor input = bucket.buffer;
    if (s.iter < s.start_powerSGD_iter) {
      maybe_increase_iter(s, bucket);
      input.div_(world);
      return BucketFuture(comm.all_reduce_async(input, ReduceOp::Sum), input);
    }
    auto job = std::make_shared<PendingBucket>();
    job->state = state;
    job->bucket = bucket;
    const size_t index = bucket.index;
    const auto options = input.options();

    // Error feedback.
    if (s.use_error_feedback) {
      auto error = s.error_dict.find(index);
      if (error != s.error_dict.end()) {
        input.add_(on_device(error->second, input.device()));
      } else {
        s.error_dict[index] = torch::zeros({input.numel()}, options);
      }
      job->input_copy = input.detach().clone();
    }

    // Which gradients to compress.
    std::vector<torch::Tensor> to_compress;
    int64_t ps_size = 0, qs_size = 0;
    for (const torch::Tensor& tensor : bucket.gradients) {
      if (tensor.dim() == 0) {  // a scalar has no matrix view: PyTorch would fail; send it as is
        job->uncompressed.push_back(tensor);
        s.total_numel_before_compression += 1;
        s.total_numel_after_compression += 1;
        continue;
      }
      torch::Tensor matrix = tensor.view({tensor.size(0), -1});
      const int64_t n = matrix.size(0), m = matrix.size(1);
      const int64_t rank = std::min({n, m, s.matrix_approximation_rank});
      const int64_t compressed = (n + m) * rank;
      s.total_numel_before_compression += n * m;
      if (static_cast<double>(compressed) * s.min_compression_rate < static_cast<double>(n * m)) {
        to_compress.push_back(matrix);
        ps_size += n * rank;
        qs_size += m * rank;
        s.total_numel_after_compression += compressed;
      } else {
        job->uncompressed.push_back(tensor);
        s.total_numel_after_compression += n * m;
      }
    }
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& t : job->uncompressed) flat.push_back(t.reshape(-1));
    job->uncompressed_memory = flat.empty() ? torch::empty({0}, options) : torch::cat(flat);

    const bool randomize_qs = !s.warm_start || s.p_memory_dict.count(index) == 0;
    if (randomize_qs) {
      s.p_memory_dict[index] = torch::empty({ps_size}, options);
      s.q_memory_dict[index] = torch::empty({qs_size}, options);
    }
    // Grouped by shape, in the order each shape first appears (PyTorch's shape_to_tensors).
    std::vector<std::vector<torch::Tensor>> by_shape;
    for (const torch::Tensor& matrix : to_compress) {
      auto same = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& group) {
        return group.front().sizes() == matrix.sizes();
      });
      if (same == by_shape.end()) {
        by_shape.push_back({matrix});
      } else {
        same->push_back(matrix);
      }
    }
    job->p_memory = on_device(s.p_memory_dict[index], input.device());
    job->q_memory = on_device(s.q_memory_dict[index], input.device());
    int64_t p_at = 0, q_at = 0;
    for (const auto& group : by_shape) {
      for (const torch::Tensor& matrix : group) {
        const int64_t n = matrix.size(0), m = matrix.size(1);
        const int64_t rank = std::min({n, m, s.matrix_approximation_rank});
        job->matrices.push_back(matrix.unsqueeze(0));
        job->ps.push_back(job->p_memory.narrow(0, p_at, n * rank).view({1, n, rank}));
        job->qs.push_back(job->q_memory.narrow(0, q_at, m * rank).view({1, m, rank}));
        p_at += n * rank;
        q_at += m * rank;
      }
    }
    if (!randomize_qs) {
      for (const torch::Tensor& q : job->qs) orthogonalize(q, s.orthogonalization_epsilon);
    } else {
      // PyTorch: torch.manual_seed(state.rng.randint(1_000_000_000)) inside fork_rng, then randn.
      torch::Generator generator =
          at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(numpy_randint_1e9(s.rng)));
      for (const torch::Tensor& q : job->qs) {
        q.copy_(torch::randn(q.sizes(), generator, torch::TensorOptions().dtype(q.scalar_type())));
        orthogonalize(q, s.orthogonalization_epsilon);
      }
    }
    for (size_t k = 0; k < job->matrices.size(); ++k) {
      torch::bmm_out(job->ps[k], job->matrices[k], job->qs[k]);
    }

    // The uncompressed tensors and the Ps start at once, and the Qs behind them: each Q is
    // computed from its P's sum when its all-reduce's turn comes (Communicator::
    // all_reduce_after_fill; the host backends' worker thread does it), so backward goes on
    // meanwhile, as in PyTorch, where P's completion starts the Qs. And every rank issues its
    // collectives in hook order from one thread (PyTorch's callback can issue them in another
    // order on each rank, which gloo reports as a collective mismatch). The sums are the same,
    // each all-reduce on its own. `fill` holds the tensors, not the job (which holds its Work).
    std::unique_ptr<Work> first;
    if (job->uncompressed_memory.numel() > 0) {
      first = comm.all_reduce_async(job->uncompressed_memory, ReduceOp::Sum);
    }
    if (job->p_memory.numel() > 0) {
      std::shared_ptr<Work> p_sum = comm.all_reduce_async(job->p_memory, ReduceOp::Sum);
      auto compute_qs = [p_sum, ps = job->ps, qs = job->qs, matrices = job->matrices,
                         epsilon = s.orthogonalization_epsilon]() mutable {
        p_sum->wait();
        for (const torch::Tensor& p : ps) orthogonalize(p, epsilon);
        for (size_t k = 0; k < matrices.size(); ++k) {
          torch::bmm_out(qs[k], matrices[k].transpose(1, 2), ps[k]);
        }
      };
      job->q_sum = comm.all_reduce_after_fill(job->q_memory, std::move(compute_qs), ReduceOp::Sum);
    }
    return BucketFuture(std::move(first), input).then([job, index, world](torch::Tensor) {
      PowerSGDState& s = *job->state;
      // unpack_uncompressed_tensors_and_allreduce_ps
      job->uncompressed_memory.div_(world);
      int64_t at = 0;
      for (const torch::Tensor& t : job->uncompressed) {
        t.copy_(job->uncompressed_memory.narrow(0, at, t.numel()).view_as(t));
        at += t.numel();
      }
      if (job->q_sum) job->q_sum->wait();
      // decompress
      job->q_memory.div_(world);
      for (size_t k = 0; k < job->matrices.size(); ++k) {
        torch::bmm_out(job->matrices[k], job->ps[k], job->qs[k].transpose(1, 2));
      }
      torch::Tensor input = job->bucket.buffer;
      if (s.use_error_feedback) s.error_dict[index] = job->input_copy - input;
      if (!s.warm_start) {
        s.p_memory_dict.clear();
        s.q_memory_dict.clear();
      }
      maybe_increase_iter(s, job->bucket);
      return input;
    });
  };
  return CommHook(std::move(hook), std::make_shared<SavedPowerSGD>(state), describe(*state));
}

}  // namespace ddp
