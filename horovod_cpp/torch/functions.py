"""Helpers built on the collectives, as in horovod.torch.functions."""
import collections
import io

import cloudpickle
import torch

from horovod_cpp.torch.basics import rank
from horovod_cpp.torch.collectives import allgather, broadcast_, broadcast_async_
from horovod_cpp.torch.process_sets import global_process_set
from horovod_cpp.torch.tensor_bridge import synchronize


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Broadcasts the parameters from ``root_rank`` to every rank, in place.

    ``params``: a ``model.state_dict()`` (or any dict of tensors), or a list of tensors or
    (name, tensor) pairs such as ``model.named_parameters()``.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    handles = [broadcast_async_(p, root_rank, name, process_set=process_set)
               for name, p in params]
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Broadcasts an optimizer's state (per-parameter tensors and scalars, and the options of
    every parameter group such as the learning rate) from ``root_rank`` to every rank.

    Works with every ``torch.optim`` optimizer except LBFGS, and with a DistributedOptimizer.
    An optimizer with no state yet gets it first, by a step with zero gradients.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()

    # A new optimizer has no state: create it with a zero-gradient step.
    if len(state_dict["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in state_dict["state"]:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        # A DistributedOptimizer's step() would allreduce; take the wrapped class's step.
        if getattr(optimizer, "_is_horovod_cpp_distributed", False):
            super(optimizer.__class__, optimizer).step()
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()

    # Options of every parameter group (lr, betas, ...), as one pickled object.
    options = [{k: v for k, v in group.items() if k != "params"}
               for group in state_dict["param_groups"]]
    options = broadcast_object(options, root_rank, name="optimizer.options",
                               process_set=process_set)
    for group, group_options in zip(optimizer.param_groups, options):
        group.update(group_options)

    if len(state_dict["state"]) == 0:
        return  # a stateless optimizer: nothing else to send

    # Per-parameter state: tensors in place, everything else pickled.
    tensors, scalars = [], []
    occurrences = collections.defaultdict(int)
    for group in state_dict["param_groups"]:
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                continue  # the parameter does not require a gradient
            for name, value in sorted(state_dict["state"][pid].items()):
                occurrences[name] += 1
                key = "%s.%d" % (name, occurrences[name])
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars.append((pid, name, value))
    broadcast_parameters(tensors, root_rank, process_set=process_set)
    values = broadcast_object([v for _, _, v in scalars], root_rank,
                              name="optimizer.scalars", process_set=process_set)
    # state_dict()'s per-parameter dicts are the optimizer's own, so this updates it.
    for (pid, name, _), value in zip(scalars, values):
        state_dict["state"][pid][name] = value


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Sends any picklable ``obj`` (cloudpickle) from ``root_rank`` to every rank and returns
    it."""
    if name is None:
        name = type(obj).__name__
    if rank() == root_rank:
        buf = io.BytesIO()
        cloudpickle.dump(obj, buf)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        broadcast_(size, root_rank, name + ".sz", process_set=process_set)
    else:
        size = torch.zeros(1, dtype=torch.int64)
        broadcast_(size, root_rank, name + ".sz", process_set=process_set)
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name + ".t", process_set=process_set)
    if rank() != root_rank:
        obj = cloudpickle.loads(payload.numpy().tobytes())
    return obj


def allgather_object(obj, name=None, process_set=global_process_set):
    """Gathers any picklable ``obj`` from every rank of the set; returns the list, in rank
    order."""
    if name is None:
        name = type(obj).__name__
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=name + ".sz",
                      process_set=process_set).tolist()
    gathered = allgather(payload, name=name + ".t", process_set=process_set).numpy()
    objects, start = [], 0
    for size in sizes:
        objects.append(cloudpickle.loads(gathered[start:start + size].tobytes()))
        start += size
    return objects
