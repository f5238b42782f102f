"""SyncBatchNorm: batch normalization with statistics over every rank's batch."""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horovod_cpp.torch.basics import Sum, size
from horovod_cpp.torch.collectives import allreduce
from horovod_cpp.torch.process_sets import global_process_set


class SyncBatchNorm(_BatchNorm):
    """Applies batch normalization over the union of every rank's mini-batch.

    In training, each rank sums its per-channel count, sum and sum of squares; one allreduce
    (differentiable, so autograd gives the exact gradient through the shared statistics) makes
    them global. Evaluation uses the running statistics, as ``torch.nn.BatchNorm*`` does.
    Arguments are those of ``torch.nn.BatchNorm1d/2d/3d``.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        else:
            factor = 0.0
        if not self.training or size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, self.training or not self.track_running_stats, factor,
                                self.eps)

        channels = input.size(1)
        dims = [0] + list(range(2, input.dim()))
        count = torch.full([1], input.numel() / channels, dtype=input.dtype, device=input.device)
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = allreduce(local, op=Sum, process_set=self.process_set)
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels:2 * channels] / n - mean * mean  # biased, as batch norm uses
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * n / (n - 1) if n > 1 else var
                self.running_mean.mul_(1 - factor).add_(factor * mean)
                self.running_var.mul_(1 - factor).add_(factor * unbiased)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
