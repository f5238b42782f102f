"""``import horovod_cpp.tensorflow as hvd``: Horovod's TensorFlow 2 API over horovod_cpp's core,
for today's TensorFlow (2.16 and later, whose Keras is Keras 3), with no TensorFlow op compiled
at install time or at run time: a TensorFlow upgrade never needs horovod_cpp rebuilt.

The collectives work eagerly and inside ``tf.function`` (docs/tensorflow.md says what each path
costs). ``hvd.DistributedGradientTape`` reduces a tape's gradients; Keras 3 users wrap their
optimizer with ``horovod_cpp.keras.DistributedOptimizer`` (also reachable as
``horovod_cpp.tensorflow.keras``).
"""
from horovod_cpp.common.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                             global_process_set, remove_process_set)
from horovod_cpp.tensorflow.basics import *  # noqa: F401,F403
from horovod_cpp.tensorflow.basics import _core  # noqa: F401
from horovod_cpp.tensorflow.collectives import *  # noqa: F401,F403
from horovod_cpp.tensorflow.compression import Compression  # noqa: F401
from horovod_cpp.tensorflow.functions import *  # noqa: F401,F403
from horovod_cpp.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401
from horovod_cpp.common.ops import handle_average_backwards_compatibility  # noqa: F401
from horovod_cpp.tensorflow import elastic  # noqa: F401,E402
