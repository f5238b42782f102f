// horovod_cpp — Apache-2.0
// The LibTorch C++ API under mpirun (np 2 and 3): collectives on torch::Tensor, the
// DistributedOptimizer against one process on the full batch (computed here with a plain
// optimizer), bit-identical parameters on every rank after every step, broadcasts of
// parameters and optimizer state from a non-zero root, and errors reaching the caller.

#include "bindings/torch.h"

#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

namespace {

namespace ht = hvd::torch;
using hvd::ReduceOp;
using hvd::StatusCode;
using ::torch::Tensor;

int R() { return ht::Rank(); }
int N() { return ht::Size(); }


// A parameter's entry in a LibTorch optimizer's state: keyed by the printed address of its
// TensorImpl up to LibTorch 1.13, by the address itself from 2.x on (both lanes build this).
template <typename StateMap>
auto FindState(StateMap& state, const ::torch::Tensor& p) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;
    key << p.unsafeGetTensorImpl();
    return state.find(key.str());
  } else {
    return state.find(p.unsafeGetTensorImpl());
  }
}

TEST(TorchCollectives, MatchIndependentReferences) {
  const int n = N(), me = R();
  Tensor x = ::torch::arange(6, ::torch::kDouble).reshape({2, 3}) * (me + 1);
  Tensor sum = ht::Allreduce(x, "t.sum", {ReduceOp::kSum});
  EXPECT_TRUE(sum.equal(::torch::arange(6, ::torch::kDouble).reshape({2, 3}) * (n * (n + 1) / 2)));
  EXPECT_TRUE(x.equal(::torch::arange(6, ::torch::kDouble).reshape({2, 3}) * (me + 1)));
  Tensor avg = ht::Allreduce(::torch::full({4}, me * 2.0), "t.avg");
  EXPECT_TRUE(avg.allclose(::torch::full({4}, n - 1.0)));
  Tensor ints = ::torch::full({3}, me + 1, ::torch::kInt);
  ht::Allreduce_(ints, "t.max", {ReduceOp::kMax});
  EXPECT_EQ(ints[2].item<int>(), n);

  Tensor rows = ::torch::full({me + 1, 2}, static_cast<int64_t>(me), ::torch::kLong);
  Tensor gathered = ht::Allgather(rows, "t.gather");
  ASSERT_EQ(gathered.size(0), n * (n + 1) / 2);
  int64_t row = 0;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i <= r; ++i, ++row) EXPECT_EQ(gathered[row][1].item<int64_t>(), r);
  }

  Tensor b = ::torch::full({3}, static_cast<float>(me));
  EXPECT_TRUE(ht::Broadcast(b, n - 1, "t.bcast").equal(::torch::full({3}, n - 1.0f)));
  ht::Broadcast_(b, 0, "t.bcast_");
  EXPECT_TRUE(b.equal(::torch::zeros({3})));

  // Alltoall: 1 row to every rank, tagged with sender and receiver.
  Tensor send = ::torch::arange(n, ::torch::kLong) + 100 * me;
  auto [recv, splits] = ht::Alltoall(send, {}, "t.a2a");
  EXPECT_EQ(splits, std::vector<int64_t>(n, 1));
  for (int r = 0; r < n; ++r) EXPECT_EQ(recv[r].item<int64_t>(), 100 * r + me);

  // Reducescatter of 2n + 1 rows: rank 0 keeps 3, the others 2.
  Tensor rs = ht::Reducescatter(::torch::ones({2 * n + 1, 2}), "t.rs", {ReduceOp::kSum});
  EXPECT_EQ(rs.size(0), me == 0 ? 3 : 2);
  EXPECT_TRUE(rs.equal(::torch::full({me == 0 ? 3 : 2, 2}, static_cast<float>(n))));

  ht::TorchHandle h = ht::AllreduceAsync(::torch::ones({2}), "t.async", {ReduceOp::kSum});
  EXPECT_TRUE(h.Synchronize().equal(::torch::full({2}, static_cast<float>(n))));
}

// ---- the optimizer against one process on the full batch --------------------------------------

struct MlpImpl : ::torch::nn::Module {
  explicit MlpImpl(::torch::ScalarType dtype = ::torch::kDouble)
      : a(register_module("a", ::torch::nn::Linear(5, 7))),
        b(register_module("b", ::torch::nn::Linear(7, 3))) {
    to(dtype);
  }
  Tensor forward(const Tensor& x) { return b(::torch::tanh(a(x))); }
  ::torch::nn::Linear a, b;
};
TORCH_MODULE(Mlp);

Mlp MakeModel(::torch::ScalarType dtype = ::torch::kDouble) {
  ::torch::manual_seed(17);
  return Mlp(dtype);
}

using MakeOptimizer = std::function<std::shared_ptr<::torch::optim::Optimizer>(Mlp&)>;

// steps x passes batches of n * 4 samples, the same on every rank.
std::vector<std::vector<std::pair<Tensor, Tensor>>> Batches(
    int steps, int passes, ::torch::ScalarType dtype = ::torch::kDouble) {
  ::torch::manual_seed(29);
  std::vector<std::vector<std::pair<Tensor, Tensor>>> out(steps);
  for (auto& step : out) {
    for (int p = 0; p < passes; ++p) {
      step.push_back({::torch::randn({N() * 4, 5}, dtype),
                      ::torch::randint(0, 3, {N() * 4}, ::torch::kLong)});
    }
  }
  return out;
}

