"""What the Python benchmarks share: their models and percentile. Imported by the scripts
next to it (the script's folder is on sys.path), so it needs only torch: it serves
horovod_cpp's venv and Horovod's alike."""
import functools

import torch


def percentile(values, p):
    values = sorted(values)
    return values[int(p * (len(values) - 1))]


def interleaved_blocks(blocks, block, ours, base):
    """Block times (ms) of ours and the baseline, each `(model, optimizer)`: `block(model, opt)`
    times one block; one warm-up block each, then `blocks` measured, alternating which goes
    first. Returns (ours_ms, base_ms)."""
    times = ([], [])
    for b in range(-1, blocks):
        order = ((ours, times[0]), (base, times[1]))
        for (model, opt), kept in (order if b % 2 else order[::-1]):
            ms = block(model, opt)
            if b >= 0:
                kept.append(ms)
    return times


def small_cnn():
    """Compute-heavy for its size: 56,714 parameters in 8 tensors, 1x28x28 inputs."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 5 * 5, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10))


def mlp(depth, width):
    """`depth` width x width layers with ReLU, then 10 outputs: communication-heavy."""
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def mlp_factory(depth, width):
    return functools.partial(mlp, depth, width)
