"""Stage 3 (hvd.shard_model + ShardedOptimizer(stage=3)): the parameters sharded too.

N ranks, each on 1/N of the batch, must match DistributedOptimizer on the same data and one
process on the full batch (plain torch, computed here): with tied weights, a frozen embedding,
a module called twice, clipping and gradient accumulation. A rank that skips a unit must end
as an error on every rank, not a hang."""
import os
import re

import pytest
import torch

import horovod_cpp.torch as hvd

VOCAB, DIM, SEQ, PER_RANK = 11, 8, 5, 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 2 * DIM)
        self.down = torch.nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class TinyLM(torch.nn.Module):
    """Embedding -> blocks -> norm -> head; the head's weight tied to the embedding's
    (``tied``); ``reuse`` runs the first block twice."""

    def __init__(self, blocks=3, tied=True, frozen_embedding=False, reuse=False):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(blocks)])
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight
        if frozen_embedding:
            self.embed.weight.requires_grad_(False)
        self.reuse = reuse

    def forward(self, ids, skip=None):
        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            if i != skip:
                x = block(x)
        if self.reuse:
            x = self.blocks[0](x)
        return self.head(self.norm(x))


def make_model(dtype=torch.float32, **kw):
    torch.manual_seed(5)
    return TinyLM(**kw).to(dtype)


def batches(steps, micro, seed=3, ranks=None):
    """The full batches every rank agrees on: steps x micro x (ranks * PER_RANK) sequences."""
    g = torch.Generator().manual_seed(seed)
    total = (ranks or hvd.size()) * PER_RANK
    return [[(torch.randint(0, VOCAB, (total, SEQ), generator=g),
              torch.randint(0, VOCAB, (total, SEQ), generator=g)) for _ in range(micro)]
            for _ in range(steps)]


def mine(x):
    return x[hvd.rank() * PER_RANK:(hvd.rank() + 1) * PER_RANK]


def train_on(model, opt, data, ps):
    """Steps over data, each rank of the process set ps on its rows of every batch."""
    rows = slice(ps.rank() * PER_RANK, (ps.rank() + 1) * PER_RANK)
    for micro in data:
        opt.zero_grad()
        for ids, targets in micro:
            loss_fn(model, ids[rows], targets[rows]).backward()
        opt.step()


def loss_fn(model, ids, targets):
    return torch.nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), targets.reshape(-1))


