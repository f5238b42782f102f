// horovod_cpp — Apache-2.0
#pragma once
// horovod_cpp's LibTorch C++ API: collectives on torch::Tensor and a DistributedOptimizer,
// so that `mpirun -np N ./train` trains a C++ model without Python.
//
//   hvd::torch::Init();
//   auto model = std::make_shared<Net>();
//   hvd::torch::BroadcastParameters(*model, /*root=*/0);
//   hvd::torch::DistributedOptimizer opt(
//       std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1)),
//       model->named_parameters());
//   ... loss.backward();   // each gradient's allreduce starts as soon as it is computed
//   opt.step();            // waits for the allreduces, then steps the wrapped optimizer
//
// Errors are thrown as hvd::torch::Error (a std::runtime_error) carrying the core's Status.
// Tensors must be on the CPU: this library links the CPU LibTorch only (no c10::cuda streams
// to order work with), so CUDA tensors are refused with an error that points to what takes
// them (horovod_cpp.torch in Python, or the core API's TensorView with a device and stream).
// Inputs that are not contiguous are copied; in-place operations require contiguous tensors.
//
// Threads: like the core, any thread may call these functions; a tensor must not be touched
// while its operation is in flight.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/horovod.h"

namespace hvd {
namespace torch {

class Error : public std::runtime_error {
 public:
  explicit Error(const Status& status) : std::runtime_error(status.message()), status_(status) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// Init/Shutdown/Rank/Size of the core, throwing hvd::torch::Error instead of returning Status.
void Init();
void Shutdown();
int Rank();
int Size();
int LocalRank();
int LocalSize();

// The horovod_cpp dtype of a torch dtype (throws for dtypes horovod_cpp cannot move).
DataType DataTypeOf(c10::ScalarType type);

// ---- collectives ----------------------------------------------------------------------------

struct ReduceOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t process_set_id = kGlobalProcessSetId;
  int32_t stats_group = -1;  // >= 0: measure the tensor's squared norms (hvd::TakeGradStats)
};

// An operation in flight: Synchronize() waits and returns its result.
class TorchHandle {
 public:
  enum class Kind { kTensor, kOutput, kAlltoall };  // what Synchronize returns

  TorchHandle() = default;
  bool valid() const { return handle_ != 0; }
  // True once the operation has completed.
  bool Poll() const;
  // Waits; returns the result (alltoall: use SynchronizeAlltoall). Throws on failure.
  ::torch::Tensor Synchronize();
  // For alltoall: the result and the rows received from each rank.
  std::pair<::torch::Tensor, std::vector<int64_t>> SynchronizeAlltoall();

