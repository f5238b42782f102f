"""Stage 3 from a model that is never whole: built under hvd.sharded_init() (or, on PyTorch
>= 2, torch.device("meta")), initialised by hvd.shard_model one module at a time into each
rank's slices. Expected: the parameters and buffers of the same model built whole by plain
torch with the same seed, bit for bit, at every world size the suite runs at; training from
there equal to training the model built whole and sharded."""
import pytest
import torch

import horovod_cpp.torch as hvd
from horovod_cpp.torch.sharding.flat import storage_bytes
from test_sharded_model import (DIM, OPTIMIZERS, Block, TinyLM, batches, full_parameters, loss_fn,
                                mine)

SEED = 5


class TiedInTheMiddle(torch.nn.Module):
    """b's weight is a's: b's initialisation still draws from the generator (as building it
    whole does), so c's values depend on it being drawn."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.c = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


class Normed(torch.nn.Module):
    """Buffers: BatchNorm's running statistics (floats, and an int64 counter)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 12)
        self.norm = torch.nn.BatchNorm1d(12)
        self.down = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


class Scaled(torch.nn.Module):
    """A parameter of its own made in __init__, with no reset_parameters()."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.scale = torch.nn.Parameter(torch.randn(6))

    def forward(self, x):
        return self.lin(x) * self.scale


MODELS = {"tied": lambda: TinyLM(), "untied": lambda: TinyLM(tied=False),
          "tied_in_the_middle": TiedInTheMiddle, "normed": Normed,
          # nn.MultiheadAttention: its out_proj and its own parameters initialised together,
          # as building it does
          "encoder_layer": lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                     batch_first=True)}


def built_whole(make, seed=SEED):
    torch.manual_seed(seed)
    return make()


def built_deferred(make, seed=SEED):
    torch.manual_seed(seed)
    with hvd.sharded_init():
        return make()


def assert_state_equal(state, reference):
    assert sorted(state) == sorted(reference)
    for k in reference:
        assert state[k].dtype == reference[k].dtype, k
        assert torch.equal(state[k], reference[k]), k


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("wrap", [True, False])
def test_same_parameters_and_buffers_as_built_whole(name, wrap):
    make = MODELS[name]
    reference = built_whole(make).state_dict()
    model = built_deferred(make)
    assert all(p.is_meta for p in model.parameters())
    hvd.shard_model(model, auto_wrap={Block, torch.nn.Linear} if wrap else None)
    assert not any(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())
    assert_state_equal(full_parameters(model), reference)


@pytest.mark.skipif(not hasattr(torch.device("meta"), "__enter__"),
                    reason="torch.device as a context manager: PyTorch >= 2.0")
def test_a_model_built_under_torch_device_meta():
    reference = built_whole(TinyLM).state_dict()
    torch.manual_seed(SEED)
    with torch.device("meta"):
        model = TinyLM()
    hvd.shard_model(model, auto_wrap={Block})
    assert_state_equal(full_parameters(model), reference)


def test_rank_0s_seed_decides_and_sharded_init_restores_the_random_state():
    torch.manual_seed(SEED + hvd.rank())
    before = torch.get_rng_state()
    with hvd.sharded_init():
        model = TinyLM()
    assert torch.equal(torch.get_rng_state(), before)
    hvd.shard_model(model, auto_wrap={Block})
    assert_state_equal(full_parameters(model), built_whole(TinyLM, SEED).state_dict())
    # Every rank's generator went on from rank 0's state, as after seeding every rank alike.
    states = hvd.allgather_object(torch.get_rng_state())
    assert all(torch.equal(s, states[0]) for s in states)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_training_from_deferred_equals_training_the_model_built_whole(kind):
    data = batches(6, 1)
    states = []
    for model in (built_whole(TinyLM), built_deferred(TinyLM)):
        hvd.shard_model(model, auto_wrap={Block})
        cls, kw = OPTIMIZERS[kind]
        opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=3, **kw)
        for micro in data:
            opt.zero_grad()
            for ids, targets in micro:
                loss_fn(model, mine(ids), mine(targets)).backward()
            opt.step()
        states.append(full_parameters(model))
    assert_state_equal(states[1], states[0])


def test_no_rank_holds_more_than_the_module_being_initialised():
    """param_init_fn sees, of all the model's parameters, only its module's own ones real
    (every other one a one-element placeholder), and no unit gathered."""
    model = built_deferred(TinyLM)
    seen = []

    def init(module):
        own = {id(p) for p in module.parameters(recurse=False)}
        others = [storage_bytes(p) for p in model.parameters() if id(p) not in own]
        seen.append((type(module).__name__, max(others),
                     sum(storage_bytes(p) for p in module.parameters(recurse=False))))
        module.reset_parameters()

    hvd.shard_model(model, auto_wrap={Block}, param_init_fn=init)
    assert [name for name, _, _ in seen] == \
        [type(m).__name__ for m in model.modules() if list(m.parameters(recurse=False))]
    assert all(biggest <= 4 for _, biggest, _ in seen), seen  # (one float32)
    assert all(own >= 4 * DIM for _, _, own in seen), seen
    for f in hvd.sharding_of(model).flats:
        assert storage_bytes(f.full) == 0
    assert_state_equal(full_parameters(model), built_whole(TinyLM).state_dict())


def test_a_module_without_reset_parameters_needs_param_init_fn():
    with pytest.raises(ValueError, match=r"the model \(Scaled\) has parameters or buffers on "
                                         r"the meta device \(scale\) and no reset_parameters"):
        hvd.shard_model(built_deferred(Scaled))

    def init(module):
        if isinstance(module, Scaled):
            module.scale.fill_(2.5)
        else:
            module.reset_parameters()

    model = hvd.shard_model(built_deferred(Scaled), param_init_fn=init)
    state = full_parameters(model)
    assert torch.equal(state["scale"], torch.full((6,), 2.5))
    # The model's own scale is initialised first (model.modules()' order) and draws nothing:
    # the Linear's values are those of a Linear built right after the seed.
    torch.manual_seed(SEED)
    lin = torch.nn.Linear(6, 6)
    assert torch.equal(state["lin.weight"], lin.weight.detach())
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()  # nothing stuck


class Meddling(torch.nn.Module):
    """reset_parameters() sets a submodule's parameter too."""

    def __init__(self):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(6))
        self.lin = torch.nn.Linear(6, 6)

    def reset_parameters(self):
        self.gain.data.fill_(1.0)
        self.lin.bias.data.zero_()


def test_an_initialisation_that_sets_another_modules_parameters_is_named():
    with pytest.raises(RuntimeError, match=r"initialising the model \(Meddling\) set parameters "
                                           r"of other modules"):
        hvd.shard_model(built_deferred(Meddling))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()  # nothing stuck


def test_an_initialisation_that_leaves_a_parameter_unset_is_named():
    def init(module):
        if isinstance(module, torch.nn.Linear):
            module.weight.zero_()  # not the bias

    with pytest.raises(ValueError, match=r"up \(Linear\)'s param_init_fn left bias "
                                         r"uninitialised"):
        hvd.shard_model(built_deferred(Normed), param_init_fn=init)


def test_param_init_fn_for_a_built_model_is_an_error():
    with pytest.raises(ValueError, match="this one is built already"):
        hvd.shard_model(built_whole(TinyLM), param_init_fn=lambda m: None)
