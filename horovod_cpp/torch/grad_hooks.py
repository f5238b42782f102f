"""When a parameter's gradient is ready: the one hook registration that DistributedOptimizer and
the sharded optimizers share.

PyTorch 2.1+ has ``Tensor.register_post_accumulate_grad_hook``: a hook on the parameter itself
that runs once its ``.grad`` has been accumulated, and survives whatever rebuilds the autograd
graph around it. Before (1.13) the hook sits on the parameter's gradient accumulator node, which
must then be made while the parameter has its shape (the accumulator keeps it).
examples/bench/grad_hooks.py measures both.
"""
import torch

#: Whether this PyTorch has post-accumulate-grad hooks. Read at each registration, so a benchmark
#: or a test may set it to False to take the accumulator path on a new PyTorch.
POST_ACCUMULATE_GRAD_HOOK = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def register_grad_ready_hook(p, hook):
    """Calls ``hook()`` each time autograd has accumulated ``p``'s gradient. Returns what keeps
    the hook alive: a ``RemovableHandle`` (post-accumulate hook) or the ``AccumulateGrad`` node;
    keep it as long as the hook should run."""
    if POST_ACCUMULATE_GRAD_HOOK:
        return p.register_post_accumulate_grad_hook(lambda *ignore: hook())
    grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
    grad_acc.register_hook(lambda *ignore: hook())
    return grad_acc
