"""The prelude of a test script that runs torch.distributed in one process: a gloo group of one
on a free local port. Run in a subprocess, so that no process group outlives the test."""

PRELUDE = """
import os, socket
import torch, torch.distributed as dist

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
"""

# DeepSpeed's own initialisation of the same group of one (deepspeed.init_distributed reads the rank and
# world from the environment). Its shared-memory all-reduce among a node's CPU ranks, which a group of
# one never uses, is left out as DeepSpeed leaves it out off Linux (ShareMemCommBuilder.is_compatible:
# gloo alone): built on first use, it compiled for about 35 s of a fresh clone's suite.
DEEPSPEED_PRELUDE = """
import os, socket, sys
import torch, deepspeed, deepspeed.ops
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
deepspeed.init_distributed(dist_backend="gloo")
"""
