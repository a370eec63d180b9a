"""PyTorch DDP's gradient buckets, measured: what ``model_states.bucket_copy_bytes`` prices.

DDP copies each gradient into a flat bucket for its all-reduce. Unless
``gradient_as_bucket_view=True``, ``param.grad`` keeps its own storage beside the bucket, so the
gradients take twice their bytes; with it, the gradients are views of the buckets. The run
counts every distinct storage behind the parameters' gradients and the buckets a comm hook sees.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cost_models.model_states import bucket_copy_bytes, state_bytes  # noqa: E402
from cost_models.specs import TrainingSpec  # noqa: E402
from gloo_one_rank import PRELUDE  # noqa: E402
from planner.engines import behaviour_of  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

SCRIPT = PRELUDE + textwrap.dedent("""
    from torch.nn.parallel import DistributedDataParallel

    for view in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=view, bucket_cap_mb=0.25)
        buffers = []

        def hook(state, bucket):
            buffers.append(bucket.buffer())
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp.register_comm_hook(None, hook)
        ddp(torch.randn(8, 256)).sum().backward()
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in [p.grad for p in model.parameters()] + buffers}
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(view, sum(storages.values()) / gradient_bytes)
    dist.destroy_process_group()
""")


def test_ddp_holds_its_buckets_beside_the_gradients_unless_they_are_views():
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    held = {line.split()[0]: float(line.split()[1]) for line in run.stdout.splitlines() if line.strip()}
    assert held == {"False": 2.0, "True": 1.0}
    # What the model prices for plain PyTorch over more than one replica: one more copy of the
    # gradients, in the parameters' (here the gradients') dtype.
    training = TrainingSpec(global_batch_size=8, seq_len=8, precision="fp32", engine=behaviour_of("any"))
    assert 1 + bucket_copy_bytes(training, 0, 8) / state_bytes(training).gradients == held["False"]