OPTIMIZERS = {
    "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def train_reference(kind, data, max_norm=None, **model_kw):
    """One process on the full batch."""
    model = make_model(**model_kw)
    cls, kw = OPTIMIZERS[kind]
    opt = cls(trainable(model), **kw)
    for micro in data:
        opt.zero_grad()
        for ids, targets in micro:
            (loss_fn(model, ids, targets) / len(micro)).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(trainable(model), max_norm)
        opt.step()
    return model, opt


def train_distributed(kind, data, **model_kw):
    """DistributedOptimizer on this rank's part of every batch."""
    model = make_model(**model_kw)
    cls, kw = OPTIMIZERS[kind]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = hvd.DistributedOptimizer(cls([p for _, p in named], **kw), named_parameters=named)
    for micro in data:
        opt.zero_grad()
        for ids, targets in micro:
            loss_fn(model, mine(ids), mine(targets)).backward()
        opt.step()
    return model


def train_stage3(kind, data, max_norm=None, auto_wrap=(Block,), **model_kw):
    model = make_model(**model_kw)
    hvd.shard_model(model, auto_wrap=set(auto_wrap) if auto_wrap else None,
                    backward_passes_per_step=len(data[0]))
    cls, kw = OPTIMIZERS[kind]
    opt = hvd.ShardedOptimizer([(n, p) for n, p in model.named_parameters()
                                if p.requires_grad], cls, stage=3, **kw)
    for micro in data:
        opt.zero_grad()
        for ids, targets in micro:
            (loss_fn(model, mine(ids), mine(targets)) / len(micro)).backward()
        if max_norm is not None:
            opt.clip_grad_norm_(max_norm)
        opt.step()
    return model, opt


def full_parameters(model):
    return hvd.sharding_of(model).state_dict(to=None)


def assert_parameters_close(state, reference, rtol=1e-5, atol=1e-6):
    ref = reference.state_dict()
    assert sorted(state) == sorted(ref)
    for k in ref:
        torch.testing.assert_close(state[k], ref[k], rtol=rtol, atol=atol, msg=k)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_20_steps_match_distributed_optimizer_and_one_process(kind):
    data = batches(20, 1)
    model, _ = train_stage3(kind, data)
    state = full_parameters(model)
    assert_parameters_close(state, train_distributed(kind, data))
    assert_parameters_close(state, train_reference(kind, data)[0])


def test_tied_weight_is_one_parameter_in_the_root():
    model = make_model()
    hvd.shard_model(model, auto_wrap={Block})
    sharding = hvd.sharding_of(model)
    (flat, _), = [sharding.flat_of[model.embed.weight]]
    assert model.head.weight is model.embed.weight
    assert flat.unit.index == 0  # used by two modules of the root: owned by the root
    owners = {sharding.names[p]: sharding.flat_of[p][0].unit.name for p in sharding.flat_of}
    assert owners["blocks.1.up.weight"] == "blocks.1"
    assert owners["norm.weight"] == ""
    assert len(sharding.flat_of) == len(list(make_model().parameters()))


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_frozen_embedding(kind):
    data = batches(6, 1)
    model, _ = train_stage3(kind, data, tied=False, frozen_embedding=True)
    reference, _ = train_reference(kind, data, tied=False, frozen_embedding=True)
    state = full_parameters(model)
    assert_parameters_close(state, reference)
    torch.testing.assert_close(state["embed.weight"], make_model(tied=False).embed.weight.detach())


def test_a_module_called_twice():
    data = batches(6, 1)
    model, _ = train_stage3("adamw", data, reuse=True)
    assert_parameters_close(full_parameters(model), train_reference("adamw", data, reuse=True)[0])


@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_accumulation_and_clipping_match_one_process(max_norm):
    data = batches(5, 2)
    model, _ = train_stage3("adamw", data, max_norm=max_norm)
    reference, _ = train_reference("adamw", data, max_norm=max_norm)
    assert_parameters_close(full_parameters(model), reference)


def test_whole_model_one_unit_and_every_block_its_own():
    data = batches(4, 1)
    reference, _ = train_reference("sgd", data)
    for auto_wrap in (None, (Block, torch.nn.Linear)):
        model, _ = train_stage3("sgd", data, auto_wrap=auto_wrap)
        assert_parameters_close(full_parameters(model), reference)


def test_parameters_hold_no_data_outside_forward_and_eval_matches():
    model, _ = train_stage3("sgd", batches(3, 1))
    reference, _ = train_reference("sgd", batches(3, 1))
    assert all(p.numel() == 0 for p in model.parameters())
    ids = batches(1, 1, seed=9)[0][0][0]
    model.eval()
    reference.eval()
    with torch.no_grad():
        out = model(ids)
    torch.testing.assert_close(out, reference(ids), rtol=1e-5, atol=1e-6)
    assert all(p.numel() == 0 for p in model.parameters())
    sharding = hvd.sharding_of(model)
    total = sum(p.numel() for p in reference.parameters()) * 4
    held = sharding.held_bytes()["parameters"]
    # This rank's slices only (each flat split evenly, give or take one element).
    assert held <= total / hvd.size() + 4 * len(sharding.flats)


def test_only_the_running_unit_and_the_next_are_whole_in_forward_and_backward():
    """Stage 3's point: while a block runs, the other blocks' parameters hold no memory (at most
    the running unit, the root and one prefetched unit are gathered)."""
    model = make_model(blocks=4)
    hvd.shard_model(model, auto_wrap={Block})
    sharding = hvd.sharding_of(model)
    seen = []

    def gathered_now(*ignore):
        seen.append(sorted(u.name for u in sharding.units if u.gathered or u.handles))

    def on_output(module, inputs, output):  # runs after shard_model's hooks, in both passes
        output.register_hook(gathered_now)

    ids, targets = batches(1, 1)[0][0]
    loss_fn(model, mine(ids), mine(targets)).backward()  # a first step: the order is known
    sharding.finish_reductions()
    sharding.zero_grad()
    for block in model.blocks:
        block.register_forward_pre_hook(gathered_now)
        block.register_forward_hook(on_output)
    loss_fn(model, mine(ids), mine(targets)).backward()
    sharding.finish_reductions()
    assert len(seen) == 8, seen
    for names in seen:
        assert len([n for n in names if n.startswith("blocks.")]) <= 2, seen
    # Forward: block i running, block i + 1 prefetched; backward: block i, block i - 1.
    assert seen[0] == ["", "blocks.0", "blocks.1"], seen
    assert seen[3] == ["", "blocks.3"], seen
    assert seen[4] == ["", "blocks.2", "blocks.3"], seen
    assert seen[7] == ["", "blocks.0"], seen
    assert not any(u.gathered or u.handles for u in sharding.units)
    stored = sum(f.full.numel() and _bytes(f.full) for f in sharding.flats)
    assert stored == 0


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_an_embedding_unit_is_not_gathered_again_for_backward(kind, monkeypatch):
    """An embedding lookup's gradient needs the indices and the weight's shape only: a unit
    that is one nn.Embedding is gathered for forward and not for backward (no allgather; while
    its backward runs its weight holds one element), and training matches one process."""
    import horovod_cpp.torch.sharding.model as stage3
    gathers = []
    real = stage3._allgather_into_async

    def counting(shard, out, name, process_set):
        gathers.append(name)
        return real(shard, out, name=name, process_set=process_set)

    monkeypatch.setattr(stage3, "_allgather_into_async", counting)
    data = batches(6, 1)
    model = make_model(tied=False)
    hvd.shard_model(model, auto_wrap={Block, torch.nn.Embedding})
    held = []

    def on_output(module, inputs, output):  # runs after shard_model's hooks, in both passes
        output.register_hook(lambda grad: held.append(_bytes(module.weight)))

    model.embed.register_forward_hook(on_output)
    cls, kw = OPTIMIZERS[kind]
    opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=3, **kw)
    train_on(model, opt, data, hvd.global_process_set)
    # Its backward saw a one-element stand-in (gathered, it would be VOCAB x DIM).
    assert held == [4] * len(data), held
    embed = [n for n in gathers if ".embed." in n]
    if hvd.size() > 1:  # (at one rank nothing is gathered: the slice is the whole)
        assert len(embed) == len(data) and not any(n.endswith(".b") for n in embed), embed
        assert any(n.endswith(".b") for n in gathers)  # (the blocks are, for their backward)
    assert_parameters_close(full_parameters(model), train_reference(kind, data, tied=False)[0])


