// horovod_cpp — Apache-2.0
// Stage 3 in the LibTorch C++ API: ShardedModel and FullyShardedOptimizer (bindings/torch.h).
#include <ATen/native/Resize.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "bindings/torch.h"
#include "bindings/torch_internal.h"

namespace hvd {
namespace torch {

using internal::Bytes;
using internal::Get;
using internal::ShardRange;
using internal::Throw;

namespace {

// Frees (0) or reallocates the storage under `t` and every view of it: the views that autograd
// saved in forward see the data again once the unit is gathered for backward.
void ResizeStorage(const ::torch::Tensor& t, int64_t numel) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(),
                               static_cast<size_t>(numel) * t.element_size());
}

}  // namespace

// One dtype's trainable parameters of one unit, packed.
struct ShardedModel::Flat {
  std::string label;                      // "unit.dtype" (the collectives' names)
  std::vector<::torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;  // (a parameter's own is empty between uses)
  std::vector<int64_t> offsets, numels;
  int64_t length = 0, start = 0, end = 0;
  ::torch::Tensor shard;      // this rank's slice (at one rank: the whole buffer)
  ::torch::Tensor full;       // the gathered buffer; its storage is empty between uses
  ::torch::Tensor empty;      // what a parameter holds between uses
  ::torch::Tensor grad_full;  // the pass's gradients, packed as they arrive
  std::vector<char> arrived;  // per parameter, this pass
  int arrived_count = 0;
  std::vector<int> passes;    // per parameter, since the last FinishReductions
  int launched = 0;           // reductions started this step
  std::vector<TorchHandle> handles;  // reductions in flight (shard.grad(): the ones done)
  size_t unit = 0;

  ::torch::Tensor View(const ::torch::Tensor& whole, size_t i) const {
    return whole.narrow(0, offsets[i], numels[i]);
  }
  // Parameter i as a view of the whole buffer.
  void Point(const ::torch::Tensor& whole, size_t i) {
    params[i].set_data(View(whole, i).view(shapes[i]));
  }
};

struct ShardedModel::Unit {
  const ::torch::nn::Module* module = nullptr;
  std::string name;
  std::vector<std::unique_ptr<Flat>> flats;
  bool gathered = false;
  int awaiting = -1;  // gradients still to come in this backward (-1: not in backward)
};