 private:
  friend struct HandleAccess;
  Handle handle_ = 0;
  Kind kind_ = Kind::kTensor;
  std::vector<::torch::Tensor> keep_alive_;  // inputs and outputs until completion
  ::torch::Tensor result_;
};

// Asynchronous forms. The name identifies the tensor across ranks ("" = numbered per process).
TorchHandle AllreduceAsync(const ::torch::Tensor& tensor, const std::string& name = "",
                           const ReduceOptions& options = {});
TorchHandle AllreduceAsync_(::torch::Tensor& tensor, const std::string& name = "",
                            const ReduceOptions& options = {});
TorchHandle AllgatherAsync(const ::torch::Tensor& tensor, const std::string& name = "",
                           int32_t process_set_id = kGlobalProcessSetId);
// Allgather into `output` (contiguous, of the result's size: the inputs' dim 0 summed over the
// ranks): the core writes it, no copy; Synchronize() returns `output`.
TorchHandle AllgatherIntoAsync(const ::torch::Tensor& tensor, ::torch::Tensor& output,
                               const std::string& name = "",
                               int32_t process_set_id = kGlobalProcessSetId);
TorchHandle BroadcastAsync(const ::torch::Tensor& tensor, int root_rank,
                           const std::string& name = "",
                           int32_t process_set_id = kGlobalProcessSetId);
TorchHandle BroadcastAsync_(::torch::Tensor& tensor, int root_rank, const std::string& name = "",
                            int32_t process_set_id = kGlobalProcessSetId);
TorchHandle AlltoallAsync(const ::torch::Tensor& tensor, const std::vector<int64_t>& splits = {},
                          const std::string& name = "",
                          int32_t process_set_id = kGlobalProcessSetId);
TorchHandle ReducescatterAsync(const ::torch::Tensor& tensor, const std::string& name = "",
                               const ReduceOptions& options = {});

// Blocking forms.
::torch::Tensor Allreduce(const ::torch::Tensor& tensor, const std::string& name = "",
                          const ReduceOptions& options = {});
void Allreduce_(::torch::Tensor& tensor, const std::string& name = "",
                const ReduceOptions& options = {});
::torch::Tensor Allgather(const ::torch::Tensor& tensor, const std::string& name = "",
                          int32_t process_set_id = kGlobalProcessSetId);
::torch::Tensor Broadcast(const ::torch::Tensor& tensor, int root_rank,
                          const std::string& name = "",
                          int32_t process_set_id = kGlobalProcessSetId);
void Broadcast_(::torch::Tensor& tensor, int root_rank, const std::string& name = "",
                int32_t process_set_id = kGlobalProcessSetId);
std::pair<::torch::Tensor, std::vector<int64_t>> Alltoall(
    const ::torch::Tensor& tensor, const std::vector<int64_t>& splits = {},
    const std::string& name = "", int32_t process_set_id = kGlobalProcessSetId);
::torch::Tensor Reducescatter(const ::torch::Tensor& tensor, const std::string& name = "",
                              const ReduceOptions& options = {});

// ---- training helpers -----------------------------------------------------------------------

// Copies `root_rank`'s parameters and buffers into every rank's module, in place.
void BroadcastParameters(const ::torch::nn::Module& module, int root_rank);
// Copies `root_rank`'s optimizer state (per-parameter state and the options of every group,
// e.g. the learning rate) to every rank.
void BroadcastOptimizerState(::torch::optim::Optimizer& optimizer, int root_rank);

// How DistributedOptimizer's gradients travel (horovod_cpp.torch's hvd.Compression): as they
// are, as float16 or bfloat16 (floating-point gradients; back in their dtype after), or
// PowerSGD low-rank approximations (PowerSGDOptions).
enum class Compression { kNone, kFP16, kBF16, kPowerSGD };

// PowerSGD (Vogels et al., NeurIPS 2019) with PyTorch's semantics, as
// hvd.Compression.powersgd(...) in Python: a gradient whose matrix view (n x m: the first
// dimension by the rest) saves more than min_compression_rate travels as P = M Q (summed,
// orthonormalized) and Q = M^T P (averaged), and becomes P Q^T on every rank; other gradients
// are averaged exactly, and all of them for the first start_powersgd_iter steps. Error
// feedback adds what an approximation left out to the next gradient; warm start keeps each Q.
// Random Qs come from PowerSGDQSeed (the same on every rank, and as Python draws them).
struct PowerSGDOptions {
  int matrix_approximation_rank = 1;
  int64_t start_powersgd_iter = 1000;
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 0.0;
  int64_t random_seed = 0;
  // Compress only while it pays (not in PyTorch; horovod_cpp.torch's `adaptive`, the same
  // policy): from start_powersgd_iter on, a probe alternates blocks of exact and compressed
  // steps (probe_blocks of each, probe_block steps long, the first step of each block not
  // counted) and compares the median step times, each the slowest rank's (every rank takes
  // the same decision); the job then compresses only if compressed steps were faster. The
  // probe is repeated after probe_interval steps, twice as long after each probe that did not
  // change the decision (up to probe_interval_max). An exact step sends each rank's kept error
  // with its gradient (and drops it), so nothing error feedback kept is lost. false: PyTorch's
  // behaviour, every step compressed from start_powersgd_iter on (trajectories that do not
  // depend on timing).
  bool adaptive = true;
  int probe_block = 3;
  int probe_blocks = 3;
  int64_t probe_interval = 250;
  int64_t probe_interval_max = 4000;
  // The clock steps are timed by, in seconds (empty: std::chrono::steady_clock; tests pass a
  // fake one).
  std::function<double()> clock;
};

// One probe's outcome (DistributedOptimizer::powersgd_decisions()): the first step it applies
// to, the slowest rank's median step time of each kind, and whether the job compresses.
struct PowerSGDDecision {
  int64_t step = 0;
  double compressed_ms = 0;
  double exact_ms = 0;
  bool compress = false;
};

// The seed of a parameter's random Q at a step: FNV-1a (64 bit) of "random_seed/name/step",
// the top bit cleared (horovod_cpp.torch.powersgd.q_seed).
uint64_t PowerSGDQSeed(int64_t random_seed, const std::string& name, int64_t step);

struct DistributedOptimizerOptions {
  ReduceOp op = ReduceOp::kAverage;  // Average or Sum (PowerSGD: Average only)
  int backward_passes_per_step = 1;  // accumulate locally over this many backward passes
  double gradient_predivide_factor = 1.0;
  int32_t process_set_id = kGlobalProcessSetId;
  Compression compression = Compression::kNone;
  PowerSGDOptions powersgd;  // with Compression::kPowerSGD
  // Adaptive training: >= 0 measures every gradient's squared norms, before and after the
  // reduction, into this stats group of the process set; TakeGradStats() returns them. Not
  // with PowerSGD.
  int32_t stats_group = -1;
};

// Wraps any torch::optim::Optimizer: every parameter gets a gradient hook that starts the
// allreduce of its (locally accumulated) gradient as soon as it is computed, so communication
// overlaps the rest of the backward pass; Step() waits for them and steps the optimizer.
// Semantics follow horovod.torch.DistributedOptimizer: Synchronize() also submits parameters
// whose gradient was not computed on this rank (with zeros), so every rank submits the same
// set; Step() after an explicit Synchronize() warns unless inside SkipSynchronize();
// ZeroGrad() with allreduces outstanding throws.
class DistributedOptimizer {
 public:
  // `named_parameters`: unique names for every parameter of `optimizer` (module's
  // named_parameters()); empty gives "allreduce.noname.<group>.<index>".
  DistributedOptimizer(std::shared_ptr<::torch::optim::Optimizer> optimizer,
                       const ::torch::OrderedDict<std::string, ::torch::Tensor>& named_parameters =
                           ::torch::OrderedDict<std::string, ::torch::Tensor>(),
                       DistributedOptimizerOptions options = {});
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Waits for every gradient's allreduce and writes the results into the gradients.
  // `where`: the caller's line (the default records it), named in deadlock and
  // collective-timeout reports about the reductions this call waits for.
  void Synchronize(CallSite where = CallSite::Here());
  // Synchronizes (unless inside SkipSynchronize) and steps the wrapped optimizer.
  void Step(CallSite where = CallSite::Here());
  void ZeroGrad();

