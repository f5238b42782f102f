"""The bad-input matrix for the Python API: every row is a call a user can get wrong, the
exception type horovod.torch users expect, and the text that says what went wrong. After every
row the process must keep working: a valid allreduce gives the exact sum.

Covered elsewhere and not repeated here: unsupported dtypes, Adasum, a non-contiguous in-place
tensor, a root rank >= size and None for a tensor (test_ops.py:
test_bad_arguments_are_value_errors_that_say_what_is_supported), mismatched shapes, dtypes and
roots across ranks (test_ops.py), duplicate names in flight (test_ops.py), empty and 0-d tensors
(test_ops.py), a peer's shutdown (test_functions.py).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import horovod_cpp.torch as hvd


def unregistered_set():
    return hvd.ProcessSet([0])


ROWS = [
    # (label, call, exception, message regex)
    ("list instead of tensor", lambda: hvd.allreduce([1.0, 2.0]), TypeError,
     "allreduce expects a torch.Tensor, got list"),
    ("numpy array", lambda: hvd.allgather(np.zeros(3)), TypeError,
     "allgather expects a torch.Tensor, got ndarray"),
    ("int", lambda: hvd.broadcast(3, root_rank=0), TypeError,
     "broadcast expects a torch.Tensor, got int"),
    ("None in a group", lambda: hvd.grouped_allreduce([torch.ones(2), None]), TypeError,
     "expects a torch.Tensor, got NoneType"),
    ("name of wrong type", lambda: hvd.allreduce(torch.ones(2), name=7), TypeError,
     "allreduce: name must be a str or None, got int"),
    ("negative root", lambda: hvd.broadcast(torch.ones(2), root_rank=-1), ValueError,
     "root rank -1 is out of range"),
    ("root far out of range", lambda: hvd.broadcast_(torch.ones(2), root_rank=10 ** 6),
     ValueError, "root rank 1000000 is out of range"),
    ("unregistered process set", lambda: hvd.allreduce(torch.ones(2),
                                                        process_set=unregistered_set()),
     ValueError, "has not been registered"),
    ("process set of wrong type", lambda: hvd.allreduce(torch.ones(2), process_set=[0, 1]),
     (TypeError, ValueError), "process_set"),
    ("unknown reduce op", lambda: hvd.allreduce(torch.ones(2), op=42), ValueError, "op"),
    ("average and op together", lambda: hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum),
     ValueError, "average"),
    ("non-finite prescale", lambda: hvd.allreduce(torch.ones(2), prescale_factor=float("nan")),
     ValueError, "finite"),
    ("complex dtype in allgather", lambda: hvd.allgather(torch.zeros(2, dtype=torch.complex64)),
     ValueError, "torch.complex64 is not supported by allgather"),
    ("0-d tensor in allgather", lambda: hvd.allgather(torch.tensor(1.0)), ValueError,
     "scalar"),
    ("0-d tensor in reducescatter", lambda: hvd.reducescatter(torch.tensor(1.0)), ValueError,
     "scalar"),
    ("Max in reducescatter", lambda: hvd.reducescatter(torch.ones(4), op=hvd.Max), ValueError,
     "Reducescatter currently only supports AVERAGE and SUM"),
    ("uneven alltoall", lambda: hvd.alltoall(torch.ones(hvd.size() * 2 + 1)), ValueError,
     r"the first dimension \(\d+\) is not divisible by the \d+ ranks"),
    ("negative alltoall split", lambda: hvd.alltoall(
        torch.ones(2), splits=torch.tensor([-1] + [0] * (hvd.size() - 2) + [3])), ValueError,
     "negative"),
    ("poll of an unknown handle", lambda: hvd.poll(123456789), ValueError, "handle"),
]


@pytest.mark.parametrize("label,call,exc,text", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_gets_a_clear_error_and_the_process_keeps_working(label, call, exc, text):
    with pytest.raises(exc, match=text):
        call()
    n = hvd.size()
    assert hvd.allreduce(torch.full((3,), hvd.rank() + 1.0), op=hvd.Sum,
                         name="after." + label).tolist() == [n * (n + 1) / 2] * 3


def test_non_contiguous_inputs_work_for_every_out_of_place_op():
    n, r = hvd.size(), hvd.rank()
    base = torch.arange(2.0 * n * 3).reshape(3, 2 * n)
    t = base.t()  # (2n, 3), not contiguous
    assert not t.is_contiguous()
    assert torch.equal(hvd.allgather(t), torch.cat([t] * n))
    assert torch.equal(hvd.broadcast(t * (r + 1), root_rank=0), t)
    assert torch.equal(hvd.alltoall(t), torch.cat([t[2 * r:2 * r + 2]] * n))
    assert torch.equal(hvd.reducescatter(t, op=hvd.Sum), t[2 * r:2 * r + 2] * n)


def _fresh_python(code):
    """Runs ``code`` in a new interpreter that is not part of the MPI job."""
    launcher = ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_RANK", "HOROVOD_SIZE",
                "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
                "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "HVD_", "HOROVOD_GLOO_")) and k not in launcher}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)


def test_calls_before_init_and_after_shutdown_are_value_errors():
    if hvd.rank() != 0:
        return
    r = _fresh_python("""
