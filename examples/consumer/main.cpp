// A minimal LibTorch program on horovod_cpp: every rank fits y = 3x on its own samples and
// the DistributedOptimizer averages the gradients.  mpirun -np 2 ./my_trainer
#include <horovod_cpp/bindings/torch.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>

int main() {
  hvd::torch::Init();
  torch::manual_seed(hvd::torch::Rank());  // different data on every rank
  torch::nn::Linear model(1, 1);
  hvd::torch::BroadcastParameters(*model, /*root_rank=*/0);  // same start everywhere
  auto sgd =
      std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.5));
  hvd::torch::DistributedOptimizer optimizer(sgd, model->named_parameters());
  for (int step = 0; step < 300; ++step) {
    torch::Tensor x = torch::rand({16, 1});
    optimizer.ZeroGrad();
    torch::mse_loss(model->forward(x), 3 * x).backward();
    optimizer.Step();  // waits for the averaged gradients, then steps SGD
  }
  if (hvd::torch::Rank() == 0) {
    std::printf("weight %.3f on %d ranks\n", model->weight.item<double>(), hvd::torch::Size());
  }
  hvd::torch::Shutdown();
  return 0;
}
