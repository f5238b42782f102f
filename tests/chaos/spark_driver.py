"""One chaos scenario on the test bed's Spark cluster: HorovodRunner runs worker.main(spec) on
NP ranks (the driver on hvd-h1, the ranks on the worker hosts).

    spark_driver.py MASTER NP SPEC_JSON

Prints what the ranks print (HorovodRunner streams it), then "chaos: driver: rank 0 returned
..." or "chaos: driver error: ..." (exit 1) when run() raised.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(spec, here):
    sys.path.insert(0, here)
    import worker
    return worker.main(spec)


def main():
    master, np, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    from pyspark.sql import SparkSession

    from horovod_cpp.spark import HorovodRunner
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.pop("SPARK_LOCAL_IP", None)
    session = (SparkSession.builder.appName("chaos %s" % spec["tag"]).master(master)
               .config("spark.ui.enabled", "false").config("spark.executor.memory", "768m")
               .config("spark.driver.memory", "768m").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        # driver_log_verbosity="all": every rank's output streamed to the driver (the harness
        # reads the ranks' lines there)
        value = HorovodRunner(np=np, driver_log_verbosity="all").run(rank_main, spec=spec,
                                                                      here=HERE)
        print("chaos: driver: rank 0 returned %s" % (value,), flush=True)
        code = 0
    except Exception as e:  # noqa: BLE001 (the harness judges the message)
        # one line (the harness reads line by line)
        print("chaos: driver error: %s: %s" % (type(e).__name__, " | ".join(str(e).splitlines())),
              flush=True)
        code = 1
    finally:
        session.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
