"""Low-precision training recipes: which GEMMs run below 16 bits, at which peak, and what
quantizing their operands costs in HBM traffic and saved bytes.

A recipe quantizes the operands of a transformer layer's linear GEMMs (QKV, projection and the
MLP) before each GEMM; attention, norms, the embedding and the LM head stay in bf16 (Transformer
Engine runs ``DotProductAttention`` in bf16 unless fp8 attention is asked for, and leaves the
output layer to Megatron's bf16 ``ColumnParallelLinear``; torchao's and torchtitan's converters
skip ``lm_head``, torchtitan's llama3 405B config by ``filter_fqns=["lm_head"]``). A linear
layer Y = X·Wᵀ (X: m×k, W: n×k, dY: m×n) runs three GEMMs that contract different axes:

- forward Y = X·Wᵀ contracts k: X and W scaled along k;
- dgrad dX = dY·W contracts n: dY along n, W along n;
- wgrad dW = dYᵀ·X contracts m: dY along m, X along m.

So every operand is used in two layouts. Per-tensor scales (``delayed``, ``tensorwise``) hold
for both: the second layout is a transpose of the quantized data. Scales along the contraction
axis (``rowwise``, ``blockwise``, ``mxfp8``, ``nvfp4``) differ between the layouts, so the second
is quantized again along the other axis. Either way a library writes both from one read of the
bf16 tensor (Transformer Engine's ``cast_transpose`` and its MX/NVFP4 quantizers' row- and
column-wise outputs) or casts each use from the bf16 tensor (torchao), which
:func:`tensor_quantize_bytes` counts. Each recipe (sources per entry of :data:`RECIPES`):

- ``delayed``: per-tensor scale from the amax history of earlier steps (Micikevicius et al.
  2022, "FP8 formats for deep learning", §4.3; Transformer Engine ``DelayedScaling``, Megatron's
  default ``fp8_recipe``): the cast computes the amax as it goes, one pass over the tensor.
- ``tensorwise``: per-tensor scale from the tensor's own amax (TE ``Float8CurrentScaling``;
  torchao's default ``Float8LinearConfig``): one more read of the tensor for its amax first.
- ``rowwise``: one scale per row along k (torchao ``Float8LinearRecipeName.ROWWISE``), GEMMs in
  row-scaled kernels; ``rowwise_with_gw_hp`` keeps the wgrad GEMM in bf16 (torchao
  ``ROWWISE_WITH_GW_HP``).
- ``blockwise``: 1×128 tiles for activations and gradients, 128×128 blocks for weights, fp32
  scales (DeepSeek-V3 technical report, arXiv 2412.19437, §3.3.2; TE ``Float8BlockScaling``).
- ``mxfp8``: OCP Microscaling v1.0: blocks of 32 elements along k share one E8M0 scale (1 byte
  per 32), in the tensor cores of Blackwell (TE ``MXFP8BlockScaling``; torchao MX).
- ``nvfp4``: E2M1 elements (half a byte) in blocks of 16 with an E4M3 scale (1 byte per 16) and
  an fp32 per-tensor scale, at the fp4 peak (NVIDIA, "Pretraining Large Language Models with
  NVFP4", arXiv 2509.25149; TE ``NVFP4BlockScaling``). The per-tensor scale needs the tensor's
  amax first. The recipe keeps "selective high-precision layers" (the paper's abstract): the
  last 15 % of the decoder layers stay bf16 in torchtitan's llama3 NVFP4 config
  (``_NVFP4_BF16_TAIL_FRACTION = 0.15``, ``models/llama3/config_registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Bytes of one bf16 element: what the quantize kernels read.
HIGH_PRECISION_BYTES = 2.0


def activation_bytes(precision: str) -> int:
    """Bytes per saved activation element: 4 in fp32, else 2.

    Low-precision recipes run norms, softmax and residuals in bf16; what their linears keep of
    their inputs is :func:`saved_input_bytes`.
    """
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class Recipe:
    """What a low-precision recipe does to a linear layer's GEMMs."""

    name: str
    peak: str  # the tensor-core rate its GEMMs run at: a key of GPUSpec.peak_flops ("fp8", "fp4")
    kernel: str  # which achieved efficiency the GEMMs reach (Performance.gemm_efficiency_for)
    element_bytes: float  # bytes per quantized element
    scale_bytes: float  # bytes of scale per element (E8M0 per 32: 1/32; fp32 per 128: 4/128)
    amax_pass: bool  # the tensor is read once for its (per-tensor) amax before it is cast
    wgrad_low: bool = True  # the wgrad GEMM runs at the low precision too
    high_precision_layers: float = 0.0  # share of the decoder layers whose linears stay bf16
    # One per-tensor scale serves both layouts, so the column-wise copy is the row-wise data transposed.
    per_tensor: bool = False
    # A weight's column-wise layout follows from its row-wise quantized data (one per-tensor scale, or
    # square blocks, 128×128 or NVFP4's 16×16, whose scales transpose with them), so one quantized copy
    # serves both GEMMs.
    weight_layouts_from_one: bool = False

    @property
    def quantized_bytes(self) -> float:
        """Bytes per element written by a quantize kernel (data and scales)."""
        return self.element_bytes + self.scale_bytes


FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise")

RECIPES: dict[str, Recipe] = {
    "delayed": Recipe("delayed", "fp8", "fp8", 1.0, 0.0, amax_pass=False, per_tensor=True,
                      weight_layouts_from_one=True),
    "tensorwise": Recipe("tensorwise", "fp8", "fp8", 1.0, 0.0, amax_pass=True, per_tensor=True,
                         weight_layouts_from_one=True),
    # One fp32 scale per row of k elements: negligible bytes.
    "rowwise": Recipe("rowwise", "fp8", "fp8_rowwise", 1.0, 0.0, amax_pass=False),
    "rowwise_with_gw_hp": Recipe("rowwise_with_gw_hp", "fp8", "fp8_rowwise", 1.0, 0.0, amax_pass=False,
                                 wgrad_low=False),
    "blockwise": Recipe("blockwise", "fp8", "fp8", 1.0, 4 / 128, amax_pass=False, weight_layouts_from_one=True),
    "mxfp8": Recipe("mxfp8", "fp8", "fp8", 1.0, 1 / 32, amax_pass=False),
    # Weights share one scale per 16×16 block (TE NVFP4BlockScaling: "a 2D block of 16x16 elements"),
    # so their two layouts are one quantization.
    "nvfp4": Recipe("nvfp4", "fp4", "fp4", 0.5, 1 / 16, amax_pass=True, high_precision_layers=0.15,
                    weight_layouts_from_one=True),
}

# training.precision values that quantize GEMMs, and the recipe each names by itself.
LOW_PRECISIONS = ("fp8", "mxfp8", "nvfp4")


def recipe_for(precision: str, fp8_recipe: Optional[str]) -> Optional[Recipe]:
    """The recipe of ``precision`` (``fp8_recipe`` for fp8); None for 16- and 32-bit training."""
    if precision == "fp8":
        return RECIPES[fp8_recipe or "delayed"]
    return RECIPES.get(precision)


def tensor_quantize_bytes(recipe: Recipe, elements: float, layouts: int, fused_layouts: bool,
                          in_producer: bool = False) -> float:
    """HBM bytes of quantizing one bf16 tensor of ``elements`` into ``layouts`` (1 or 2) layouts.

    A pass reads the bf16 tensor (2 bytes an element), twice where a per-tensor amax is taken
    first (``amax_pass``), and writes the layouts it produces (``quantized_bytes`` each). A
    library that emits both layouts from one read (``fused_layouts``: Transformer Engine's
    ``cast_transpose`` and its MX/NVFP4 quantizers' row- and column-wise outputs) pays one pass;
    one that quantizes each use from the bf16 tensor (torchao: the wgrad copy of the input is cast
    again in backward) pays one pass per layout. A quantize done by the kernel that produces the
    tensor (``in_producer``) reads nothing (its amax pass apart).
    """
    passes = 1 if fused_layouts else layouts
    reads = passes * HIGH_PRECISION_BYTES * ((not in_producer) + recipe.amax_pass)
    return elements * (reads + layouts * recipe.quantized_bytes)


