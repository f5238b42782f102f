"""DistributedGradientTape against one process on the full batch: each rank trains on its
shard of every batch, and its variables must end where one process training on the whole
batch ends (computed on every rank, with no communication)."""
import numpy as np
import pytest
import tensorflow as tf

import horovod_cpp.tensorflow as hvd

PER_RANK = 4


def data(step):
    rng = np.random.default_rng(step)
    n = PER_RANK * hvd.size()
    x = rng.normal(size=(n, 5)).astype(np.float32)
    ids = rng.integers(0, 12, size=n)
    y = rng.integers(0, 3, size=n)
    return x, ids, y


def make_variables():
    rng = np.random.default_rng(42)
    return [tf.Variable(rng.normal(size=(12, 4)).astype(np.float32), name="embedding"),
            tf.Variable(rng.normal(size=(9, 3)).astype(np.float32), name="kernel"),
            tf.Variable(np.zeros(3, np.float32), name="bias")]


def loss_fn(variables, x, ids, y):
    emb, kernel, bias = variables
    features = tf.concat([x, tf.gather(emb, ids)], axis=1)  # tf.gather: an IndexedSlices grad
    logits = tf.matmul(features, kernel) + bias
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def train(distributed, steps=4, use_function=False, **tape_args):
    variables = make_variables()
    opt = tf.keras.optimizers.SGD(0.5)
    r = hvd.rank()

    def step_fn(x, ids, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(variables, x, ids, y)
        if distributed:
            tape = hvd.DistributedGradientTape(tape, **tape_args)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))

    step = tf.function(step_fn) if use_function else step_fn
    for s in range(steps):
        x, ids, y = data(s)
        if distributed:
            part = slice(r * PER_RANK, (r + 1) * PER_RANK)
            x, ids, y = x[part], ids[part], y[part]
        step(tf.constant(x), tf.constant(ids), tf.constant(y))
    return [v.numpy() for v in variables]


@pytest.mark.parametrize("use_function", [False, True])
@pytest.mark.parametrize("tape_args", [
    {}, {"sparse_as_dense": True}, {"num_groups": 2},
    {"gradient_predivide_factor": 2.0}, {"compression": "bf16"}])
def test_tape_training_equals_one_process_on_the_full_batch(use_function, tape_args):
    tolerance = 1e-5
    if tape_args.get("compression"):
        tape_args = dict(tape_args, compression=getattr(hvd.Compression, tape_args["compression"]))
        tolerance = 2e-2
    want = train(False)
    got = train(True, use_function=use_function, **tape_args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tolerance, atol=tolerance)


def test_sum_op_and_local_sources():
    v, local = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v) * (hvd.rank() + 1) + tf.reduce_sum(local) * (hvd.rank() + 1)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    tape.register_local_source(local)
    gv, gl = tape.gradient(loss, [v, local])
    n = hvd.size()
    assert gv.numpy().tolist() == [n * (n + 1) / 2] * 2
    assert gl.numpy().tolist() == [hvd.rank() + 1.0]  # local: not reduced (Sum: not scaled)


def test_gradient_of_a_dict_of_sources_and_a_none_gradient():
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    with tf.GradientTape() as tape:
        loss = a * (hvd.rank() + 1.0)
    grads = hvd.DistributedGradientTape(tape).gradient(loss, {"a": a, "b": b})
    assert grads["b"] is None
    assert grads["a"].numpy() == pytest.approx((hvd.size() + 1) / 2)