Tensor Loss(Mlp& model, const Tensor& x, const Tensor& y) {
  return ::torch::nll_loss(::torch::log_softmax(model->forward(x), 1), y);
}

std::vector<Tensor> Flat(Mlp& model) {
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

void CheckAgainstOneProcess(const MakeOptimizer& make, int passes) {
  auto data = Batches(3, passes);
  // One process, full batch: the gradients of a pass add up, then one step.
  Mlp ref = MakeModel();
  auto ref_opt = make(ref);
  std::vector<std::vector<Tensor>> want;
  for (auto& step : data) {
    ref_opt->zero_grad();
    for (auto& [x, y] : step) Loss(ref, x, y).backward();
    ref_opt->step();
    want.push_back(Flat(ref));
  }
  // N ranks, each on its quarter-rows shard of every batch.
  Mlp model = MakeModel();
  ht::DistributedOptimizerOptions options;
  options.backward_passes_per_step = passes;
  ht::DistributedOptimizer opt(make(model), model->named_parameters(), options);
  const int64_t lo = R() * 4, hi = lo + 4;
  for (size_t s = 0; s < data.size(); ++s) {
    opt.ZeroGrad();
    for (auto& [x, y] : data[s]) Loss(model, x.slice(0, lo, hi), y.slice(0, lo, hi)).backward();
    opt.Step();
    std::vector<Tensor> got = Flat(model);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].allclose(want[s][i], 1e-9, 1e-11)) << "step " << s << " param " << i;
      // Bit-identical on every rank: gather every rank's copy and compare exactly.
      Tensor all = ht::Allgather(got[i].reshape({1, -1}),
                                 "check." + std::to_string(s) + "." + std::to_string(i));
      for (int r = 0; r < N(); ++r) ASSERT_TRUE(all[r].equal(all[0])) << "rank " << r;
    }
  }
}

TEST(TorchCollectives, NonCpuTensorsGetAClearError) {
  // A meta tensor stands in for a CUDA one (this LibTorch is CPU-only).
  Tensor meta = ::torch::empty({4}, ::torch::TensorOptions().device(::torch::kMeta));
  try {
    ht::Allreduce(meta, "torch.meta");
    FAIL() << "a non-CPU tensor must be rejected";
  } catch (const ht::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("the LibTorch C++ API takes CPU tensors (got one on meta)"),
        std::string::npos)
        << e.what();
  }
  Tensor ok = ::torch::ones({2});
  const int size = ht::Size();
  EXPECT_TRUE(::torch::equal(ht::Allreduce(ok, "torch.after.meta", {ReduceOp::kSum}),
                             ::torch::full({2}, static_cast<float>(size))));
}

TEST(TorchDistributedOptimizer, SgdWithMomentumMatchesOneProcess) {
  for (int passes : {1, 2}) {
    CheckAgainstOneProcess(
        [](Mlp& m) {
          return std::make_shared<::torch::optim::SGD>(
              m->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
        },
        passes);
  }
}

TEST(TorchDistributedOptimizer, AdamMatchesOneProcess) {
  for (int passes : {1, 2}) {
    CheckAgainstOneProcess(
        [](Mlp& m) {
          return std::make_shared<::torch::optim::Adam>(m->parameters(),
                                                        ::torch::optim::AdamOptions(0.01));
        },
        passes);
  }
}

// ---- Compression -------------------------------------------------------------------------------

using Steps = std::vector<std::vector<std::pair<Tensor, Tensor>>>;

// A one-process reference of PowerSGD written here (every rank's gradient on its shard, QR
// for the orthonormalization, rank 1, SGD at `lr`), in the data's dtype: the parameters after
// each step. Step s is compressed when compress_at(s); an exact step sends each matrix's kept
// errors with the gradients and drops them.
std::vector<std::vector<Tensor>> ReferencePowerSGD(
    const Steps& data, bool warm, double lr, const std::function<bool(int64_t)>& compress_at) {
  const ::torch::ScalarType dtype = data[0][0].first.scalar_type();
  Mlp ref = MakeModel(dtype);
  std::map<std::string, Tensor> qs;
  std::map<std::string, std::vector<Tensor>> errors;
  std::vector<std::vector<Tensor>> want;
  for (size_t s = 0; s < data.size(); ++s) {
    std::vector<std::map<std::string, Tensor>> grads(N());
    for (int r = 0; r < N(); ++r) {
      for (auto& p : ref->parameters()) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      auto& [x, y] = data[s][0];
      Loss(ref, x.slice(0, r * 4, r * 4 + 4), y.slice(0, r * 4, r * 4 + 4)).backward();
      for (auto& item : ref->named_parameters()) {
        grads[r][item.key()] = item.value().grad().clone();
      }
    }
    ::torch::NoGradGuard no_grad;
    for (auto& item : ref->named_parameters()) {
      const std::string& name = item.key();
      const Tensor& g0 = grads[0][name];
      Tensor reduced = ::torch::zeros_like(g0);
      const int64_t n = g0.dim() >= 2 ? g0.size(0) : 0, m = n ? g0.numel() / n : 0;
      if (!compress_at(static_cast<int64_t>(s)) || n == 0 || !(n * m > (n + m) * 1 * 2)) {
        for (int r = 0; r < N(); ++r) {
          reduced += grads[r][name];
          if (errors.count(name)) reduced += errors[name][r].reshape(g0.sizes());
        }
        errors.erase(name);
        reduced /= N();
      } else {
        std::vector<Tensor> mats;
        for (int r = 0; r < N(); ++r) {
          Tensor mat = grads[r][name].reshape({n, m});
          if (errors.count(name)) mat = mat + errors[name][r];
          mats.push_back(mat);
        }
        Tensor q;
        if (warm && qs.count(name)) {
          q = qs[name];
        } else {
          auto gen = at::detail::createCPUGenerator(ht::PowerSGDQSeed(0, name, s));
          q = at::randn({m, 1}, gen, ::torch::TensorOptions().dtype(::torch::kFloat)).to(dtype);
        }
        q = std::get<0>(at::linalg_qr(q));
        Tensor psum = ::torch::zeros({n, 1}, dtype);
        for (auto& mat : mats) psum += ::torch::mm(mat, q);
        Tensor p = std::get<0>(at::linalg_qr(psum));
        Tensor qsum = ::torch::zeros({m, 1}, dtype);
        for (auto& mat : mats) qsum += ::torch::mm(mat.t(), p);
        q = qsum / N();
        Tensor approx = ::torch::mm(p, q.t());
        errors[name].clear();
        for (auto& mat : mats) errors[name].push_back(mat - approx);
        qs[name] = q;
        reduced = approx.reshape(g0.sizes());
      }
      item.value().sub_(lr * reduced);
    }
    want.push_back(Flat(ref));
  }
  return want;
}

// One step of `opt` on this rank's 4 samples of `batch`.
void StepOnShard(ht::DistributedOptimizer& opt, Mlp& model,
                 const std::pair<Tensor, Tensor>& batch) {
  opt.ZeroGrad();
  const auto& [x, y] = batch;
  Loss(model, x.slice(0, R() * 4, R() * 4 + 4), y.slice(0, R() * 4, R() * 4 + 4)).backward();
  opt.Step();
}

// Trains `model` through `opt` on `data` (this rank's shard) and checks its parameters after
// every step against `want`, to 1e-5.
void ExpectPowerSGDSteps(const Steps& data, ht::DistributedOptimizer& opt, Mlp& model,
                         const std::vector<std::vector<Tensor>>& want, const std::string& what) {
  for (size_t s = 0; s < data.size(); ++s) {
    StepOnShard(opt, model, data[s][0]);
    std::vector<Tensor> got = Flat(model);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].allclose(want[s][i], 1e-5, 1e-5))
          << what << " step " << s << " param " << i;
    }
  }
}

