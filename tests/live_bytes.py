"""The most bytes alive at once in tensors of one size, as PyTorch's ops make them: every storage an op
returns is followed until it is freed, whatever an allocator would cache or reuse. The loss tests
measure the LM head's cross-entropy with it (test_eager_loss_torch, test_chunked_loss_torch,
test_loss_parallel_torch); the subprocess scripts import it from the repository's root."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class SizedBytes(TorchDispatchMode):
    """The peak of the bytes live at once in storages of ``elements`` elements, 2 or 4 bytes each."""

    def __init__(self, elements: int) -> None:
        super().__init__()
        self.sizes = (2 * elements, 4 * elements)
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if type(t) is torch.Tensor and t.untyped_storage().nbytes() in self.sizes:
                storage = t.untyped_storage()
                if storage._cdata not in self.live:
                    self.live[storage._cdata] = storage.nbytes()
                    self.now += storage.nbytes()
                    weakref.finalize(storage, self._free, storage._cdata)
        self.peak = max(self.peak, self.now)
        return out

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
