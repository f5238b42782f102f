"""``horovod_cpp.tensorflow.keras``: Horovod's module path for the Keras API. Importing it
gives the ``horovod_cpp.keras`` module itself (its ``callbacks`` and ``elastic`` too), so both
paths name the same objects."""
import sys

import horovod_cpp.keras as _keras

sys.modules[__name__ + ".callbacks"] = _keras.callbacks
sys.modules[__name__ + ".elastic"] = _keras.elastic
sys.modules[__name__] = _keras
