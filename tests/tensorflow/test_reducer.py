"""The shared reducer's grouping (horovod_cpp.common.reducer), hand-computed: Horovod's
``num_groups`` (consecutive gradients, the first groups one larger, as numpy.array_split) and
``groups`` (lists of variables together, every other gradient alone)."""
import pytest

from horovod_cpp.common.reducer import split_into_groups


def test_num_groups_splits_consecutive_gradients_first_groups_larger():
    assert split_into_groups([0, 1, 2, 3, 4], num_groups=2) == [[0, 1, 2], [3, 4]]
    assert split_into_groups([0, 1, 2, 3, 4], num_groups=3) == [[0, 1], [2, 3], [4]]
    assert split_into_groups([0, 2], num_groups=5) == [[0], [2]]  # no empty group
    assert split_into_groups([0, 1, 2]) == [[0, 1, 2]]  # default: one group
    assert split_into_groups([]) == []


def test_groups_of_variables_and_every_other_gradient_alone():
    v = [object() for _ in range(5)]
    got = split_into_groups([0, 1, 2, 3], groups=[[v[2], v[0]], [v[4]]], variables=v)
    # v[4] has no gradient here (index 4 not among those reduced): its group is dropped
    assert got == [[2, 0], [1], [3]]


def test_groups_and_num_groups_together_are_an_error():
    with pytest.raises(ValueError, match="not both"):
        split_into_groups([0], num_groups=2, groups=[[object()]], variables=[object()])
    with pytest.raises(ValueError, match="list of lists"):
        split_into_groups([0], groups=[object()], variables=[object()])