// PowerSGD against the one-process reference, to 1e-5, with and without warm start; float64
// through torch's operations, float32 through the core's fused passes (hvd::LowRankStart and
// LowRankFinish).
TEST(TorchDistributedOptimizer, PowerSGDMatchesAOneProcessReference) {
  for (auto [warm, dtype] : {std::pair{true, ::torch::kDouble}, std::pair{false, ::torch::kDouble},
                             std::pair{true, ::torch::kFloat}, std::pair{false, ::torch::kFloat}}) {
    auto data = Batches(5, 1, dtype);
    const int64_t start = 1;
    const double lr = 0.1;
    auto want = ReferencePowerSGD(data, warm, lr, [&](int64_t s) { return s >= start; });
    Mlp model = MakeModel(dtype);
    ht::DistributedOptimizerOptions options;
    options.compression = ht::Compression::kPowerSGD;
    options.powersgd.start_powersgd_iter = start;
    options.powersgd.warm_start = warm;
    options.powersgd.adaptive = false;  // every step from `start` compressed, as PyTorch
    ht::DistributedOptimizer opt(
        std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(lr)),
        model->named_parameters(), options);
    ExpectPowerSGDSteps(data, opt, model, want,
                        "warm " + std::to_string(warm) + " " + ::c10::toString(dtype));
    EXPECT_EQ(opt.powersgd_iter(), 5);
    // a.weight 7x5 and b.weight 3x7 as (7+5) and (3+7) numbers, the biases (7, 3) whole.
    EXPECT_NEAR(opt.compression_rate(), (35.0 + 21 + 7 + 3) / (12 + 10 + 7 + 3), 1e-12);
    EXPECT_TRUE(opt.powersgd_decisions().empty());
  }
}

// PowerSGD from step 0 with short probes (blocks of 2 steps, 2 of each kind, the next probe 5
// steps after a decision) on a fake clock: step s costs cost(s) seconds.
ht::DistributedOptimizerOptions ShortProbes(std::function<double(int64_t)> cost) {
  ht::DistributedOptimizerOptions options;
  options.compression = ht::Compression::kPowerSGD;
  options.powersgd.start_powersgd_iter = 0;
  options.powersgd.probe_block = 2;
  options.powersgd.probe_blocks = 2;
  options.powersgd.probe_interval = 5;
  auto now = std::make_shared<double>(0);
  auto step = std::make_shared<int64_t>(0);
  options.powersgd.clock = [=] {  // called once per step, when it ends
    *now += cost((*step)++);
    return *now;
  };
  return options;
}

