"""A training script as TorchDistributor and HorovodRunner run them by path: its arguments
from argparse; rank 0 writes what it computed to --out. Exits with --exit-code if given."""
import argparse
import json
import sys

import torch

import horovod_cpp.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--scale", type=float, default=1.0)
p.add_argument("--exit-code", type=int, default=0)
args = p.parse_args()
hvd.init()
total = hvd.allreduce(torch.tensor([args.scale * (hvd.rank() + 1)]), op=hvd.Sum).item()
if hvd.rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"size": hvd.size(), "total": total, "argv": sys.argv[1:],
                   "name": __name__}, f)
hvd.shutdown()
sys.exit(args.exit_code)
