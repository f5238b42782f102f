"""The gradient noise scale measured exactly along a training run, against what a moving
average over a horizon makes of the same values (issue 49's time-to-accuracy analysis).

One process trains the time-to-accuracy bench's CNN on MNIST-1D (SGD, momentum 0.9) at one
batch size; every --every steps it computes per-sample gradients of --probe training samples at
the current weights (torch.func.vmap) and from them, unbiased, |G|^2 and tr(Sigma), and the
noise scale tr(Sigma) / |G|^2 in samples (B0 * var / sqr as adaptive training defines it). It
then prints, at every such point, the exact value beside the ratio of moving averages of the
same |G|^2 and tr(Sigma) series with horizons of 1000, 300 and 100 steps at B0 (the estimator's
form in horovod_cpp/adaptive/noise.py; adaptive training's default horizon is 1000):

    .venv-pypi/bin/python examples/bench/noise_scale_exact.py --data d.npz --batch 128 --lr 0.1

(d.npz: adaptive_time_to_accuracy.py --make-data). PyPI's torch (torch.func)."""
import argparse
import math
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--b0", type=int, default=32, help="the initial batch (horizons' unit)")
    p.add_argument("--samples", type=int, default=140000, help="training samples in all")
    p.add_argument("--every", type=int, default=25, help="steps between exact measurements")
    p.add_argument("--probe", type=int, default=4000, help="samples per exact measurement")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch
    from torch.func import functional_call, grad, vmap
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from adaptive_time_to_accuracy import data_and_model

    (x, y, x_test, y_test), model = data_and_model(torch, args.data, args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def one_loss(params, xi, yi):
        out = functional_call(model, params, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(one_loss), in_dims=(None, 0, 0))

    def exact():
        params = {k: v.detach() for k, v in model.named_parameters()}
        idx = torch.randperm(len(x))[:args.probe]
        g = per_sample(params, x[idx], y[idx])
        flat = torch.cat([v.reshape(args.probe, -1) for v in g.values()], 1).double()
        mean = flat.mean(0)
        trace = ((flat - mean) ** 2).sum(1).sum() / (args.probe - 1)
        sqr = mean.pow(2).sum() - trace / args.probe  # |mean|^2 is biased by tr / n
        return float(sqr), float(trace)

    horizons = (1000, 300, 100)
    sums = {h: [0.0, 0.0] for h in horizons}  # moving averages of sqr and trace
    gen = torch.Generator().manual_seed(args.seed + 1)
    print("samples accuracy exact " + " ".join("avg%d" % h for h in horizons))
    step, seen, last = 0, 0, 0
    while seen < args.samples:
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x) - args.batch + 1, args.batch):
            if step % args.every == 0:
                sqr, trace = exact()
                decay = math.exp(-(seen - last) / float(args.b0))  # per horizon step below
                last = seen
                row = []
                for h in horizons:
                    keep = decay ** (1.0 / h) if step else 0.0  # (the first: the value)
                    s = sums[h]
                    s[0] = keep * s[0] + (1 - keep) * sqr
                    s[1] = keep * s[1] + (1 - keep) * trace
                    row.append(s[1] / s[0] if s[0] > 0 else float("nan"))
                with torch.no_grad():
                    acc = (model(x_test).argmax(1) == y_test).float().mean().item()
                print("%d %.4f %.1f %s" % (seen, acc, trace / sqr if sqr > 0 else float("nan"),
                                           " ".join("%.1f" % v for v in row)), flush=True)
            b = perm[i:i + args.batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
            step += 1
            seen += args.batch
            if seen >= args.samples:
                break


if __name__ == "__main__":
    main()
