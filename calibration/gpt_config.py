"""The shape of :mod:`calibration.gpt`'s model, apart from the model: the parent process of a
validation run builds its run from this and never needs torch (two seconds of import on every
`validate`); the ranks build the model from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.specs import ACTIVATIONS, RECOMPUTE

if TYPE_CHECKING:
    from cost_models.specs import ModelSpec

ATTENTIONS = ("megatron", "sdpa")


@dataclass(frozen=True)
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    activation: str  # "gelu" (LayerNorm, biases) or "swiglu" (RMSNorm, no biases)
    vocab_size: int
    dropout: float = 0.0  # attention, hidden and embedding dropout
    attention: str = "megatron"  # "megatron" (unfused, keeps s×s) or "sdpa" (flash)
    tied_embeddings: bool = False
    max_seq_len: int = 2048  # rows of the learned position embedding
    recompute: str = "none"  # "none", "selective" (core attention) or "full" (whole layers)
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                     "ffn_hidden_size", "vocab_size", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must divide "
                             f"hidden_size {self.hidden_size}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} must divide "
                             f"num_attention_heads {self.num_attention_heads}")
        for name, choices in (("activation", ACTIVATIONS), ("attention", ATTENTIONS),
                              ("recompute", RECOMPUTE)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}: expected one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a probability in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the K (or V) projection: kv heads × head dim."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_model_spec(cls, model: "ModelSpec", attention: str = "megatron", *,
                        recompute: str = "none", max_seq_len: int = 2048) -> "GPTConfig":
        """The config of ``model`` (a :class:`cost_models.specs.ModelSpec`).

        ``attention="sdpa"`` corresponds to ``TrainingSpec.flash_attention=True``.
        """
        return cls(
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            num_attention_heads=model.num_attention_heads,
            num_kv_heads=model.num_kv_heads,
            ffn_hidden_size=model.ffn_hidden_size,
            activation=model.activation,
            vocab_size=model.vocab_size,
            dropout=float(model.dropout),
            attention=attention,
            tied_embeddings=model.tied_embeddings,
            max_seq_len=max_seq_len,
            recompute=recompute,
        )
