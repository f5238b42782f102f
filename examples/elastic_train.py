"""Elastic training of the digits classifier: survives ranks leaving and grows onto new hosts.

    hvdrun --min-np 2 --max-np 3 -H host1:1,host2:1,host3:1 \\
        python examples/elastic_train.py [--epochs 20] [--batch-size 16] [--lr 0.05]
    hvdrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python examples/elastic_train.py

Each rank takes --batch-size samples a step (an ElasticSampler splits what is left of the epoch
over the ranks there are), so the global batch is batch-size x ranks; the learning rate follows
it linearly (lr x ranks), set again in a reset callback whenever the world changes. The state
(model, optimizer, sampler, epoch, batch) is committed every --commit-every steps; a failure
rolls back to the last commit, and the job goes on with the ranks that remain. Rank 0 logs every
epoch and every resize; every rank checks after a reset that its parameters are what a rank
committed (rank 0's commit, which can be one newer than another rank's own) and says so.

With --sharded 1 or 2 the optimizer is hvd.ShardedOptimizer (stage 1 or 2): each rank holds a
slice of the optimizer state, a commit keeps a replica of every slice on another host, and a
reset reshards the last commit over the ranks there are; the check after a reset then also
compares the whole optimizer state (gathered from the slices) with the last commit's. With
--sharded 3 the parameters are sharded too (hvd.shard_model, each Linear a unit): a commit keeps
every rank's slices of the parameters and of the optimizer state with a replica, and a reset
re-splits both over the ranks there are.

With --powersgd R the gradients travel PowerSGD-compressed (rank R, from step 30): a commit keeps
its state (Qs, step count, each rank's error feedback as the mean over the ranks), and the check
after a reset also says whether every rank holds the same PowerSGD state.
"""
import argparse
import hashlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import DEFAULT_DATA, load_digits  # noqa: E402

import horovod_cpp.torch as hvd  # noqa: E402


