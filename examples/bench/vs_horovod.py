"""The same workloads through horovod.torch (Horovod 0.28.1) and horovod_cpp.torch.

    mpirun -np 2 .venv/bin/python examples/bench/vs_horovod.py --impl horovod_cpp --out a.jsonl
    mpirun -np 2 .venv-horovod/bin/python examples/bench/vs_horovod.py --impl horovod --out b.jsonl
    python3 examples/bench/compare_horovod.py a.jsonl b.jsonl ...

./bench.sh builds Horovod (scripts/setup_horovod.sh), alternates the two implementations over
several rounds and compares them. The script uses only the API the two share, so the only
difference between two runs is the module imported. Rank 0 writes one JSON line per
workload: its figure (p50 over repetitions; samples/s for training), whether lower or higher
is better, and a check value computed from the results, which must agree between the two.
"""
import argparse
import importlib
import json
import time

import torch

from bench_models import mlp_factory, percentile, small_cnn

MLP24 = mlp_factory(24, 512)


def resnet50_shapes():
    """The 161 parameter shapes of torchvision's ResNet-50 (25.6 M floats)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


class Bench(object):
    def __init__(self, hvd, reps):
        self.hvd = hvd
        self.reps = reps
        self.rank = hvd.rank()
        self.size = hvd.size()

    def sync(self):
        self.hvd.allreduce(torch.zeros(1), name="bench.sync", op=self.hvd.Sum)

    def timed(self, setup, body, reps=None, warmup=2):
        """p50 and p90 of body() in ms; setup() runs untimed before each repetition."""
        times = []
        for i in range(warmup + (reps or self.reps)):
            state = setup()
            self.sync()
            start = time.perf_counter()
            result = body(state)
            elapsed = (time.perf_counter() - start) * 1000.0
            if i >= warmup:
                times.append(elapsed)
        return percentile(times, 0.5), percentile(times, 0.9), result

    # ---- collectives --------------------------------------------------------------------------

    def lone_allreduce(self):
        t = torch.tensor([float(self.rank + 1)])
        p50, p90, out = self.timed(
            lambda: None, lambda _: self.hvd.allreduce(t, name="lone", op=self.hvd.Sum),
            reps=self.reps * 10)
        return p50 * 1000.0, p90 * 1000.0, "us", float(out.item())

    def inplace_async(self, sizes, prefix, op=None):
        op = self.hvd.Average if op is None else op
        base = [torch.full((n,), float(self.rank + 1 + i % 7)) for i, n in enumerate(sizes)]
        tensors = [b.clone() for b in base]

        def setup():
            for t, b in zip(tensors, base):
                t.copy_(b)

        def body(_):
            handles = [self.hvd.allreduce_async_(t, name="%s.%d" % (prefix, i), op=op)
                       for i, t in enumerate(tensors)]
            for h in handles:
                self.hvd.synchronize(h)
            return sum(float(t[0]) + float(t[-1]) for t in tensors)

        p50, p90, check = self.timed(setup, body)
        return p50, p90, "ms", check

    def resnet50_mix(self):
        sizes = [int(torch.Size(s).numel()) for s in resnet50_shapes()]
        return self.inplace_async(sizes, "resnet")

    def small_tensors(self):
        return self.inplace_async([1024] * 100, "small")

    def one_64mib(self):
        return self.inplace_async([16 << 20], "big")

    def grouped_allreduce(self):
        base = [torch.full((1024,), float(self.rank + 1 + i % 5)) for i in range(100)]
        tensors = [b.clone() for b in base]

        def setup():
            for t, b in zip(tensors, base):
                t.copy_(b)

        def body(_):
            self.hvd.grouped_allreduce_(tensors, name="grouped", op=self.hvd.Average)
            return sum(float(t[0]) for t in tensors)

        p50, p90, check = self.timed(setup, body)
        return p50, p90, "ms", check

    def variable_allgathers(self):
        tensors = [torch.full((self.rank + 1 + i % 3, 16), float(self.rank + i)) for i in range(50)]

        def body(_):
            handles = [self.hvd.allgather_async(t, name="gather.%d" % i)
                       for i, t in enumerate(tensors)]
            return sum(float(self.hvd.synchronize(h).sum()) for h in handles)

        p50, p90, check = self.timed(lambda: None, body)
        return p50, p90, "ms", check

    def large_allgathers(self):
        tensors = [torch.full((1 << 20,), float(self.rank + i)) for i in range(4)]

        def body(_):
            handles = [self.hvd.allgather_async(t, name="biggather.%d" % i)
                       for i, t in enumerate(tensors)]
            return sum(float(self.hvd.synchronize(h).sum()) for h in handles)

        p50, p90, check = self.timed(lambda: None, body, reps=max(3, self.reps // 2))
        return p50, p90, "ms", check

    def alltoall(self):
        t = torch.arange(1 << 20, dtype=torch.float32) + self.rank

        def body(_):
            return float(self.hvd.alltoall(t, name="alltoall").sum())

        p50, p90, check = self.timed(lambda: None, body)
        return p50, p90, "ms", check

    def reducescatter(self):
        t = torch.full((4 << 20,), float(self.rank + 1))

        def body(_):
            return float(self.hvd.reducescatter(t, name="rs", op=self.hvd.Sum).sum())

        p50, p90, check = self.timed(lambda: None, body)
        return p50, p90, "ms", check

    def broadcast_parameters(self):
        shapes = resnet50_shapes()
        params = {"p%03d" % i: torch.full(s, float(self.rank + i % 3)) for i, s in
                  enumerate(shapes)}

        def setup():
            for i, t in enumerate(params.values()):
                t.fill_(float(self.rank + i % 3))

        def body(_):
            self.hvd.broadcast_parameters(params, root_rank=0)
            return sum(float(t.view(-1)[0]) for t in params.values())

        p50, p90, check = self.timed(setup, body, reps=max(3, self.reps // 2))
        return p50, p90, "ms", check

    def broadcast_object(self):
        obj = {"epoch": 7, "rank": self.rank, "history": list(range(20000)),
               "name": "x" * 1000}

        def body(_):
            got = self.hvd.broadcast_object(obj, root_rank=0)
            return float(got["rank"] + len(got["history"]) + sum(got["history"][:10]))

        p50, p90, check = self.timed(lambda: None, body)
        return p50, p90, "ms", check

    # ---- training -----------------------------------------------------------------------------

    def train(self, make, shape, batch, steps, blocks, passes=1):
        torch.manual_seed(1234)
        model = make()
        opt = self.hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                            named_parameters=model.named_parameters(),
                                            backward_passes_per_step=passes)
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        gen = torch.Generator().manual_seed(100 + self.rank)
        data = [(torch.randn((batch,) + shape, generator=gen),
                 torch.randint(0, 10, (batch,), generator=gen)) for _ in range(steps * passes)]

        def block(_):
            for i in range(steps):
                opt.zero_grad()
                for p in range(passes):
                    x, y = data[i * passes + p]
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            return None

        p50, p90, _ = self.timed(lambda: None, block, reps=blocks, warmup=1)
        samples = steps * passes * batch * self.size
        check = sum(float(p.detach().double().sum()) for p in model.parameters())
        # samples/s: higher is better; p90 of the time is the p10 of the rate.
        return samples / p50 * 1000.0, samples / p90 * 1000.0, "samples/s", check

    def mlp(self):
        return self.train(MLP24, (512,), 8, 10, self.blocks)

    def mlp_passes2(self):
        return self.train(MLP24, (512,), 8, 5, self.blocks, passes=2)

    def cnn(self):
        return self.train(small_cnn, (1, 28, 28), 64, 10, self.blocks)


# (id, method, what); "lower" figures are times, "higher" ones rates.
WORKLOADS = [
    ("H1", "lone_allreduce", "lone 4-byte allreduce"),
    ("H2", "resnet50_mix", "ResNet-50 gradient mix, 161 tensors, async + synchronize"),
    ("H3", "small_tensors", "100 x 4 KiB tensors"),
    ("H4", "one_64mib", "one 64 MiB tensor"),
    ("H5", "variable_allgathers", "50 variable-size allgathers"),
    ("H6", "broadcast_parameters", "broadcast_parameters of a ResNet-50-sized state dict"),
    ("H7", "mlp", "DistributedOptimizer, 24-layer MLP"),
    ("H8", "cnn", "DistributedOptimizer, small CNN"),
    ("H9", "grouped_allreduce", "grouped allreduce of 100 x 4 KiB"),
    ("H10", "large_allgathers", "4 allgathers of 4 MiB"),
    ("H11", "alltoall", "alltoall of 4 MiB"),
    ("H12", "reducescatter", "reducescatter of 16 MiB"),
    ("H13", "broadcast_object", "broadcast_object of a 20000-element dict"),
    ("H14", "mlp_passes2", "DistributedOptimizer, 24-layer MLP, backward_passes_per_step=2"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", required=True, choices=("horovod", "horovod_cpp"))
    parser.add_argument("--out", required=True, help="JSON lines, written by rank 0")
    parser.add_argument("--reps", type=int, default=20, help="repetitions per collective")
    parser.add_argument("--blocks", type=int, default=5, help="training blocks per model")
    parser.add_argument("--only", default="", help="comma-separated workload ids")
    args = parser.parse_args()

    torch.set_num_threads(1)  # one core per rank on these machines, for both
    hvd = importlib.import_module(args.impl + ".torch")
    hvd.init()
    bench = Bench(hvd, args.reps)
    bench.blocks = args.blocks
    only = set(args.only.split(",")) if args.only else None
    lines = []
    for wid, method, what in WORKLOADS:
        if only and wid not in only:
            continue
        value, spread, unit, check = getattr(bench, method)()
        lines.append({"id": wid, "workload": what, "impl": args.impl, "value": value,
                      "p90": spread, "unit": unit,
                      "better": "higher" if unit == "samples/s" else "lower", "check": check})
        if bench.rank == 0:
            print("%s %-4s %-62s %10.3f %s" % (args.impl, wid, what, value, unit), flush=True)
    if bench.rank == 0:
        with open(args.out, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