ShardedModel::ShardedModel(::torch::nn::Module& model,
                           const std::vector<std::shared_ptr<::torch::nn::Module>>& units,
                           ShardedModelOptions options)
    : options_(options) {
  if (options_.op != ReduceOp::kAverage && options_.op != ReduceOp::kSum) {
    Throw(Status::InvalidArgument("ShardedModel supports op Average and Sum"));
  }
  if (options_.backward_passes_per_step <= 0) {
    Throw(Status::InvalidArgument("backward_passes_per_step must be > 0"));
  }
  ProcessSetInfo set = Get(GetProcessSet(options_.process_set_id));
  if (!set.included) {
    Throw(Status::InvalidArgument("ShardedModel: this rank is not in the process set"));
  }
  size_ = set.size;
  rank_ = set.rank;
  // Each unit's trainable parameters (by TensorImpl); a parameter goes to the innermost unit
  // holding it (the one with the fewest parameters), which every other unit holding it must
  // contain whole.
  std::vector<std::set<const void*>> holds(units.size());
  for (size_t k = 0; k < units.size(); ++k) {
    if (!units[k]) Throw(Status::InvalidArgument("ShardedModel: unit " + std::to_string(k) +
                                                 " is null"));
    for (const auto& p : units[k]->parameters()) {
      if (p.requires_grad()) holds[k].insert(p.unsafeGetTensorImpl());
    }
  }
  // contains(k, j): unit k holds every parameter unit j holds (asked once per pair).
  std::map<std::pair<size_t, size_t>, bool> containment;
  auto contains = [&](size_t k, size_t j) {
    auto it = containment.find({k, j});
    if (it == containment.end()) {
      bool all = std::includes(holds[k].begin(), holds[k].end(), holds[j].begin(),
                               holds[j].end());
      it = containment.emplace(std::make_pair(k, j), all).first;
    }
    return it->second;
  };
  std::unordered_map<const void*, size_t> owner;
  for (const auto& item : model.named_parameters()) {
    const ::torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const void* key = p.unsafeGetTensorImpl();
    if (!p.device().is_cpu()) {
      Throw(Status::InvalidArgument("ShardedModel (C++) takes CPU parameters; " + item.key() +
                                    " is on " + p.device().str()));
    }
    size_t best = units.size();
    for (size_t k = 0; k < units.size(); ++k) {
      if (holds[k].count(key) && (best == units.size() || holds[k].size() < holds[best].size())) {
        best = k;
      }
    }
    if (best == units.size()) {
      Throw(Status::InvalidArgument("ShardedModel: parameter " + item.key() +
                                    " is in no unit (give the model itself as a unit for the "
                                    "parameters no other unit holds)"));
    }
    for (size_t k = 0; k < units.size(); ++k) {
      if (k != best && holds[k].count(key) && !contains(k, best)) {
        Throw(Status::InvalidArgument(
            "ShardedModel: parameter " + item.key() + " is shared by units " +
            std::to_string(best) + " and " + std::to_string(k) +
            ", neither of which contains the other"));
      }
    }
    owner.emplace(key, best);
  }
  for (size_t k = 0; k < units.size(); ++k) {
    auto u = std::make_unique<Unit>();
    u->module = units[k].get();
    u->name = std::to_string(k);
    units_.push_back(std::move(u));
  }
  // Flats in the order of the model's parameters, one per unit and dtype.
  ::torch::NoGradGuard no_grad;
  std::map<std::pair<size_t, int>, Flat*> flat_of;
  std::set<const void*> seen;
  for (const auto& item : model.named_parameters()) {
    ::torch::Tensor p = item.value();
    const void* key = p.unsafeGetTensorImpl();
    if (!p.requires_grad() || !seen.insert(key).second) continue;
    const size_t k = owner.at(key);
    const auto dtype = static_cast<int>(p.scalar_type());
    Flat*& f = flat_of[{k, dtype}];
    if (f == nullptr) {
      auto made = std::make_unique<Flat>();
      made->unit = k;
      made->label = units_[k]->name + "." + c10::toString(p.scalar_type());
      f = made.get();
      units_[k]->flats.push_back(std::move(made));
      flats_.push_back(f);
    }
    f->params.push_back(p);
    f->names.push_back(item.key());
    f->shapes.push_back(p.sizes().vec());
    f->numels.push_back(p.numel());
    f->offsets.push_back(f->length);
    f->length += p.numel();
  }
  for (Flat* f : flats_) {
    const ::torch::TensorOptions opts = f->params[0].options().requires_grad(false);
    ::torch::Tensor whole = ::torch::empty({f->length}, opts);
    for (size_t i = 0; i < f->params.size(); ++i) {
      f->View(whole, i).copy_(f->params[i].detach().reshape({-1}));
    }
    std::tie(f->start, f->end) = ShardRange(f->length, size_, rank_);
    f->arrived.assign(f->params.size(), 0);
    f->passes.assign(f->params.size(), 0);
    f->empty = ::torch::empty({0}, opts);
    if (size_ == 1) {  // the slice is the whole buffer: the parameters are views of it for good
      f->shard = whole;
      for (size_t i = 0; i < f->params.size(); ++i) f->Point(whole, i);
    } else {
      f->shard = whole.narrow(0, f->start, f->end - f->start).clone();
      f->full = ::torch::empty({f->length}, opts);
      ResizeStorage(f->full, 0);
      for (::torch::Tensor& p : f->params) p.set_data(f->empty);
    }
  }
  for (Flat* f : flats_) {
    for (size_t i = 0; i < f->params.size(); ++i) {
      ::torch::Tensor p = f->params[i];
      hooks_.emplace_back(p, p.register_hook([this, f, i](const ::torch::Tensor& grad) {
        OnGradient(*f, i, grad);
      }));
    }
  }
}

ShardedModel::~ShardedModel() {
  for (auto& [p, h] : hooks_) p.remove_hook(h);
  for (Flat* f : flats_) {
    for (auto& h : f->handles) {
      try {
        h.Synchronize();  // the tensors must outlive the operation
      } catch (const Error&) {
      }
    }
  }
}

ShardedModel::Unit& ShardedModel::UnitOf(const ::torch::nn::Module& module) {
  for (auto& u : units_) {
    if (u->module == &module) return *u;
  }
  Throw(Status::InvalidArgument("ShardedModel::Run: " + module.name() +
                                " is not one of the units given to ShardedModel"));
}

