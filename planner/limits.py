"""Every bound the planner puts on its input, in one place.

Each bound sits far above any real training job and far below what would make a
command run for minutes or exhaust memory; an input past one is refused in one line
that names the key and the bound.
"""

from __future__ import annotations

# Input files (case, hf_config, cluster.profile, --config, --megatron-args, published
# runs): the largest real one, a published-runs file, is about 3 MB.
MAX_INPUT_BYTES = 16 * 2**20
# A training log (`calibrate --from-logs`): a line for every step of a long run, so more than the rest.
MAX_LOG_BYTES = 256 * 2**20
# YAML nodes after alias expansion (the largest published-runs file holds ~130,000), alias uses
# (the presets use a handful) and nesting depth: a "billion laughs" document or a
# multi-million-entry list is refused before it is built.
MAX_YAML_NODES = 250_000
# A case file's nodes: its sections hold hundreds (an inline GPU, fabric and performance mapping a few
# hundred more). A case of 240,000 list items was refused as an unknown key after 3-9 s of parsing.
MAX_CASE_YAML_NODES = 20_000
MAX_YAML_ALIASES = 100
MAX_NESTING = 100
# Integers anywhere in a case: within a 64-bit integer, so every figure converts to a
# finite float.
MAX_INT = 2**63 - 1

# `plan`: the search enumerates divisors of these, so each is bounded.
MAX_GPUS = 1 << 20
# Streaming multiprocessors (or compute units) of one GPU: 4,096, more than ten times the most
# shipped (MI300X's 304 compute units; B200's 148 SMs). 2^63 was taken, and priced as steps of
# 2.6e15 s blamed on "the GPU's figures".
MAX_SM_COUNT = 4096
# A CUDA compute capability's major: 99, past any NVIDIA has named (12 for consumer Blackwell).
MAX_COMPUTE_CAPABILITY_MAJOR = 99
# Tokens per sequence: 16 M, sixteen times the longest context trained on published (1 M);
# the search enumerates context-parallel degrees and micro-batches against it.
MAX_SEQ_LEN = 1 << 24
# Layers: 1,024, above the deepest transformer trained on published (DeepNet, arXiv:2203.00555:
# 1,000 layers); a mixture of experts of 3,000 layers kept `plan` busy for 27 s, of 10,000 for 83 s
# (each pipeline split's chunks, up to one layer each, are priced one by one).
MAX_LAYERS = 1024
# A model's widths (hidden, MLP, head and latent sizes, vocabulary), heads and experts, where a case
# reads them: 2^20 and 2^24, 40 and 60 times the widest published (PaLM's MLP, 73,728; Gemma's
# 262,144-token vocabulary) and 2^20 experts, PEER's million (arXiv:2407.04153). A hidden size of
# 2^62 was an estimate of 10^18 s a step, refused as the GPU's figures.
MAX_MODEL_WIDTH = 1 << 20
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 20
MAX_GLOBAL_BATCH = 1 << 24
# Tokens in one global batch (sequences × tokens each): 2^30, seventeen times DeepSeek-V3's 63 M
# (15,360 × 4,096), the largest published; DeepSeek-V3 at 15.7 M sequences of 196,608 tokens on
# 491,520 GPUs kept `plan` busy for 209 s.
MAX_BATCH_TOKENS = 1 << 30
MAX_TOP_K = 100
# `size`: the cluster sizes it plans, over every GPU type (whole nodes or racks up to each type's
# limit): 2^20 GPUs of one type in nodes of 8. Sixteen types of 2^20 GPUs each, two million
# sizes, kept it busy for 203 s.
MAX_CLUSTER_SIZES = 1 << 17
# `size`: the price of one GPU-hour, and the tokens and deadline of a run (a thousand
# years of the largest cluster at a million tokens per second per GPU is under 10^25 tokens).
MAX_GPU_HOUR_COST = 1e6
# And the least, the bound above mirrored: a millionth of a unit of whatever currency prices a GPU-hour
# (a $2 GPU-hour is 2e-5 bitcoin). Below it, "above 0" let a denormal through: at 5e-324 the costs kept
# a digit or two (197.57 GPU-hours cost 9.8e-322, not 9.88e-322) and the knee's days² × cost (size_front)
# underflowed to 0, so that every size tied on it.
MIN_GPU_HOUR_COST = 1e-6
MAX_TOKENS = 1e25
MAX_DEADLINE_S = 1000 * 365 * 86400.0
# --simplest-within, in percent of the fastest step time.
MAX_SIMPLEST_WITHIN_PCT = 1000.0
# The solver holds step times in whole microseconds, weighted by the table's rows, in
# 64-bit integers; a step over this (116 days) comes from figures of no real hardware.
MAX_STEP_TIME_S = 1e7

# A fixed time in the case or a profile (a kernel's, a collective step's, a step's or a
# micro-batch's overhead): an hour is no figure of real hardware, and times beyond it multiplied
# by a step's kernels overflow the step time.
MAX_FIXED_TIME_S = 3600.0

# Quantities with units, in bytes or bytes/s: a figure below one byte (per second) gives
# infinite step times.
MIN_QUANTITY = 1.0
MAX_QUANTITY = 1e21
# Achieved-performance fractions and TFLOP/s figures below this are no measurement.
MIN_FIGURE = 1e-6
# A GPU's peak TFLOP/s in any precision: 100 PFLOP/s, seven times B300's dense FP4 (15 PFLOP/s).
MAX_PEAK_TFLOPS = 1e5
# A fabric's achieved share of its line rate at some span: SHARP's in-network reduction doubles
# what the ring's bus bandwidth counts, no fabric more (FabricSpec.efficiency: at most 1.5).
MAX_FABRIC_EFFICIENCY = 1.5
# RoPE's base (rope_theta): two million times Llama 3's 500,000; Megatron-LM takes it whole.
MAX_ROPE_BASE = 1e12

# Reading a Megatron argument list or launch script: the longest value a shell variable
# or an expanded --pipeline-model-parallel-layout may reach.
MAX_EXPANDED_CHARS = 1_000_000

# search.headroom: the share of GPU memory a layout must leave free.
MAX_HEADROOM = 0.9

# `calibrate --timeout` and `validate --timeout`: a day, and `validate --steps` / `--warmup`:
# runs on this machine's CPUs or GPUs that are a few minutes long; nan or inf would disarm the
# watchdog, and 2^70 steps would never end.
MAX_TIMEOUT_S = 86400.0
MAX_RUN_STEPS = 10_000
# `validate-published --few-shot K`: the runs of each source's GPU type drawn for one fit (five draws
# each for K = 0, 1, 3, 5 up to K); a team hands in a few, and the largest group but the Playbook's
# holds 78.
MAX_FEW_SHOT = 50
# Runs one fit takes (calibrate --from-runs / --from-logs): every run is checked and priced, about 50 ms
# each on a slow core, and the fit prices them again each iteration; 4,500 runs took nearly five
# minutes. A profile's few shared figures are informed by a few dozen runs.
MAX_FIT_RUNS = 500

# `calibrate --nproc`: ranks per CPU core (or per GPU) at most.
MAX_RANKS_PER_CORE = 1

# A string in a case (a name, a path, a choice): a path's longest on Linux. The report wraps
# names into its tables, and one word of 60,000 characters took 20 s to wrap.
MAX_STRING_CHARS = 4096

# Error messages: one line of at most this many characters per part.
MAX_MESSAGE_PART = 300
