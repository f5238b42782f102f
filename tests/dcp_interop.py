"""Checkpoints carried between horovod_cpp and FSDP2 (torch.distributed.fsdp.fully_shard, gloo,
CPU) in PyTorch's distributed-checkpoint format, at different world sizes:

1. horovod_cpp stage 3 at 4 ranks trains 3 steps with AdamW and writes (hvd.dcp.save); FSDP2 at
   2 ranks loads it (dcp.load + set_state_dict): every parameter and every AdamW state tensor
   equal, bit for bit, to what the horovod_cpp job held (its consolidated state, saved whole
   beside the checkpoint).
2. FSDP2 at 3 ranks trains 3 steps and writes (dcp.save of get_state_dict); horovod_cpp loads it
   at 2 and at 4 ranks (stage 3) and trains 2 more steps: the parameters those of one process
   that trained all 5 steps on the full batches (plain torch, computed there).
3. The same FSDP2 checkpoint loaded by stage 2 (ShardedOptimizer over a whole model) at 2 ranks.

    python tests/dcp_interop.py            (the PyPI lane's Python: torch >= 2.6; ~1 minute)

Each job runs under a timeout; the checkpoints live in a temporary directory removed at the
end. The modes below are the jobs' own entry points."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import torch

VOCAB, DIM, SEQ, GLOBAL_BATCH = 13, 8, 5, 12   # 12 rows: 2, 3 and 4 ranks split it evenly
FIRST, THEN = 3, 2
ADAMW = dict(lr=0.01, weight_decay=0.1)
HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 180


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 3 * DIM)
        self.down = torch.nn.Linear(3 * DIM, DIM)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class LM(torch.nn.Module):
    """Embedding -> 3 blocks -> norm -> head, the head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def make_model():
    torch.manual_seed(11)
    return LM()


def data(steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g),
             torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)) for _ in range(steps)]


def loss_fn(model, ids, targets):
    return torch.nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), targets.reshape(-1))


def train(model, opt, batches, rank, size):
    rows = slice(rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size)
    for ids, targets in batches:
        opt.zero_grad()
        loss_fn(model, ids[rows], targets[rows]).backward()
        opt.step()


def one_process():
    """The parameters of one process after all FIRST + THEN steps on the full batches."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    train(model, opt, data(FIRST, 1) + data(THEN, 2), 0, 1)
    return model.state_dict()


# ---- the jobs ---------------------------------------------------------------------------------

def hvd_write(directory):
    import horovod_cpp.torch as hvd
    hvd.init()
    model = hvd.shard_model(make_model(), auto_wrap={Block})
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=3, **ADAMW)
    train(model, opt, data(FIRST, 1), hvd.rank(), hvd.size())
    hvd.dcp.save({"model": model, "optim": opt}, os.path.join(directory, "hvd"))
    params = hvd.sharding_of(model).state_dict(to=0)
    opt.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        names = [n for n, _ in model.named_parameters()]
        state = {names[i]: st for i, st in opt.state_dict()["state"].items()}
        torch.save({"model": params, "optim": state}, os.path.join(directory, "hvd-whole.pt"))
    hvd.shutdown()


def fsdp_job(mode, directory, rank, size, port):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    model = make_model()
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    if mode == "fsdp-write":
        train(model, opt, data(FIRST, 1), rank, size)
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd},
                 checkpoint_id=os.path.join(directory, "fsdp"))
    else:
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.load({"model": model_sd, "optim": optim_sd},
                 checkpoint_id=os.path.join(directory, "hvd"))
        set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
        full = StateDictOptions(full_state_dict=True)
        params, state = get_state_dict(model, opt, options=full)
        if rank == 0:
            want = torch.load(os.path.join(directory, "hvd-whole.pt"))
            bad = [k for k, v in want["model"].items() if not torch.equal(params[k], v)]
            n = 0
            for fqn, st in want["optim"].items():
                for k, v in st.items():
                    n += 1
                    if not torch.equal(state["state"][fqn][k], v):
                        bad.append("optim %s %s" % (fqn, k))
            if bad:
                raise SystemExit("FSDP2 loaded values that differ from horovod_cpp's: %s" % bad)
            print("dcp interop: horovod_cpp stage 3 at 4 ranks -> FSDP2 at 2 ranks: %d "
                  "parameters and %d AdamW state tensors equal bit for bit"
                  % (len(want["model"]), n))
    dist.destroy_process_group()


def hvd_read(directory, stage):
    import horovod_cpp.torch as hvd
    hvd.init()
    model = make_model()
    if stage == 3:
        hvd.shard_model(model, auto_wrap={Block})
    opt = hvd.ShardedOptimizer(model.named_parameters(), torch.optim.AdamW, stage=stage,
                               **ADAMW)
    hvd.dcp.load({"model": model, "optim": opt}, os.path.join(directory, "fsdp"))
    train(model, opt, data(THEN, 2), hvd.rank(), hvd.size())
    got = hvd.sharding_of(model).state_dict(to=None) if stage == 3 else model.state_dict()
    worst = 0.0
    for k, v in one_process().items():
        torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=k)
        worst = max(worst, float((got[k] - v).abs().max()))
    if hvd.rank() == 0:
        print("dcp interop: FSDP2 at 3 ranks -> horovod_cpp stage %d at %d ranks, %d more "
              "steps: like one process (largest difference %.1e)"
              % (stage, hvd.size(), THEN, worst))
    hvd.shutdown()


# ---- the driver -------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmds, what):
    """Starts every command, waits for all within TIMEOUT; kills them all past it."""
    start = time.time()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    outs, failed = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, TIMEOUT - (time.time() - start)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += "\n(killed after %d s)" % TIMEOUT
            failed = True
        outs.append(out)
        failed = failed or p.returncode != 0
    text = "\n".join(outs)
    if failed:
        sys.stderr.write(text)
        raise SystemExit("dcp interop: %s failed" % what)
    for line in text.splitlines():  # (hvdrun prefixes a rank's lines with its rank)
        if "dcp interop:" in line:
            print(line[line.index("dcp interop:"):], flush=True)


def hvdrun(np_, *args):
    return [sys.executable, "-m", "horovod_cpp.runner", "--gloo", "-np", str(np_),
            sys.executable, os.path.abspath(__file__)] + list(args)


def fsdp(mode, directory, size):
    port = free_port()
    return [[sys.executable, os.path.abspath(__file__), mode, directory, str(r), str(size),
             str(port)] for r in range(size)]


def main():
    directory = tempfile.mkdtemp(prefix="hvd-dcp-")
    try:
        run([hvdrun(4, "hvd-write", directory)], "horovod_cpp stage 3 writing at 4 ranks")
        run(fsdp("fsdp-read", directory, 2), "FSDP2 reading at 2 ranks")
        run(fsdp("fsdp-write", directory, 3), "FSDP2 writing at 3 ranks")
        for np_, stage in ((2, 3), (4, 3), (2, 2)):
            run([hvdrun(np_, "hvd-read", directory, str(stage))],
                "horovod_cpp stage %d reading at %d ranks" % (stage, np_))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if len(sys.argv) == 1:
        main()
    elif sys.argv[1] == "hvd-write":
        hvd_write(sys.argv[2])
    elif sys.argv[1] == "hvd-read":
        hvd_read(sys.argv[2], int(sys.argv[3]))
    else:
        fsdp_job(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