@pytest.mark.parametrize("bound", [1, 0])
def test_reductions_in_flight_are_bounded_when_a_rank_runs_ahead(bound, monkeypatch):
    """Each reduce-scatter in flight keeps its unit's whole flat gradient. Rank 0 runs ahead
    (the others sleep before each block's backward): with reductions_in_flight=1 it never has
    more than one started and not done; with 0 (no bound) it has more, which is what the bound
    is for. Both match one process."""
    import time
    import horovod_cpp.torch.sharding.model as stage3
    if hvd.size() == 1:
        pytest.skip("one rank reduces nothing")
    data = batches(3, 1)
    model = make_model(blocks=4)
    hvd.shard_model(model, auto_wrap={Block}, reductions_in_flight=bound)
    sharding = hvd.sharding_of(model)
    pending = []
    real = stage3._reducescatter_async

    def counting(*args):
        pending.append(len(sharding._reducing))  # started before this one, not yet done
        return real(*args)

    def slow(module, inputs, output):
        if hvd.rank() != 0:
            output.register_hook(lambda grad: time.sleep(0.1))

    for block in model.blocks:
        block.register_forward_hook(slow)
    monkeypatch.setattr(stage3, "_reducescatter_async", counting)
    cls, kw = OPTIMIZERS["adamw"]
    opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=3, **kw)
    train_on(model, opt, data, hvd.global_process_set)
    if hvd.rank() == 0:
        if bound:
            assert max(pending) < bound, pending
        else:
            assert max(pending) >= 2, pending
    assert_parameters_close(full_parameters(model), train_reference("adamw", data,
                                                                    blocks=4)[0])