// The adaptive policy (the same as horovod_cpp.torch's) on a fake clock: a probe over steps
// 0-7 (blocks of 2: exact, compressed, exact, compressed), then its decision until the next
// probe, 5 steps later (10 when the decision stayed: compressing is where the job starts),
// and the second probe.
// Compressed steps cost 1 s and exact ones 2 s, or the reverse. The parameters after each
// step against the one-process reference with the same steps compressed, where an exact step
// after compressed ones sends each rank's error with its gradient.
TEST(TorchDistributedOptimizer, AdaptivePowerSGDFollowsItsProbeAndKeepsEveryError) {
  for (auto [pays, dtype] : {std::pair{true, ::torch::kDouble}, std::pair{false, ::torch::kDouble},
                             std::pair{true, ::torch::kFloat}, std::pair{false, ::torch::kFloat}}) {
    const int64_t interval = pays ? 10 : 5, length = 8;
    auto compress_at = [&](int64_t s) {
      if (s < length) return (s / 2) % 2 == 1;
      if (s >= length + interval) return ((s - length - interval) / 2) % 2 == 1;
      return pays;
    };
    auto data = Batches(2 * length + interval, 1, dtype);  // through the second probe
    const double lr = 0.1;
    auto want = ReferencePowerSGD(data, true, lr, compress_at);
    Mlp model = MakeModel(dtype);
    auto options = ShortProbes([&](int64_t s) { return compress_at(s) == pays ? 1.0 : 2.0; });
    ht::DistributedOptimizer opt(
        std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(lr)),
        model->named_parameters(), options);
    ExpectPowerSGDSteps(data, opt, model, want,
                        std::string(pays ? "pays " : "does not pay ") + ::c10::toString(dtype));
    ASSERT_EQ(opt.powersgd_decisions().size(), 2u);
    const ht::PowerSGDDecision& first = opt.powersgd_decisions()[0];
    EXPECT_EQ(first.step, length);
    EXPECT_DOUBLE_EQ(first.compressed_ms, pays ? 1000.0 : 2000.0);
    EXPECT_DOUBLE_EQ(first.exact_ms, pays ? 2000.0 : 1000.0);
    EXPECT_EQ(first.compress, pays);
    EXPECT_EQ(opt.powersgd_decisions()[1].step, 2 * length + interval);
    EXPECT_EQ(opt.powersgd_compressing(), pays);
  }
}

// Rank 0 finds compressed steps faster, every other rank slower: the job goes by its slowest
// rank's times (compressed 3 s against exact 2 s), and every rank decides alike.
TEST(TorchDistributedOptimizer, AdaptivePowerSGDRanksTakeOneDecisionFromTheSlowest) {
  auto data = Batches(9, 1);
  Mlp model = MakeModel();
  auto options = ShortProbes([](int64_t s) {
    const bool compressed = (s / 2) % 2 == 1;
    return compressed ? (R() == 0 ? 1.0 : 3.0) : 2.0;
  });
  ht::DistributedOptimizer opt(
      std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(0.1)),
      model->named_parameters(), options);
  for (auto& batch : data) StepOnShard(opt, model, batch[0]);
  ASSERT_EQ(opt.powersgd_decisions().size(), 1u);
  EXPECT_EQ(opt.powersgd_decisions()[0].step, 8);
  EXPECT_DOUBLE_EQ(opt.powersgd_decisions()[0].compressed_ms, 3000.0);
  EXPECT_DOUBLE_EQ(opt.powersgd_decisions()[0].exact_ms, 2000.0);
  EXPECT_FALSE(opt.powersgd_compressing());
}

