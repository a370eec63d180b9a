"""Megatron-LM: what it runs and how (``engine``), the launch files it takes (``emit``), its configs read back (``read``). Adding to or changing the engine touches this package alone."""

from .engine import BEHAVIOUR, ENGINE, SUPPORT, recompute_module_refusals

__all__ = ["BEHAVIOUR", "ENGINE", "SUPPORT", "recompute_module_refusals"]