  // While alive, Step() does not synchronize (you called Synchronize() yourself).
  class SkipSynchronizeGuard {
   public:
    explicit SkipSynchronizeGuard(DistributedOptimizer* opt) : opt_(opt) {
      opt_->should_synchronize_ = false;
    }
    ~SkipSynchronizeGuard() { opt_->should_synchronize_ = true; }

   private:
    DistributedOptimizer* opt_;
  };
  SkipSynchronizeGuard SkipSynchronize() { return SkipSynchronizeGuard(this); }

  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }

  // Adaptive training (options.stats_group): the squared norms of the gradients reduced since
  // the last call, local (this rank's, before the reduction) and reduced (the averaged
  // gradient's), summed over the parameters; call after Synchronize(). fp16/bf16-compressed
  // gradients are measured before compression (local) and after decompression (reduced).
  GradStats TakeGradStats();

  // PowerSGD: the steps reduced so far, and the numbers a step would send uncompressed / what
  // the last compressed step sent (1 before any step compressed).
  int64_t powersgd_iter() const { return powersgd_iter_; }
  double compression_rate() const { return compression_rate_; }
  // The adaptive policy (PowerSGDOptions::adaptive): whether the job compresses outside a
  // probe, and each probe's outcome so far.
  bool powersgd_compressing() const { return compressing_; }
  const std::vector<PowerSGDDecision>& powersgd_decisions() const { return decisions_; }

