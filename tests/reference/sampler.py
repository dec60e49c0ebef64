"""Prints torch.utils.data.DistributedSampler's indices over a grid of parameters.

One line per (configuration, rank):
  size replicas rank shuffle seed epoch drop_last : i0 i1 ...
"""
import itertools

from torch.utils.data import DistributedSampler

SIZES = [0, 1, 5, 7, 10, 17, 100, 1001, 60000]
REPLICAS = [1, 2, 3, 4, 7]
SHUFFLE = [False, True]
SEEDS = [0, 1, 42, -3]
EPOCHS = [0, 1, 5]
DROP_LAST = [False, True]

for size, replicas, shuffle, seed, epoch, drop_last in itertools.product(
        SIZES, REPLICAS, SHUFFLE, SEEDS, EPOCHS, DROP_LAST):
    if not shuffle and (seed != 0 or epoch != 0):
        continue  # seed and epoch only matter when shuffling
    if size == 60000 and (replicas not in (2, 4) or seed not in (0, 1)):
        continue  # keep the big case small
    for rank in range(replicas):
        sampler = DistributedSampler(range(size), num_replicas=replicas, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        assert len(indices) == len(sampler)
        print(size, replicas, rank, int(shuffle), seed, epoch, int(drop_last), ":",
              " ".join(map(str, indices)))