@dataclass(frozen=True)
class LinearQuantization:
    """HBM bytes of the quantize kernels of one linear layer, in its forward and its backward."""

    forward: float
    backward: float


def linear_quantize_bytes(recipe: Recipe, m: float, n: float, k: float, fused_layouts: bool,
                          weight_share: float = 1.0, input_in_producer: bool = False) -> LinearQuantization:
    """Quantize traffic of one linear layer's three GEMMs for one micro-batch.

    X (m·k) feeds forward and wgrad, W (n·k) forward and dgrad, dY (m·n) dgrad and wgrad
    (:func:`tensor_quantize_bytes` each). ``weight_share`` is the part of the weight's quantize
    this micro-batch pays: 1, or 1/(micro-batches) where the engine keeps the quantized weight for
    the whole step (Transformer Engine's cache, ``is_first_microbatch``), or 1/(shards) where the
    weight is quantized on its shard before the gather (fp8 parameter all-gather). With the wgrad
    GEMM in bf16 (``wgrad_low`` false), X and dY are quantized for one GEMM only. A fused library
    writes both layouts of X and W in forward; otherwise the second of each is cast in backward.
    ``input_in_producer``: the norm or activation kernel that computes X writes it quantized
    (Transformer Engine's ``LayerNormLinear`` and ``LayerNormMLP``, which Megatron's TE layer spec
    runs for QKV, FC1 and FC2), so X is not read again.
    """
    uses = 2 if recipe.wgrad_low else 1
    x = tensor_quantize_bytes(recipe, m * k, uses, fused_layouts, input_in_producer and fused_layouts)
    w = tensor_quantize_bytes(recipe, n * k, 2, fused_layouts) * weight_share
    dy = tensor_quantize_bytes(recipe, m * n, uses, fused_layouts)
    if fused_layouts:
        return LinearQuantization(forward=x + w, backward=dy)
    x_first = x / uses
    return LinearQuantization(forward=x_first + w / 2, backward=(x - x_first) + w / 2 + dy)


def cached_weight_bytes(recipe: Recipe, any_layout_gemm: bool) -> float:
    """Bytes per weight element of the quantized copy Transformer Engine keeps for a whole step
    (its weight workspace, ``TransformerEngineBaseModule._fp8_workspaces``, filled on the first
    micro-batch where Megatron passes ``is_first_microbatch``; ``transformer_engine/pytorch/module/
    linear.py``): the row-wise layout forward reads and the column-wise one dgrad reads, each at
    ``quantized_bytes``. A per-tensor-scaled copy on a GPU whose fp8 GEMMs take either operand
    layout (``any_layout_gemm``: Blackwell, TE's ``is_non_tn_fp8_gemm_supported``) keeps the
    row-wise data alone: Megatron-FSDP's README prices that transpose cache at one byte a
    parameter, "no benefit from the Blackwell architecture"."""
    layouts = 1 if recipe.per_tensor and any_layout_gemm else 2
    return layouts * recipe.quantized_bytes


def saved_input_bytes(recipe: Optional[Recipe], saves_quantized: bool, high_precision: float) -> float:
    """Bytes per element a linear layer keeps of its input for the wgrad GEMM.

    Transformer Engine keeps the quantized copy wgrad reads (its column-wise data and scales for
    MX and NVFP4), where the wgrad runs at the low precision; torchao keeps the bf16 input and
    quantizes it again in backward (``matmul_with_hp_or_float8_args`` saves ``input_hp``)."""
    if recipe is None or not saves_quantized or not recipe.wgrad_low:
        return high_precision
    return recipe.quantized_bytes
