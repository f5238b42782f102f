// horovod_cpp — Apache-2.0
#include "bindings/torch.h"
#include "bindings/torch_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <ATen/CPUGeneratorImpl.h>

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

using internal::Bytes;
using internal::Check;
using internal::Get;
using internal::ShardRange;
using internal::Throw;

namespace {

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

// |t|^2 in float64 (the framework's own measurement, for gradients the core sees compressed).
double SquaredNorm(const ::torch::Tensor& t) {
  ::torch::NoGradGuard no_grad;
  return t.detach().to(::torch::kDouble).square().sum().item<double>();
}

AllreduceOptions CoreOptions(const ReduceOptions& o) {
  return AllreduceOptions{o.op, o.prescale_factor, o.postscale_factor, o.process_set_id,
                          o.stats_group};
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
  Output o = Get(std::move(out)).front();
  // (Into a given output: the core wrote it, unless its size did not match the result's.)
  if (result_.defined() && o.data.get() == result_.data_ptr()) return result_;
  return FromOutput(o);
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

TorchHandle AllgatherIntoAsync(const ::torch::Tensor& tensor, ::torch::Tensor& output,
                               const std::string& name, int32_t process_set_id) {
  ::torch::Tensor in = tensor.detach().contiguous();
  ::torch::Tensor out = InPlace(output, "allgather into");
  Handle h = Get(EnqueueAllgatherInto(View(in), View(out), name, process_set_id));
  return HandleAccess::Make(h, TorchHandle::Kind::kOutput, {in, out}, output);
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
  std::string name;  // "allreduce." + key
  std::string key;   // the name given (PowerSGD's seeds use it, as Python does)
  ::torch::Tensor tensor;
  unsigned hook = 0;
  bool hooked = false;
  int passes = 0;      // backward passes since the last Synchronize
  TorchHandle handle;  // the allreduce in flight
  ::torch::ScalarType sent_as = ::torch::kFloat;  // fp16 / bf16: the dtype to restore
  bool cast = false;
  // PowerSGD: 0 none in flight, 1 P's allreduce, 2 Q's.
  int low_rank_stage = 0;
  // M (n x m: the gradient + error); P and Q held transposed (r x n, r x m: the products then
  // read M row by row, several times faster); Q^T kept for warm start.
  ::torch::Tensor matrix, pt, qt, error;
};

uint64_t PowerSGDQSeed(int64_t random_seed, const std::string& name, int64_t step) {
  const std::string text =
      std::to_string(random_seed) + "/" + name + "/" + std::to_string(step);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h & 0x7FFFFFFFFFFFFFFFULL;
}

namespace {

// Orthonormal rows (r x n: the columns of P or Q), in place (Gram-Schmidt in float32 at
// least); a zero row stays zero.
void OrthogonalizeRows(::torch::Tensor& rows, double epsilon) {
  ::torch::Tensor work = (rows.scalar_type() == ::torch::kFloat ||
                          rows.scalar_type() == ::torch::kDouble)
                             ? rows
                             : rows.to(::torch::kFloat);
  const int64_t count = work.size(0);
  for (int64_t i = 0; i < count; ++i) {
    ::torch::Tensor row = work[i];
    const double norm = row.norm().item<double>();
    if (norm == 0.0) continue;
    row.div_(norm + epsilon);
    if (i + 1 < count) {
      ::torch::Tensor rest = work.narrow(0, i + 1, count - i - 1);
      rest.sub_(::torch::outer(::torch::mv(rest, row), row));
    }
  }
  if (!work.is_same(rows)) rows.copy_(work);
}

// P Q^T (n x m) from P^T (r x n) and Q^T (r x m): for r <= 4 (r <= 2 on fewer than 512 rows)
// a sum of r outer products, which the BLAS' general product of so thin a pair ran 2-5x slower
// than (docs/compression.md); the same rule as horovod_cpp/torch/powersgd.py's.
::torch::Tensor LowRankProduct(const ::torch::Tensor& pt, const ::torch::Tensor& qt) {
  const int64_t r = pt.size(0), n = pt.size(1), m = qt.size(1);
  if (!((r <= 4 && n >= 512) || (r <= 2 && n * m >= 65536))) return ::torch::mm(pt.t(), qt);
  ::torch::Tensor out = ::torch::outer(pt[0], qt[0]);
  for (int64_t i = 1; i < r; ++i) out.addr_(pt[i], qt[i]);
  return out;
}

// Whether PowerSGD takes the core's fused passes (hvd::LowRankStart/Finish) for this gradient:
// float32 on the CPU at rank <= 4, as the Python optimizer (horovod_cpp/torch/powersgd.py).
bool FusedLowRank(const ::torch::Tensor& gradient, int64_t r) {
  return gradient.scalar_type() == ::torch::kFloat && gradient.device().is_cpu() && r <= 4;
}

// (n, m, r) of a gradient's matrix view; n = 0 for fewer than 2 dimensions.
std::tuple<int64_t, int64_t, int64_t> MatrixRank(const ::torch::Tensor& t, int rank) {
  if (t.dim() < 2) return {0, 0, 0};
  const int64_t n = t.size(0), m = t.numel() / std::max<int64_t>(n, 1);
  return {n, m, std::min<int64_t>({n, m, rank})};
}

}  // namespace

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
  if (options_.stats_group >= 0 && options_.compression == Compression::kPowerSGD) {
    Throw(Status::InvalidArgument("stats_group (adaptive training) measures the exact "
                                  "gradients; it does not work with PowerSGD compression"));
  }
  if (options_.compression == Compression::kPowerSGD) {
    const PowerSGDOptions& o = options_.powersgd;
    if (options_.op != ReduceOp::kAverage) {
      Throw(Status::InvalidArgument("PowerSGD averages gradients: op must be Average"));
    }
    if (o.matrix_approximation_rank < 1 || o.start_powersgd_iter < 0 ||
        o.min_compression_rate < 0 || o.orthogonalization_epsilon < 0) {
      Throw(Status::InvalidArgument(
          "PowerSGDOptions: matrix_approximation_rank must be >= 1, start_powersgd_iter, "
          "min_compression_rate and orthogonalization_epsilon >= 0"));
    }
    if (o.probe_block < 1 || o.probe_blocks < 1 || o.probe_interval < 0 ||
        o.probe_interval_max < o.probe_interval) {
      Throw(Status::InvalidArgument(
          "PowerSGDOptions: probe_block and probe_blocks must be >= 1, and "
          "0 <= probe_interval <= probe_interval_max"));
    }
    next_probe_ = o.start_powersgd_iter;
    probe_interval_ = o.probe_interval;
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
        p->key = it->second;
        p->name = "allreduce." + it->second;
      } else if (named_parameters.is_empty()) {
        p->key = "noname." + std::to_string(g) + "." + std::to_string(i);
        p->name = "allreduce." + p->key;
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
  if (q_group_.valid()) {
    try {
      q_group_.Synchronize();
    } catch (const Error&) {
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

std::pair<bool, bool> DistributedOptimizer::PowerSGDMode() const {
  if (options_.compression != Compression::kPowerSGD) return {false, false};
  const PowerSGDOptions& o = options_.powersgd;
  if (powersgd_iter_ < o.start_powersgd_iter) return {false, false};
  if (!o.adaptive) return {true, false};
  const int64_t k = powersgd_iter_ - next_probe_;
  if (k >= 0 && k < ProbeLength()) {
    return {(k / o.probe_block) % 2 == 1, k % o.probe_block > 0};  // exact blocks first
  }
  return {compressing_, false};
}

void DistributedOptimizer::PowerSGDStepDone() {
  const PowerSGDOptions& o = options_.powersgd;
  const auto [compressed, timed] = PowerSGDMode();
  const double now =
      o.clock ? o.clock()
              : std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  if (timed && last_step_end_ >= 0) probe_times_[compressed].push_back(now - last_step_end_);
  last_step_end_ = now;
  if (o.adaptive && powersgd_iter_ >= o.start_powersgd_iter &&
      powersgd_iter_ - next_probe_ == ProbeLength() - 1) {
    // The median of each kind on each rank, the slowest rank's (a maximum: the same bits on
    // every rank whatever the reduction order), one decision everywhere.
    auto median = [](std::vector<double> t) {
      if (t.empty()) return 0.0;
      std::sort(t.begin(), t.end());
      const size_t h = t.size() / 2;
      return t.size() % 2 ? t[h] : (t[h - 1] + t[h]) / 2;
    };
    ::torch::Tensor medians = ::torch::tensor(
        {median(probe_times_[true]), median(probe_times_[false])}, ::torch::kDouble);
    ReduceOptions max;
    max.op = ReduceOp::kMax;
    max.process_set_id = options_.process_set_id;
    ::torch::Tensor slowest = Allreduce(medians, "powersgd.probe", max);
    const double compressed_s = slowest[0].item<double>(), exact_s = slowest[1].item<double>();
    const bool compress = compressed_s < exact_s;
    probe_interval_ = compress == compressing_ ? std::min(2 * probe_interval_,
                                                          o.probe_interval_max)
                                               : o.probe_interval;
    compressing_ = compress;
    next_probe_ = powersgd_iter_ + 1 + probe_interval_;
    probe_times_[0].clear();
    probe_times_[1].clear();
    decisions_.push_back({powersgd_iter_ + 1, 1e3 * compressed_s, 1e3 * exact_s, compress});
  }
}

bool DistributedOptimizer::Compresses(const Param& p) const {
  if (!PowerSGDMode().first) return false;
  const PowerSGDOptions& o = options_.powersgd;
  auto [n, m, r] = MatrixRank(p.tensor, o.matrix_approximation_rank);
  return n > 0 && static_cast<double>(n) * m > static_cast<double>(n + m) * r *
                                                   o.min_compression_rate;
}

void DistributedOptimizer::StartLowRank(Param& p, ::torch::Tensor gradient) {
  const PowerSGDOptions& o = options_.powersgd;
  ::torch::NoGradGuard no_grad;
  auto [n, m, r] = MatrixRank(gradient, o.matrix_approximation_rank);
  p.matrix = gradient.contiguous().view({n, m});
  ::torch::Tensor error;
  if (o.use_error_feedback && p.error.defined() && p.error.sizes() == p.matrix.sizes()) {
    error = p.error;
  }
  const bool fused = FusedLowRank(gradient, r);
  if (error.defined() && !fused) p.matrix.add_(error);
  if (!o.warm_start || !p.qt.defined() || p.qt.size(1) != m || p.qt.size(0) != r) {
    auto gen = at::detail::createCPUGenerator(
        PowerSGDQSeed(o.random_seed, p.key, powersgd_iter_));
    p.qt = at::randn({m, r}, gen, ::torch::TensorOptions().dtype(::torch::kFloat))
               .to(gradient.scalar_type())
               .t()
               .contiguous();
  }
  if (fused) {
    LowRankOrthogonalize(p.qt.data_ptr<float>(), r, m, o.orthogonalization_epsilon);
    // M += E and P^T = Q^T M^T in one pass over M (hvd::LowRankStart)
    if (error.defined()) error = error.to(::torch::kFloat).contiguous();
    p.pt = ::torch::empty({r, n}, ::torch::TensorOptions().dtype(::torch::kFloat));
    LowRankStart(p.matrix.data_ptr<float>(), error.defined() ? error.data_ptr<float>() : nullptr,
                 p.qt.data_ptr<float>(), r, n, m, p.pt.data_ptr<float>(), at::get_num_threads());
  } else {
    OrthogonalizeRows(p.qt, o.orthogonalization_epsilon);
    p.pt = ::torch::mm(p.qt, p.matrix.t());  // (M Q)^T
  }
  ReduceOptions sum;
  sum.op = ReduceOp::kSum;
  sum.process_set_id = options_.process_set_id;
  p.handle = AllreduceAsync_(p.pt, "powersgd.P." + p.key, sum);
  p.low_rank_stage = 1;
}

void DistributedOptimizer::StartQReductions() {
  ::torch::NoGradGuard no_grad;
  std::vector<::torch::Tensor> qts;
  std::vector<TensorView> views;
  std::string first;
  for (auto& p : params_) {
    if (p->low_rank_stage != 1) continue;
    p->pt = p->handle.Synchronize();
    if (FusedLowRank(p->matrix, p->pt.size(0))) {
      LowRankOrthogonalize(p->pt.data_ptr<float>(), p->pt.size(0), p->pt.size(1),
                           options_.powersgd.orthogonalization_epsilon);
    } else {
      OrthogonalizeRows(p->pt, options_.powersgd.orthogonalization_epsilon);
    }
    p->qt = ::torch::mm(p->pt, p->matrix);  // (M^T P)^T
    p->low_rank_stage = 2;
    if (first.empty()) first = p->key;
    qts.push_back(p->qt);
    views.push_back(View(p->qt));
  }
  if (qts.empty()) return;
  ReduceOptions average;
  average.op = ReduceOp::kAverage;
  average.process_set_id = options_.process_set_id;
  const std::string name =
      "powersgd.Q." + first + "+" + std::to_string(static_cast<int64_t>(qts.size()) - 1);
  Handle h = Get(EnqueueGroupedAllreduce(views, views, name, CoreOptions(average)));
  q_group_ = HandleAccess::Make(h, TorchHandle::Kind::kTensor, std::move(qts), {});
}

::torch::Tensor DistributedOptimizer::FinishLowRank(Param& p) {
  if (p.low_rank_stage == 1) StartQReductions();
  if (q_group_.valid()) q_group_.Synchronize();  // every Q of the step, reduced in place
  ::torch::NoGradGuard no_grad;
  const bool keep_error = options_.powersgd.use_error_feedback;
  ::torch::Tensor approx;
  if (FusedLowRank(p.matrix, p.pt.size(0))) {
    // P Q^T and M - P Q^T in one pass (hvd::LowRankFinish): the gradient into the previous
    // error's buffer (read by StartLowRank, free since), the new error in M's own memory.
    const int64_t r = p.pt.size(0), n = p.matrix.size(0), m = p.matrix.size(1);
    approx = p.matrix;
    if (keep_error) {
      approx = p.error;
      if (!approx.defined() || approx.scalar_type() != ::torch::kFloat ||
          !approx.is_contiguous() || approx.numel() != n * m ||
          approx.data_ptr() == p.matrix.data_ptr()) {
        approx = ::torch::empty({n, m}, ::torch::TensorOptions().dtype(::torch::kFloat));
      }
    }
    LowRankFinish(p.matrix.data_ptr<float>(), p.pt.data_ptr<float>(), p.qt.data_ptr<float>(), r,
                  n, m, approx.data_ptr<float>(), at::get_num_threads());
    if (keep_error) p.error = p.matrix;
  } else {
    approx = LowRankProduct(p.pt, p.qt);
    // The error M - P Q^T, computed in M's own memory (this step's gradient tensor, see
    // Submit's callers), which the error then keeps: no new tensor a step, a pass fewer.
    if (keep_error) p.error = p.matrix.sub_(approx);
  }
  if (!options_.powersgd.warm_start) p.qt = ::torch::Tensor();
  p.low_rank_stage = 0;
  p.matrix = ::torch::Tensor();
  return approx.view(p.tensor.sizes());
}

void DistributedOptimizer::Submit(Param& p, ::torch::Tensor gradient) {
  if (Compresses(p)) {
    StartLowRank(p, std::move(gradient));
    return;
  }
  if (p.error.defined()) {
    // An exact step after compressed ones (the adaptive policy): the error that error
    // feedback kept goes with the gradient, and is dropped. (`gradient` is this step's own
    // tensor.)
    ::torch::NoGradGuard no_grad;
    if (p.error.numel() == gradient.numel()) gradient.add_(p.error.view(gradient.sizes()));
    p.error = ::torch::Tensor();
  }
  p.cast = false;
  if ((options_.compression == Compression::kFP16 ||
       options_.compression == Compression::kBF16) &&
      gradient.is_floating_point()) {
    p.sent_as = gradient.scalar_type();
    p.cast = true;
    if (options_.stats_group >= 0) {  // measured here, before compression
      framework_stats_.local_sq += SquaredNorm(gradient);
      framework_stats_.elements += gradient.numel();
    }
    gradient = gradient.to(options_.compression == Compression::kFP16 ? ::torch::kHalf
                                                                       : ::torch::kBFloat16);
  }
  ReduceOptions o;
  o.op = options_.op;
  o.process_set_id = options_.process_set_id;
  if (options_.op == ReduceOp::kAverage) {
    o.prescale_factor = 1.0 / options_.gradient_predivide_factor;
    o.postscale_factor = options_.gradient_predivide_factor;
  }
  if (options_.stats_group >= 0 && !p.cast) o.stats_group = options_.stats_group;
  p.handle = AllreduceAsync_(gradient, p.name, o);
}

void DistributedOptimizer::Synchronize(CallSite where) {
  CallSiteScope at(where);
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
    // Every compressed gradient's Q allreduce starts, in one group, before any is waited for.
    StartQReductions();
    int64_t before = 0, after = 0;
    for (auto& p : params_) {
      const bool low_rank = p->low_rank_stage != 0;  // (its Q is in the step's group)
      if (!low_rank && !p->handle.valid()) continue;
      ::torch::Tensor reduced = low_rank ? FinishLowRank(*p) : p->handle.Synchronize();
      if (p->cast) {
        reduced = reduced.to(p->sent_as);
        if (options_.stats_group >= 0) {  // after decompression (widening is exact)
          framework_stats_.reduced_sq += SquaredNorm(reduced);
          framework_stats_.tensors += 1;
        }
      }
      before += p->tensor.numel();
      if (low_rank) {
        auto [n, m, r] = MatrixRank(p->tensor, options_.powersgd.matrix_approximation_rank);
        after += (n + m) * r;
      } else {
        after += p->tensor.numel();
      }
      ::torch::NoGradGuard no_grad;
      if (p->tensor.grad().defined()) {
        p->tensor.mutable_grad().copy_(reduced);
      } else {
        p->tensor.mutable_grad() = reduced;
      }
      p->passes = 0;
    }
    if (options_.compression == Compression::kPowerSGD) {
      if (PowerSGDMode().first && after > 0) {
        compression_rate_ = static_cast<double>(before) / static_cast<double>(after);
      }
      PowerSGDStepDone();
      ++powersgd_iter_;
    }
  }
  synchronized_ = true;
}

GradStats DistributedOptimizer::TakeGradStats() {
  GradStats s;
  if (options_.stats_group >= 0) s = Get(hvd::TakeGradStats(options_.process_set_id,
                                                            options_.stats_group));
  s.local_sq += framework_stats_.local_sq;
  s.reduced_sq += framework_stats_.reduced_sq;
  s.elements += framework_stats_.elements;
  s.tensors += framework_stats_.tensors;
  framework_stats_ = GradStats{};
  return s;
}

void DistributedOptimizer::Step(CallSite where) {
  CallSiteScope at(where);
  if (should_synchronize_) {
    if (synchronized_) {
      std::cerr << "horovod_cpp: optimizer.step() called without optimizer.skip_synchronize() "
                   "context after optimizer.synchronize(). This can cause training slowdown. "
                   "You may want to consider using optimizer.skip_synchronize() context if you "
                   "use optimizer.synchronize() in your code.\n";
    }
    Synchronize(where);
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

// ---- ShardedOptimizer ---------------------------------------------------------------------------

struct ShardedOptimizer::Param {
  ::torch::Tensor tensor;
  size_t bucket = 0;
  int64_t offset = 0;
  int passes = 0;         // backward passes since the last Synchronize
  bool arrived = false;   // its gradient is in the bucket's buffer (this pass / step)
  unsigned hook = 0;
};

struct ShardedOptimizer::Bucket {
  size_t index = 0;
  std::vector<size_t> params;  // indices into params_
  int64_t length = 0, start = 0, end = 0;
  ::torch::Tensor flat;       // the parameters
  ::torch::Tensor grad_flat;  // stage 1: persistent; stage 2: the pass being filled
  ::torch::Tensor shard;      // flat[start:end]: what the wrapped optimizer steps
  int arrived = 0;
  int launched = 0;           // reductions started this step
  std::vector<TorchHandle> handles;
};

ShardedOptimizer::ShardedOptimizer(
    const ::torch::OrderedDict<std::string, ::torch::Tensor>& named_parameters,
    Factory make_optimizer, ShardedOptimizerOptions options)
    : options_(options) {
  if (options_.stage != 1 && options_.stage != 2) {
    Throw(Status::InvalidArgument("stage must be 1 (optimizer state sharded) or 2 (gradients "
                                  "too), got " + std::to_string(options_.stage) +
                                  "; stage 3 is ShardedModel with FullyShardedOptimizer"));
  }
  if (options_.backward_passes_per_step <= 0) {
    Throw(Status::InvalidArgument("backward_passes_per_step must be > 0"));
  }
  if (options_.op != ReduceOp::kAverage && options_.op != ReduceOp::kSum) {
    Throw(Status::InvalidArgument("ShardedOptimizer supports op Average and Sum"));
  }
  Result<ProcessSetInfo> set = GetProcessSet(options_.process_set_id);
  if (!set.ok()) Throw(set.status());
  if (!set->included) Throw(Status::InvalidArgument("ShardedOptimizer: this rank is not in the "
                                                    "process set"));
  size_ = set->size;
  rank_ = set->rank;

  // Reverse order (the order backward produces gradients), per dtype, up to the cap.
  std::vector<::torch::Tensor> order;
  for (const auto& item : named_parameters) {
    if (item.value().requires_grad()) order.push_back(item.value());
  }
  std::reverse(order.begin(), order.end());
  std::vector<c10::ScalarType> dtypes;
  for (const auto& t : order) {
    if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) {
      dtypes.push_back(t.scalar_type());
    }
  }
  ::torch::NoGradGuard no_grad;
  std::vector<::torch::Tensor> shards;
  for (c10::ScalarType dtype : dtypes) {
    std::vector<size_t> current;
    int64_t bytes = 0;
    auto close = [&] {
      if (current.empty()) return;
      auto b = std::make_unique<Bucket>();
      b->index = buckets_.size();
      b->params = current;
      for (size_t i : current) {
        params_[i]->bucket = b->index;
        params_[i]->offset = b->length;
        b->length += params_[i]->tensor.numel();
      }
      b->flat = ::torch::empty({b->length}, params_[current[0]]->tensor.options()
                                                .requires_grad(false));
      for (size_t i : current) {
        Param& p = *params_[i];
        ::torch::Tensor view = b->flat.narrow(0, p.offset, p.tensor.numel());
        view.copy_(p.tensor.detach().reshape({-1}));
        p.tensor.set_data(view.view(p.tensor.sizes()));
      }
      std::tie(b->start, b->end) = ShardRange(b->length, size_, rank_);
      b->shard = b->flat.narrow(0, b->start, b->end - b->start);
      if (options_.stage == 1) b->grad_flat = ::torch::zeros_like(b->flat);
      shards.push_back(b->shard);
      buckets_.push_back(std::move(b));
      current.clear();
      bytes = 0;
    };
    for (const auto& t : order) {
      if (t.scalar_type() != dtype) continue;
      if (!t.device().is_cpu()) {
        Throw(Status::InvalidArgument("ShardedOptimizer (C++) supports CPU parameters"));
      }
      const int64_t size = Bytes(t);
      if (!current.empty() && bytes + size > options_.bucket_cap_bytes) close();
      auto p = std::make_unique<Param>();
      p->tensor = t;
      params_.push_back(std::move(p));
      current.push_back(params_.size() - 1);
      bytes += size;
    }
    close();
  }
  if (params_.empty()) Throw(Status::InvalidArgument("ShardedOptimizer got no parameter that "
                                                     "requires a gradient"));
  optimizer_ = make_optimizer(shards);
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->hook = params_[i]->tensor.register_hook(
        [this, i](const ::torch::Tensor& grad) { OnGradient(i, grad); });
  }
}

ShardedOptimizer::~ShardedOptimizer() {
  for (auto& p : params_) p->tensor.remove_hook(p->hook);
  for (auto& b : buckets_) {
    for (auto& h : b->handles) {
      try {
        h.Synchronize();  // the tensors must outlive the operation
      } catch (const Error&) {
      }
    }
  }
}

// Runs inside backward(), before autograd adds `grad` into grad().
void ShardedOptimizer::OnGradient(size_t index, const ::torch::Tensor& grad) {
  Param& p = *params_[index];
  Bucket& b = *buckets_[p.bucket];
  if (p.passes >= options_.backward_passes_per_step) {
    Throw(Status::FailedPrecondition(
        "Gradients were computed more than backward_passes_per_step times before call to "
        "step(). Increase backward_passes_per_step to accumulate gradients locally."));
  }
  reduced_ = false;
  ++p.passes;
  ::torch::NoGradGuard no_grad;
  if (options_.stage == 1) {
    if (p.passes < options_.backward_passes_per_step) return;  // accumulate locally
    const ::torch::Tensor& held = p.tensor.grad();
    ::torch::Tensor view = b.grad_flat.narrow(0, p.offset, p.tensor.numel());
    view.copy_(held.defined() ? (held + grad).reshape({-1}) : grad.reshape({-1}));
    p.arrived = true;
    if (++b.arrived == static_cast<int>(b.params.size())) Launch(b);
    return;
  }
  if (p.arrived) Launch(b);  // a second pass before the bucket's other gradients arrived
  if (!b.grad_flat.defined()) b.grad_flat = ::torch::empty_like(b.flat);
  b.grad_flat.narrow(0, p.offset, p.tensor.numel()).copy_(grad.reshape({-1}));
  p.arrived = true;
  if (++b.arrived == static_cast<int>(b.params.size())) Launch(b);
}

void ShardedOptimizer::Launch(Bucket& b) {
  ::torch::NoGradGuard no_grad;
  if (!b.grad_flat.defined()) b.grad_flat = ::torch::zeros_like(b.flat);
  for (size_t i : b.params) {
    Param& p = *params_[i];
    if (p.arrived) continue;
    ::torch::Tensor view = b.grad_flat.narrow(0, p.offset, p.tensor.numel());
    // Stage 1: what earlier passes accumulated (or nothing); stage 2: no gradient this pass.
    const ::torch::Tensor& held = p.tensor.grad();
    if (options_.stage == 1 && held.defined()) {
      view.copy_(held.reshape({-1}));
    } else {
      view.zero_();
    }
  }
  ReduceOptions o;
  o.op = options_.op;
  o.process_set_id = options_.process_set_id;
  o.stats_group = options_.stats_group;
  const std::string name =
      "sharded." + std::to_string(b.index) + "." + std::to_string(b.launched);
  if (options_.stage == 1) {
    b.handles.push_back(AllreduceAsync_(b.grad_flat, name, o));
  } else {
    b.handles.push_back(ReducescatterAsync(b.grad_flat, name, o));
    b.grad_flat = ::torch::Tensor();  // the handle keeps it until the reduction is done
  }
  ++b.launched;
  b.arrived = 0;
  for (size_t i : b.params) params_[i]->arrived = false;
}

void ShardedOptimizer::Synchronize(CallSite where) {
  CallSiteScope at(where);
  if (reduced_) return;
  const int want = options_.stage == 1 ? 1 : options_.backward_passes_per_step;
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    if (b.arrived > 0 || b.launched == 0) Launch(b);
    while (b.launched < want) Launch(b);
  }
  ::torch::NoGradGuard no_grad;
  for (auto& bp : buckets_) {
    Bucket& b = *bp;
    ::torch::Tensor grad;
    for (auto& h : b.handles) {
      ::torch::Tensor out = h.Synchronize();
      if (options_.stage == 1) continue;
      grad = grad.defined() ? grad.add_(out) : out;
    }
    b.handles.clear();
    b.launched = 0;
    if (options_.stage == 1) {
      b.shard.mutable_grad() = b.grad_flat.narrow(0, b.start, b.end - b.start);
      for (size_t i : b.params) {  // the averaged gradient, as DistributedOptimizer leaves it
        Param& p = *params_[i];
        p.tensor.mutable_grad() =
            b.grad_flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.sizes());
      }
    } else {
      b.shard.mutable_grad() = grad;
      for (size_t i : b.params) params_[i]->tensor.mutable_grad() = ::torch::Tensor();
    }
  }
  for (auto& p : params_) p->passes = 0;
  reduced_ = true;
}

void ShardedOptimizer::Step(CallSite where) {
  CallSiteScope at(where);
  Synchronize(where);
  optimizer_->step();
  reduced_ = false;
  // Every bucket's updated slices into the parameters, at most two buckets in flight.
  ::torch::NoGradGuard no_grad;
  std::vector<std::pair<Bucket*, TorchHandle>> pending;
  for (auto& bp : buckets_) {
    pending.emplace_back(bp.get(), AllgatherAsync(bp->shard.detach(),
                                                  "sharded.gather." + std::to_string(bp->index),
                                                  options_.process_set_id));
    if (pending.size() >= 2) {
      pending.front().first->flat.copy_(pending.front().second.Synchronize());
      pending.erase(pending.begin());
    }
  }
  for (auto& [b, h] : pending) b->flat.copy_(h.Synchronize());
}

void ShardedOptimizer::ZeroGrad() {
  for (auto& b : buckets_) {
    if (!b->handles.empty()) {
      Throw(Status::FailedPrecondition(
          "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
          "or optimizer.synchronize(). This is prohibited as it can cause a race condition."));
    }
  }
  for (auto& p : params_) {
    p->tensor.mutable_grad() = ::torch::Tensor();
    p->passes = 0;
    p->arrived = false;
  }
  for (auto& b : buckets_) {
    b->shard.mutable_grad() = ::torch::Tensor();
    b->arrived = 0;
  }
  reduced_ = false;
}

double ShardedOptimizer::ClipGradNorm(double max_norm, double norm_type) {
  Synchronize();
  std::vector<::torch::Tensor> slices;
  for (auto& b : buckets_) slices.push_back(b->shard);
  return internal::ClipSlicesByGlobalNorm(slices, max_norm, norm_type, options_.process_set_id,
                                          "sharded.clip");
}

namespace internal {

double ClipSlicesByGlobalNorm(const std::vector<::torch::Tensor>& slices, double max_norm,
                              double norm_type, int32_t process_set_id, const std::string& name) {
  ::torch::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  double local = 0;
  for (const ::torch::Tensor& s : slices) {
    const ::torch::Tensor& g = s.grad();
    if (!g.defined() || g.numel() == 0) continue;
    ::torch::Tensor d = g.to(::torch::kDouble);
    if (inf) {
      local = std::max(local, d.abs().max().item<double>());
    } else {
      local += d.abs().pow(norm_type).sum().item<double>();
    }
  }
  ReduceOptions o;
  o.op = inf ? ReduceOp::kMax : ReduceOp::kSum;
  o.process_set_id = process_set_id;
  double total = Allreduce(::torch::tensor({local}, ::torch::kDouble), name, o).item<double>();
  if (!inf) total = std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (const ::torch::Tensor& s : slices) {
      if (s.grad().defined()) s.grad().mul_(coef);
    }
  }
  return total;
}

int64_t OptimizerStateBytes(const ::torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& item : optimizer.state()) {
    const auto* state = item.second.get();
    if (const auto* adam = dynamic_cast<const ::torch::optim::AdamParamState*>(state)) {
      bytes += Bytes(adam->exp_avg()) + Bytes(adam->exp_avg_sq()) + Bytes(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const ::torch::optim::AdamWParamState*>(state)) {
      bytes +=
          Bytes(adamw->exp_avg()) + Bytes(adamw->exp_avg_sq()) + Bytes(adamw->max_exp_avg_sq());
    } else if (const auto* sgd = dynamic_cast<const ::torch::optim::SGDParamState*>(state)) {
      bytes += Bytes(sgd->momentum_buffer());
    }
  }
  return bytes;
}

}  // namespace internal

GradStats ShardedOptimizer::TakeGradStats() {
  if (options_.stats_group < 0) return GradStats{};
  GradStats s = Get(hvd::TakeGradStats(options_.process_set_id, options_.stats_group));
  if (options_.stage == 1) return s;
  // Stage 2: each rank's slice of the averaged gradient, summed over the ranks.
  double mine = 0;
  for (auto& b : buckets_) {
    const ::torch::Tensor& g = b->shard.grad();
    if (g.defined() && g.numel() > 0) mine += SquaredNorm(g);
  }
  ReduceOptions o;
  o.op = ReduceOp::kSum;
  o.process_set_id = options_.process_set_id;
  s.reduced_sq = Allreduce(::torch::tensor({mine}, ::torch::kDouble), "sharded.grad_stats", o)
                     .item<double>();
  return s;
}

ShardedOptimizer::HeldBytes ShardedOptimizer::Held() const {
  HeldBytes held;
  for (const auto& b : buckets_) {
    held.parameters += Bytes(b->flat);
    held.gradients += options_.stage == 1 ? Bytes(b->grad_flat) : Bytes(b->shard.grad());
  }
  if (options_.stage == 2) {
    for (const auto& p : params_) held.gradients += Bytes(p->tensor.grad());
  }
  held.optimizer_state = internal::OptimizerStateBytes(*optimizer_);
  return held;
}

}  // namespace torch
}  // namespace hvd