TEST(TorchDistributedOptimizer, PowerSGDRefusesBadProbeOptions) {
  Mlp model = MakeModel();
  for (auto bad : std::vector<std::function<void(ht::PowerSGDOptions&)>>{
           [](ht::PowerSGDOptions& o) { o.probe_block = 0; },
           [](ht::PowerSGDOptions& o) { o.probe_blocks = 0; },
           [](ht::PowerSGDOptions& o) { o.probe_interval = -1; },
           [](ht::PowerSGDOptions& o) { o.probe_interval_max = o.probe_interval - 1; }}) {
    ht::DistributedOptimizerOptions options;
    options.compression = ht::Compression::kPowerSGD;
    bad(options.powersgd);
    try {
      ht::DistributedOptimizer opt(std::make_shared<::torch::optim::SGD>(
                                       model->parameters(), ::torch::optim::SGDOptions(0.1)),
                                   model->named_parameters(), options);
      FAIL() << "accepted";
    } catch (const hvd::torch::Error& e) {
      EXPECT_NE(std::string(e.what()).find("probe_block and probe_blocks must be >= 1"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(TorchDistributedOptimizer, HalfPrecisionCompressionStaysCloseToFp32) {
  for (auto kind : {ht::Compression::kFP16, ht::Compression::kBF16}) {
    Mlp exact = MakeModel(), half = MakeModel();
    ht::DistributedOptimizerOptions options;
    options.compression = kind;
    ht::DistributedOptimizer a(
        std::make_shared<::torch::optim::SGD>(exact->parameters(), ::torch::optim::SGDOptions(0.1)),
        exact->named_parameters());
    ht::DistributedOptimizer b(
        std::make_shared<::torch::optim::SGD>(half->parameters(), ::torch::optim::SGDOptions(0.1)),
        half->named_parameters(), options);
    for (auto& step : Batches(3, 1)) {
      // One after the other: both name their reductions after the same parameters.
      StepOnShard(a, exact, step[0]);
      StepOnShard(b, half, step[0]);
    }
    bool differs = false;
    for (size_t i = 0; i < exact->parameters().size(); ++i) {
      const Tensor e = exact->parameters()[i];
      const Tensor h = half->parameters()[i];
      EXPECT_EQ(h.scalar_type(), ::torch::kDouble);
      EXPECT_TRUE(h.allclose(e, 1e-2, 1e-3)) << "param " << i;
      differs = differs || !h.equal(e);
    }
    EXPECT_TRUE(differs) << "the gradients did not travel in half precision";
  }
}

// ---- ShardedOptimizer (stages 1 and 2) against one process on the full batch ------------------

using Factory = ht::ShardedOptimizer::Factory;

// 20 steps of `passes` backward passes, optionally clipped to `max_norm` (0: no clipping);
// 200-byte buckets: the Mlp's four tensors (3, 21, 7 and 35 doubles, in reverse order) land in
// three buckets, split unevenly over the ranks.
void CheckShardedAgainstOneProcess(int stage, const Factory& make, int passes, double max_norm) {
  auto data = Batches(20, passes);
  Mlp ref = MakeModel();
  auto ref_opt = make(ref->parameters());
  std::vector<std::vector<Tensor>> want;
  std::vector<double> want_norms;
  for (auto& step : data) {
    ref_opt->zero_grad();
    for (auto& [x, y] : step) Loss(ref, x, y).backward();
    if (max_norm > 0) {
      want_norms.push_back(::torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm));
    }
    ref_opt->step();
    want.push_back(Flat(ref));
  }
  Mlp model = MakeModel();
  ht::ShardedOptimizerOptions options;
  options.stage = stage;
  options.backward_passes_per_step = passes;
  options.bucket_cap_bytes = 200;
  ht::ShardedOptimizer opt(model->named_parameters(), make, options);
  const int64_t lo = R() * 4, hi = lo + 4;
  int clipped = 0;
  for (size_t s = 0; s < data.size(); ++s) {
    opt.ZeroGrad();
    for (auto& [x, y] : data[s]) Loss(model, x.slice(0, lo, hi), y.slice(0, lo, hi)).backward();
    if (stage == 2) {  // only the slices' gradients are left after Synchronize
      opt.Synchronize();
      for (const Tensor& p : model->parameters()) ASSERT_FALSE(p.grad().defined());
    }
    if (max_norm > 0) {
      double norm = opt.ClipGradNorm(max_norm);
      ASSERT_NEAR(norm, want_norms[s], 1e-9 * want_norms[s]) << "step " << s;
      clipped += norm > max_norm;
    }
    opt.Step();
    std::vector<Tensor> got = Flat(model);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].allclose(want[s][i], 1e-9, 1e-11))
          << "stage " << stage << " step " << s << " param " << i << ": "
          << (got[i] - want[s][i]).abs().max().item<double>();
    }
  }
  if (max_norm > 0) {
    EXPECT_GT(clipped, 5);  // the clipping did clip
  }
  // This rank holds its slices' state only: SGD's momentum or Adam's two moments.
  auto held = opt.Held();
  int64_t all = 0, mine = 0;
  for (const Tensor& p : model->parameters()) all += p.numel();
  for (int64_t length : {24, 7, 35}) {
    mine += length / N() + (R() < length % N() ? 1 : 0);
  }
  EXPECT_EQ(held.parameters, 8 * all);
  EXPECT_EQ(held.gradients, 8 * (stage == 1 ? all : mine));
  EXPECT_TRUE(held.optimizer_state == 8 * mine || held.optimizer_state == 16 * mine)
      << held.optimizer_state << " for " << mine << " elements";
}

Factory SgdMomentum() {
  return ht::ShardedOptimizer::Of<::torch::optim::SGD>(
      ::torch::optim::SGDOptions(0.1).momentum(0.9));
}
Factory Adam() {
  return ht::ShardedOptimizer::Of<::torch::optim::Adam>(::torch::optim::AdamOptions(0.01));
}
Factory AdamW() {
  return ht::ShardedOptimizer::Of<::torch::optim::AdamW>(
      ::torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

TEST(TorchShardedOptimizer, MatchesOneProcessOnTheFullBatch) {
  for (int stage : {1, 2}) {
    for (int passes : {1, 2}) {
      for (double max_norm : {0.0, 0.05}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + " passes " + std::to_string(passes) +
                     " max_norm " + std::to_string(max_norm));
        CheckShardedAgainstOneProcess(stage, SgdMomentum(), passes, max_norm);
        CheckShardedAgainstOneProcess(stage, Adam(), passes, max_norm);
        CheckShardedAgainstOneProcess(stage, AdamW(), passes, max_norm);
      }
    }
  }
}

// ---- stage 3: ShardedModel + FullyShardedOptimizer against one process on the full batch ----

// Three layers; the model itself is a unit too (it holds c), enclosing the units a and b.
struct Net3Impl : ::torch::nn::Module {
  Net3Impl()
      : a(register_module("a", ::torch::nn::Linear(5, 7))),
        b(register_module("b", ::torch::nn::Linear(7, 7))),
        c(register_module("c", ::torch::nn::Linear(7, 3))) {
    to(::torch::kDouble);
  }
  // `run(unit, f)`: f() with the unit's parameters whole (ShardedModel::Run), or f().
  using Runner = std::function<Tensor(const ::torch::nn::Module&, std::function<Tensor()>)>;
  Tensor forward(const Tensor& x, const Runner& run) {
    return run(*this, [&] {
      Tensor h = ::torch::tanh(run(*a, [&] { return a(x); }));
      h = ::torch::tanh(run(*b, [&] { return b(h); }));
      return c(h);
    });
  }
  ::torch::nn::Linear a, b, c;
};
TORCH_MODULE(Net3);

Net3 MakeNet3() {
  ::torch::manual_seed(23);
  return Net3();
}

Tensor Loss3(Net3& model, const Tensor& x, const Tensor& y, const Net3Impl::Runner& run) {
  return ::torch::nll_loss(::torch::log_softmax(model->forward(x, run), 1), y);
}

void CheckStage3AgainstOneProcess(const Factory& make, int passes, double max_norm) {
  auto data = Batches(20, passes);
  auto plain = [](const ::torch::nn::Module&, std::function<Tensor()> f) { return f(); };
  Net3 ref = MakeNet3();
  auto ref_opt = make(ref->parameters());
  std::vector<std::map<std::string, Tensor>> want;
  std::vector<double> want_norms;
  for (auto& step : data) {
    ref_opt->zero_grad();
    for (auto& [x, y] : step) Loss3(ref, x, y, plain).backward();
    if (max_norm > 0) {
      want_norms.push_back(::torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm));
    }
    ref_opt->step();
    std::map<std::string, Tensor> params;
    for (const auto& item : ref->named_parameters()) params[item.key()] = item.value().clone();
    want.push_back(params);
  }
  Net3 model = MakeNet3();
  ht::ShardedModelOptions options;
  options.backward_passes_per_step = passes;
  ht::ShardedModel sharded(*model, {model.ptr(), model->a.ptr(), model->b.ptr()}, options);
  ht::FullyShardedOptimizer opt(sharded, make);
  auto run = [&](const ::torch::nn::Module& unit, std::function<Tensor()> f) {
    return sharded.Run(unit, f);
  };
  // Between uses a parameter holds nothing (at one rank it is a view of the whole slice).
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.numel() == 0, N() > 1);
  const int64_t lo = R() * 4, hi = lo + 4;
  int clipped = 0;
  for (size_t s = 0; s < data.size(); ++s) {
    opt.ZeroGrad();
    for (auto& [x, y] : data[s]) {
      Loss3(model, x.slice(0, lo, hi), y.slice(0, lo, hi), run).backward();
    }
    if (max_norm > 0) {
      double norm = opt.ClipGradNorm(max_norm);
      ASSERT_NEAR(norm, want_norms[s], 1e-9 * want_norms[s]) << "step " << s;
      clipped += norm > max_norm;
    }
    opt.Step();
    auto got = sharded.FullParameters();
    ASSERT_EQ(got.size(), want[s].size());
    for (const auto& [name, t] : got) {
      ASSERT_TRUE(t.allclose(want[s].at(name), 1e-9, 1e-11))
          << "step " << s << " " << name << ": " << (t - want[s].at(name)).abs().max().item<double>();
    }
  }
  if (max_norm > 0) {
    EXPECT_GT(clipped, 5);  // the clipping did clip
  }
  // Flats: the model's own (c: 24 doubles), a (42), b (56). This rank holds its slices, their
  // gradients and their state, nothing gathered.
  int64_t mine = 0;
  for (int64_t length : {24, 42, 56}) mine += length / N() + (R() < length % N() ? 1 : 0);
  auto held = opt.Held();
  EXPECT_EQ(held.parameters, 8 * mine);
  EXPECT_EQ(held.gradients, 8 * mine);
  EXPECT_TRUE(held.optimizer_state == 8 * mine || held.optimizer_state == 16 * mine)
      << held.optimizer_state << " for " << mine << " elements";
  // Evaluation (no gradients) gathers and frees too; the result is the one-process model's.
  ::torch::NoGradGuard no_grad;
  Tensor x = data[0][0].first;
  auto plain_ref = [](const ::torch::nn::Module&, std::function<Tensor()> f) { return f(); };
  EXPECT_TRUE(model->forward(x, run).allclose(ref->forward(x, plain_ref), 1e-9, 1e-11));
  EXPECT_EQ(opt.Held().parameters, 8 * mine);
}

