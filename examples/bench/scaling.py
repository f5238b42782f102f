"""Scaling of a training step across hosts: samples/s of hvd.DistributedOptimizer on N ranks
(same per-rank batch), for bench.sh to compare 1 host with 2 (one rank per host, so that
every rank has a core of its own on a 2-core machine and the difference is the network).

    hvdrun -np N [-H ...] .venv/bin/python examples/bench/scaling.py [--steps 30] [--model cnn]
        [--compression C[,C...]] [--powersgd-rank R[,R...]] [--rounds K]

C is none, fp16, bf16, powersgd, powersgd-always, powersgd-unfused or lockstep. Several configurations run in one
job, interleaved: each gets its own copy of the model and its optimizer, warms up once, then
every round times --steps steps of each in turn (the machine's speed drifts by tens of percent
over minutes here; configurations measured one after the other would compare the drift).
Rank 0 prints one line per configuration and round:

    SCALING np=N model=... batch=... compression=... round=K samples_per_s=... step_p50_ms=...
        wire_bytes_per_step=...

compression is "powersgd_rR" for PowerSGD at rank R. wire_bytes_per_step is what the hosts'
eth0 interfaces sent during the timed steps, summed over the hosts, per step: measured from
/proc/net/dev in each host's network namespace by its first rank; "n/a" where there is no eth0,
i.e. not on the test bed.

PowerSGD starts after the warm-up steps. "powersgd" is the default, adaptive PowerSGD: its first
probe (exact and compressed steps, timed) is part of the warm-up, the timed steps follow its
decision (printed: powersgd_decision=compress|exact, and the probe's median step times; a later
probe would come after 250 steps); "powersgd-always" compresses every step (adaptive=False,
PyTorch's behaviour); "powersgd-unfused" too, through torch's operations instead of the core's
fused passes (what a PowerSGD step cost before those, for comparison).

"lockstep" is a baseline, not a compressor: the ranks exchange no gradients (each steps its own
model) and allreduce one number per step, so they compute in lock step. Its samples/s is the
most any synchronous data-parallel job reaches on these hosts whatever its network: every step
waits for the slower rank (on a noisy machine, the slower of two noisy step times) and the
ranks share the machine's caches and memory bandwidth.
"""
import argparse
import time

import torch

import horovod_cpp.torch as hvd
from bench_models import mlp, percentile, small_cnn

MODELS = {  # name: (constructor, input shape without batch, per-rank batch)
    "cnn": (small_cnn, (1, 28, 28), 64),
    "mlp": (lambda: mlp(4, 1024), (1024,), 32),  # ~4.2 M parameters, 16 MiB of gradients
}
KINDS = ("none", "fp16", "bf16", "powersgd", "powersgd-always", "powersgd-unfused", "lockstep")


def eth0_tx_bytes():
    """Bytes this network namespace's eth0 has sent (None without one)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "eth0":
                return int(fields.split()[8])
    return None


class Config(object):
    """One configuration: its label, model copy, optimizer and (PowerSGD) compressor."""

    def __init__(self, kind, powersgd_rank, make, warmup, index):
        self.kind = kind
        self.powersgd = kind.startswith("powersgd")
        self.label = kind + ("_r%d" % powersgd_rank if self.powersgd else "")
        torch.manual_seed(0)
        self.model = make()
        self.comp = None
        if self.powersgd:
            self.comp = hvd.Compression.powersgd(matrix_approximation_rank=powersgd_rank,
                                                 start_powerSGD_iter=warmup,
                                                 adaptive=kind == "powersgd")
            # powersgd-unfused: every step compressed, through torch's operations instead of
            # the core's fused passes (what PowerSGD cost before them)
            self.comp.fused_passes = kind != "powersgd-unfused"
        elif kind != "lockstep":
            self.comp = getattr(hvd.Compression, kind)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        if kind != "lockstep":
            # Each configuration's tensors get names of their own (the runtime refuses a name
            # that is still in flight, and its cache keeps each configuration's responses).
            named = [("c%d.%s" % (index, n), p) for n, p in self.model.named_parameters()]
            self.opt = hvd.DistributedOptimizer(self.opt, named_parameters=named,
                                                compression=self.comp)
        self.warmup = warmup
        if kind == "powersgd":  # its first probe is warm-up too
            self.warmup += 2 * self.comp.PROBE_BLOCKS * self.comp.PROBE_BLOCK
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def step(self, x, y):
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.model(x), y).backward()
        self.opt.step()
        if self.kind == "lockstep":
            hvd.allreduce(torch.zeros(1), name="lockstep")

    def decision(self):
        if self.kind != "powersgd":
            return ""
        _, compressed_ms, exact_ms, compress = self.comp.decisions[0]
        return (" powersgd_decision=%s probe_compressed_ms=%.2f probe_exact_ms=%.2f"
                % ("compress" if compress else "exact", compressed_ms, exact_ms))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--compression", default="none",
                        help="comma-separated, of: " + ", ".join(KINDS))
    parser.add_argument("--powersgd-rank", default="4",
                        help="PowerSGD's matrix_approximation_rank; comma-separated: each "
                             "PowerSGD configuration runs at each")
    parser.add_argument("--batch", type=int, default=0,
                        help="samples per rank per step (default: the model's, mlp 32, cnn 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank (1: a rank per core, so that 1 host and 2 "
                             "hosts x 1 rank compute alike and what they differ in is network)")
    args = parser.parse_args()
    kinds = args.compression.split(",")
    for kind in kinds:
        if kind not in KINDS:
            parser.error("--compression: unknown '%s' (choose from %s)" % (kind, ", ".join(KINDS)))
    ranks = [int(r) for r in args.powersgd_rank.split(",")]
    torch.set_num_threads(args.threads)
    hvd.init()
    make, shape, batch = MODELS[args.model]
    batch = args.batch or batch
    configs = []
    for kind in kinds:
        for r in (ranks if kind.startswith("powersgd") else [0]):
            configs.append(Config(kind, r, make, args.warmup, len(configs)))
    x = torch.randn(batch, *shape)
    y = torch.randint(0, 10, (batch,))
    for c in configs:
        for _ in range(c.warmup):
            c.step(x, y)
    for round_ in range(args.rounds):
        for c in configs:
            hvd.barrier()
            tx_before = eth0_tx_bytes()
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                c.step(x, y)
                times.append(time.perf_counter() - start)
            tx_after = eth0_tx_bytes()
            # The job's pace is its slowest rank's.
            total = hvd.allreduce(torch.tensor([sum(times)]), op=hvd.Max, name="total").item()
            sent = (tx_after - tx_before if hvd.local_rank() == 0 and tx_after is not None
                    else 0)
            sent = hvd.allreduce(torch.tensor([float(sent)]), op=hvd.Sum, name="wire").item()
            wire = "%.0f" % (sent / args.steps) if tx_after is not None else "n/a"
            if hvd.rank() == 0:
                print("SCALING np=%d model=%s batch=%d compression=%s round=%d samples_per_s=%.1f "
                      "step_p50_ms=%.2f wire_bytes_per_step=%s%s"
                      % (hvd.size(), args.model, batch, c.label, round_ + 1,
                         hvd.size() * batch * args.steps / total, 1000 * percentile(times, 0.5),
                         wire, c.decision()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
