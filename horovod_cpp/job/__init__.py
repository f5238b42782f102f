"""What every way of running a function on N ranks shares, below ``horovod_cpp.runner``
(``hvdrun``, ``runner.run``), ``horovod_cpp.spark`` (HorovodRunner, ``spark.run``) and Ray, none
of which imports another: host lists (``hosts``), the mpirun command and its supervision
(``mpirun``), process helpers (``proc``), the authenticated messaging (``network``), the job
service that hands the pickled function to the ranks and takes their results, errors and
output back (``service``), and the ranks' entry point (``python -m horovod_cpp.job.rank_main``).
"""
