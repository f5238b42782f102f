"""horovod_cpp.tensorflow's collectives against hand-computed results: every rank's input is
a known function of its rank, so each rank computes what every op must return. Each op runs
eagerly and inside tf.function."""
import sys

import numpy as np
import pytest
import tensorflow as tf

import horovod_cpp.tensorflow as hvd
from conftest import same_on_every_rank

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
DTYPES = FLOATS + [tf.uint8, tf.int8, tf.int32, tf.int64]
MODES = ["eager", "function"]


def call(mode, fn, *args):
    if mode == "eager":
        return fn(*args)
    return tf.function(fn)(*args)


def value(rank, shape, dtype):
    """Rank ``rank``'s input: small integers, exact in every dtype."""
    base = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) % 7
    return tf.cast(tf.constant(base + rank + 1), dtype)


def every_rank(shape, dtype):
    return [value(r, shape, dtype).numpy().astype(np.float64) for r in range(hvd.size())]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["Average", "Sum", "Min", "Max", "Product"])
def test_allreduce(mode, dtype, op):
    if op == "Average" and not dtype.is_floating:
        pytest.skip("the average of integers is a float")
    if op == "Product" and dtype in (tf.uint8, tf.int8, tf.float16, tf.bfloat16) and \
            hvd.size() > 2:
        pytest.skip("the product overflows this dtype")
    inputs = np.stack(every_rank([2, 3], dtype))
    want = {"Average": inputs.mean(0), "Sum": inputs.sum(0), "Min": inputs.min(0),
            "Max": inputs.max(0), "Product": inputs.prod(0)}[op]
    got = call(mode, lambda x: hvd.allreduce(x, op=getattr(hvd, op), name="ar.%s" % op),
               value(hvd.rank(), [2, 3], dtype))
    assert got.dtype == dtype and got.shape == (2, 3)
    np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scale_factors_and_scalar(mode):
    got = call(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                             postscale_factor=3.0), tf.constant(2.0 * (hvd.rank() + 1)))
    assert got.shape == ()
    assert got.numpy() == pytest.approx(3.0 * sum(r + 1 for r in range(hvd.size())))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixes_dtypes_and_shapes(mode):
    def fn(a, b, c):
        return hvd.grouped_allreduce([a, b, c], op=hvd.Sum)
    r = hvd.rank()
    got = call(mode, fn, tf.fill([3], float(r)), tf.fill([2, 2], r + 1), tf.constant(1.0, tf.float64))
    n = hvd.size()
    np.testing.assert_array_equal(got[0].numpy(), np.full(3, n * (n - 1) / 2))
    np.testing.assert_array_equal(got[1].numpy(), np.full((2, 2), n * (n + 1) // 2))
    assert got[1].dtype == tf.int32 and got[2].numpy() == n


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_allreduce_of_indexed_slices_gathers(mode, op):
    r, n = hvd.rank(), hvd.size()

    def fn(values, indices):
        s = hvd.allreduce(tf.IndexedSlices(values, indices, dense_shape=[10, 2]),
                          op=getattr(hvd, op))
        return s.values, s.indices
    values, indices = call(mode, fn, tf.fill([r + 1, 2], float(r + 1)),
                           tf.range(r + 1, dtype=tf.int64) + r)
    want_values = np.concatenate([np.full((q + 1, 2), float(q + 1)) for q in range(n)])
    if op == "Average":
        want_values = want_values / n
    np.testing.assert_allclose(values.numpy(), want_values)
    np.testing.assert_array_equal(indices.numpy(),
                                  np.concatenate([np.arange(q + 1) + q for q in range(n)]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.int64, tf.bool, tf.bfloat16])
def test_allgather_rows_differ_per_rank(mode, dtype):
    r, n = hvd.rank(), hvd.size()
    got = call(mode, lambda x: hvd.allgather(x), tf.cast(tf.fill([r + 1, 3], r % 2), dtype))
    want = np.concatenate([np.full((q + 1, 3), q % 2) for q in range(n)])
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy().astype(np.int64), want)


def test_grouped_allgather():
    r, n = hvd.rank(), hvd.size()
    a, b = hvd.grouped_allgather([tf.fill([r + 1], r), tf.fill([1, 2], float(r))])
    np.testing.assert_array_equal(a.numpy(), np.concatenate([np.full(q + 1, q) for q in range(n)]))
    np.testing.assert_array_equal(b.numpy(), np.repeat(np.arange(n, dtype=np.float32), 2).reshape(n, 2))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_from_every_root(mode):
    for root in range(hvd.size()):
        got = call(mode, lambda x: hvd.broadcast(x, root), value(hvd.rank(), [4], tf.float32))
        np.testing.assert_array_equal(got.numpy(), value(root, [4], tf.float32).numpy())


def test_broadcast_variables_and_objects():
    r = hvd.rank()
    v = tf.Variable(tf.fill([3], float(r)))
    w = tf.Variable(r, dtype=tf.int64)
    hvd.broadcast_variables([v, w], root_rank=hvd.size() - 1)
    assert v.numpy().tolist() == [hvd.size() - 1.0] * 3 and int(w.numpy()) == hvd.size() - 1
    assert hvd.broadcast_object({"from": r, "list": [r] * 3}, root_rank=1) == \
        {"from": 1, "list": [1] * 3}
    assert hvd.allgather_object(("rank", r)) == [("rank", q) for q in range(hvd.size())]
    assert hvd.broadcast_object_fn(root_rank=0)(r) == 0


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_and_without_splits(mode):
    r, n = hvd.rank(), hvd.size()
    got, received = call(mode, lambda x: hvd.alltoall(x), tf.range(2 * n) + 100 * r)
    np.testing.assert_array_equal(got.numpy(), np.concatenate(
        [np.arange(2 * r, 2 * r + 2) + 100 * q for q in range(n)]))
    assert received.numpy().tolist() == [2] * n
    # rank r sends d + 1 rows to rank d
    splits = tf.constant([d + 1 for d in range(n)], tf.int64)
    rows = tf.reshape(tf.range(sum(d + 1 for d in range(n)) * 2), [-1, 2]) + 1000 * r
    got, received = call(mode, lambda x, s: hvd.alltoall(x, splits=s), rows, splits)
    assert received.numpy().tolist() == [r + 1] * n
    offset = sum(d + 1 for d in range(r))
    want = np.concatenate([np.arange(2 * offset, 2 * (offset + r + 1)).reshape(-1, 2) + 1000 * q
                           for q in range(n)])
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_reducescatter_uneven_rows(mode, op):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    x = tf.reshape(tf.range(rows * 2, dtype=tf.float32), [rows, 2]) * (r + 1)
    got = call(mode, lambda t: hvd.reducescatter(t, op=getattr(hvd, op)), x)
    full = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * sum(q + 1 for q in range(n))
    if op == "Average":
        full /= n
    counts = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
    start = sum(counts[:r])
    np.testing.assert_allclose(got.numpy(), full[start:start + counts[r]])
    a, b = hvd.grouped_reducescatter([x, x[:, :1]], op=getattr(hvd, op))
    np.testing.assert_allclose(a.numpy(), full[start:start + counts[r]])
    np.testing.assert_allclose(b.numpy(), full[start:start + counts[r], :1])


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compression_casts_on_the_wire(compression):
    x = tf.constant([1.5, -2.25, 1024.0], tf.float32) * (hvd.rank() + 1)
    got = hvd.allreduce(x, op=hvd.Sum, compression=getattr(hvd.Compression, compression))
    assert got.dtype == tf.float32
    n = hvd.size()
    np.testing.assert_array_equal(got.numpy(), np.array([1.5, -2.25, 1024.0]) * n * (n + 1) / 2)


def test_gradients_of_allreduce_allgather_and_broadcast():
    r, n = hvd.rank(), hvd.size()
    x = tf.Variable(tf.fill([r + 1, 2], 1.0))
    with tf.GradientTape(persistent=True) as tape:
        summed = tf.reduce_sum(hvd.allreduce(x[:1] * float(r + 1), op=hvd.Sum))
        gathered = tf.reduce_sum(hvd.allgather(x) * 3.0)
        bcast = tf.reduce_sum(hvd.broadcast(x[:1], 0) * 5.0)
    # d/dx of sum(allreduce_sum(x * (r+1))): the gradient's allreduce (n) times r+1, first row
    g = tape.gradient(summed, x).numpy()
    np.testing.assert_allclose(g[0], [n * (r + 1.0)] * 2)
    # allgather: this rank's rows of the summed gradient (3 from every rank)
    np.testing.assert_allclose(tape.gradient(gathered, x).numpy(), np.full((r + 1, 2), 3.0 * n))
    # broadcast: the root gets the sum of every rank's gradient, the others zero
    gb = tape.gradient(bcast, x).numpy()[0]
    np.testing.assert_allclose(gb, [5.0 * n] * 2 if r == 0 else [0.0, 0.0])


def test_process_set_collectives():
    if hvd.size() < 3:
        pytest.skip("needs 3 ranks")
    ps = hvd.add_process_set([0, 2])
    try:
        if hvd.rank() in (0, 2):
            got = hvd.allreduce(tf.constant([float(hvd.rank())]), op=hvd.Sum, process_set=ps)
            assert got.numpy().tolist() == [2.0]
            assert hvd.size_op(ps.process_set_id).numpy() == 2
            assert hvd.allgather(tf.constant([hvd.rank()]), process_set=ps).numpy().tolist() == [0, 2]
    finally:
        hvd.remove_process_set(ps)


def test_topology_ops_inside_a_function():
    @tf.function
    def topology():
        return hvd.size_op(), hvd.rank_op(), hvd.local_size_op()
    size, rank, local = topology()
    assert (int(size), int(rank)) == (hvd.size(), hvd.rank())
    assert int(local) == hvd.local_size() and hvd.is_homogeneous() in (True, False)
    hvd.barrier()


def test_a_mismatch_between_ranks_is_an_error_on_every_rank():
    shape = [2] if hvd.rank() == 0 else [3]
    with pytest.raises(hvd.HorovodInternalError) as e:
        hvd.allreduce(tf.ones(shape), name="mismatched")
    assert "mismatched" in str(e.value) and "shape" in str(e.value).lower()
    dtype = tf.float32 if hvd.rank() == 0 else tf.float64
    with pytest.raises(hvd.HorovodInternalError) as e:
        hvd.allreduce(tf.ones([2], dtype), name="mismatched_dtype")
    assert "mismatched_dtype" in str(e.value)


def test_bad_input_is_a_clear_error_before_any_collective():
    with pytest.raises(ValueError, match="not supported by allreduce"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(hvd.HorovodNotSupportedError, match="Adasum"):
        hvd.allreduce(tf.ones([2]), op=hvd.Adasum)
    with pytest.raises(ValueError, match="process_set"):
        hvd.allreduce(tf.ones([2]), process_set="everyone")

    @tf.function(jit_compile=True)
    def under_xla(x):
        return hvd.allreduce(x)
    with pytest.raises(ValueError, match="jit_compile=False"):
        under_xla(tf.ones([2]))


def here():
    """The caller's file:line, as errors name the call site of a collective."""
    frame = sys._getframe(1)
    return "%s:%d" % (frame.f_code.co_filename, frame.f_lineno)


def test_a_deadlock_names_the_tensorflow_op_and_the_users_line_on_every_rank():
    # Rank 0 waits in a barrier, the others in a TensorFlow allgather: neither can complete.
    with pytest.raises(hvd.HorovodInternalError) as info:
        if hvd.rank() == 0:
            site = here(); hvd.barrier()  # noqa: E702
        else:
            site = here(); hvd.allgather(tf.ones([1, 2]), name="tf_deadlocked")  # noqa: E702
    message = str(info.value)
    sites = same_on_every_rank(site)
    assert "deadlock: every rank is blocked waiting" in message, message
    for r in range(1, hvd.size()):
        assert "waits for allgather 'allgather.tf_deadlocked' called at %s" % sites[r] in message
    assert same_on_every_rank(message) == [message] * hvd.size()
    hvd.barrier()  # the job goes on
    assert hvd.allgather(tf.ones([1, 2]), name="tf_deadlocked").shape == (hvd.size(), 2)


def test_a_tapes_call_site_is_the_users_gradient_line():
    v = tf.Variable(tf.ones([2 if hvd.rank() == 0 else 3]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v)
    tape = hvd.DistributedGradientTape(tape)
    with pytest.raises(hvd.HorovodInternalError) as info:
        site = here(); tape.gradient(loss, [v])  # noqa: E702
    sites = same_on_every_rank(site)
    assert "DistributedGradientTape" in str(info.value)
    for r, s in enumerate(sites):
        assert s in str(info.value), (s, str(info.value))


def test_an_error_inside_a_function_arrives_as_tensorflows_with_the_message():
    from horovod_cpp.tensorflow.tensor_bridge import internal_error_message

    @tf.function
    def reduce(x):
        return hvd.allreduce(x, name="fn_mismatch")
    with pytest.raises(tf.errors.OpError) as info:
        reduce(tf.ones([2] if hvd.rank() == 0 else [3]))
    message = internal_error_message(info.value)  # what hvd.elastic.run reads
    assert message is not None and "allreduce.fn_mismatch" in message, str(info.value)
    assert "mismatched shapes" in message
    assert internal_error_message(ValueError("HorovodInternalError: no")) is None
    hvd.barrier()
