"""Elastic Keras 3 training (run by hvdrun's elastic mode): a model fit on a fixed problem, one
epoch per fit under ``hvd.elastic.run`` with KerasState and the three elastic callbacks. Each
epoch rank 0 prints ``epoch E/N  S ranks``; after a reset every rank prints a check that it
holds rank 0's weights; at the end rank 0 prints the final loss on the full data and
``done: N epochs, S ranks at the end``. --step-delay slows each batch (so a kill lands
mid-epoch)."""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import horovod_cpp.keras as hvd  # noqa: E402


class Delay(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--step-delay", type=float, default=0.0)
    args = p.parse_args()
    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(480, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    keras.utils.set_random_seed(hvd.rank())
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    resets = [0]  # this process's count (the state's attributes come back from rank 0's commit)
    state.register_reset_callbacks([lambda: resets.__setitem__(0, resets[0] + 1)])

    def check_after_reset():
        # run() syncs the state from rank 0 after the reset callbacks, before train() again
        weights = [w.tolist() for w in model.get_weights()]
        everyone = hvd.allgather_object(weights)
        print("reset check: rank %d of %d holds rank 0's weights %s"
              % (hvd.rank(), hvd.size(), all(w == everyone[0] for w in everyone)), flush=True)
    callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=5),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), Delay(args.step_delay)]

    @hvd.elastic.run
    def train(state):
        if resets[0]:
            check_after_reset()
        while state.epoch < args.epochs:
            r, n = hvd.rank(), hvd.size()
            if r == 0:
                print("epoch %d/%d  %d ranks" % (state.epoch + 1, args.epochs, n), flush=True)
            model.fit(x[r::n], y[r::n], batch_size=8, epochs=state.epoch + 1,
                      initial_epoch=state.epoch, shuffle=False, verbose=0, callbacks=callbacks)

    train(state)
    loss = model.evaluate(x, y, verbose=0)
    if hvd.rank() == 0:
        print("done: %d epochs, %d ranks at the end, %d resets, final loss %.4f"
              % (state.epoch, hvd.size(), resets[0], loss), flush=True)


if __name__ == "__main__":
    main()