TEST(TorchStage3, MatchesOneProcessOnTheFullBatch) {
  for (int passes : {1, 2}) {
    for (double max_norm : {0.0, 0.05}) {
      SCOPED_TRACE("passes " + std::to_string(passes) + " max_norm " + std::to_string(max_norm));
      CheckStage3AgainstOneProcess(SgdMomentum(), passes, max_norm);
      CheckStage3AgainstOneProcess(Adam(), passes, max_norm);
      CheckStage3AgainstOneProcess(AdamW(), passes, max_norm);
    }
  }
}

TEST(TorchStage3, ChecksAndErrors) {
  Net3 model = MakeNet3();
  // A parameter in no unit; a unit that is not the model's; op Max.
  EXPECT_THROW(ht::ShardedModel(*model, {model->a.ptr(), model->b.ptr()}), ht::Error);
  ht::ShardedModelOptions bad;
  bad.op = ReduceOp::kMax;
  EXPECT_THROW(ht::ShardedModel(*model, {model.ptr()}, bad), ht::Error);
  // c shared by two units neither of which contains the other.
  ::torch::nn::Sequential c_and_a(model->c, model->a), c_and_b(model->c, model->b);
  EXPECT_THROW(ht::ShardedModel(*model, {model.ptr(), c_and_a.ptr(), c_and_b.ptr()}), ht::Error);
  ht::ShardedModel sharded(*model, {model.ptr(), model->a.ptr(), model->b.ptr()});
  ht::FullyShardedOptimizer opt(sharded, Adam());
  Mlp stranger = MakeModel();
  EXPECT_THROW(sharded.Run(*stranger, [] { return Tensor(); }), ht::Error);
  auto data = Batches(1, 2);
  auto run = [&](const ::torch::nn::Module& unit, std::function<Tensor()> f) {
    return sharded.Run(unit, f);
  };
  const int64_t lo = R() * 4, hi = lo + 4;
  auto [x, y] = data[0][0];
  Loss3(model, x.slice(0, lo, hi), y.slice(0, lo, hi), run).backward();
  // zero_grad with reductions outstanding, and a second pass with backward_passes_per_step 1:
  // Horovod's errors.
  EXPECT_THROW(opt.ZeroGrad(), ht::Error);
  auto [x2, y2] = data[0][1];
  EXPECT_THROW(Loss3(model, x2.slice(0, lo, hi), y2.slice(0, lo, hi), run).backward(),
               std::exception);
  opt.Step();
}