 private:
  struct Param;
  void OnGradient(size_t index, const ::torch::Tensor& grad);
  void Submit(Param& p, ::torch::Tensor gradient);
  bool Compresses(const Param& p) const;   // PowerSGD at this step
  // PowerSGD at this step: (compressed?, timed for a probe?).
  std::pair<bool, bool> PowerSGDMode() const;
  // Once per step, after the reductions: times the step, ends a probe.
  void PowerSGDStepDone();
  // Steps in one probe: probe_blocks exact and as many compressed blocks.
  int64_t ProbeLength() const {
    return 2 * int64_t{options_.powersgd.probe_blocks} * options_.powersgd.probe_block;
  }
  void StartLowRank(Param& p, ::torch::Tensor gradient);
  // Every P reduced, orthonormalized, and its Q computed; then all the Qs' allreduces start
  // as one grouped allreduce (one negotiation, one fused collective).
  void StartQReductions();
  ::torch::Tensor FinishLowRank(Param& p); // Q reduced: P Q^T, the error kept

  std::shared_ptr<::torch::optim::Optimizer> optimizer_;
  DistributedOptimizerOptions options_;
  std::vector<std::unique_ptr<Param>> params_;
  bool synchronized_ = false;
  bool should_synchronize_ = true;
  int64_t powersgd_iter_ = 0;
  double compression_rate_ = 1.0;
  // The adaptive policy: the decision, when the next probe starts, the interval after it, the
  // step times of the probe under way ([true]: compressed steps', [false]: exact ones'), the
  // end of the last step.
  bool compressing_ = true;
  int64_t next_probe_ = 0;
  int64_t probe_interval_ = 0;
  std::vector<double> probe_times_[2];
  double last_step_end_ = -1;
  std::vector<PowerSGDDecision> decisions_;
  TorchHandle q_group_;  // the step's grouped Q allreduce (keeps the Qs alive)
  GradStats framework_stats_;  // norms measured here (compressed gradients), since the take
};

struct ShardedOptimizerOptions {
  int stage = 2;                     // 1: optimizer state sharded; 2: gradients too
  ReduceOp op = ReduceOp::kAverage;  // Average or Sum
  int backward_passes_per_step = 1;
  int64_t bucket_cap_bytes = 25 << 20;  // the most bytes of parameters in one flat bucket
  int32_t process_set_id = kGlobalProcessSetId;
  // Adaptive training: >= 0 measures the buckets' gradient norms into this stats group
  // (TakeGradStats).
  int32_t stats_group = -1;
};

// The C++ counterpart of horovod_cpp.torch.ShardedOptimizer (stages 1 and 2; see its docs and
// docs/sharding.md). The parameters that require a gradient are packed, per dtype, in reverse
// order, into flat buckets (each parameter's data becomes a view of its bucket); rank r of N
// owns one contiguous slice of every bucket (reducescatter's split: L / N each, the first
// L % N ranks one more), and the wrapped optimizer, built by `make_optimizer` over this rank's
// slices only, holds state for them alone.
//   Stage 1: each bucket's gradient is allreduced in place as soon as the bucket is complete;
//     the averaged gradients stay in the parameters' grad().
//   Stage 2: each bucket's gradient is reduce-scattered as soon as it is complete (every pass
//     when accumulating) and a rank keeps the averaged gradient of its slice only. LibTorch's
//     C++ hooks run before autograd accumulates, so the full gradients autograd accumulates in
//     grad() live until Synchronize(), which frees them.
// Step() synchronizes, steps the slices and allgathers them into the parameters. Parameters
// without a gradient on some rank contribute zeros there, as in DistributedOptimizer.
class ShardedOptimizer {
 public:
  using Factory =
      std::function<std::shared_ptr<::torch::optim::Optimizer>(std::vector<::torch::Tensor>)>;
  // A factory for `Optim` with `options`: ShardedOptimizer::Of<torch::optim::Adam>(
  //   torch::optim::AdamOptions(1e-3)).
  template <typename Optim, typename OptimOptions>
  static Factory Of(OptimOptions options) {
    return [options](std::vector<::torch::Tensor> params) {
      return std::make_shared<Optim>(std::move(params), options);
    };
  }

