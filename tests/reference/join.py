"""PyTorch DDP's join() (uneven inputs, gloo, CPU): the reference of tests/test_join_reference.cpp,
which must match it bit for bit.

Usage: join.py WORLD_SIZE TMP_DIR. cnn_batchnorm.py's model, data and optimizer, but rank R trains
3 + 2 R steps (rank 0 runs out first) inside `ddp.join(divide_by_initial_world_size=False)`: a rank
that has run out shadows the others' collectives, gradients are averaged over the ranks still
training, buffers come from the highest rank still training, and at the end every rank gets the
model of the highest rank that trained last. Rank R writes TMP_DIR/rank<R>.txt: its steps' lines
as cnn_batchnorm.py writes them, then "final params : ..." and "final buffers : ..." after the join.
"""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from cnn_batchnorm import BATCH, LR, MOMENTUM, build_model, data, fmt
from gloo_store import finish, store_from_argv


def steps_of(rank):
    return 3 + 2 * rank


def run(rank, world, tmp, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    x, y = data(world)
    model = build_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    bn = model[1]
    mine = slice(rank * BATCH, (rank + 1) * BATCH)

    def write(out, key):
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out.write("%s params : %s\n" % (key, fmt(params)))
        out.write("%s buffers : %s %s %d\n" % (key, fmt(bn.running_mean), fmt(bn.running_var),
                                               bn.num_batches_tracked.item()))

    with open(os.path.join(tmp, "rank%d.txt" % rank), "w") as out:
        with ddp.join(divide_by_initial_world_size=False):
            for step in range(steps_of(rank)):
                opt.zero_grad()
                loss = F.cross_entropy(ddp(x[step][mine]), y[step][mine])
                loss.backward()
                opt.step()
                out.write("%d loss : %s\n" % (step, fmt(loss.detach())))
                write(out, str(step))
        write(out, "final")
    finish()


if __name__ == "__main__":
    world, tmp, store = store_from_argv()
    mp.spawn(run, args=(world, tmp, store), nprocs=world, join=True)
