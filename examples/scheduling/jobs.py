"""The small adaptive training job that the scheduler's tests and demonstration submit
(horovod_cpp.ray.scheduler): a 2-layer MLP on a synthetic classification task (a random teacher
network labels Gaussian inputs), trained under ``hvd.elastic.run`` until its progress, in steps
at the initial batch size (AdaptDL's scale-invariant progress), reaches ``target``.

``train_job(target, seed, ...)`` returns rank 0's record: steps, progress, the sizes the job ran
at, the global batch sizes it used, the steps lost to resets (steps taken after the last commit
before a reset: 0 when every resize was a drain at a commit), the final training loss, and the
worker id of rank 0. With ``fixed=True`` the batch stays at ``batch_size`` (the static
baseline's jobs). ``sample_delay``: seconds of emulated compute per sample in each micro-batch
(a sleep before the optimizer step): the test bed has more slots than this machine has cores,
and this makes each slot compute like a processor of its own, so that a job's speed depends on
its share of slots as on a real cluster (the gradients, reductions, noise scale and resizes stay
real). ``stop_file``: the job also ends once that file exists."""
import os
import time


def make_data(seed, n=8192, dim=64, classes=8):
    import torch
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, dim, generator=g)
    teacher = torch.nn.Sequential(torch.nn.Linear(dim, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, classes))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 * 2)
        logits = teacher(x) + 0.5 * torch.randn(n, classes, generator=g)
    return x, logits.argmax(1)


def train_job(target, seed=0, batch_size=32, max_batch_size=512, lr=0.05, commit_every=5,
              fixed=False, sample_delay=0.0, width=256, stop_file=None):
    import torch

    import horovod_cpp.torch as hvd
    import horovod_cpp.torch.adaptive as adl

    hvd.init()
    torch.manual_seed(seed)
    x, y = make_data(seed)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, int(y.max()) + 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model = adl.AdaptiveDataParallel(model, optimizer, decide_every=10)
    loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(x, y),
                                    batch_size=batch_size, shuffle=True)
    if not fixed:
        loader.autoscale_batch_size(max_batch_size, local_bsz_bounds=(8, 256))
    state = hvd.elastic.TorchState(model, optimizer, sizes=[], batches=[], lost=0,
                                   last_loss=float("nan"))
    seen = {"steps": 0}  # this process's last step, committed or not

    def on_reset():
        # (the state is restored to the last commit: the steps after it are taken again)
        state.lost += max(0, seen["steps"] - model.steps)
        seen["steps"] = model.steps
    state.register_reset_callbacks([on_reset])
    started = time.time()
    stopped = [False]

    def done():
        """The target reached, or (checked every commit_every steps, the same on every rank)
        ``stop_file`` made by someone (the tests end a job this way, whatever the load)."""
        if model.scale_progress >= target:
            return True
        if stop_file is not None and model.steps % commit_every == 0:
            flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
            stopped[0] = hvd.allreduce(flag, op=hvd.Max, name="job.stop").item() > 0
        return stopped[0]

    @hvd.elastic.run
    def train(state):
        while not done():
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                if sample_delay:  # (emulated compute: a slot as a processor of its own)
                    time.sleep(sample_delay * len(xb))
                optimizer.step()
                if not loader.is_optim_step():
                    continue
                seen["steps"] = model.steps
                stats = adl.stats()
                if not state.sizes or state.sizes[-1] != hvd.size():
                    state.sizes = state.sizes + [hvd.size()]
                if not state.batches or state.batches[-1] != stats["batch_size"]:
                    state.batches = state.batches + [stats["batch_size"]]
                state.last_loss = loss.item()
                if done():
                    break
                if model.steps % commit_every == 0:
                    state.commit()
        state.commit()

    train(state)
    lost = hvd.allreduce(torch.tensor([float(state.lost)]), op=hvd.Max, name="job.lost").item()
    return {"steps": model.steps, "progress": model.scale_progress, "sizes": state.sizes,
            "batches": state.batches, "lost_steps": int(lost), "loss": state.last_loss,
            "size": hvd.size(), "rank": hvd.rank(), "seconds": time.time() - started}
