"""Learning-rate scaling rules (horovod_cpp/adaptive/scaling.py) against hand-computed values."""
import math

import pytest

from horovod_cpp.adaptive.scaling import (AdamScale, AdaScale, LEGWScale, LinearScale,
                                          SqrtScale, adascale_gain)


def test_adascale_gain_by_hand():
    # sqr 1, var 3 (at the initial batch), 4 times the batch: (3 + 1) / (3/4 + 1) = 16/7.
    assert adascale_gain(1.0, 3.0, 4) == pytest.approx(16 / 7)
    assert adascale_gain(1.0, 0.0, 4) == pytest.approx(1.0)       # no noise: no gain
    assert adascale_gain(0.0, 3.0, 4) == pytest.approx(4.0)       # all noise: linear
    assert adascale_gain(None, None, 4) == 1.0                    # nothing measured yet
    assert 1.0 <= adascale_gain(0.3, 7.0, 8) <= 8.0


def test_rules():
    grad = (1.0, 3.0)
    assert AdaScale().lr_factor(4, grad) == pytest.approx(16 / 7)
    assert AdaScale().progress(4, grad) == pytest.approx(16 / 7)
    assert AdamScale().lr_factor(4, grad) == pytest.approx(math.sqrt(16 / 7))
    assert AdamScale().progress(4, grad) == pytest.approx(16 / 7)
    assert LinearScale().lr_factor(4, grad) == 4.0 and LinearScale().progress(4) == 4
    assert SqrtScale().lr_factor(4, grad) == 2.0 and SqrtScale().progress(4) == 4
    legw = LEGWScale(base_warmup_epochs=1, data_size=1000)
    assert legw.lr_factor(4) == 0.0                     # warm-up: 1 epoch x scale 4
    legw.epoch_progress = 2.0
    assert legw.lr_factor(4) == pytest.approx(2.0 * 0.5)
    legw.epoch_progress = 10.0
    assert legw.lr_factor(4) == pytest.approx(2.0)