def test_reductions_in_flight_must_be_a_count():
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="reductions_in_flight"):
            hvd.shard_model(make_model(), reductions_in_flight=bad)


def test_a_running_unit_is_one_buffer_and_at_one_rank_its_slice():
    """While a unit runs, its parameters are views of one buffer: the gathered flat at two or
    more ranks; at one rank the slice itself (nothing gathered, no second copy)."""
    model = make_model()
    hvd.shard_model(model, auto_wrap={Block})
    sharding = hvd.sharding_of(model)
    unit = [u for u in sharding.units if u.module is model.blocks[1]][0]
    seen = []

    def check(module, inputs):
        for f in unit.flats:
            whole = f.shard if hvd.size() == 1 else f.full
            seen.append(all(_storage(p).data_ptr() == _storage(whole).data_ptr()
                            for p in f.params))
            seen.append(_bytes(f.full) == (0 if hvd.size() == 1 else
                                            f.length * f.full.element_size()))

    model.blocks[1].register_forward_pre_hook(check)
    ids, targets = batches(1, 1)[0][0]
    loss_fn(model, mine(ids), mine(targets)).backward()
    sharding.finish_reductions()
    assert seen and all(seen), seen


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _bytes(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def test_consolidated_optimizer_state_equals_the_unsharded_one_and_loads():
    data = batches(4, 1)
    model, opt = train_stage3("adamw", data)
    reference, ref_opt = train_reference("adamw", data)
    opt.consolidate_state_dict(to=None)
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sd["param_groups"][0]["params"] == ref_sd["param_groups"][0]["params"]
    assert sorted(sd["state"]) == sorted(ref_sd["state"])
    for i, entry in ref_sd["state"].items():
        for k, v in entry.items():
            torch.testing.assert_close(torch.as_tensor(sd["state"][i][k]).to(torch.as_tensor(v)),
                                       torch.as_tensor(v), rtol=1e-5, atol=1e-7)
    # The unsharded optimizer takes it; a new sharded pair takes both states and continues
    # as the reference does.
    torch.optim.AdamW(trainable(make_model()), lr=0.01).load_state_dict(sd)
    more = batches(3, 1, seed=21)
    fresh = make_model()
    hvd.shard_model(fresh, auto_wrap={Block})
    hvd.sharding_of(fresh).load_state_dict(full_parameters(model))
    fresh_opt = hvd.ShardedOptimizer(fresh.named_parameters(), torch.optim.AdamW, stage=3,
                                     lr=0.01, weight_decay=0.1)
    fresh_opt.load_state_dict(sd)
    for micro in more:
        fresh_opt.zero_grad()
        ref_opt.zero_grad()
        for ids, targets in micro:
            loss_fn(fresh, mine(ids), mine(targets)).backward()
            loss_fn(reference, ids, targets).backward()
        fresh_opt.step()
        ref_opt.step()
    assert_parameters_close(full_parameters(fresh), reference)


def test_stage3_is_a_sharded_optimizer():
    model = make_model()
    hvd.shard_model(model)
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=3, lr=0.1)
    assert isinstance(opt, hvd.ShardedOptimizer) and opt.stage == 3


def test_stage3_needs_a_sharded_model():
    model = make_model()
    with pytest.raises(ValueError, match="shard_model"):
        hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD, stage=3, lr=0.1)


