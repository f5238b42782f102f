// horovod_cpp — Apache-2.0
// Trains a small convolutional network on the 1,797 8x8 handwritten digits with the LibTorch
// C++ API:
//
//   mpirun -np 2 build/examples/train [--epochs 10] [--batch-size 128] [--lr 0.1] [--seed 42]
//                                     [--threads 1] [--data examples/data/digits.csv]
//                                     [--timeline FILE]
//
// The network (two 3x3 convolutions, 85k parameters) does enough work per sample that a step
// takes much longer than allreducing its gradients, so 2 ranks on 2 cores train nearly twice
// as many samples per second as 1 (./run.sh measures both). Each rank uses --threads torch
// threads (1: one core per rank, as mpirun binds them).
//
// The dataset is scikit-learn's digits (see examples/data/README.md); every fifth image is
// held out for testing. Each epoch every rank draws the same permutation of the training set
// and takes its slice of every global batch, so the global batch (and the result) does not
// depend on the number of ranks. Rank 0 prints per-epoch loss, test accuracy and samples/s,
// then a line with the accuracy and one with the training throughput over all epochs.

#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bindings/torch.h"

namespace po = boost::program_options;

namespace {

struct Digits {
  torch::Tensor train_x, train_y, test_x, test_y;
};

// Reads "p0,...,p63,label" lines (pixels 0..16); '#' starts a comment line.
Digits LoadDigits(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the dataset '" + path + "'");
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::stringstream fields(line);
    std::string value;
    std::vector<float> row;
    while (std::getline(fields, value, ',')) row.push_back(std::stof(value));
    if (row.size() != 65) throw std::runtime_error("malformed line in '" + path + "': " + line);
    pixels.insert(pixels.end(), row.begin(), row.begin() + 64);
    labels.push_back(static_cast<int64_t>(row[64]));
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  torch::Tensor x = torch::from_blob(pixels.data(), {n, 64}, torch::kFloat).clone() / 16.0;
  torch::Tensor y = torch::from_blob(labels.data(), {n}, torch::kLong).clone();
  torch::Tensor test = torch::arange(n) % 5 == 0;
  return {x.index({~test}), y.index({~test}), x.index({test}), y.index({test})};
}

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 4 * 4, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(conv1(x.view({-1, 1, 8, 8})));
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);  // 64 x 4 x 4
    return fc2(torch::relu(fc1(h.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) {
  int epochs = 10, batch_size = 128, seed = 42, threads = 1;
  double lr = 0.1;
  int powersgd_rank = 2, powersgd_start = 20;
  std::string data = HVD_DEFAULT_DIGITS, timeline, compression = "none";
  po::options_description opts("train: a digits classifier trained with horovod_cpp");
  opts.add_options()("help", "show this help")("epochs", po::value(&epochs)->default_value(epochs),
                                               "passes over the training set")(
      "batch-size", po::value(&batch_size)->default_value(batch_size), "global batch size")(
      "lr", po::value(&lr)->default_value(lr, "0.1"), "SGD learning rate (momentum 0.9)")(
      "seed", po::value(&seed)->default_value(seed), "random seed of the initial weights")(
      "threads", po::value(&threads)->default_value(threads), "torch threads per rank")(
      "data", po::value(&data)->default_value(data), "the digits CSV file")(
      "timeline", po::value(&timeline), "record a Chrome-tracing timeline into this file")(
      "compression", po::value(&compression)->default_value(compression),
      "how gradients travel: none, fp16, bf16 or powersgd")(
      "powersgd-rank", po::value(&powersgd_rank)->default_value(powersgd_rank),
      "PowerSGD's matrix approximation rank")(
      "powersgd-start", po::value(&powersgd_start)->default_value(powersgd_start),
      "steps averaged exactly before PowerSGD starts");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
    if (epochs <= 0 || batch_size <= 0 || lr <= 0 || threads <= 0)
      throw po::error("--epochs, --batch-size, --lr and --threads must be positive");
    if (compression != "none" && compression != "fp16" && compression != "bf16" &&
        compression != "powersgd")
      throw po::error("--compression: none, fp16, bf16 or powersgd, got '" + compression + "'");
  } catch (const po::error& e) {
    std::cerr << "train: " << e.what() << "\n\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }

  try {
    hvd::torch::Init();
    const int rank = hvd::torch::Rank(), size = hvd::torch::Size();
    if (batch_size < size) {
      throw std::invalid_argument("--batch-size " + std::to_string(batch_size) +
                                  " is smaller than the number of ranks (" + std::to_string(size) +
                                  "): every rank needs samples");
    }
    if (!timeline.empty()) {
      hvd::Status s = hvd::StartTimeline(timeline);
      if (!s.ok()) throw hvd::torch::Error(s);
    }
    torch::set_num_threads(threads);
    torch::manual_seed(seed);
    Digits d = LoadDigits(data);

    Net model;
    hvd::torch::BroadcastParameters(*model, 0);
    auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(),
                                                   torch::optim::SGDOptions(lr).momentum(0.9));
    hvd::torch::DistributedOptimizerOptions options;
    options.compression = compression == "fp16"       ? hvd::torch::Compression::kFP16
                          : compression == "bf16"     ? hvd::torch::Compression::kBF16
                          : compression == "powersgd" ? hvd::torch::Compression::kPowerSGD
                                                      : hvd::torch::Compression::kNone;
    options.powersgd.matrix_approximation_rank = powersgd_rank;
    options.powersgd.start_powersgd_iter = powersgd_start;
    // Every step compressed (not adaptive), as examples/train.py: the example shows what the
    // approximation costs in accuracy, whatever the link.
    options.powersgd.adaptive = false;
    hvd::torch::DistributedOptimizer optimizer(sgd, model->named_parameters(), options);
    hvd::torch::BroadcastOptimizerState(*sgd, 0);

    const int64_t train_n = d.train_y.size(0);
    const int64_t steps = train_n / batch_size;
    double accuracy = 0, train_seconds = 0;
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const auto start = std::chrono::steady_clock::now();
      model->train();
      torch::Tensor order = torch::randperm(
          train_n, torch::Generator(at::detail::createCPUGenerator(epoch)), torch::kLong);
      torch::Tensor loss_sum = torch::zeros({1});
      for (int64_t step = 0; step < steps; ++step) {
        torch::Tensor batch = order.slice(0, step * batch_size, (step + 1) * batch_size)
                                  .slice(0, rank, torch::indexing::None, size);
        optimizer.ZeroGrad();
        torch::Tensor loss =
            torch::nll_loss(torch::log_softmax(model->forward(d.train_x.index({batch})), 1),
                            d.train_y.index({batch}));
        loss.backward();
        optimizer.Step();
        loss_sum += loss.detach();
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      train_seconds += seconds;

      model->eval();
      torch::NoGradGuard no_grad;
      torch::Tensor mine = torch::arange(rank, d.test_y.size(0), size);
      torch::Tensor correct =
          (model->forward(d.test_x.index({mine})).argmax(1) == d.test_y.index({mine}))
              .sum()
              .to(torch::kFloat)
              .reshape({1});
      correct = hvd::torch::Allreduce(correct, "correct", {hvd::ReduceOp::kSum});
      const double mean_loss =
          hvd::torch::Allreduce(loss_sum / static_cast<double>(steps), "loss").item<double>();
      accuracy = correct.item<double>() / static_cast<double>(d.test_y.size(0));
      if (rank == 0) {
        std::printf("epoch %2d/%d  loss %.4f  test accuracy %.4f  %.0f samples/s\n", epoch, epochs,
                    mean_loss, accuracy, static_cast<double>(steps * batch_size) / seconds);
        std::fflush(stdout);
      }
    }
    if (rank == 0) {
      if (compression == "powersgd") {
        std::printf("powersgd: rank %d from step %d, %.1fx fewer numbers sent per step\n",
                    powersgd_rank, powersgd_start, optimizer.compression_rate());
      }
      std::printf("final test accuracy: %.4f (%d rank%s, %lld test images)\n", accuracy, size,
                  size == 1 ? "" : "s", static_cast<long long>(d.test_y.size(0)));
      std::printf("training throughput: %.1f samples/s over %d epochs (%d rank%s)\n",
                  static_cast<double>(steps * batch_size) * epochs / train_seconds, epochs, size,
                  size == 1 ? "" : "s");
    }
    if (!timeline.empty()) (void)hvd::StopTimeline();
    hvd::torch::Shutdown();
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
