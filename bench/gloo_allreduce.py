"""All-reduce of 4, 8 and 16 MiB float32 with PyTorch's gloo backend, 2+ ranks under mpirun
(ranks from OMPI_COMM_WORLD_*, MASTER_ADDR from the caller): the reference for
bench/emulated_duplex.sh."""
import os, time, torch, torch.distributed as dist
rank=int(os.environ["OMPI_COMM_WORLD_RANK"]); world=int(os.environ["OMPI_COMM_WORLD_SIZE"])
os.environ.setdefault("MASTER_PORT","29533")
dist.init_process_group("gloo", rank=rank, world_size=world)
for mb in (4, 8, 16):
    t=torch.ones(mb*1024*1024//4)
    dist.all_reduce(t); dist.barrier()
    n=4; s=time.perf_counter()
    for _ in range(n): dist.all_reduce(t)
    dt=(time.perf_counter()-s)/n
    if rank==0: print(f"gloo {mb} MB: {dt*1e3:.0f} ms  {mb/dt:.1f} MB/s", flush=True)
dist.destroy_process_group()