// ---- gradient statistics (adaptive training) ------------------------------------------------

// Sum of |grad|^2 over the model's parameters after a backward pass of `loss` (torch, float64).
double GradSquares(Mlp& model, const Tensor& x, const Tensor& y) {
  for (auto& p : model->parameters()) p.mutable_grad() = Tensor();
  Loss(model, x, y).backward();
  double s = 0;
  for (auto& p : model->parameters()) s += p.grad().square().sum().item<double>();
  return s;
}

TEST(TorchAdaptive, GradStatsOfBothOptimizersMatchTorchsNorms) {
  auto batch = Batches(1, 1)[0][0];
  const auto& [x, y] = batch;
  const int64_t lo = R() * 4, hi = lo + 4;
  Mlp plain = MakeModel();
  const double local = GradSquares(plain, x.slice(0, lo, hi), y.slice(0, lo, hi));
  const double global = GradSquares(plain, x, y);  // equal shards: the mean of the ranks' means
  for (auto kind : {ht::Compression::kNone, ht::Compression::kFP16, ht::Compression::kBF16}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Mlp model = MakeModel();
    ht::DistributedOptimizerOptions options;
    options.compression = kind;
    options.stats_group = 4;
    ht::DistributedOptimizer opt(
        std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(0.1)),
        model->named_parameters(), options);
    StepOnShard(opt, model, batch);
    hvd::GradStats s = opt.TakeGradStats();
    // Compressed gradients are measured before compression: the local norm is exact.
    EXPECT_NEAR(s.local_sq, local, 1e-12 * local);
    EXPECT_NEAR(s.reduced_sq, global, (kind == ht::Compression::kNone ? 1e-12 : 2e-2) * global);
    EXPECT_EQ(s.tensors, 4);
    EXPECT_EQ(opt.TakeGradStats().tensors, 0);  // taken
  }
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Mlp model = MakeModel();
    ht::ShardedOptimizerOptions options;
    options.stage = stage;
    options.bucket_cap_bytes = 200;
    options.stats_group = 5;
    ht::ShardedOptimizer opt(model->named_parameters(), SgdMomentum(), options);
    opt.ZeroGrad();
    Loss(model, x.slice(0, lo, hi), y.slice(0, lo, hi)).backward();
    opt.Synchronize();
    hvd::GradStats s = opt.TakeGradStats();
    EXPECT_NEAR(s.local_sq, local, 1e-12 * local);
    EXPECT_NEAR(s.reduced_sq, global, 1e-12 * global);
    opt.Step();
  }
  ht::DistributedOptimizerOptions bad;
  bad.compression = ht::Compression::kPowerSGD;
  bad.stats_group = 0;
  Mlp model = MakeModel();
  EXPECT_THROW(ht::DistributedOptimizer(std::make_shared<::torch::optim::SGD>(
                                            model->parameters(), ::torch::optim::SGDOptions(0.1)),
                                        model->named_parameters(), bad),
               ht::Error);
}

TEST(TorchShardedOptimizer, ChecksAndErrors) {
  Mlp model = MakeModel();
  ht::ShardedOptimizerOptions bad;
  bad.stage = 3;
  EXPECT_THROW(ht::ShardedOptimizer(model->named_parameters(), Adam(), bad), ht::Error);
  bad = {};
  bad.backward_passes_per_step = 0;
  EXPECT_THROW(ht::ShardedOptimizer(model->named_parameters(), Adam(), bad), ht::Error);
  ht::ShardedOptimizer opt(model->named_parameters(), Adam());
  auto data = Batches(1, 2);
  Loss(model, data[0][0].first, data[0][0].second).backward();
  // A second backward pass with backward_passes_per_step 1: Horovod's error.
  EXPECT_THROW(Loss(model, data[0][1].first, data[0][1].second).backward(), std::exception);
  opt.Step();
}

TEST(TorchDistributedOptimizer, HorovodChecksAndErrors) {
  Mlp model = MakeModel();
  auto sgd =
      std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(0.1));
  ht::DistributedOptimizer opt(sgd, model->named_parameters());
  Tensor x = ::torch::ones({2, 5}, ::torch::kDouble);
  model->forward(x).sum().backward();
  try {
    opt.ZeroGrad();
    FAIL() << "ZeroGrad with allreduces outstanding must throw";
  } catch (const ht::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.zero_grad() was called after "
                                         "loss.backward() but before optimizer.step()"),
              std::string::npos);
  }
  // A second backward pass before Step with backward_passes_per_step = 1.
  EXPECT_THROW(model->forward(x).sum().backward(), std::exception);
  opt.Step();  // the first pass's allreduces are owed to the other ranks
  opt.ZeroGrad();
  ht::DistributedOptimizerOptions bad;
  bad.backward_passes_per_step = 0;
  EXPECT_THROW(ht::DistributedOptimizer(sgd, model->named_parameters(), bad), ht::Error);
}