def test_a_rank_that_skips_a_unit_is_an_error_on_every_rank():
    if hvd.size() < 2:
        pytest.skip("needs 2 ranks")
    model = make_model()
    hvd.shard_model(model, auto_wrap={Block})
    ids, targets = batches(1, 1)[0][0]
    # A first step as every rank does it, so the prefetch order is known.
    loss_fn(model, mine(ids), mine(targets)).backward()
    hvd.sharding_of(model).finish_reductions()
    hvd.sharding_of(model).zero_grad()
    with pytest.raises(hvd.HorovodInternalError) as error:
        skip = 1 if hvd.rank() == 0 else None
        out = model(mine(ids), skip=skip)
        torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB),
                                          mine(targets).reshape(-1)).backward()
        hvd.sharding_of(model).finish_reductions()
    assert "deadlock" in str(error.value)
    # Rank 0 runs blocks.2 second where the others run it third: each waits for its own, and
    # the error says so on every rank.
    message = str(error.value)
    # (called at: the test's own line that runs the model, not a line of horovod_cpp or torch)
    for rank, position in ((0, 2), (1, 3)):
        assert re.search(r"rank %d \([^)]*\) waits for allgather '[a-z.]*sharded3\.gather\.blocks\."
                         r"2\.\d+\.f%d' called at %s:\d+" % (rank, position, re.escape(__file__)),
                         message), message
    # Nothing of the failed step is left in flight: a new model (the same collective names)
    # trains as one process does.
    data = batches(3, 1)
    again, _ = train_stage3("sgd", data)
    assert_parameters_close(full_parameters(again), train_reference("sgd", data)[0])


def test_sharded_checkpoint_saved_at_n_loads_at_n_minus_1_and_continues(tmp_path):
    """5 steps on every rank, each rank saves its slices (model and AdamW state) to its own
    file; the first size-1 ranks (a process set) load every file, continue 5 steps, and match
    one process on the same 10 full batches."""
    n = hvd.size()
    if n < 2:
        pytest.skip("saved at n ranks, loaded at n - 1 >= 1")
    first = batches(5, 1)
    model, opt = train_stage3("adamw", first)
    # Every rank's file in one folder that every rank knows (rank 0's tmp_path).
    folder = hvd.broadcast_object(str(tmp_path), root_rank=0)
    torch.save({"model": hvd.sharding_of(model).sharded_state_dict(),
                "optimizer": opt.sharded_state_dict()},
               "%s/rank%d.pt" % (folder, hvd.rank()))
    hvd.barrier()
    fewer = hvd.add_process_set(list(range(n - 1)))
    try:
        if fewer.included():
            saved = [torch.load("%s/rank%d.pt" % (folder, r)) for r in range(n)]
            resumed = make_model()
            with torch.no_grad():
                for p in resumed.parameters():
                    p.zero_()  # the checkpoint must bring every value back
            hvd.shard_model(resumed, auto_wrap={Block}, process_set=fewer)
            hvd.sharding_of(resumed).load_sharded_state_dict([s["model"] for s in saved])
            cls, kw = OPTIMIZERS["adamw"]
            opt2 = hvd.ShardedOptimizer(resumed.named_parameters(), cls, stage=3, lr=123.0)
            opt2.load_sharded_state_dict([s["optimizer"] for s in saved])
            second = batches(5, 1, seed=8, ranks=n - 1)
            train_on(resumed, opt2, second, fewer)
            assert opt2.param_groups[0]["lr"] == 0.01  # the saved hyperparameters
            state = hvd.sharding_of(resumed).state_dict(to=None)
            assert_parameters_close(state, train_reference("adamw", first + second)[0])
    finally:
        hvd.barrier()
        hvd.remove_process_set(fewer)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs PyTorch 2")
def test_torch_compile_of_a_sharded_model():
    """torch.compile(model) over a sharded model: the gather/free/reduce hooks run eagerly
    (graph breaks around them), the units' insides compiled; matches one process. Compiled
    by AOTAutograd's eager backend unless HVD_TEST_COMPILE_BACKEND says (tests/CMakeLists.txt:
    Inductor in one cell; it takes ~20 s)."""
    data = batches(3, 1)
    model = make_model()
    hvd.shard_model(model, auto_wrap={Block})
    cls, kw = OPTIMIZERS["sgd"]
    opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=3, **kw)
    compiled = torch.compile(model,
                             backend=os.environ.get("HVD_TEST_COMPILE_BACKEND", "aot_eager"))
    train_on(compiled, opt, data, hvd.global_process_set)
    assert_parameters_close(full_parameters(model), train_reference("sgd", data)[0])


