"""ElasticSampler: a distributed sampler that re-partitions the samples not yet processed in an
epoch whenever the world changes (as horovod.torch.elastic.ElasticSampler)."""
import math
import random

import torch.utils.data

from horovod_cpp.torch.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Use it with a TorchState (``state = TorchState(model, opt, sampler=sampler)``) and call
    ``sampler.record_batch(batch_idx, batch_size)`` after each batch: a reset then resumes the
    epoch with the samples that no rank has processed, split across the new ranks.
    ``set_epoch(e)`` starts an epoch (a new shuffle, nothing processed)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices = set()
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks the ``batch_idx``-th batch of this rank's current partition as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def reset(self):
        """Re-partitions the unprocessed samples over the current ranks (rank and size of the
        running job; 0 of 1 before init)."""
        try:
            self.rank, self.num_replicas = rank(), size()
        except ValueError:
            self.rank, self.num_replicas = 0, 1
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.num_samples = int(math.ceil(len(remaining) / float(self.num_replicas)))
        self.total_size = self.num_samples * self.num_replicas
        # Pad by repeating so every rank has the same number of batches.
        padded = remaining + remaining[:self.total_size - len(remaining)] if remaining else []
        self.remaining_indices = remaining
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
