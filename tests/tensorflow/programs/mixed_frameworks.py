"""One rank of a job whose ranks use different frameworks (--framework tensorflow or torch),
each allreducing a tensor named "mixed": --dtype and --rows say what this rank sends. Prints
the result, or the error message, and exits 0 on success, 3 on HorovodInternalError."""
import argparse
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["tensorflow", "torch"], required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rows", type=int, default=2)
    args = p.parse_args()
    if args.framework == "tensorflow":
        import tensorflow as tf
        import horovod_cpp.tensorflow as hvd
        hvd.init()
        value = tf.ones([args.rows], getattr(tf, args.dtype))
        run = lambda: hvd.allreduce(value, name="mixed", op=hvd.Sum).numpy().tolist()  # noqa: E731
    else:
        import torch
        import horovod_cpp.torch as hvd
        hvd.init()
        value = torch.ones(args.rows, dtype=getattr(torch, args.dtype))
        run = lambda: hvd.allreduce(value, name="mixed", op=hvd.Sum).tolist()  # noqa: E731
    try:
        print("rank %d %s result %s" % (hvd.rank(), args.framework, run()), flush=True)
    except hvd.HorovodInternalError as e:
        print("rank %d %s error: %s" % (hvd.rank(), args.framework, e), flush=True)
        hvd.shutdown()
        sys.exit(3)
    hvd.shutdown()


if __name__ == "__main__":
    main()
