"""Hugging Face's Trainer fine-tuning a small BERT-shaped classifier built from a config (no
download) on random token data, on the process group that --backend names; rank 0 writes the
final parameters to --out (torch.save). Launch with torchrun or mpirun.

The group is made before TrainingArguments: Accelerate then uses it (on CPU it would make a
Gloo group itself, and it takes only the backend names it knows in ddp_backend).
"""
import argparse
import gc
import os

import torch
import torch.distributed as dist

import horovod_cpp.torch  # noqa: F401  (registers the "horovod_cpp" backend)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="horovod_cpp")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4, help="per rank")
    p.add_argument("--grad-accum", type=int, default=1)
    args = p.parse_args()
    if "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun: torch's env:// wants these
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
        os.environ.setdefault("LOCAL_RANK", os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    dist.init_process_group(args.backend)

    from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                              TrainingArguments)
    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=32,
                        num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(1)
    n = 256
    ids = torch.randint(0, 200, (n, 16), generator=g)
    labels = (ids[:, 0] % 3).tolist()
    data = [{"input_ids": ids[i], "attention_mask": torch.ones(16, dtype=torch.long),
             "labels": labels[i]} for i in range(n)]
    out_dir = os.path.join(os.path.dirname(os.path.abspath(args.out)), "trainer-out")
    targs = TrainingArguments(output_dir=out_dir, max_steps=args.steps,
                              per_device_train_batch_size=args.batch,
                              gradient_accumulation_steps=args.grad_accum, learning_rate=1e-3,
                              use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
                              seed=0, data_seed=0, dataloader_num_workers=0,
                              disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=data)
    trainer.train()
    assert dist.get_backend() == args.backend.split(",")[0].split(":")[-1] or \
        args.backend in dist.get_backend(), dist.get_backend()
    if dist.get_rank() == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    dist.barrier()
    # The Trainer's DDP model holds the group in a reference cycle: released while the
    # interpreter is alive (ddp_train.py's release_process_group says why).
    del trainer, model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