  ShardedOptimizer(const ::torch::OrderedDict<std::string, ::torch::Tensor>& named_parameters,
                   Factory make_optimizer, ShardedOptimizerOptions options = {});
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Starts what the hooks did not (so every rank starts the same reductions), waits for them
  // and sets the slices' gradients. `where` as in DistributedOptimizer.
  void Synchronize(CallSite where = CallSite::Here());
  void Step(CallSite where = CallSite::Here());
  void ZeroGrad();
  // Clips every slice's gradient by the global norm (that of the whole, unsharded gradient),
  // as torch::nn::utils::clip_grad_norm_ would; returns that norm.
  double ClipGradNorm(double max_norm, double norm_type = 2.0);
  // Adaptive training (options.stats_group), after Synchronize(): local_sq is this rank's
  // squared norm of its whole gradient before the reduction (stage 2 with several backward
  // passes per step: the sum over the passes of each pass's), reduced_sq the averaged
  // gradient's: stage 1 measures it on the allreduced buckets, stage 2 sums each rank's
  // slice with one scalar allreduce (collective: every rank calls it).
  GradStats TakeGradStats();

  // The wrapped optimizer (its parameters are this rank's slices).
  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }
  struct HeldBytes {
    int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  };
  // What this rank holds, counted from the tensors (state: SGD's and Adam(W)'s buffers).
  HeldBytes Held() const;

 private:
  struct Bucket;
  struct Param;
  void OnGradient(size_t index, const ::torch::Tensor& grad);
  void Launch(Bucket& b);

  std::shared_ptr<::torch::optim::Optimizer> optimizer_;
  ShardedOptimizerOptions options_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  int size_ = 1, rank_ = 0;
  bool reduced_ = false;
};

// ---- stage 3: the parameters sharded too ----------------------------------------------------

struct ShardedModelOptions {
  ReduceOp op = ReduceOp::kAverage;  // Average or Sum
  int backward_passes_per_step = 1;
  int32_t process_set_id = kGlobalProcessSetId;
};