import torch, horovod_cpp.torch as hvd
for call in (lambda: hvd.allreduce(torch.ones(2)), hvd.rank, hvd.size,
             lambda: hvd.broadcast_parameters({"w": torch.ones(2)}, 0)):
    try:
        call()
    except ValueError as e:
        print("ValueError:", e)
hvd.init()
print("size", hvd.size(), "sum", hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())
hvd.shutdown()
try:
    hvd.allreduce(torch.ones(2))
except ValueError as e:
    print("after shutdown ValueError:", e)
try:  # horovod_cpp initialized MPI here, so its shutdown finalized it: no second init
    hvd.init()
except ValueError as e:
    print("re-init ValueError:", e)
""")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines.count("ValueError: horovod_cpp has not been initialized; "
                       "call hvd.init() first") == 4, r.stdout
    assert "size 1 sum [1.0, 1.0]" in lines, r.stdout
    assert ("after shutdown ValueError: horovod_cpp has not been initialized; "
            "call hvd.init() first") in lines, r.stdout
    assert ("re-init ValueError: MPI has already been finalized in this process (by an earlier "
            "hvd.shutdown() or by the application), and MPI cannot be initialized twice"
            in lines), r.stdout


# Where horovod.torch 0.28 raises a RuntimeError (or a subclass: NotImplementedError,
# HorovodInternalError), horovod_cpp raises an error that is that too, and still a ValueError.
RUNTIME_ERROR_ROWS = [
    ("reducescatter op=Adasum", lambda: hvd.reducescatter(torch.ones(4), op=hvd.Adasum),
     hvd.HorovodNotSupportedError, NotImplementedError,
     "Reducescatter currently only supports AVERAGE and SUM"),
    ("reducescatter op=Min", lambda: hvd.grouped_reducescatter([torch.ones(4)], op=hvd.Min),
     hvd.HorovodNotSupportedError, NotImplementedError,
     "Reducescatter currently only supports AVERAGE and SUM"),
]


@pytest.mark.parametrize("label,call,exc,base,text", RUNTIME_ERROR_ROWS,
                         ids=[r[0] for r in RUNTIME_ERROR_ROWS])
def test_errors_horovod_raises_as_runtime_errors_are_runtime_errors_too(label, call, exc, base,
                                                                        text):
    with pytest.raises(exc, match=text) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, base) and isinstance(info.value, RuntimeError)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()


def test_a_duplicate_name_in_flight_is_a_runtime_error_too():
    handle = hvd.allreduce_async(torch.ones(2), name="dup.runtime")
    try:
        with pytest.raises(hvd.HorovodPreconditionError, match="already in flight") as info:
            hvd.allreduce_async(torch.ones(2), name="dup.runtime")
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    finally:
        hvd.synchronize(handle)