void ShardedModel::Gather(Unit& u, const std::string& tag) {
  if (u.gathered || size_ == 1) {
    u.gathered = true;
    return;
  }
  ::torch::NoGradGuard no_grad;
  std::vector<TorchHandle> handles;
  for (auto& f : u.flats) {  // straight into the unit's storage
    ResizeStorage(f->full, f->length);
    handles.push_back(AllgatherIntoAsync(f->shard, f->full,
                                         "sharded3.gather." + f->label + "." + tag,
                                         options_.process_set_id));
  }
  for (size_t k = 0; k < handles.size(); ++k) {
    Flat& f = *u.flats[k];
    ::torch::Tensor got = handles[k].Synchronize();
    if (got.data_ptr() != f.full.data_ptr()) f.full.copy_(got);
    for (size_t i = 0; i < f.params.size(); ++i) f.Point(f.full, i);
  }
  u.gathered = true;
}

void ShardedModel::Free(Unit& u) {
  if (!u.gathered || size_ == 1) return;
  for (auto& f : u.flats) {
    for (::torch::Tensor& p : f->params) p.set_data(f->empty);
    ResizeStorage(f->full, 0);
  }
  u.gathered = false;
}

void ShardedModel::Settle() {
  for (::torch::Tensor& p : to_clear_) p.mutable_grad() = ::torch::Tensor();
  to_clear_.clear();
  for (Unit* u : to_free_) Free(*u);
  to_free_.clear();
}

::torch::Tensor ShardedModel::Run(const ::torch::nn::Module& module,
                                  const std::function<::torch::Tensor()>& forward) {
  Unit& u = UnitOf(module);
  Settle();
  Gather(u, "f");
  ::torch::Tensor out;
  try {
    out = forward();
  } catch (...) {
    Free(u);
    throw;
  }
  if (out.defined() && out.requires_grad() && !u.flats.empty()) {
    Unit* up = &u;
    out.register_hook([this, up](const ::torch::Tensor&) { BeforeBackward(*up); });
  }
  Free(u);
  return out;
}

void ShardedModel::BeforeBackward(Unit& u) {
  Settle();
  if (u.awaiting < 0) {
    u.awaiting = 0;
    for (auto& f : u.flats) u.awaiting += static_cast<int>(f->params.size());
  }
  Gather(u, "b");
}

// Runs inside backward(), before autograd accumulates `grad` into the parameter's grad().
void ShardedModel::OnGradient(Flat& f, size_t i, const ::torch::Tensor& grad) {
  Settle();
  if (f.passes[i] >= options_.backward_passes_per_step) {
    Throw(Status::FailedPrecondition(
        "Gradients were computed more than backward_passes_per_step times before call to "
        "step(). Increase backward_passes_per_step to accumulate gradients locally."));
  }
  ++f.passes[i];
  in_flight_ = true;
  ::torch::NoGradGuard no_grad;
  if (f.arrived[i]) Launch(f);  // a second pass before the flat's other gradients arrived
  if (!f.grad_full.defined()) f.grad_full = ::torch::empty({f.length}, f.shard.options());
  f.View(f.grad_full, i).copy_(grad.reshape({-1}));
  f.arrived[i] = 1;
  if (++f.arrived_count == static_cast<int>(f.params.size())) Launch(f);
  to_clear_.push_back(f.params[i]);  // (autograd sets its grad() once this hook returns)
  Unit& u = *units_[f.unit];
  if (u.awaiting > 0 && --u.awaiting == 0) {
    // Every gradient of the unit is in: its parameters are not needed again in this backward
    // (freed at the next hook, once autograd has accumulated this last one).
    u.awaiting = -1;
    to_free_.push_back(&u);
  }
}

void ShardedModel::Launch(Flat& f) {
  ::torch::NoGradGuard no_grad;
  if (!f.grad_full.defined()) f.grad_full = ::torch::zeros({f.length}, f.shard.options());
  for (size_t i = 0; i < f.params.size(); ++i) {
    if (!f.arrived[i]) f.View(f.grad_full, i).zero_();  // no gradient in this pass
  }
  ReduceOptions o;
  o.op = options_.op;
  o.process_set_id = options_.process_set_id;
  f.handles.push_back(ReducescatterAsync(
      f.grad_full, "sharded3.reduce." + f.label + "." + std::to_string(f.launched), o));
  f.grad_full = ::torch::Tensor();  // the handle keeps it until the reduction is done
  ++f.launched;
  f.arrived_count = 0;
  std::fill(f.arrived.begin(), f.arrived.end(), 0);
  Drain(false);
}