def digest(model):
    """A digest of the parameters; collective for a sharded model (gathered from the slices)."""
    h = hashlib.sha256()
    sharded = getattr(model, "_hvd_sharded", None)
    sd = sharded.state_dict(to=None) if sharded is not None else model.state_dict()
    for _, t in sorted(sd.items()):
        h.update(t.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def powersgd_digest(state):
    h = hashlib.sha256(str((state["iter"], sorted(state["adaptive"].items()))).encode())
    for kind in ("qs", "errors"):
        for key, value in sorted(state[kind].items()):
            h.update(("%s.%s" % (kind, key)).encode())
            h.update(value.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def optimizer_digest(optimizer):
    """A digest of the whole optimizer state; collective for a ShardedOptimizer (its slices are
    gathered), the same at any number of ranks."""
    if isinstance(optimizer, hvd.ShardedOptimizer):
        optimizer.consolidate_state_dict(to=None)
    state = optimizer.state_dict()
    h = hashlib.sha256()
    for index in sorted(state["state"]):
        for key, value in sorted(state["state"][index].items()):
            h.update(("%s.%s" % (index, key)).encode())
            h.update(value.detach().numpy().tobytes() if torch.is_tensor(value)
                     else repr(value).encode())
    return h.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate per rank")
    parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds of extra work per step (to give tests time to act)")
    parser.add_argument("--sharded", type=int, choices=(0, 1, 2, 3), default=0,
                        help="0: DistributedOptimizer; 1, 2 or 3: ShardedOptimizer of that "
                             "stage (3: the parameters sharded too, hvd.shard_model)")
    parser.add_argument("--powersgd", type=int, default=0, metavar="RANK",
                        help="DistributedOptimizer with PowerSGD of this rank (0: off)")
    parser.add_argument("--data", default=DEFAULT_DATA)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    x_train, y_train, x_test, y_test = load_digits(args.data)
    dataset = torch.utils.data.TensorDataset(x_train, y_train)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    if args.sharded == 3:
        hvd.shard_model(model, auto_wrap={torch.nn.Linear})
    if args.sharded:
        optimizer = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.SGD,
                                         stage=args.sharded, lr=args.lr * hvd.size(),
                                         momentum=0.9)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
        compression = (hvd.Compression.powersgd(matrix_approximation_rank=args.powersgd,
                                                start_powerSGD_iter=30, adaptive=False)
                       if args.powersgd else hvd.Compression.none)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, steps=0)
    # "committed": the (parameters, optimizer state) digests of this rank's last commit;
    # "candidates": what the job may roll back to: that commit, or the one under way when a
    # failure hit (it counts if any rank confirmed it).
    progress = {"steps": 0, "committed": None, "candidates": [], "last_step_time": time.time()}

    def commit():
        pending = (digest(model), optimizer_digest(optimizer) if args.sharded else None)
        progress["candidates"] = [c for c in (progress["committed"], pending) if c]
        try:
            state.commit()
        except hvd.HostsUpdatedInterrupt:  # raised after the commit
            progress["committed"], progress["candidates"] = pending, [pending]
            raise
        progress["committed"], progress["candidates"] = pending, [pending]

    def scale_lr():
        # The global batch is batch-size x ranks: the learning rate follows it.
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    def on_reset():
        # Runs on the ranks that were there before the reset (Horovod's semantics: before the
        # state is synced, so no collectives here); new ranks start in train() below.
        scale_lr()
        if hvd.rank() == 0:
            print("resize: %d ranks at %.3f; rolled back to epoch %d batch %d (%d steps since "
                  "the last commit are redone); lr %.3f"
                  % (hvd.size(), time.time(), state.epoch, state.batch,
                     max(progress["steps"] - state.steps, 0), args.lr * hvd.size()), flush=True)
        progress["steps"] = state.steps

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        # Every (re)start, after the state was synced from rank 0: every rank holds the same
        # parameters, those of a commit that a rank made.
        scale_lr()
        now = digest(model)
        digests = hvd.allgather_object(now, name="elastic.digests")
        opt_now = optimizer_digest(optimizer) if args.sharded else None
        if args.sharded and hvd.rank() == 0 and state.reshard_seconds is not None and \
                state.steps > 0:
            print("resharded the optimizer state%s over %d ranks in %.3f s"
                  % (" and the parameters" if args.sharded == 3 else "", hvd.size(),
                     state.reshard_seconds), flush=True)
        # What every rank may have rolled back to. Not only its own: a failure can let one rank
        # finish a step's allreduce (it got every chunk) and commit while another still waits
        # for a chunk from the lost rank; sync then gives the lagging rank that newer commit.
        held = [c for cs in hvd.allgather_object(progress["candidates"],
                                                 name="elastic.candidates") for c in cs]
        if progress["candidates"]:
            # The parameters and the whole optimizer state must be those of one commit.
            match = (now, opt_now) in held
            sharded = (", optimizer state %s equal to the last commit %s" % (opt_now, match)
                       if args.sharded else "")
            print("sync check: rank %d of %d params %s equal on every rank %s, equal to a rank's "
                  "commit %s%s" % (hvd.rank(), hvd.size(), now, len(set(digests)) == 1, match,
                                   sharded), flush=True)
        elif state.steps > 0:
            print("sync check: rank %d of %d params %s equal on every rank %s, new rank"
                  % (hvd.rank(), hvd.size(), now, len(set(digests)) == 1), flush=True)
        if args.powersgd and state.steps > 0:
            comp = optimizer._powersgd
            mine = powersgd_digest(comp.state_dict())
            every = hvd.allgather_object(mine, name="elastic.powersgd_digests")
            print("powersgd check: rank %d step %d, %d errors, state %s equal on every rank %s"
                  % (hvd.rank(), comp.iter, len(comp.errors), mine, len(set(every)) == 1),
                  flush=True)
        while state.epoch < args.epochs:
            model.train()
            loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size,
                                                 sampler=sampler)
            start = time.perf_counter()
            for batch_idx, (x, y) in enumerate(loader, start=0):
                # The sampler already skips what earlier rounds of this epoch did.
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if args.step_delay:
                    time.sleep(args.step_delay)
                sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                state.steps += 1
                progress["steps"] = state.steps
                progress["last_step_time"] = time.time()
                if state.steps % args.commit_every == 0:
                    commit()
            model.eval()
            with torch.no_grad():
                mine = slice(hvd.rank(), None, hvd.size())
                correct = (model(x_test[mine]).argmax(1) == y_test[mine]).sum().float()
            correct = hvd.allreduce(correct.reshape(1), op=hvd.Sum, name="correct").item()
            if hvd.rank() == 0:
                print("epoch %2d/%d  %d ranks  test accuracy %.4f  %.1f s" % (
                    state.epoch + 1, args.epochs, hvd.size(), correct / len(y_test),
                    time.perf_counter() - start), flush=True)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            commit()
        return correct / len(y_test)

    accuracy = train(state)
    if hvd.rank() == 0:
        print("final test accuracy: %.4f (%d ranks at the end)" % (accuracy, hvd.size()),
              flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