def consolidated(opt):
    opt.consolidate_state_dict(to=None)
    return opt.state_dict()


def assert_same_state(got, want):
    assert sorted(got["state"]) == sorted(want["state"])
    for i, entry in want["state"].items():
        assert sorted(got["state"][i]) == sorted(entry)
        for k, v in entry.items():
            assert torch.equal(torch.as_tensor(got["state"][i][k]), torch.as_tensor(v)), (i, k)


def continue_and_check(model, opt, ps, first, kind):
    """Three more steps over the ranks of ps equal one process on the same full batches."""
    more = batches(3, 1, seed=21, ranks=ps.size())
    train_on(model, opt, more, ps)
    assert_parameters_close(hvd.sharding_of(model).state_dict(to=None),
                            train_reference(kind, first + more)[0])


@pytest.mark.parametrize("lost", ["first", "last"])
def test_elastic_a_lost_rank_loses_no_committed_parameter_or_state(lost):
    """Commit, go on two steps, lose one rank: the others roll back, reshard the parameters and
    the optimizer state over size-1 ranks (the lost rank's slices from their replica), hold
    exactly the commit, and continue as one process on the full batches would."""
    n = hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    first = batches(3, 1)
    model, opt = train_stage3("adamw", first)
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.sync()
    state.epoch = 1
    state.commit()
    committed_params = hvd.sharding_of(model).state_dict(to=None)
    committed = consolidated(opt)
    train_on(model, opt, batches(2, 1, seed=4), hvd.global_process_set)
    gone = 0 if lost == "first" else n - 1
    survivors = hvd.add_process_set([r for r in range(n) if r != gone])
    try:
        if survivors.included():
            state.restore()
            assert state.epoch == 1
            took = opt._elastic_reshard(process_set=survivors)
            assert took >= 0
            sharding = hvd.sharding_of(model)
            assert sharding.size == n - 1 and sharding.process_set is survivors
            # Only this rank's new slices travelled to it (the parameters and AdamW's two
            # moments over them, each piece 8-byte aligned), not the flat buffers whole.
            mine = sum(3 * (f.end - f.start) * f.shard.element_size() for f in sharding.flats)
            assert mine <= opt.reshard_bytes <= mine + 3 * 8 * n * len(sharding.flats)
            got = sharding.state_dict(to=None)
            assert all(torch.equal(got[k], committed_params[k]) for k in committed_params)
            assert_same_state(consolidated(opt), committed)
            continue_and_check(model, opt, survivors, first, "adamw")
    finally:
        hvd.remove_process_set(survivors)


def test_elastic_a_rank_added_gets_its_slices():
    """Train and commit on the first size-1 ranks; then every rank (the last one new, its
    model of other weights) reshards over all of them and continues as one process would."""
    n = hvd.size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    fewer = hvd.add_process_set(list(range(n - 1)))
    try:
        torch.manual_seed(99)
        model = make_model() if fewer.included() else TinyLM()  # the new rank: other weights
        hvd.shard_model(model, auto_wrap={Block},
                        process_set=fewer if fewer.included() else hvd.global_process_set)
        cls, kw = OPTIMIZERS["adamw"]
        opt = hvd.ShardedOptimizer(model.named_parameters(), cls, stage=3, **kw)
        k = (n - 1) * PER_RANK
        first = [[(ids[:k], targets[:k]) for ids, targets in step] for step in batches(3, 1)]
        if fewer.included():
            opt._elastic_save(replicate=False)
            opt._elastic_reshard()  # (what sync does first, at the smaller size)
            train_on(model, opt, first, fewer)
            opt._elastic_save(replicate=True)  # (commit's part)
            committed = consolidated(opt)
    finally:
        hvd.remove_process_set(fewer)
    opt._elastic_reshard(process_set=hvd.global_process_set)
    got = consolidated(opt)
    if hvd.rank() == 0:
        assert_same_state(got, committed)
    continue_and_check(model, opt, hvd.global_process_set, first, "adamw")
