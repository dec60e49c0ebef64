#include <ddp/zero_redundancy_optimizer.h>

#include <c10/util/Type.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

namespace ddp {

namespace {

const char* const kWhere = "ZeroRedundancyOptimizer";

// The greedy partition of the header: largest first, each to the least loaded rank.
std::vector<int> partition(const std::vector<torch::Tensor>& params, int ranks) {
  std::vector<size_t> order(params.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(params.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();  // first on ties
    owner[i] = static_cast<int>(least);
    load[static_cast<size_t>(least)] += params[i].numel();
  }
  return owner;
}

// The key torch::optim keeps a parameter's state under.
void* key(const torch::Tensor& param) { return param.unsafeGetTensorImpl(); }

// Whether two serialised archives hold the same entries with the same values (tensors equal
// in dtype, shape and every element; other values alike as printed). Not the bytes: the order
// an archive lists its entries in is the order they were written.
bool same_entries(torch::serialize::InputArchive& a, torch::serialize::InputArchive& b) {
  std::vector<std::string> keys = a.keys(), other = b.keys();
  std::sort(keys.begin(), keys.end());
  std::sort(other.begin(), other.end());
  if (keys != other) return false;
  for (const std::string& k : keys) {
    torch::serialize::InputArchive sub_a, sub_b;
    const bool nested = a.try_read(k, sub_a);
    if (nested != b.try_read(k, sub_b)) return false;
    if (nested) {
      if (!same_entries(sub_a, sub_b)) return false;
      continue;
    }
    c10::IValue x, y;
    if (!a.try_read(k, x) || !b.try_read(k, y)) return false;
    if (x.isTensor() != y.isTensor()) return false;
    if (x.isTensor()) {
      const torch::Tensor& s = x.toTensor();
      const torch::Tensor& t = y.toTensor();
      if (s.defined() != t.defined()) return false;
      if (s.defined() && (s.scalar_type() != t.scalar_type() || s.sizes() != t.sizes() ||
                          !torch::equal(s.cpu(), t.cpu()))) {
        return false;
      }
      continue;
    }
    std::ostringstream text_x, text_y;
    text_x << x;
    text_y << y;
    if (text_x.str() != text_y.str()) return false;
  }
  return true;
}

bool same_archive(const std::string& a, const std::string& b) {
  torch::serialize::InputArchive x, y;
  x.load_from(a.data(), a.size());
  y.load_from(b.data(), b.size());
  return same_entries(x, y);
}

std::string bytes_of(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

struct ZeroRedundancyOptimizer::Impl {
  Communicator* comm = nullptr;
  Factory factory;
  std::vector<torch::Tensor> params;  // all, in the constructor's order
  std::vector<int> owner;             // rank stepping params[i]
  std::vector<int64_t> offset;        // params[i]'s first element in its owner's chunk
  std::vector<int64_t> load;          // elements of each rank's shard
  int64_t chunk = 0;                  // elements per chunk: the largest shard
  torch::Tensor flat;                 // size() chunks: gradients, then parameters
  torch::Tensor mine;                 // this rank's chunk, apart (collectives need two buffers)
  std::unique_ptr<torch::optim::Optimizer> shard;

  int rank() const { return comm->rank(); }
  std::vector<torch::Tensor> shard_of(int r) const {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) {
      if (owner[i] == r) out.push_back(params[i]);
    }
    return out;
  }
  // params[i] as a view of chunk `owner[i]` of `flat`, or of `mine`.
  torch::Tensor in_flat(size_t i) const {
    return flat
        .slice(0, owner[i] * chunk + offset[i], owner[i] * chunk + offset[i] + params[i].numel())
        .view(params[i].sizes());
  }
  torch::Tensor in_mine(size_t i) const {
    return mine.slice(0, offset[i], offset[i] + params[i].numel()).view(params[i].sizes());
  }
};

std::unique_ptr<ZeroRedundancyOptimizer::Impl> ZeroRedundancyOptimizer::make_impl(
    std::vector<torch::Tensor> parameters, Communicator& comm, Factory factory) {
  if (!factory) throw std::invalid_argument(std::string(kWhere) + ": no optimizer factory");
  if (parameters.empty()) throw std::invalid_argument(std::string(kWhere) + ": no parameters");
  const torch::Tensor& first = parameters.front();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& p = parameters[i];
    if (!p.defined() || p.scalar_type() != first.scalar_type() || p.device() != first.device()) {
      throw std::invalid_argument(
          std::string(kWhere) + ": parameter " + std::to_string(i) + " is " +
          (p.defined() ? std::string(c10::toString(p.scalar_type())) + " on " + p.device().str()
                       : std::string("undefined")) +
          ", but parameter 0 is " + c10::toString(first.scalar_type()) + " on " +
          first.device().str() + ": one flat buffer needs one dtype on one device");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->comm = &comm;
  impl->factory = std::move(factory);
  impl->params = std::move(parameters);
  impl->owner = partition(impl->params, comm.size());
  impl->load.assign(static_cast<size_t>(comm.size()), 0);
  for (size_t i = 0; i < impl->params.size(); ++i) {
    const size_t r = static_cast<size_t>(impl->owner[i]);
    impl->offset.push_back(impl->load[r]);
    impl->load[r] += impl->params[i].numel();
  }
  impl->chunk = *std::max_element(impl->load.begin(), impl->load.end());
  impl->flat = torch::zeros({impl->chunk * comm.size()}, first.options().requires_grad(false));
  impl->mine = torch::zeros({impl->chunk}, impl->flat.options());
  impl->shard = impl->factory(impl->shard_of(comm.rank()));
  if (!impl->shard || impl->shard->param_groups().size() != 1) {
    throw std::invalid_argument(std::string(kWhere) +
                                ": the factory must make an optimizer with one parameter group");
  }

  // Rank 0's parameters everywhere, as DistributedDataParallel starts.
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < impl->params.size(); ++i) impl->in_flat(i).copy_(impl->params[i]);
  comm.broadcast(impl->flat, 0);
  for (size_t i = 0; i < impl->params.size(); ++i) impl->params[i].copy_(impl->in_flat(i));
  return impl;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters,
                                                 Communicator& comm, Factory factory)
    : ZeroRedundancyOptimizer(make_impl(std::move(parameters), comm, std::move(factory))) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::unique_ptr<Impl> impl)
    : torch::optim::Optimizer(impl->params, impl->shard->defaults().clone()),
      impl_(std::move(impl)) {
  param_groups_[0].set_options(impl_->shard->param_groups()[0].options().clone());
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

torch::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  if (closure) {
    throw std::invalid_argument(std::string(kWhere) +
                                "::step: closures (LBFGS) are not supported: a closure's backward "
                                "would leave unreduced gradients");
  }
  Impl& z = *impl_;
  torch::NoGradGuard no_grad;
  // What a scheduler set on this optimizer's group applies to the shard's.
  z.shard->param_groups()[0].set_options(param_groups_[0].options().clone());

  const int rank = z.rank();
  for (size_t i = 0; i < z.params.size(); ++i) {
    const torch::Tensor& grad = z.params[i].grad();
    if (grad.defined()) {
      z.in_flat(i).copy_(grad);
    } else {
      z.in_flat(i).zero_();
    }
  }
  for (int r = 0; r < z.comm->size(); ++r) {  // padding: zeros (the all-gather wrote it)
    z.flat.slice(0, r * z.chunk + z.load[static_cast<size_t>(r)], (r + 1) * z.chunk).zero_();
  }
  z.comm->reduce_scatter(z.mine, z.flat, ReduceOp::Avg);
  for (size_t i = 0; i < z.params.size(); ++i) {
    if (z.owner[i] != rank) continue;
    torch::Tensor& grad = z.params[i].mutable_grad();
    if (grad.defined()) {
      grad.copy_(z.in_mine(i));
    } else {
      grad = z.in_mine(i).clone();
    }
  }
  z.shard->step();

  for (size_t i = 0; i < z.params.size(); ++i) {
    if (z.owner[i] == rank) z.in_mine(i).copy_(z.params[i]);
  }
  z.comm->all_gather_into(z.flat, z.mine);
  for (size_t i = 0; i < z.params.size(); ++i) {
    if (z.owner[i] != rank) z.params[i].copy_(z.in_flat(i));
  }
  return {};
}

std::unique_ptr<torch::optim::Optimizer> ZeroRedundancyOptimizer::consolidate(
    const Impl& z, const std::vector<std::string>& shards, std::string& error) const {
  auto full = z.factory(z.params);
  for (int r = 0; r < z.comm->size(); ++r) {
    // Rank r's optimizer, remade here over the same parameters, reads its state; the state then
    // goes to the full optimizer under the same parameters' keys.
    const std::vector<torch::Tensor> shard_params = z.shard_of(r);
    const std::string& saved = shards[static_cast<size_t>(r)];
    auto shard = z.factory(shard_params);
    torch::serialize::InputArchive archive;
    archive.load_from(saved.data(), saved.size());
    shard->load(archive);
    // The state moves by parameter through state(), the one place torch::optim's optimizers
    // keep it. An optimizer that keeps some elsewhere would lose it here, silently: so a shard
    // rebuilt from what moves must save what the shard saves.
    const std::string loaded = bytes_of(*shard);
    auto rebuilt = z.factory(shard_params);
    rebuilt->param_groups()[0].set_options(shard->param_groups()[0].options().clone());
    for (const torch::Tensor& p : shard_params) {
      auto found = shard->state().find(key(p));
      if (found == shard->state().end() || !found->second) continue;
      rebuilt->state()[key(p)] = found->second->clone();
      full->state()[key(p)] = std::move(found->second);
    }
    if (error.empty() && !same_archive(loaded, bytes_of(*rebuilt))) {
      error = std::string(kWhere) + "::save: the optimizer of rank " + std::to_string(r) +
              "'s shard (" + c10::demangle(typeid(*shard).name()) +
              ") saves state that its state() does not hold, so the shards cannot be put "
              "together into one optimizer's state and a snapshot would lose it: keep every "
              "parameter's state in torch::optim::Optimizer::state(), as torch::optim's "
              "optimizers and ddp::Adadelta do";
    }
  }
  full->param_groups()[0].set_options(param_groups_[0].options().clone());
  return full;
}

void ZeroRedundancyOptimizer::save(torch::serialize::OutputArchive& archive) const {
  const Impl& z = *impl_;
  // Every shard's state, serialised by its own optimizer (so any optimizer's state travels).
  const std::vector<std::string> shards = all_gather_strings(*z.comm, bytes_of(*z.shard));
  std::string error;  // rank 0's verdict, sent to every rank below
  std::unique_ptr<torch::optim::Optimizer> consolidated;
  if (z.rank() == 0) consolidated = consolidate(z, shards, error);
  for (const std::string& said : all_gather_strings(*z.comm, error)) {
    if (!said.empty()) throw std::runtime_error(said);  // on every rank alike
  }
  if (consolidated) consolidated->save(archive);
}

void ZeroRedundancyOptimizer::load(torch::serialize::InputArchive& archive) {
  Impl& z = *impl_;
  auto full = z.factory(z.params);
  full->load(archive);
  const int rank = z.rank();
  for (size_t i = 0; i < z.params.size(); ++i) {
    if (z.owner[i] != rank) continue;
    auto found = full->state().find(key(z.params[i]));
    if (found == full->state().end()) {
      z.shard->state().erase(key(z.params[i]));
    } else {
      z.shard->state()[key(z.params[i])] = std::move(found->second);
    }
  }
  param_groups_[0].set_options(full->param_groups()[0].options().clone());
  z.shard->param_groups()[0].set_options(full->param_groups()[0].options().clone());
}

const std::vector<int>& ZeroRedundancyOptimizer::owners() const { return impl_->owner; }

int64_t ZeroRedundancyOptimizer::shard_numel() const {
  return impl_->load[static_cast<size_t>(impl_->rank())];
}

torch::optim::Optimizer& ZeroRedundancyOptimizer::shard_optimizer() { return *impl_->shard; }

}  // namespace ddp
