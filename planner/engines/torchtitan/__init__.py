"""torchtitan: what it runs and how (``engine``), the launch files it takes (``emit``). Adding to or changing the engine touches this package alone."""

from .engine import BEHAVIOUR, ENGINE, SUPPORT

__all__ = ["BEHAVIOUR", "ENGINE", "SUPPORT"]
