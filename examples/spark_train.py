"""The digits example (examples/train.py) trained on 2 ranks through HorovodRunner, from a
Spark driver with a local SparkSession, the way a notebook would run it.

    .venv/bin/python examples/spark_train.py [--np 2] [--epochs 20] [--master local[2]]

The dataset is loaded on the driver and travels to the ranks with the function (cloudpickle);
rank 0 reports progress with log_to_driver, and rank 0's final accuracy is returned.
"""
import argparse
import os
import sys

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402  (examples/train.py)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2, help="ranks (negative: on the driver)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--master", default=None, help="Spark master (default local[NP])")
    args = parser.parse_args()

    # Spark's Python workers must be this interpreter (it has torch and horovod_cpp).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.master is None:  # a local session on loopback, whatever the hostname resolves to
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from horovod_cpp.spark import HorovodRunner, log_to_driver

    spark = (SparkSession.builder.appName("horovod_cpp spark_train")
             .master(args.master or "local[%d]" % max(args.np, 1))
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # train.py is not installed on the workers: send its code along with the function.
        cloudpickle.register_pickle_by_value(train)
        accuracy = HorovodRunner(np=args.np).run(
            train.train, dataset=train.load_digits(train.DEFAULT_DATA), epochs=args.epochs,
            log=log_to_driver)
        print("HorovodRunner returned rank 0's final test accuracy: %.4f" % accuracy)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