// Rank 0 steps while the others wait in a barrier: the deadlock error names the line of
// rank 0's Step() (its gradients' allreduces were started by autograd hooks, which know no
// line of the caller's).
TEST(TorchDistributedOptimizer, ADeadlockNamesTheLineOfStep) {
  Mlp model = MakeModel();
  auto sgd =
      std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(0.1));
  ht::DistributedOptimizer opt(sgd, model->named_parameters());
  int line = 0;
  std::string message;
  try {
    if (R() == 0) {
      model->forward(::torch::ones({2, 5}, ::torch::kDouble)).sum().backward();
      line = __LINE__ + 1;
      opt.Step();
    } else {
      hvd::Status s = hvd::Barrier();
      if (!s.ok()) throw ht::Error(s);
    }
    FAIL() << "a deadlock must throw";
  } catch (const ht::Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("deadlock: every rank is blocked waiting"), std::string::npos) << message;
  if (R() == 0) {
    EXPECT_NE(message.find("' called at torch_test.cc:" + std::to_string(line)),
              std::string::npos)
        << message;
  }
  EXPECT_TRUE(hvd::Barrier().ok());  // the job goes on
}

TEST(TorchDistributedOptimizer, AGradientOnlySomeRanksComputeIsStillReduced) {
  // Rank 0 uses layer b; the others do not: every rank still submits b's gradient.
  Mlp model = MakeModel();
  auto sgd =
      std::make_shared<::torch::optim::SGD>(model->parameters(), ::torch::optim::SGDOptions(1.0));
  ht::DistributedOptimizerOptions sum;
  sum.op = ReduceOp::kSum;
  ht::DistributedOptimizer opt(sgd, model->named_parameters(), sum);
  opt.ZeroGrad();
  Tensor h = ::torch::tanh(model->a(::torch::ones({1, 5}, ::torch::kDouble)));
  Tensor out = R() == 0 ? model->b(h).sum() : h.sum();
  out.backward();
  opt.Synchronize();
  Tensor rank0 = R() == 0 ? model->b->bias.grad().clone() : ::torch::zeros({3}, ::torch::kDouble);
  EXPECT_TRUE(model->b->bias.grad().equal(ht::Broadcast(rank0, 0, "expected.bias")));
  auto guard = opt.SkipSynchronize();
  opt.Step();
}

// ---- broadcasts from a non-zero root ------------------------------------------------------------

TEST(TorchBroadcast, ParametersAndOptimizerStateFromANonZeroRoot) {
  const int root = N() - 1;
  ::torch::manual_seed(100 + R());  // different weights on every rank
  Mlp model;
  auto adam = std::make_shared<::torch::optim::Adam>(
      model->parameters(), ::torch::optim::AdamOptions(0.001 * (R() + 1)));
  if (R() == root) {  // only the root has state
    for (int s = 0; s < 2; ++s) {
      adam->zero_grad();
      model->forward(::torch::ones({3, 5}, ::torch::kDouble) * (s + 1)).sum().backward();
      adam->step();
    }
  }
  ht::BroadcastParameters(*model, root);
  ht::BroadcastOptimizerState(*adam, root);
  // Every rank now holds the root's parameters and serializes to the root's exact bytes.
  for (const Tensor& p : model->parameters()) {
    Tensor all = ht::Allgather(p.detach().reshape({1, -1}), "");
    for (int r = 0; r < N(); ++r) ASSERT_TRUE(all[r].equal(all[root]));
  }
  // Every rank holds the root's Adam state for every parameter, and the root's options.
  int64_t index = 0;
  for (const Tensor& p : model->parameters()) {
    auto it = FindState(adam->state(), p);
    ASSERT_NE(it, adam->state().end()) << "no state for parameter " << index;
    auto& state = static_cast<::torch::optim::AdamParamState&>(*it->second);
    EXPECT_EQ(state.step(), 2);
    const std::string tag = "state." + std::to_string(index++);
    for (const Tensor& t : {state.exp_avg(), state.exp_avg_sq()}) {
      Tensor all =
          ht::Allgather(t.reshape({1, -1}), tag + (t.is_same(state.exp_avg()) ? ".m" : ".v"));
      for (int r = 0; r < N(); ++r) ASSERT_TRUE(all[r].equal(all[root]));
    }
  }
  auto& options = static_cast<::torch::optim::AdamOptions&>(adam->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.lr(), 0.001 * (root + 1));
  // A different optimizer on this rank is a clear error, not a crash.
  if (N() > 1) {
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1));
    if (R() == root) {
      ht::BroadcastOptimizerState(*adam, root);
    } else {
      EXPECT_THROW(ht::BroadcastOptimizerState(sgd, root), ht::Error);
    }
  }
}

TEST(TorchErrors, AMismatchReachesTheCallerAsAnException) {
  try {
    ht::Allreduce(::torch::ones({R() + 1}), "t.mismatch");
    FAIL() << "a shape mismatch must throw";
  } catch (const ht::Error& e) {
    EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("allreduce 't.mismatch': mismatched shapes: rank 0 sent "
                                         "[1]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ht::Allreduce(::torch::ones({2}, ::torch::kComplexFloat)), ht::Error);
  Tensor t = ::torch::ones({3, 4}).t();
  EXPECT_THROW(ht::Allreduce_(t), ht::Error);  // in place needs a contiguous tensor
  // The job goes on.
  EXPECT_TRUE(ht::Allreduce(::torch::ones({2}), "t.after", {ReduceOp::kSum})
                  .equal(::torch::full({2}, static_cast<float>(N()))));
}

}  // namespace
