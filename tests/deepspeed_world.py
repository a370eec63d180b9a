"""What DeepSpeedConfig asks of a running job, stood in for in one process: the world (deepspeed.comm's
rank and size) and a model-parallel unit's data-parallel size. Imported after the test module has set
DS_ACCELERATOR and skipped without deepspeed."""

from __future__ import annotations

import pytest
from deepspeed import comm as ds_comm


@pytest.fixture
def world(monkeypatch):
    """Stand in for deepspeed.comm: DeepSpeedConfig asks it for the rank and the world size."""

    def set_world(size: int) -> None:
        monkeypatch.setattr(ds_comm, "get_world_size", lambda group=None: size)
        monkeypatch.setattr(ds_comm, "get_rank", lambda group=None: 0)

    return set_world


class DataParallelMPU:
    """What a PipelineModule's grid or AutoTP's groups answer DeepSpeedConfig."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp
