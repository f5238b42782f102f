// horovod_cpp — Apache-2.0
#include "bindings/torch.h"

#include <cstring>
#include <iostream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace hvd {
namespace torch {

// Friend of TorchHandle: fills its private fields.
struct HandleAccess {
  static TorchHandle Make(Handle h, TorchHandle::Kind kind, std::vector<::torch::Tensor> keep,
                          ::torch::Tensor result) {
    TorchHandle t;
    t.handle_ = h;
    t.kind_ = kind;
    t.keep_alive_ = std::move(keep);
    t.result_ = std::move(result);
    return t;
  }
};

namespace {

[[noreturn]] void Throw(const Status& s) { throw Error(s); }

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
T Get(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

c10::ScalarType ScalarTypeOf(DataType t) {
  switch (t) {
    case DataType::kUInt8:
      return c10::kByte;
    case DataType::kInt8:
      return c10::kChar;
    case DataType::kInt16:
      return c10::kShort;
    case DataType::kInt32:
      return c10::kInt;
    case DataType::kInt64:
      return c10::kLong;
    case DataType::kFloat16:
      return c10::kHalf;
    case DataType::kBFloat16:
      return c10::kBFloat16;
    case DataType::kFloat32:
      return c10::kFloat;
    case DataType::kFloat64:
      return c10::kDouble;
    case DataType::kBool:
      return c10::kBool;
    default:
      Throw(Status::Internal(std::string("no torch dtype for ") + DataTypeName(t)));
  }
}

TensorView View(const ::torch::Tensor& t) {
  if (!t.defined()) Throw(Status::InvalidArgument("an undefined tensor was given"));
  if (!t.is_cpu()) {
    // This API links the CPU LibTorch only (no c10::cuda streams); its results are host tensors.
    Throw(Status::InvalidArgument(
        "the LibTorch C++ API takes CPU tensors (got one on " + t.device().str() +
        "); CUDA tensors go through horovod_cpp.torch in Python or the core C++ API "
        "(hvd::TensorView with device and stream)"));
  }
  return TensorView{t.data_ptr(), DataTypeOf(t.scalar_type()), t.sizes().vec(), kCpuDevice};
}

::torch::Tensor InPlace(::torch::Tensor& t, const char* op) {
  if (!t.is_contiguous()) {
    Throw(Status::InvalidArgument(std::string(op) +
                                  ": the tensor is not contiguous, so it cannot be updated in "
                                  "place; call .contiguous() first"));
  }
  return t.detach();  // same storage; writing it does not touch autograd history
}

AllreduceOptions CoreOptions(const ReduceOptions& o) {
  return AllreduceOptions{o.op, o.prescale_factor, o.postscale_factor, o.process_set_id};
}

// A tensor over runtime-owned memory (no copy); it keeps the memory alive.
::torch::Tensor FromOutput(const Output& o) {
  auto options = ::torch::TensorOptions().dtype(ScalarTypeOf(o.dtype));
  if (NumElements(o.shape) == 0) return ::torch::empty(o.shape, options);
  std::shared_ptr<void> owner = o.data;
  return ::torch::from_blob(
      o.data.get(), o.shape, [owner](void*) mutable { owner.reset(); }, options);
}

}  // namespace

DataType DataTypeOf(c10::ScalarType type) {
  switch (type) {
    case c10::kByte:
      return DataType::kUInt8;
    case c10::kChar:
      return DataType::kInt8;
    case c10::kShort:
      return DataType::kInt16;
    case c10::kInt:
      return DataType::kInt32;
    case c10::kLong:
      return DataType::kInt64;
    case c10::kHalf:
      return DataType::kFloat16;
    case c10::kBFloat16:
      return DataType::kBFloat16;
    case c10::kFloat:
      return DataType::kFloat32;
    case c10::kDouble:
      return DataType::kFloat64;
    case c10::kBool:
      return DataType::kBool;
    default:
      Throw(Status::InvalidArgument(std::string("tensor type ") + c10::toString(type) +
                                    " is not supported; supported: uint8, int8, int16, int32, "
                                    "int64, float16, bfloat16, float32, float64, bool"));
  }
}

void Init() { Check(hvd::Init()); }
void Shutdown() { Check(hvd::Shutdown()); }
int Rank() { return Get(hvd::Rank()); }
int Size() { return Get(hvd::Size()); }
int LocalRank() { return Get(hvd::LocalRank()); }
int LocalSize() { return Get(hvd::LocalSize()); }

// ---- handles --------------------------------------------------------------------------------

bool TorchHandle::Poll() const { return Get(hvd::Poll(handle_)); }

::torch::Tensor TorchHandle::Synchronize() {
  if (kind_ == Kind::kAlltoall) return SynchronizeAlltoall().first;
  const Handle h = handle_;
  handle_ = 0;
  if (kind_ == Kind::kTensor) {
    Status s = hvd::Wait(h);
    keep_alive_.clear();
    Check(s);
    return result_;
  }
  Result<std::vector<Output>> out = WaitOutputs(h);
  keep_alive_.clear();
  return FromOutput(Get(std::move(out)).front());
}

std::pair<::torch::Tensor, std::vector<int64_t>> TorchHandle::SynchronizeAlltoall() {
  const Handle h = handle_;
  handle_ = 0;
  Result<std::vector<Output>> out = WaitOutputs(h);
  keep_alive_.clear();
  Output o = Get(std::move(out)).front();
  return {FromOutput(o), o.received_splits};
}

// ---- collectives ----------------------------------------------------------------------------

TorchHandle AllreduceAsync(const ::torch::Tensor& tensor, const std::string& name,
                           const ReduceOptions& options) {
  ::torch::Tensor in = tensor.detach().contiguous();
  ::torch::Tensor out = ::torch::empty_like(in);
  Handle h = Get(EnqueueAllreduce(View(in), View(out), name, CoreOptions(options)));
  return HandleAccess::Make(h, TorchHandle::Kind::kTensor, {in, out}, out);
}

TorchHandle AllreduceAsync_(::torch::Tensor& tensor, const std::string& name,
                            const ReduceOptions& options) {
  ::torch::Tensor t = InPlace(tensor, "allreduce_");
  Handle h = Get(EnqueueAllreduce(View(t), View(t), name, CoreOptions(options)));
  return HandleAccess::Make(h, TorchHandle::Kind::kTensor, {t}, tensor);
}

TorchHandle AllgatherAsync(const ::torch::Tensor& tensor, const std::string& name,
                           int32_t process_set_id) {
  ::torch::Tensor in = tensor.detach().contiguous();
  Handle h = Get(EnqueueAllgather(View(in), name, process_set_id));
  return HandleAccess::Make(h, TorchHandle::Kind::kOutput, {in}, {});
}

TorchHandle BroadcastAsync(const ::torch::Tensor& tensor, int root_rank, const std::string& name,
                           int32_t process_set_id) {
  ::torch::Tensor in = tensor.detach().contiguous();
  ::torch::Tensor out = ::torch::empty_like(in);
  Handle h = Get(EnqueueBroadcast(View(in), View(out), root_rank, name, process_set_id));
  return HandleAccess::Make(h, TorchHandle::Kind::kTensor, {in, out}, out);
}

TorchHandle BroadcastAsync_(::torch::Tensor& tensor, int root_rank, const std::string& name,
                            int32_t process_set_id) {
  ::torch::Tensor t = InPlace(tensor, "broadcast_");
  Handle h = Get(EnqueueBroadcast(View(t), View(t), root_rank, name, process_set_id));
  return HandleAccess::Make(h, TorchHandle::Kind::kTensor, {t}, tensor);
}

TorchHandle AlltoallAsync(const ::torch::Tensor& tensor, const std::vector<int64_t>& splits,
                          const std::string& name, int32_t process_set_id) {
  ::torch::Tensor in = tensor.detach().contiguous();
  Handle h = Get(EnqueueAlltoall(View(in), splits, name, process_set_id));
  return HandleAccess::Make(h, TorchHandle::Kind::kAlltoall, {in}, {});
}

TorchHandle ReducescatterAsync(const ::torch::Tensor& tensor, const std::string& name,
                               const ReduceOptions& options) {
  ::torch::Tensor in = tensor.detach().contiguous();
  TensorShape shape = Get(ReducescatterShape(in.sizes().vec(), options.process_set_id));
  ::torch::Tensor out = ::torch::empty(shape, in.options());
  Handle h = Get(EnqueueReducescatter(View(in), View(out), name, CoreOptions(options)));
  return HandleAccess::Make(h, TorchHandle::Kind::kTensor, {in, out}, out);
}

::torch::Tensor Allreduce(const ::torch::Tensor& tensor, const std::string& name,
                          const ReduceOptions& options) {
  return AllreduceAsync(tensor, name, options).Synchronize();
}

void Allreduce_(::torch::Tensor& tensor, const std::string& name, const ReduceOptions& options) {
  AllreduceAsync_(tensor, name, options).Synchronize();
}

::torch::Tensor Allgather(const ::torch::Tensor& tensor, const std::string& name,
                          int32_t process_set_id) {
  return AllgatherAsync(tensor, name, process_set_id).Synchronize();
}

::torch::Tensor Broadcast(const ::torch::Tensor& tensor, int root_rank, const std::string& name,
                          int32_t process_set_id) {
  return BroadcastAsync(tensor, root_rank, name, process_set_id).Synchronize();
}

void Broadcast_(::torch::Tensor& tensor, int root_rank, const std::string& name,
                int32_t process_set_id) {
  BroadcastAsync_(tensor, root_rank, name, process_set_id).Synchronize();
}

std::pair<::torch::Tensor, std::vector<int64_t>> Alltoall(const ::torch::Tensor& tensor,
                                                          const std::vector<int64_t>& splits,
                                                          const std::string& name,
                                                          int32_t process_set_id) {
  return AlltoallAsync(tensor, splits, name, process_set_id).SynchronizeAlltoall();
}

::torch::Tensor Reducescatter(const ::torch::Tensor& tensor, const std::string& name,
                              const ReduceOptions& options) {
  return ReducescatterAsync(tensor, name, options).Synchronize();
}

// ---- training helpers -----------------------------------------------------------------------

void BroadcastParameters(const ::torch::nn::Module& module, int root_rank) {
  std::vector<TorchHandle> handles;
  auto broadcast_all = [&](const ::torch::OrderedDict<std::string, ::torch::Tensor>& dict,
                           const char* kind) {
    for (const auto& item : dict) {
      ::torch::Tensor t = item.value();
      handles.push_back(BroadcastAsync_(t, root_rank, std::string(kind) + item.key()));
    }
  };
  broadcast_all(module.named_parameters(), "broadcast.parameter.");
  broadcast_all(module.named_buffers(), "broadcast.buffer.");
  for (TorchHandle& h : handles) h.Synchronize();
}

void BroadcastOptimizerState(::torch::optim::Optimizer& optimizer, int root_rank) {
  // The optimizer's own serialization carries every parameter's state whatever the optimizer
  // type; LibTorch's load() restores only that state, so every group's options (learning
  // rate, betas, ...) travel beside it through their own virtual serialize().
  const size_t groups = optimizer.param_groups().size();
  std::string bytes;
  if (Rank() == root_rank) {
    ::torch::serialize::OutputArchive archive;
    ::torch::serialize::OutputArchive state(archive.compilation_unit());
    optimizer.save(state);
    archive.write("state", state);
    for (size_t g = 0; g < groups; ++g) {
      ::torch::serialize::OutputArchive options(archive.compilation_unit());
      optimizer.param_groups()[g].options().serialize(options);
      archive.write("group." + std::to_string(g), options);
    }
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  ::torch::Tensor size = ::torch::tensor({static_cast<int64_t>(bytes.size())}, ::torch::kLong);
  Broadcast_(size, root_rank, "broadcast.optimizer_state.size");
  ::torch::Tensor payload = ::torch::empty({size.item<int64_t>()}, ::torch::kByte);
  if (Rank() == root_rank) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
  Broadcast_(payload, root_rank, "broadcast.optimizer_state");
  if (Rank() == root_rank) return;
  try {
    std::istringstream in(std::string(static_cast<const char*>(payload.data_ptr()),
                                      static_cast<size_t>(payload.numel())));
    ::torch::serialize::InputArchive archive;
    archive.load_from(in);
    ::torch::serialize::InputArchive state;
    archive.read("state", state);
    optimizer.load(state);
    for (size_t g = 0; g < groups; ++g) {
      ::torch::serialize::InputArchive options;
      archive.read("group." + std::to_string(g), options);
      optimizer.param_groups()[g].options().serialize(options);
    }
  } catch (const c10::Error& e) {
    Throw(Status::FailedPrecondition(
        "broadcast_optimizer_state: rank " + std::to_string(root_rank) +
        "'s optimizer state does not fit this rank's optimizer (same optimizer type and "
        "parameter groups on every rank?): " +
        e.what_without_backtrace()));
  }
}

// ---- DistributedOptimizer -------------------------------------------------------------------

struct DistributedOptimizer::Param {
  std::string name;
  ::torch::Tensor tensor;
  unsigned hook = 0;
  bool hooked = false;
  int passes = 0;      // backward passes since the last Synchronize
  TorchHandle handle;  // the allreduce in flight
};

DistributedOptimizer::DistributedOptimizer(
    std::shared_ptr<::torch::optim::Optimizer> optimizer,
    const ::torch::OrderedDict<std::string, ::torch::Tensor>& named_parameters,
    DistributedOptimizerOptions options)
    : optimizer_(std::move(optimizer)), options_(options) {
  if (options_.backward_passes_per_step <= 0) {
    Throw(Status::InvalidArgument("backward_passes_per_step must be > 0"));
  }
  if (options_.gradient_predivide_factor != 1.0 && options_.op != ReduceOp::kAverage) {
    Throw(Status::InvalidArgument("gradient_predivide_factor not supported with op != Average"));
  }
  std::unordered_map<const void*, std::string> names;
  std::unordered_set<std::string> seen;
  for (const auto& item : named_parameters) {
    if (!seen.insert(item.key()).second) {
      Throw(
          Status::InvalidArgument("Parameter names in named_parameters must be unique. Found "
                                  "duplicates: " +
                                  item.key()));
    }
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  for (size_t g = 0; g < optimizer_->param_groups().size(); ++g) {
    const auto& params = optimizer_->param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto p = std::make_unique<Param>();
      p->tensor = params[i];
      auto it = names.find(params[i].unsafeGetTensorImpl());
      if (it != names.end()) {
        p->name = "allreduce." + it->second;
      } else if (named_parameters.is_empty()) {
        p->name = "allreduce.noname." + std::to_string(g) + "." + std::to_string(i);
      } else {
        Throw(
            Status::InvalidArgument("named_parameters was specified, but one or more model "
                                    "parameters were not named (group " +
                                    std::to_string(g) + ", index " + std::to_string(i) + ")"));
      }
      params_.push_back(std::move(p));
    }
  }
  Result<ProcessSetInfo> set = GetProcessSet(options_.process_set_id);
  if (!set.ok()) Throw(set.status());
  if (!set->included || set->size <= 1) return;  // nothing to average with
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    if (!p.tensor.requires_grad()) continue;
    p.hook =
        p.tensor.register_hook([this, i](const ::torch::Tensor& grad) { OnGradient(i, grad); });
    p.hooked = true;
  }
}

DistributedOptimizer::~DistributedOptimizer() {
  for (auto& p : params_) {
    if (p->hooked) p->tensor.remove_hook(p->hook);
    if (p->handle.valid()) {
      try {
        p->handle.Synchronize();  // the tensors must outlive the operation
      } catch (const Error&) {
      }
    }
  }
}

// Runs inside backward(), before autograd adds `grad` into p.grad: the gradient to reduce is
// what previous passes accumulated plus this one. Step() then overwrites p.grad with the result.
void DistributedOptimizer::OnGradient(size_t index, const ::torch::Tensor& grad) {
  Param& p = *params_[index];
  if (p.passes >= options_.backward_passes_per_step) {
    Throw(Status::FailedPrecondition(
        "Gradients were computed more than backward_passes_per_step times before call to "
        "step(). Increase backward_passes_per_step to accumulate gradients locally."));
  }
  if (++p.passes < options_.backward_passes_per_step) return;  // accumulate locally
  const ::torch::Tensor& held = p.tensor.grad();
  Submit(p, held.defined() ? (held + grad).detach() : grad.detach().clone());
}

void DistributedOptimizer::Submit(Param& p, ::torch::Tensor gradient) {
  ReduceOptions o;
  o.op = options_.op;
  o.process_set_id = options_.process_set_id;
  if (options_.op == ReduceOp::kAverage) {
    o.prescale_factor = 1.0 / options_.gradient_predivide_factor;
    o.postscale_factor = options_.gradient_predivide_factor;
  }
  p.handle = AllreduceAsync_(gradient, p.name, o);
}

void DistributedOptimizer::Synchronize() {
  Result<ProcessSetInfo> set = GetProcessSet(options_.process_set_id);
  if (!set.ok()) Throw(set.status());
  if (set->included && set->size > 1) {
    // Parameters whose gradient was not (fully) computed on this rank still take part, so
    // every rank submits the same tensors.
    for (auto& p : params_) {
      if (!p->hooked || p->handle.valid()) continue;
      const ::torch::Tensor& held = p->tensor.grad();
      Submit(*p, held.defined() ? held.detach().clone() : ::torch::zeros_like(p->tensor));
    }
    for (auto& p : params_) {
      if (!p->handle.valid()) continue;
      ::torch::Tensor reduced = p->handle.Synchronize();
      ::torch::NoGradGuard no_grad;
      if (p->tensor.grad().defined()) {
        p->tensor.mutable_grad().copy_(reduced);
      } else {
        p->tensor.mutable_grad() = reduced;
      }
      p->passes = 0;
    }
  }
  synchronized_ = true;
}

void DistributedOptimizer::Step() {
  if (should_synchronize_) {
    if (synchronized_) {
      std::cerr << "horovod_cpp: optimizer.step() called without optimizer.skip_synchronize() "
                   "context after optimizer.synchronize(). This can cause training slowdown. "
                   "You may want to consider using optimizer.skip_synchronize() context if you "
                   "use optimizer.synchronize() in your code.\n";
    }
    Synchronize();
  }
  synchronized_ = false;
  optimizer_->step();
}

void DistributedOptimizer::ZeroGrad() {
  for (auto& p : params_) {
    if (p->handle.valid() || p->passes > 0) {
      Throw(Status::FailedPrecondition(
          "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
          "or optimizer.synchronize(). This is prohibited as it can cause a race condition."));
    }
  }
  optimizer_->zero_grad();
}

}  // namespace torch
}  // namespace hvd