// The C++ counterpart of hvd.shard_model (stage 3; docs/sharding.md). Each unit's trainable
// parameters are packed, per dtype, into a flat buffer of which rank r of N keeps slice r
// (reducescatter's split); between uses a parameter holds no data (an empty tensor). LibTorch
// has no module hooks, so the model's forward calls each unit through Run():
//
//   hvd::torch::ShardedModel sharded(*model, {model, model->encoder, model->head});
//   hvd::torch::FullyShardedOptimizer opt(sharded, ShardedOptimizer::Of<torch::optim::AdamW>(
//       torch::optim::AdamWOptions(1e-3)));
//   // in the model's forward:
//   auto h = sharded.Run(*encoder, [&] { return encoder->forward(x); });
//
// Run() gathers the unit (an allgather straight into its flat buffer), runs the function and
// frees the unit again; a hook on the result gathers it again when backward reaches it, and
// the unit is freed once its last gradient has been taken. A unit's gradients are packed as
// they arrive and reduce-scattered as soon as the unit's are complete (every backward pass
// when accumulating); this rank keeps the reduced gradient of its slice alone. A parameter
// belongs to the innermost unit that holds it: a unit may contain others (the model itself
// as the outermost: its parameters are those no other unit holds), and its Run() then encloses
// theirs. Every trainable parameter of `model` must be in a unit; a parameter shared by two
// units of which neither contains the other is refused. Parameters without requires_grad stay
// whole on every rank. The gathers are not prefetched (horovod_cpp.torch's are). CPU tensors.
class ShardedModel {
 public:
  ShardedModel(::torch::nn::Module& model,
               const std::vector<std::shared_ptr<::torch::nn::Module>>& units,
               ShardedModelOptions options = {});
  ~ShardedModel();
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;

  // Runs `forward` with `unit`'s parameters whole (see above). Collective: every rank runs the
  // same units in the same order.
  ::torch::Tensor Run(const ::torch::nn::Module& unit,
                      const std::function<::torch::Tensor()>& forward);
  // Every trainable parameter, whole, by name (copies; collective): for checkpoints and checks.
  std::vector<std::pair<std::string, ::torch::Tensor>> FullParameters();
  // Starts the reductions that backward did not (a parameter without a gradient on this rank
  // contributes zeros, as in DistributedOptimizer), waits for them; then the grad() of each of
  // Slices() is the reduced gradient of that slice. FullyShardedOptimizer calls it.
  void FinishReductions();
  // This rank's slices of the flat buffers (what the optimizer steps).
  std::vector<::torch::Tensor> Slices() const;
  void ZeroGrad();
  bool ReductionsInFlight() const;
  const ShardedModelOptions& options() const { return options_; }
  int64_t ParameterBytes() const;  // slices and whatever is gathered now
  int64_t GradientBytes() const;

 private:
  struct Flat;
  struct Unit;
  Unit& UnitOf(const ::torch::nn::Module& module);
  void Gather(Unit& u, const std::string& tag);
  void Free(Unit& u);
  void BeforeBackward(Unit& u);
  void OnGradient(Flat& f, size_t i, const ::torch::Tensor& grad);
  void Launch(Flat& f);
  void Drain(bool wait);
  void Settle();  // frees what earlier hooks finished with (their accumulation has run since)

  ShardedModelOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Flat*> flats_;
  std::vector<std::pair<::torch::Tensor, unsigned>> hooks_;
  std::vector<Unit*> to_free_;
  std::vector<::torch::Tensor> to_clear_;  // parameters whose grad() autograd just set
  int size_ = 1, rank_ = 0;
  bool in_flight_ = false;
};

// Steps a ShardedModel's slices with the wrapped optimizer (built by `make_optimizer` over
// them, so its state covers this rank's slices alone); nothing is gathered after the step (the
// next forward gathers what it uses). The C++ counterpart of ShardedOptimizer(stage=3).
class FullyShardedOptimizer {
 public:
  FullyShardedOptimizer(ShardedModel& model, const ShardedOptimizer::Factory& make_optimizer);
  void Synchronize(CallSite where = CallSite::Here());
  void Step(CallSite where = CallSite::Here());
  void ZeroGrad();
  // As ShardedOptimizer::ClipGradNorm: by the norm of the whole gradient.
  double ClipGradNorm(double max_norm, double norm_type = 2.0);
  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }
  ShardedOptimizer::HeldBytes Held() const;

 private:
  ShardedModel& model_;
  std::shared_ptr<::torch::optim::Optimizer> optimizer_;
  bool reduced_ = false;
};

}  // namespace torch
}  // namespace hvd