// Takes the reductions that have completed (all: wait) into the slices' gradients, which frees
// their packed inputs.
void ShardedModel::Drain(bool wait) {
  ::torch::NoGradGuard no_grad;
  for (Flat* f : flats_) {
    while (!f->handles.empty() && (wait || f->handles.front().Poll())) {
      ::torch::Tensor out = f->handles.front().Synchronize();
      f->handles.erase(f->handles.begin());
      if (f->shard.grad().defined()) {
        f->shard.grad().add_(out);
      } else {
        f->shard.mutable_grad() = out;
      }
    }
  }
}

void ShardedModel::FinishReductions() {
  Settle();
  for (Flat* f : flats_) {
    if (f->arrived_count > 0 || f->launched == 0) Launch(*f);
    while (f->launched < options_.backward_passes_per_step) Launch(*f);
  }
  Drain(true);
  for (Flat* f : flats_) {
    f->launched = 0;
    std::fill(f->passes.begin(), f->passes.end(), 0);
  }
  for (auto& u : units_) {
    u->awaiting = -1;
    Free(*u);
  }
  in_flight_ = false;
}

std::vector<::torch::Tensor> ShardedModel::Slices() const {
  std::vector<::torch::Tensor> out;
  for (Flat* f : flats_) out.push_back(f->shard);
  return out;
}

void ShardedModel::ZeroGrad() {
  if (in_flight_) {
    Throw(Status::FailedPrecondition(
        "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
        "or optimizer.synchronize(). This is prohibited as it can cause a race condition."));
  }
  Settle();
  for (Flat* f : flats_) {
    f->shard.mutable_grad() = ::torch::Tensor();
    for (::torch::Tensor& p : f->params) p.mutable_grad() = ::torch::Tensor();
  }
}

bool ShardedModel::ReductionsInFlight() const { return in_flight_; }

std::vector<std::pair<std::string, ::torch::Tensor>> ShardedModel::FullParameters() {
  Settle();
  std::vector<std::pair<std::string, ::torch::Tensor>> out;
  for (auto& u : units_) {
    const bool was = u->gathered;
    Gather(*u, "s");
    for (auto& f : u->flats) {
      for (size_t i = 0; i < f->params.size(); ++i) {
        out.emplace_back(f->names[i], f->params[i].detach().clone());
      }
    }
    if (!was) Free(*u);
  }
  return out;
}

int64_t ShardedModel::ParameterBytes() const {
  int64_t bytes = 0;
  for (Flat* f : flats_) {
    bytes += Bytes(f->shard);
    if (f->full.defined()) bytes += static_cast<int64_t>(f->full.storage().nbytes());
  }
  return bytes;
}

int64_t ShardedModel::GradientBytes() const {
  int64_t bytes = 0;
  for (Flat* f : flats_) {
    bytes += Bytes(f->shard.grad()) + Bytes(f->grad_full);
    for (const ::torch::Tensor& p : f->params) bytes += Bytes(p.grad());
  }
  return bytes;
}

// ---- FullyShardedOptimizer ------------------------------------------------------------------

FullyShardedOptimizer::FullyShardedOptimizer(ShardedModel& model,
                                             const ShardedOptimizer::Factory& make_optimizer)
    : model_(model) {
  std::vector<::torch::Tensor> slices = model_.Slices();
  if (slices.empty()) {
    Throw(Status::InvalidArgument("FullyShardedOptimizer: the model has no trainable "
                                  "parameter"));
  }
  optimizer_ = make_optimizer(slices);
}

void FullyShardedOptimizer::Synchronize(CallSite where) {
  CallSiteScope at(where);
  if (reduced_ && !model_.ReductionsInFlight()) return;
  model_.FinishReductions();
  reduced_ = true;
}

void FullyShardedOptimizer::Step(CallSite where) {
  CallSiteScope at(where);
  Synchronize(where);
  optimizer_->step();  // nothing gathered: the next forward gathers what it uses
  reduced_ = false;
}

void FullyShardedOptimizer::ZeroGrad() {
  model_.ZeroGrad();
  reduced_ = false;
}

double FullyShardedOptimizer::ClipGradNorm(double max_norm, double norm_type) {
  Synchronize();
  return internal::ClipSlicesByGlobalNorm(model_.Slices(), max_norm, norm_type,
                                          model_.options().process_set_id, "sharded3.clip");
}

ShardedOptimizer::HeldBytes FullyShardedOptimizer::Held() const {
  ShardedOptimizer::HeldBytes held;
  held.parameters = model_.ParameterBytes();
  held.gradients = model_.GradientBytes();
  held.optimizer_state = internal::OptimizerStateBytes(*optimizer_);
  return held;
}

}  // namespace torch
}  // namespace hvd
