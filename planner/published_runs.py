"""Published training runs as cases: each row written as a user of that run would write it.

The rows (``planner/published/*.yaml``, README beside them) carry a layout and a measured
result. :func:`case_of` turns one into a case dict in the case-file schema with what a user
of the run knows: the model, the GPU, the layout, the engine the framework is, and what the
source's own scripts set (flash attention, dropout, tied embeddings, TP overlap in NeMo's
recipes). :func:`measured_tokens_per_s` reads the measured throughput without any FLOP
convention where the row allows, and inverts Narayanan et al.'s eq. (3) where that is all a
row gives. Nothing here is fitted: these are the facts the model is scored against.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Optional

from cost_models.flops import model_flops_per_token
from cost_models.specs import RECOMPUTE_MODULES, ModelSpec

from .errors import CaseError, one_line, safe_repr
from .limits import MAX_GPUS, MAX_LAYERS, MIN_FIGURE
from .presets import gpu_presets
from .units import parse_memory

DATA = Path(__file__).parent / "published"
DEFAULT_FILES = tuple(DATA / name for name in ("published_runs.yaml", "published_runs_2.yaml",
                                               "published_runs_moe.yaml"))

# Sources whose runs predate flash attention and kept Megatron's 0.1 dropout, and the GPT-style
# models whose input embedding and LM head share weights. BLOOM's script sets no dropout, so the
# bigscience fork's defaults apply (megatron/arguments.py: --attention-dropout and --hidden-dropout
# 0.1; train/tr11-176B-ml/README.md: "The default Megatron-LM dropout settings are inherited").
PRE_FLASH = ("Narayanan", "Korthikanti", "bigscience", "Smith", "Black")
DROPOUT = ("Narayanan", "Korthikanti", "Smith", "bigscience")
TIED = ("Narayanan", "Korthikanti", "bigscience", "Smith", "mosaicml", "Black", "NVIDIA/NeMo docs")
# nanotron's scaling_benchmarks.py (the Ultra-Scale Playbook's sweep) ties the embeddings of the
# models it builds with an FFN under 10,000 wide ("model < 4B": its 1B and 3B), not the 80B.
NANOTRON_TIED_BELOW_FFN = 10_000
# Clusters a row names by their scale-out network where it is not the GPU preset's own (the
# Playbook's AWS p5 nodes: "EFA inter-node"), by GPU preset; and the networks of sources that ran
# on one machine, by source: BLOOM on Jean Zay's A100 nodes, 4 Omni-Path 100 Gbit/s links each
# (train/tr11-176B-ml/README.md, "Hardware"; only its main row's GPU names the network).
EFA_FABRICS = {"h100-sxm-80gb": "aws-efa-p5", "a100-sxm-80gb": "aws-efa-p4d", "a100-sxm-40gb": "aws-efa-p4d"}
SOURCE_FABRICS = {"bigscience-workshop/bigscience train/tr11": "omni-path-100"}
# Runs that accumulate and reduce their gradients in fp32 (``fp32_gradients``): by framework, nanotron's
# sweep; by source, BLOOM, which trained bf16 through DeepSpeed's BF16_Optimizer.
FP32_GRADIENT_FRAMEWORKS = ("nanotron",)
BF16_OPTIMIZER_SOURCES = ("bigscience",)
# Machines that ran under a power cap, by what their row's `gpu` says: torchao's MX README ran on "8x power
# limited B200" GPUs (limit not stated). Their tensor cores run at 0.635 of the clock the B200 preset's
# efficiencies hold at: MEASURED from that machine's bf16 run (8,307.5 tok/s a GPU, torchtitan Llama 3 8B),
# where the preset's GEMM and fused-attention figures give it at that clock (-1 %, bench/fidelity.py).
POWER_LIMITED_CLOCK = {"B200 (POWER LIMITED": 0.635}
# NeMo AutoModel's benchmark configs (examples/llm_benchmark/*.yaml, formerly examples/benchmark/configs/)
# by model, where the row leaves out what the config sets: Qwen3-30B-A3B's checkpoints every block
# (parallelizer.activation_checkpointing: true in every revision, 2025-10 to 2026-08).
AUTOMODEL_SOURCE = "NeMo AutoModel"
AUTOMODEL_CHECKPOINTED = ("Qwen3-30B-A3B",)
# torchtitan compiles the loss with the model (training.compile) since bbb1b616e (2025-04-02: "Enable
# compiling the loss function ... reduction of memory"); its 0.0.2 release did not (e8977b0,
# 2024-12-18, had turned the loss's compile off). The torchtitan versions the rows name, by whether
# their compiled runs compile the loss.
TORCHTITAN_COMPILES_LOSS = {"0.0.2": False, "2c8b594": True, "6fc499f": True}
# Megatron-Bridge's 25.09 rows carry no recipe: their settings are its perf script's
# (scripts/performance/run_script.py at v0.1.0rc4, the first release whose docs hold the 25.09 table), by
# model and GPU preset. DeepSeek-V3: on H100 (the "dropless" row) DeepEP with its dispatch overlapped in
# the 1F1B schedule (A2A_1F1B: overlap_moe_expert_parallel_comm) and MLA's up-projections and the dense
# MLPs recomputed, in its own pipeline layout, whose last model chunk holds the MTP module and the loss
# alone (run_script.py: layout = "Et|(tt|)*30mL" on H100); on B200 and GB200 (the "tokendrop" rows)
# MLA's up-projections recomputed.
BRIDGE_2509_SOURCE = "Megatron-Bridge performance summary, NeMo 25.09"
BRIDGE_2509_SETTINGS = {
    ("DeepSeek-V3", "h100-sxm-80gb"): {"overlap_moe_expert_parallel_comm": True,
                                       "recompute_modules": ["mla_up_proj", "mlp"],
                                       "pipeline_model_parallel_layout": "Et|(tt|)*30mL"},
    ("DeepSeek-V3", "b200"): {"recompute_modules": ["mla_up_proj"]},
    ("DeepSeek-V3", "gb200"): {"recompute_modules": ["mla_up_proj"]},
}
# Megatron-Bridge's 25.11 rows whose recipe the source could not attach (no workload base config of
# v0.2.0-v0.2.2 reproduces their TP/PP/VP/EP/MBS/GBS) but whose layout is the one base config for
# their model and GPU in all but the global batch: that config's settings, which do not depend on it.
# DeepSeek-V3 on GB200 in BF16 (4,096 sequences, where DEEPSEEK_V3_GB200_BASE_CONFIG has 2,048):
# MLA's up-projections recomputed (scripts/performance/configs/deepseek/workload_base_configs.py at
# v0.2.1, the first release whose docs hold the 25.11 table). Keyed by model, GPU preset and
# (tp, pp, vpp, ep, micro-batch).
BRIDGE_2511_SOURCE = "Megatron-Bridge performance summary, NeMo 25.11"
BRIDGE_2511_SETTINGS = {
    ("DeepSeek-V3", "gb200", (1, 4, 4, 64, 1)): {"recompute_modules": ["mla_up_proj"]},
}
# Megatron-Bridge's "(tokendrop)" runs: apply_moe_token_drop's capacity factor 1.0, each expert padded to
# it (src/megatron/bridge/training/utils/moe_token_drop.py, v0.1.0rc4 onwards).
BRIDGE_TOKEN_DROP_CAPACITY = 1.0
# NeMo's GPT3 recipes: the GPT-2 BPE padded to 51,200 (NeMo's LLM_VOCAB_SIZE_MAP["gpt3"]).
NEMO_GPT3_VOCAB = 51200

# Row `gpu` strings (upper-cased, without "NVIDIA ") by prefix, most specific first.
GPU_PREFIXES = (
    ("BLACKWELL ULTRA", "gb300"), ("BLACKWELL GPU (GB2", "gb200"), ("H200", "h200-sxm-141gb"),
    ("H800", "h800"), ("B300", "b300"), ("MI300X", "mi300x"), ("GB300", "gb300"), ("GB200", "gb200"),
    ("B200", "b200"), ("H100", "h100-sxm-80gb"), ("V100", "v100-sxm-32gb"), ("MI325X", "mi325x"), ("MI355X", "mi355x"),
)
# The names a row's GPU may be written as, for a refusal to list: each family's model number (A100's
# memory picks its preset), each the SXM/OAM module or the NVL72 rack the presets hold.
ACCEPTED_GPUS = ", ".join(sorted({"A100"} | {p for p, _ in GPU_PREFIXES if re.fullmatch(r"[A-Z]+\d+X?", p)}))


class Rows(list):
    """Published-run rows, each with where it was read (``origins``: ``file[index]``), so that a row
    that cannot be read is named by its file and place."""

    origins: list[str]


# What each runs file read so far parsed to, by its path: (its text, the data). The shipped files are
# 4 MB of YAML, 2 s to parse, and `validate-published --leave-family-out` loaded them twice (its scores,
# then the families'), as a Python session scoring them more than once does.
_PARSED: dict[str, tuple[str, Any]] = {}
_PARSED_LIMIT = 16  # emptied when full: a session reading many files of its own keeps no more than this


def _runs_data(path: Path) -> Any:
    """A runs file's YAML, parsed again only when its text changed; a copy each time, so that a caller
    that edits its rows changes no other caller's."""
    from .inputs import load_yaml, read_text

    text, name = read_text(path, "YAML"), os.fsdecode(path)
    cached = _PARSED.get(name)
    if cached is None or cached[0] != text:
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        cached = _PARSED[name] = (text, load_yaml(text, name))  # a file it refuses raises, cached as nothing
    return copy.deepcopy(cached[1])


def load_rows(paths=DEFAULT_FILES) -> Rows:
    """The rows of the given published-run files (the repo's own copies by default)."""
    from .inputs import check_each_file_once

    check_each_file_once(paths, "runs")
    rows = Rows()
    rows.origins = []
    for path in paths:
        data = _runs_data(Path(path))
        if not isinstance(data, list):
            raise CaseError(str(path), "", "expected a list of published runs")
        # A row that is not a run is reported by whoever reads it; a team's run without its source is its
        # file's, as `calibrate --from-runs` reads it (validate-published refused the file it took).
        rows.extend({**row, "source": str(path)} if isinstance(row, dict) and not row.get("source") else row
                    for row in data)
        rows.origins += [f"{path}[{i}]" for i in range(len(data))]
    # A run given twice (repeated in a file, an alias of it, or in two files) counted twice in every
    # score and band: refused, as calibrate --from-runs refuses it.
    seen: dict[str, str] = {}
    for row, origin in zip(rows, rows.origins):
        run_id = row.get("id") if isinstance(row, dict) else None
        if isinstance(run_id, str) and run_id in seen:
            raise CaseError(origin, run_id, f"the same run id as {seen[run_id]}: give each run once (a copy would "
                                            "count twice in every score)")
        if isinstance(run_id, str):
            seen[run_id] = origin
    return rows


def job_key(case: dict) -> str:
    """A run's case as the job it trains, whatever the job is called (a model's name defaults to its
    run's id): two runs of one key ran the same model, cluster, training and layout."""
    case = {**case, "model": {k: v for k, v in case["model"].items() if k != "name"}} \
        if isinstance(case.get("model"), dict) else case
    return repr(sorted((k, repr(v)) for k, v in case.items()))


def copied_run(original: str, counts: str) -> str:
    """What a run copied from ``original`` under another id is told (two measurements of one job never
    agree to the last digit); ``counts``: what the copy would do."""
    return f"repeats run {original}: the same job and the same measurement; give each run once (a copy would {counts})"


def row_name(rows: list, index: int) -> str:
    """A row as a report names it: its id where it has one, and where it was read (file and index)."""
    origins = getattr(rows, "origins", None)
    where = origins[index] if origins else f"row {index}"
    row = rows[index]
    rid = row.get("id") if isinstance(row, dict) else None
    return f"{one_line(rid, 80)} ({where})" if rid is not None else where


# A GPU name's variants that are other GPUs than the SXM part the presets hold: PCIe cards and the NVL
# boards of H100 and H200 ("H100 NVL 94GB": other peaks, clocks and memory, no SXM NVLink switch);
# "NVL72", a GB200 or GB300 rack, and "NVLink" are not. "NVL" is matched by letters, not word
# boundaries: "H100_NVL" and "H100NVL" are the NVL board too, as "H100 PCI-E" is the PCIe card (each was
# scored as the SXM module).
# The HGX A100 and HGX H100 4-GPU boards join their 4 SXM modules to each other, with no NVSwitch (the HGX
# datasheets' "4-GPU" columns: NVSwitch "N/A"): not the 8-GPU NVSwitch domain of the presets.
OTHER_PARTS = re.compile(r"PCI|CNX|(?<![A-Z])NVL(?![A-Z0-9])|(?<![A-Z0-9])4-GPU")
# NVIDIA's DGX and HGX systems by the module they hold, "DGX H100", "DGX-B200", "HGX B300": each 8 of the
# SXM module on one NVSwitch board (the DGX H100 datasheet: 8x H100 SXM5 80GB, 4 NVSwitches; DGX B200: 8x
# B200, 1,440 GB; HGX B300: 8 Blackwell Ultra SXM GPUs; DGX A100: 8x A100 SXM4, 6 NVSwitches; DGX GB200:
# the NVL72 rack), which is the preset's part. Only before a model number: DGX-1 and DGX-2 name none (P100
# or V100; DGX-2 joins 16 on 12 NVSwitches), and "DGX Station A100" is 4 A100s without NVSwitch.
SYSTEM = re.compile(r"^[DH]GX[ -](?=[A-Z]+\d)")
# NVIDIA's NVLink systems ("NVL" and a GPU count) whose NVLink domain is the preset's: the GB200 NVL72 and
# GB300 NVL72 datasheets (72 GPUs joined by the rack's NVLink switch trays, the presets' nvlink_domain 72)
# and NVIDIA's HGX B300 NVL16 (the HGX B300 board: 8 Blackwell Ultra GPUs, two dies each). Any other count
# is another system of the family (GB200 NVL4 and NVL2: a 4- and a 2-GPU domain, not the rack's 72) or no
# product at all: "H100 NVL72" was scored as the H100 SXM module, but the NVL72 racks are Grace
# Blackwell's, and H100's one "NVL" is the PCIe board pair (OTHER_PARTS).
NVL_SYSTEMS = {"gb200": ("NVL72",), "gb300": ("NVL72",), "b300": ("NVL16",)}
NVL_COUNT = re.compile(r"(?<![A-Z])NVL\d+")


def gpu_name(name: Any) -> str:
    """A GPU's name as the presets are looked up by: upper case, its spaces single ("NVIDIA  H100" and
    "  H100   SXM " were refused where "nvidia h100" was read), without the vendor's "NVIDIA " or a leading
    "AMD Instinct " ("MI300X" was refused where "AMD-MI300X" was read), or NVIDIA's former data-centre
    brand, "Tesla ", that nvidia-smi still names the V100 by ("Tesla V100-SXM2-32GB" was refused), or the
    DGX or HGX system before a model number (``SYSTEM``: "DGX-H100" and "HGX B300" were refused)."""
    n = re.sub(r"^(AMD[ -](INSTINCT )?|TESLA )", "", " ".join(str(name).split()).upper().replace("NVIDIA ", ""))
    return SYSTEM.sub("", n)


def model_number(name: Any) -> Optional[str]:
    """The family's model number a GPU's name starts with (a ``GPU_PREFIXES`` prefix, or A100), None for none."""
    n = gpu_name(name)
    return next((prefix for prefix, _ in GPU_PREFIXES if n.startswith(prefix)), "A100" if n.startswith("A100") else None)


# The memory a GPU's name states after its model number, in GB as the datasheets print it ("H100 80GB HBM3",
# "V100-SXM2-16GB"); an nvidia-smi total in MiB ("81559 MiB") is the preset's own and not read, nor is a link's
# bandwidth ("H800 (NVLink 160 GB/s intra-node ...)", DeepSeek-V3's row) or "1600 Gbps RoCE".
STATED_MEMORY = re.compile(r"(\d+)\s*GI?B(?![A-Z0-9/])")
# Modules of a preset's family that differ from its part in memory alone, by the GB their name states, and the
# cluster.memory their case states: the V100 SXM2 with 16 GB (the V100 datasheet's SXM2 column: "32/16 GB
# HBM2", one 900 GB/s and one 125 TFLOPS for both) and Meta's Grand Teton H100 with 96 GB (as
# shared/validation/score.py reads it).
MEMORY_VARIANTS = {"v100-sxm-32gb": {16: "16 GiB"}, "h100-sxm-80gb": {95: "96 GiB", 96: "96 GiB"}}
# A name's "80GB" is the marketing figure: the preset's memory in GB or GiB, either within 5 %.
MEMORY_ROUNDING = 0.05


def stated_memory(name: Any) -> Optional[int]:
    """The GB a GPU's name states after its model number (``STATED_MEMORY``), None where it states none."""
    part = model_number(name)
    found = STATED_MEMORY.search(gpu_name(name)[len(part):]) if part else None
    return int(found[1]) if found else None


def memory_variant(name: Any) -> Optional[str]:
    """The ``cluster.memory`` of a module that is its preset's part with other memory (``MEMORY_VARIANTS``),
    None for the preset's own memory: one reading for a published row and a team's run."""
    return MEMORY_VARIANTS.get(family_preset(name) or "", {}).get(stated_memory(name) or 0)


def other_memory(name: Any) -> bool:
    """Whether a GPU's name states a memory neither its preset's part holds nor a variant of it does
    (``MEMORY_VARIANTS``): "H100 SXM5 64GB" and "V100 SXM2 8GB" were scored as the 80 GB and 32 GB presets."""
    gb, preset = stated_memory(name), family_preset(name)
    if gb is None or preset is None or memory_variant(name):
        return False
    size = parse_memory(gpu_presets()[preset]["memory"])
    return all(abs(gb / (size / unit) - 1) > MEMORY_ROUNDING for unit in (1e9, 2**30))


def family_preset(name: str) -> Optional[str]:
    """The preset of the GPU family a name reads as, by its prefix, whatever part of it: the H100 SXM
    preset for "H100 PCIe" too (:func:`gpu_preset` is the part's)."""
    n = gpu_name(name)
    if n.startswith("A100"):
        return "a100-sxm-40gb" if "40GB" in n else "a100-sxm-80gb"
    return next((preset for prefix, preset in GPU_PREFIXES if n.startswith(prefix)), None)


def gpu_preset(name: str) -> Optional[str]:
    """The preset a run's GPU is: its family's (:func:`family_preset`), None for a PCIe or NVL part
    (``OTHER_PARTS``), whose peak, clocks and links are not the SXM module's ("H100 PCIe 80GB" was
    scored as an H100 SXM, 99 % off, with no word)."""
    if OTHER_PARTS.search(str(name).upper()):
        return None
    # Another number or letter after a family's model number is another GPU: "A1000" (an RTX workstation
    # card) and "H1000" were scored as the A100 and H100 SXM modules, and so was "A100X", NVIDIA's A100X
    # converged accelerator (its datasheet: an A100 80GB on a dual-slot PCIe card with an on-board
    # ConnectX-6 Dx and PCIe switch, NVLink bridged to one other card, no NVSwitch board), as "V100S"
    # (a PCIe card only) the V100 SXM2. The SXM module's own "H100SXM5" is the preset's.
    n, part = gpu_name(name), model_number(name)
    rest = n[len(part):] if part else ""
    if part and re.fullmatch(r"[A-Z]+\d+X?", part) and rest[:1].isalnum() and not rest.startswith("SXM"):
        return None
    preset = family_preset(name)
    if any(count not in NVL_SYSTEMS.get(preset, ()) for count in NVL_COUNT.findall(n)):
        return None
    # Another memory than its part's and no variant's: other HBM stacks, so another bandwidth too.
    return None if other_memory(name) else preset


def other_nvlink_system(name: Any) -> Optional[str]:
    """What a name's NVLink system ("NVL" and a count) was expected to be where it is not one its preset
    is (``NVL_SYSTEMS``): "GB200 NVL36" (racks of 36 GPUs) is no NVL72 rack, and neither the published
    rows nor a team's runs have a key for another NVLink domain; None where it names none or its own."""
    preset = family_preset(name)
    other = next((count for count in NVL_COUNT.findall(gpu_name(name)) if count not in NVL_SYSTEMS.get(preset, ())), None)
    if preset is None or other is None:
        return None
    systems = " or ".join(NVL_SYSTEMS.get(preset, ())) or "the SXM module's NVSwitch board"
    return (f"expected the NVLink system the {preset} preset is ({systems}, an NVLink domain of "
            f"{gpu_presets()[preset]['nvlink_domain']} GPUs): {other} is another NVLink system, whose domain a "
            f"run cannot state; got {one_line(repr(str(name)), 60)}")


def gpu_expected(name: Any) -> str:
    """What a run's ``gpu`` was expected to be, where :func:`gpu_preset` reads it as no preset."""
    if system := other_nvlink_system(name):
        return system
    if other_memory(name):
        preset = family_preset(name)
        held = [gpu_presets()[preset]["memory"]] + list(MEMORY_VARIANTS.get(preset, {}).values())
        return (f"expected the memory of a GPU the planner has a preset for: {stated_memory(name)} GB is no "
                f"{preset}'s ({' or '.join(dict.fromkeys(held))}: another memory is other HBM stacks, another "
                f"bandwidth); got {one_line(repr(str(name)), 60)}")
    return (f"expected a GPU the planner has a preset for, by its model number ({ACCEPTED_GPUS}): the SXM or "
            f"OAM module (or the DGX or HGX system of 8), or its NVL72 rack, not a PCIe card, an NVL board, a converged accelerator or another "
            f"NVLink system; got {one_line(repr(str(name)), 60)}")


def unsupported(row: dict) -> tuple[str, str]:
    """(key, what was expected) of a row :func:`case_of` calls "not a supported row": its record, its GPU
    or its precision, in the order it reads them."""
    if row.get("record_type") != "measured_throughput":
        return "record_type", (f"expected measured_throughput (a run's measurement), got "
                               f"{one_line(safe_repr(row.get('record_type')), 60)}")
    if gpu_preset(row.get("gpu")) is None:
        return "gpu", gpu_expected(row.get("gpu"))
    return "precision", (f"expected a pretraining precision, got {one_line(safe_repr(row.get('precision')), 60)} "
                         f"(adapter fine-tuning is no layout of the planner's)")


def named_precision(text: Any) -> Optional[str]:
    """The training precision a row's text names (fp32 for TF32 matmuls too), or None where it names none."""
    p = str(text or "").lower()
    for name in ("nvfp4", "mxfp8", "fp8"):
        if name in p:
            return name
    if "fp16" in p and "bf16" not in p:
        return "fp16"
    if "bf16" in p:
        return "bf16"
    return "fp32" if "fp32" in p or "tf32" in p else None


def precision(text: Any) -> Optional[str]:
    """The training precision a published row states, bf16 where it names none (a table's "mixed (not
    stated)"); None for adapter fine-tuning (not a pretraining layout). A row that names fp32 (or
    TF32 matmuls) trained in fp32: validate-published scored one as bf16 (none of the published
    rows does)."""
    if "lora" in str(text or "").lower():
        return None
    named = named_precision(text)
    return named if named in ("nvfp4", "mxfp8", "fp8", "fp16", "fp32") else "bf16"


def fp8_recipe(text: Any) -> Optional[str]:
    """The fp8 scaling a row states (torchao's recipe names, Transformer Engine's FP8_RECIPE, the
    DeepSeek-V3 tiles); None where it states none (the engine's default)."""
    p = str(text or "").lower()
    for names, recipe in ((("rowwise_with_gw_hp",), "rowwise_with_gw_hp"), (("rowwise",), "rowwise"),
                          (("tensorwise", "per-tensor current", "fp8_cs"), "tensorwise"),
                          (("blockwise", "1x128"), "blockwise"), (("delayed",), "delayed")):
        if any(name in p for name in names):
            return recipe
    return None


def quantized_weight_gather(text: Any) -> bool:
    """Whether a row's weights were gathered in fp8: torchao's "float8 all-gather", MLPerf's
    FP8_PARAM_GATHER ("fp8 param all-gather")."""
    p = str(text or "").lower()
    return "float8 all-gather" in p or "f8 all-gather" in p or "param all-gather" in p


def bridge_param_gather(row: dict, prec: str) -> Optional[bool]:
    """Whether a Megatron-Bridge performance run kept its weights quantized: the perf scripts take
    their precision from ``scripts/performance/utils/precision.py`` (``get_precision_config``),
    whose ``bf16_with_mxfp8_mixed`` and ``bf16_with_fp8_current_scaling_mixed`` set
    ``fp8_param_gather = True`` in every release the rows cite (v0.2.0 to v0.6.0); the
    sub-channel (blockwise) and NVFP4 configs leave it off (``fp4_param_gather`` came in v0.5.0,
    and which rows ran it is not said), as do the 25.09 rows, whose fp8 recipe is unstated.
    None for other sources: the engine's default."""
    if not row["source"].startswith("Megatron-Bridge"):
        return None
    return prec == "mxfp8" or (prec == "fp8" and fp8_recipe(row["precision"]) == "tensorwise")


def recipe_settings(row: dict) -> dict:
    """The settings of the recipe a row ran, as its source's recipe files give them
    (Megatron-Bridge's ``*workload_base_configs.py`` fields, or a perf recipe's explicit
    assignments, keyed without their ``model.``/``comm_overlap.`` prefix); for its 25.09 rows, which
    name no recipe, its perf script's (``BRIDGE_2509_SETTINGS``); for its 25.11 rows without one, the
    base config their layout matches in all but the global batch (``BRIDGE_2511_SETTINGS``)."""
    recipe = row.get("recipe") or {}
    if not recipe and row["source"].startswith(BRIDGE_2509_SOURCE):
        return dict(BRIDGE_2509_SETTINGS.get((row["model"].get("name"), gpu_preset(row["gpu"])), {}))
    if not recipe.get("layout_match") and row["source"].startswith(BRIDGE_2511_SOURCE):
        par = row["parallel"]
        layout = (par.get("tp"), par.get("pp"), par.get("vpp") or 1, par.get("ep") or 1,
                  row["batch"].get("micro_batch_size"))
        return dict(BRIDGE_2511_SETTINGS.get((row["model"].get("name"), gpu_preset(row["gpu"]), layout), {}))
    out = dict(recipe.get("base_config_fields") or {})
    for key, value in (recipe.get("explicit_settings") or {}).items():
        out[key.split(".")[-1]] = value
    return out


def recompute(row: dict) -> str:
    """The row's recomputation, else its recipe's: Megatron's recompute modules (MLA's
    up-projections, the experts' activation, the MLP) are selective recomputation; NeMo
    AutoModel's activation checkpointing (``AUTOMODEL_CHECKPOINTED``) wraps whole blocks
    (``moe/parallelizer.py``: ``apply_ac``, ``checkpoint_wrapper`` per block)."""
    v = str(row.get("recompute") or "none").lower()
    if v.startswith("full") or (row["source"].startswith(AUTOMODEL_SOURCE) and not row.get("recompute")
                                and row["model"].get("name") in AUTOMODEL_CHECKPOINTED):
        return "full"
    if v.startswith("selective"):
        return "selective"
    settings = recipe_settings(row)
    if str(settings.get("recompute_granularity") or "").lower() == "full":
        return "full"
    return "selective" if settings.get("recompute_modules") else "none"


def recompute_modules(row: dict) -> Optional[list[str]]:
    """The modules a Megatron row's selective recomputation names: its recipe's
    ``recompute_modules``, else the row's "selective: a, b" text; None where it names none (or
    one the planner does not price)."""
    if recompute(row) != "selective":
        return None
    names = recipe_settings(row).get("recompute_modules")
    if names is None:
        text = str(row.get("recompute") or "")
        names = [n.strip() for n in text.partition(":")[2].split(",")] if text.startswith("selective:") else []
    names = [str(n) for n in names if str(n)]
    return names if names and all(n in RECOMPUTE_MODULES for n in names) else None


def zero_stage(row: dict) -> int:
    """FSDP's sharding strategy, an explicit stage, or the distributed optimizer (ZeRO-1);
    Megatron-Core's performance recipes run the distributed optimizer unless they say. A row
    that gives FSDP as the number of ranks it shards over (NeMo AutoModel's FSDP column) runs
    FSDP2's ``fully_shard``: ZeRO-3."""
    par = row["parallel"]
    if isinstance(par.get("fsdp"), int) and not isinstance(par.get("fsdp"), bool) and par["fsdp"] > 1:
        return 3
    fsdp = str(par.get("fsdp") or "").upper()
    if "FULL_SHARD" in fsdp or "HYBRID" in fsdp:
        return 3
    if "SHARD_GRAD_OP" in fsdp:
        return 2
    if par.get("zero_stage") is not None:
        return int(par["zero_stage"])
    if par.get("distributed_optimizer") or (par.get("distributed_optimizer") is None
                                            and "Megatron-Core" in row["framework"]):
        return 1
    return 0


def engine(row: dict) -> str:
    """The engine a user of the run would name: DeepSpeed where it drives the run, Megatron for
    Megatron-LM, NeMo, Megatron-Bridge and MegaScale, nanotron for its own runs (the Playbook's),
    and no engine in particular for the other PyTorch stacks (FSDP, torchtitan). The names are matched
    whatever their letters' case: a team's ``deepspeed 0.16`` was priced as plain PyTorch."""
    fw = row["framework"].lower()
    if fw.startswith("nanotron"):
        return "nanotron"
    if "deepspeed" in fw or "gpt-neox" in fw:
        return "deepspeed"
    if any(k in fw for k in ("megatron", "nemo", "megascale")) and "fsdp" not in fw:
        return "megatron"
    return "any"


# The counts a row's case is built from: whole numbers from 1, where given (None: not published).
ROW_COUNTS = {"": ("num_gpus",), "model": ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"),
              "parallel": ("dp", "tp", "pp", "vpp", "cp", "ep", "etp"),
              "batch": ("global_batch_size", "micro_batch_size", "grad_accum", "local_batch_size")}
# The most each parallel degree may be, as a case's own keys are bounded (planner/limits.py): a pp of
# 2^70 was "Python int too large to convert to C ssize_t", with no key named. The other counts the case
# built from the row bounds, naming the row's key.
# num_gpus among them before the degrees: 10^30 GPUs beside dp 32 was said as "parallel.dp: 32, but 10^30 GPUs
# ... leave dp 10^30", blaming the degree the run stated for the count it overstated.
ROW_COUNT_BOUNDS = {"num_gpus": MAX_GPUS, "dp": MAX_GPUS, "tp": MAX_GPUS, "pp": MAX_GPUS, "vpp": MAX_LAYERS,
                    "cp": MAX_GPUS, "ep": MAX_GPUS, "etp": MAX_GPUS}
# What a row measured and the planner scores against: finite, at least MIN_FIGURE (1e-300 TFLOP/s
# gave a headline error of 1.5e302) and below what no training run measures (a GPU's 10^5
# TFLOP/s, 10^5 GB, a step of 10^7 s).
ROW_MEASURES = {"iteration_time_s": 1e7, "tokens_per_sec_total": 1e15, "tokens_per_sec_per_gpu": 1e12,
                "tflops_per_gpu": 1e5, "memory_gb_per_gpu": 1e5}


# Where each key of the case :func:`case_of` builds comes from in a run (the published-runs
# schema), so that a refusal of the case names the run's own key.
ROW_KEYS = {
    "cluster.num_gpus": "num_gpus", "cluster.gpu": "gpu", "model.num_layers": "model.layers",
    "model.hidden_size": "model.hidden", "model.num_attention_heads": "model.heads",
    "model.num_kv_heads": "model.kv_heads", "model.ffn_hidden_size": "model.ffn_hidden",
    "model.vocab_size": "model.vocab", "model.num_experts": "model.moe.num_experts",
    "model.moe_top_k": "model.moe.top_k", "model.moe_ffn_hidden_size": "model.moe.expert_ffn_hidden",
    "model.moe_shared_expert_ffn_hidden_size": "model.moe.shared_expert_ffn_hidden",
    "model.moe_first_dense_layers": "model.moe.first_dense_layers",
    "model.q_lora_rank": "model.attention.q_lora_rank", "model.kv_lora_rank": "model.attention.kv_lora_rank",
    "model.qk_head_dim": "model.attention.qk_head_dim", "model.qk_rope_head_dim": "model.attention.qk_rope_head_dim",
    "model.v_head_dim": "model.attention.v_head_dim", "training.global_batch_size": "batch.global_batch_size",
    "training.seq_len": "model.seq_len", "training.precision": "precision",
    "layout.micro_batch_size": "batch.micro_batch_size", "layout.tp": "parallel.tp", "layout.pp": "parallel.pp",
    "layout.cp": "parallel.cp", "layout.dp": "parallel.dp", "layout.vpp": "parallel.vpp", "layout.ep": "parallel.ep",
    "layout.etp": "parallel.etp", "layout.sequence_parallel": "parallel.sp", "layout.zero_stage": "parallel.zero_stage",
    # An uneven split the run's pp makes (more stages than layers leave some empty), and a step the
    # GPU's figures make endless (a global batch of 2^40): the run's keys that gave them.
    "layout.stage_layers": "parallel.pp", "cluster": "batch.global_batch_size",
}


def row_key(case_key: str) -> str:
    """The run's own key (the published-runs schema) for a key of the case made from it, where it has one."""
    return ROW_KEYS.get(case_key, case_key)


def row_problem(row: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) of the first field of a run the planner cannot read as a
    number, else None: a count that is no whole number from 1, a measurement that is no positive
    finite number below its bound (a NaN or a negative TFLOP/s, a `true`), a section that is no mapping."""
    for section in ("model", "parallel", "batch"):
        if section not in row:
            return section, "missing"
        if not isinstance(row[section], dict):
            return section, f"expected a mapping, got {type(row[section]).__name__}"
    for section, keys in ROW_COUNTS.items():
        fields = row[section] if section else row
        for key in keys:
            name = f"{section}.{key}" if section else key
            value = fields.get(key)
            if value is None:  # not published: the row is skipped as such, or the case goes without it
                continue
            most = ROW_COUNT_BOUNDS.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most and value > most):
                return name, f"expected a whole number from 1{f' to {most:,}' if most else ''}, got {_quoted(value)}"
    stage = row["parallel"].get("zero_stage")
    if stage is not None and (isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3):
        return "parallel.zero_stage", f"expected 0, 1, 2 or 3, got {_quoted(stage)}"  # 1.5 and true were 1
    sp = row["parallel"].get("sp")
    if sp is not None and not isinstance(sp, bool):  # "yes please" was read as true
        return "parallel.sp", f"expected true or false, got {_quoted(sp)}"
    for key, expected in TEXT_FIELDS.items():  # a framework of null was "'NoneType' object has no attribute …"
        if not isinstance(row.get(key), str):
            return key, f"expected {expected}, got {_quoted(row.get(key))}"
    measured = row.get("measured")
    if measured is None:
        return None
    if not isinstance(measured, dict):
        return "measured", f"expected a mapping, got {type(measured).__name__}"
    for key in ROW_MEASURES:
        value = measured.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not measure_in_bounds(key, value)):
            return f"measured.{key}", f"expected a number from {MIN_FIGURE:g} to {ROW_MEASURES[key]:g}, got " \
                                      f"{_quoted(value)}"
    return None


# The fields of a run read as text, which every published row states.
TEXT_FIELDS = {"framework": "the framework that ran it (Megatron-Core, DeepSpeed, torchtitan, nanotron …)",
               "gpu": "the GPU it ran on (H100-SXM5-80GB, B200 …)", "source": "the source's name",
               "record_type": "measured_throughput, or another record type of the schema"}


def stated_problem(row: dict, case: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) of the first statement of a run that its case would take
    for something else, else None: a precision that names none (read as bf16, which only a table's
    "mixed (not stated)" means), a recomputation in words that say neither none, selective, full nor
    what it recomputes (read as none), degrees that do not hold its GPUs (its stated dp unread), a step
    time and tokens/s that say two speeds (the tokens/s unread), tokens/s in all and per GPU that say two
    speeds, or a gradient accumulation its batch does not make (each unread)."""
    text = row.get("precision")
    lowered = str(text).lower()
    if text is not None and named_precision(text) is None and not lowered.startswith("mixed") and "lora" not in lowered:
        return "precision", (f"expected the run's training precision (bf16, fp16, fp8, mxfp8, nvfp4 or fp32; "
                             f"\"mixed\" where the source does not say which), got {_quoted(text)}")
    stated = row.get("recompute")
    lowered = str(stated).lower()
    if stated is not None and not lowered.startswith(RECOMPUTE_WORDS) and "recomput" not in lowered:
        return "recompute", (f"expected none, selective or full (a description may follow), or what it "
                             f"recomputes, got {_quoted(stated)}")
    return grid_problem(row, case) or measures_problem(row, measured_tokens_per_s(row)) or tokens_problem(row) \
        or batch_problem(row, case)


# A table prints tokens/s per GPU to its last digit (whole tokens, a 7 of 512 GPUs as much as 7 % off the
# total) and tokens/s in all to three or four figures (at most 0.5 % off each): the two statements of one
# run agree within half a token per GPU and 1 % of the total. The published rows that state both (1,366)
# are at most 0.72 of that apart; a total 32x the per-GPU figure's (100,000 beside 99,999 on 32 GPUs) was
# scored on the total without a word.
TOKENS_ROUNDING = 0.01


def tokens_problem(row: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where a run states tokens/s in all and per GPU and the two
    (the per-GPU figure times the GPUs) say different speeds beyond rounding (TOKENS_ROUNDING); else None.
    The total was scored, the per-GPU figure unread."""
    measured = row.get("measured") or {}
    total, per_gpu, gpus = measured.get("tokens_per_sec_total"), measured.get("tokens_per_sec_per_gpu"), row["num_gpus"]
    if not (total and per_gpu):
        return None
    if abs(total - per_gpu * gpus) > TOKENS_ROUNDING * total + 0.5 * gpus:
        return "measured.tokens_per_sec_per_gpu", (f"{per_gpu:,g} on {gpus:,} GPUs gives {per_gpu * gpus:,.0f} tokens/s, "
                                                   f"but tokens_per_sec_total says {total:,g} "
                                                   f"({total / (per_gpu * gpus) - 1:+.0%}; rounding allows half a token "
                                                   "per GPU and 1 %): give the two of one run, or one of them")
    return None


def tokens_per_batch_problem(row: dict, case: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where a run's ``batch.tokens_per_batch`` is not its global
    batch times its sequence (counts, printed whole); else None. A team's runs are held to it too
    (``team_runs``)."""
    tokens, training = row["batch"].get("tokens_per_batch"), case["training"]
    if tokens is None or tokens == training["global_batch_size"] * training["seq_len"]:
        return None
    return "batch.tokens_per_batch", (f"{_quoted(tokens)}, but global batch {training['global_batch_size']} × "
                                      f"sequence {training['seq_len']} is "
                                      f"{training['global_batch_size'] * training['seq_len']}")


def batch_problem(row: dict, case: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where a run's tokens a batch are not the batch times the
    sequence, or its gradient accumulation does not make its global batch (``accumulation_problem``:
    NeMo AutoModel's tables state the batch per rank as ``batch.local_batch_size``); else None. Counts are
    printed whole, so no rounding is allowed. A row the source marks ``trust: low`` is left as it is: the
    Ultra-Scale Playbook's sweep marks so its rows whose dp · mbs · accumulation is not the batch
    (validation README), real measurements the scores keep."""
    problem = tokens_per_batch_problem(row, case)
    if problem is not None:
        return problem
    return None if row.get("trust") == "low" else accumulation_problem(row, case)


def accumulation_problem(row: dict, case: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where a run states its gradient accumulation and its global
    batch is not its batch per rank (``batch.local_batch_size`` where given, else the micro-batch) times
    the accumulation times the data-parallel degree its GPUs leave; else None. The message names the
    field the run gave. A team's run is held to it whatever its ``trust`` (``team_runs``)."""
    batch = row["batch"]
    gbs, accum = batch.get("global_batch_size"), batch.get("grad_accum")
    local = batch.get("local_batch_size")
    per_rank = local if isinstance(local, int) and not isinstance(local, bool) and local >= 1 \
        else batch.get("micro_batch_size")
    if not (gbs and accum and per_rank):
        return None
    dp = case["layout"]["dp"]
    if per_rank * accum * dp != gbs:
        what = "local_batch_size" if per_rank is local else "micro_batch_size"
        return "batch.grad_accum", (f"{accum}, but global_batch_size {gbs} over {what} {per_rank} · dp {dp} "
                                    + (f"leaves {gbs // (per_rank * dp)}" if gbs % (per_rank * dp) == 0 else
                                       f"leaves no whole accumulation ({gbs / (per_rank * dp):g})")
                                    + ": give the counts of one run")
    return None


# Published tables round a step time to three figures and tokens/s to whole tokens: two statements
# of one run's speed further apart than this are two runs, or a typo.
MEASURES_AGREE = 0.05


def measures_problem(row: dict, tokens: Optional[float]) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where a run states its step time and its tokens/s and the two
    say different speeds (``tokens``: what the step time gives, as measured_tokens_per_s reads it, which
    takes the step time and leaves the tokens/s unread); else None."""
    measured = row.get("measured") or {}
    if not (tokens and measured.get("iteration_time_s")):
        return None
    stated = measured.get("tokens_per_sec_total") or (measured.get("tokens_per_sec_per_gpu") or 0) * row["num_gpus"]
    if stated and abs(stated / tokens - 1) > MEASURES_AGREE:
        return "measured.iteration_time_s", (f"{measured['iteration_time_s']:g} s gives {tokens:,.0f} tokens/s, but the "
                                             f"run's tokens/s says {stated:,.0f} ({stated / tokens - 1:+.0%}): give the "
                                             "two of one run, or one of them")
    return None


# How a run's recomputation begins (a description may follow).
RECOMPUTE_WORDS = ("none", "selective", "full")


def grid_problem(row: dict, case: dict) -> Optional[tuple[str, str]]:
    """(the dotted key, what was expected) where the run's degrees do not hold its GPUs: tp·pp·cp
    divides them, and a stated dp is what they leave; else None."""
    lay, gpus, parallel = case["layout"], row["num_gpus"], row["parallel"]
    grid = lay["tp"] * lay["pp"] * lay["cp"]
    if gpus % grid:
        return "num_gpus", f"{gpus} GPUs, which tp {lay['tp']} · pp {lay['pp']} · cp {lay['cp']} = {grid} does not divide"
    if parallel.get("dp") is not None and parallel["dp"] != gpus // grid:
        return "parallel.dp", (f"{parallel['dp']}, but {gpus} GPUs over tp {lay['tp']} · pp {lay['pp']} · cp "
                               f"{lay['cp']} leave dp {gpus // grid}")
    return None


def measure_in_bounds(key: str, value: float) -> bool:
    """Whether a run's measurement ``key`` (ROW_MEASURES) is one a training run could have measured."""
    return MIN_FIGURE <= value <= ROW_MEASURES[key]


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def measured_tokens_per_s(row: dict) -> Optional[float]:
    """Measured tokens/s over all GPUs: from the iteration time, or tokens/s as printed; for
    the rows that give only hardware TFLOP/s per GPU (Narayanan, BLOOM, MT-NLG), through
    Narayanan et al. 2021 eq. (3): F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration."""
    m, b = row.get("measured") or {}, row["batch"]
    tokens = b["global_batch_size"] * row["model"]["seq_len"]
    if m.get("iteration_time_s"):
        return tokens / m["iteration_time_s"]
    if m.get("tokens_per_sec_total"):
        return m["tokens_per_sec_total"]
    if m.get("tokens_per_sec_per_gpu"):
        return m["tokens_per_sec_per_gpu"] * row["num_gpus"]
    if m.get("tflops_per_gpu") and row["source"].startswith(("Narayanan", "bigscience", "Smith")):
        md = row["model"]
        B, s, l, h, V = b["global_batch_size"], md["seq_len"], md["layers"], md["hidden"], md["vocab"]
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return tokens / (flops / (m["tflops_per_gpu"] * 1e12 * row["num_gpus"]))
    return None


def published_memory_stage(row: dict) -> Optional[int]:
    """The pipeline stage whose memory a row publishes, where it is not the heaviest (None).
    nanotron's benchmark mode writes its table from world rank 0 alone (``helpers.py``,
    ``log_throughput``: ``write_to_csv`` where ``dist.get_rank(world_pg) == 0``), and rank 0 is
    the first pipeline stage: the Playbook's memory is that stage's. Its 1B at pp 2 with one
    micro-batch of 8 a step shows it: 44.9 GiB published, 41.8 predicted for the first stage and
    70.8 for the last, which holds the LM head's logits."""
    return 0 if row["framework"].startswith("nanotron") else None


def pipeline_split(layers: int, stages: int) -> Optional[dict]:
    """Megatron's --account-for-embedding/loss-in-pipeline-split (BLOOM's
    'type:transformer|embedding' likewise): recipes whose layer count pp·vpp does not divide
    count the embedding and the loss as a layer each. {} where the layers divide."""
    if layers % stages == 0:
        return {}
    if (layers + 2) % stages == 0:
        return {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    return None


def tied_embeddings(row: dict) -> bool:
    """Whether the run shares its input embedding and LM head: the GPT-style models of the
    sources in ``TIED`` (not their Llamas), and nanotron's scaling-benchmark models narrower
    than ``NANOTRON_TIED_BELOW_FFN`` (``scripts/scaling_benchmarks.py``: ``tie_word_embeddings``)."""
    md, source = row["model"], row["source"]
    stated = (md.get("extra") or {}).get("tied_embeddings")
    if isinstance(stated, bool):  # a team's run says so (model.extra.tied_embeddings)
        return stated
    if row["framework"].startswith("nanotron") and "Playbook" in source:
        return (md.get("ffn_hidden") or 4 * md["hidden"]) < NANOTRON_TIED_BELOW_FFN
    return source.startswith(TIED) and "Llama" not in str(md.get("name"))


def cluster_fabric(row: dict, gpu: str) -> Optional[str]:
    """The scale-out fabric a row or its source names where it is not the GPU preset's own."""
    return efa_fabric(row, gpu) or next((fabric for source, fabric in SOURCE_FABRICS.items()
                                         if row["source"].startswith(source)), None)


def cluster_performance(row: dict) -> Optional[dict]:
    """``cluster.performance`` settings of a machine whose row says it ran power-limited
    (``POWER_LIMITED_CLOCK``): its sustained clock; None for a GPU at its full power."""
    name = row["gpu"].upper()
    clock = next((value for prefix, value in POWER_LIMITED_CLOCK.items() if name.startswith(prefix)), None)
    return {"sustained_clock": clock} if clock is not None else None


def efa_fabric(row: dict, gpu: str) -> Optional[str]:
    """AWS EFA where the row's GPU names it (the Playbook's p5 nodes: "EFA inter-node")."""
    return EFA_FABRICS.get(gpu) if "EFA" in row["gpu"] else None


def fp32_gradients(row: dict) -> Optional[bool]:
    """Gradients accumulated and reduced in fp32 where the run's own config says so, else None
    (the engine's default):
    - nanotron's sweep config (``examples/config_tiny_llama_bench.yaml``:
      ``accumulate_grad_in_fp32: true``) reduces its fp32 accumulation buffers;
    - BLOOM's script runs DeepSpeed at stage 0 with bf16 (tr11-176B-ml.slurm: "bf16 must use z0! it
      implements its own zero stage 1 equivalent"), that is DeepSpeed's BF16_Optimizer, whose pipeline
      all-reduces its fp32 gradient buffers (``runtime/pipe/engine.py`` ``_bf16_reduce_grads`` →
      ``BF16_Optimizer.get_grads_for_reduction``: ``fp32_groups_gradients_flat``, from the first
      bf16 + pipeline release, 2022-04)."""
    if row["framework"].startswith(FP32_GRADIENT_FRAMEWORKS) or row["source"].startswith(BF16_OPTIMIZER_SOURCES):
        return True
    return None


def master_weights(row: dict) -> Optional[bool]:
    """False where the run keeps no master copy: NeMo AutoModel builds its models in the HF
    config's torch_dtype, bf16 (``components/models/*/model.py``), and steps them with
    ``torch.optim.Adam`` (its benchmark configs), whose moments take the weights' dtype."""
    return False if row["source"].startswith(AUTOMODEL_SOURCE) else None


def compiled_loss(row: dict) -> Optional[bool]:
    """Whether a torchtitan run with torch.compile compiled its loss, by the torchtitan version its
    framework names (``TORCHTITAN_COMPILES_LOSS``); None where the row does not say."""
    words = row["framework"].split()
    if len(words) < 2 or words[0] != "torchtitan" or "torch.compile" not in row["framework"]:
        return None
    return TORCHTITAN_COMPILES_LOSS.get(words[1])


def fused_attention(row: dict) -> Optional[bool]:
    """True where the run's attention is Transformer Engine's fused kernel: NeMo AutoModel's rows
    whose kernels name TE and no other attention kernel (its benchmark configs' ``backend.attn:
    te``; the Nemotron 3 rows name TorchSDPA, GPT-OSS FlexAttn); None (the engine's own) elsewhere."""
    kernels = str((row.get("moe_runtime") or {}).get("kernels") or "")
    named = [k.strip() for k in kernels.split("+")]
    return True if "TE" in named and not any("SDPA" in k or "Flex" in k for k in named) else None


def runs_deepep(row: dict) -> bool:
    """Whether the run dispatches its experts with DeepEP or HybridEP (``moe_runtime.token_dispatcher``)."""
    dispatcher = str((row.get("moe_runtime") or {}).get("token_dispatcher") or "").lower()
    return "deepep" in dispatcher or "hybridep" in dispatcher


def fake_gate_routing(row: dict, moe: dict) -> dict:
    """The routing of a run whose benchmark replaces the router by NeMo AutoModel's
    ``FakeBalancedGate`` (the rows' ``moe_runtime.load_balancing``; the benchmark configs'
    ``backend.fake_balanced_gate: true``), as the model fields that carry it; {} for another router.

    The gate gives token t the k contiguous experts from t·k mod E (``nemo_automodel/components/
    moe/layers.py``, ``FakeBalancedGate.forward``: ``indices = torch.arange(T * k).view(-1, k) %
    n_routed_experts``, at the config's commit 89e3a9fd as today), whatever the model's own router
    (DeepSeek-V3's node-limited groups included): E/k groups of k contiguous experts, one picked a
    token, round-robin, so every group alike. A DeepEP dispatch then sends each token to the one
    domain that holds its group (``cost_models.experts.remote_domains_per_token``: (D − 1)/D remote
    domains a token), not to the 4.59 of the other 7 nodes a random top-8 of 256 reaches (of 8 nodes, 8 experts a
    token drawn as with replacement: 7·(1 − (7/8)^8), ``remote_domains_per_token``'s ungrouped count). Megatron's forced
    balancing (``moe_router_force_load_balancing``: random logits, ``moe_utils.apply_random_logits``)
    keeps the router's groups and is not this. Where k does not divide E a token's window wraps
    around the experts' ends: not groups, left to the router's own fields."""
    if "fake balanced gate" not in str((row.get("moe_runtime") or {}).get("load_balancing") or "").lower():
        return {}
    experts, top_k = moe.get("num_experts"), moe.get("moe_top_k")
    if not experts or not top_k or experts % top_k:
        return {}
    return {"moe_router_num_groups": experts // top_k, "moe_router_group_topk": 1}


def head_dim(md: dict) -> Optional[int]:
    """The attention head width where the row publishes one other than hidden/heads (Qwen3:
    32 heads of 128 over a hidden size of 2,048)."""
    width = (md.get("extra") or {}).get("head_dim")
    return width if width and width * md["heads"] != md["hidden"] else None


def stage_split(row: dict, layers: int, pp: int, vpp: int) -> dict:
    """The layout's split of the layers over pipeline stages, as the run's engine makes it: none for
    nanotron, which cuts its own (``cost_models.partition.block_cost_partition``), Megatron's
    (:func:`pipeline_split`), and other engines' as even as they can (:func:`balanced_stages`)."""
    if row["framework"].startswith("nanotron"):
        return {}
    return engine_split(layers, pp, vpp)


def engine_split(layers: int, pp: int, vpp: int) -> dict:
    """Megatron's split where it has one (:func:`pipeline_split`), else, without interleaving,
    as even as an engine makes it (:func:`balanced_stages`)."""
    split = pipeline_split(layers, pp * vpp)
    if split is None and vpp == 1:
        return {"stage_layers": balanced_stages(layers, pp)}
    return split or {}


def balanced_stages(layers: int, pp: int) -> list[int]:
    """What an engine that splits unevenly by itself does (nanotron, torchtitan): as even as
    possible, spare layers on the middle stages first (the edges also hold embedding and head)."""
    base, spare = divmod(layers, pp)
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    extra = set(order[:spare])
    return [base + (i in extra) for i in range(pp)]


def mtp_layers(row: dict, model: dict) -> int:
    """The multi-token prediction modules the run trained: the row's ``model.extra.mtp_layers``,
    where its published model FLOPs count them. Megatron-Bridge counts the module
    (``num_floating_point_operations``): DeepSeek-V3's rows with it imply 260 GFLOP a token,
    those labelled "w/o MTP" 249.6, as NeMo AutoModel's do; so the count the published TFLOP/s
    and tokens/s imply decides, the closer of the model with and without the modules. Rows that
    publish no FLOPs keep the field."""
    count = (row["model"].get("extra") or {}).get("mtp_layers") or 0
    measured = row.get("measured") or {}
    tflops, tokens = measured.get("tflops_per_gpu"), measured.get("tokens_per_sec_per_gpu")
    if not count or not (tflops and tokens):
        return count
    implied = tflops * 1e12 / tokens
    seq = row["model"]["seq_len"]
    with_mtp, without = (model_flops_per_token(ModelSpec(**model, mtp_layers=n), seq) for n in (count, 0))
    return count if abs(implied - with_mtp) < abs(implied - without) else 0


def bridge_mtp_split(layers: int, pp: int, vpp: int) -> Optional[list[int]]:
    """Layers of each model chunk (``layout.chunk_layers``, model order) as Megatron-Bridge lays
    out a model with MTP: each of the pp·vpp virtual stages ⌈L/(pp·vpp)⌉ layers, the last the rest
    beside the MTP layers and the loss (``recipes/deepseek/h100/deepseek_v3.py``
    ``_get_deepseek_v3_pipeline_layout``; its performance recipes' ``"Et*4|(t*4|)*14tmL"``); None
    where the rest would be empty."""
    stages = pp * vpp
    each = -(-layers // stages)
    last = layers - each * (stages - 1)
    if stages == 1 or last < 1:
        return None
    return [each] * (stages - 1) + [last]


def _moe_fields(md: dict) -> Optional[dict]:
    moe = md.get("moe") or {}
    if not moe.get("num_experts"):
        return {}
    if not (moe.get("top_k") and moe.get("expert_ffn_hidden")):
        return None
    return {"num_experts": moe["num_experts"], "moe_top_k": moe["top_k"],
            "moe_ffn_hidden_size": moe["expert_ffn_hidden"],
            "moe_shared_expert_ffn_hidden_size": (moe.get("shared_experts") or 0)
            * (moe.get("shared_expert_ffn_hidden") or moe["expert_ffn_hidden"]),
            "moe_first_dense_layers": moe.get("first_dense_layers") or 0, **router_groups(md)}


def router_groups(md: dict) -> dict:
    """Group-limited routing as a row's model states it ("group-limited (8 groups, top-4
    groups)": DeepSeek-V3's node-limited routing), as the model fields that carry it."""
    found = re.search(r"group-limited \((\d+) groups, top-(\d+) groups\)", str((md.get("extra") or {}).get("router")))
    if not found:
        return {}
    return {"moe_router_num_groups": int(found[1]), "moe_router_group_topk": int(found[2])}


def token_drop_capacity(row: dict) -> Optional[float]:
    """The capacity factor of a Megatron-Bridge run its table labels "(tokendrop)" (apply_moe_token_drop's
    1.0, padded); None for a dropless run or another source."""
    if not row["source"].startswith("Megatron-Bridge") or "(tokendrop)" not in str(row.get("notes")):
        return None
    return BRIDGE_TOKEN_DROP_CAPACITY


def _mla_fields(md: dict) -> Optional[dict]:
    attn = md.get("attention") or {}
    if str(attn.get("type")).lower() != "mla":
        return {}
    keys = ("kv_lora_rank", "qk_head_dim", "qk_rope_head_dim", "v_head_dim")
    if not all(attn.get(k) for k in keys):
        return None
    return {"attention_type": "mla", "q_lora_rank": attn.get("q_lora_rank"), **{k: attn[k] for k in keys}}


def case_of(row: dict) -> tuple[Optional[dict], str]:
    """(the case a user of the run would write, "") or (None, why the row cannot be one)."""
    md, par, b = row["model"], row["parallel"], row["batch"]
    if not md.get("vocab"):
        if "NeMo" in row["source"] and "GPT" in str(md.get("name")):
            md = {**md, "vocab": NEMO_GPT3_VOCAB}
        else:
            return None, "model not fully published"
    prec, gpu = precision(row["precision"]), gpu_preset(row["gpu"])
    if row["record_type"] != "measured_throughput" or not prec or not gpu:
        return None, "not a supported row"
    if b.get("micro_batch_size") is None or par.get("tp") is None or par.get("pp") is None:
        return None, "layout not published"
    if row.get("num_gpus") is None:  # divided by the degrees: "unsupported operand type(s) for //", no key named
        return None, "GPU count not published (num_gpus)"
    if b.get("global_batch_size") is None:  # multiplied by the sequence: "unsupported operand type(s)"
        return None, "global batch not published (batch.global_batch_size)"
    if ((par.get("ep") or 1) > 1 or md.get("moe")) and not (md.get("moe") or {}).get("num_experts"):
        return None, "mixture of experts without its expert fields"
    moe, mla = _moe_fields(md), _mla_fields(md)
    if moe is None or mla is None:
        return None, "model not fully published"
    tp, pp, cp, vpp = par["tp"], par["pp"], par.get("cp") or 1, par.get("vpp") or 1
    sp = par.get("sp")
    if sp is None:
        sp = tp > 1 and "Megatron-Core" in row["framework"]
    source = row["source"]
    model = {"name": md.get("name") or row["id"], "num_layers": md["layers"], "hidden_size": md["hidden"],
             "num_attention_heads": md["heads"], "num_kv_heads": md.get("kv_heads") or md["heads"],
             "ffn_hidden_size": md.get("ffn_hidden") or 4 * md["hidden"],
             # A gated MLP (SwiGLU, GeGLU: three matrices) is priced as the cost model's swiglu; the
             # gate's function changes an element-wise kernel, not the GEMMs.
             "activation": "swiglu" if any(g in str(md.get("ffn_act")).lower() for g in ("swiglu", "geglu"))
             else "gelu",
             "vocab_size": md["vocab"],
             "tied_embeddings": tied_embeddings(row),
             "dropout": 0.1 if source.startswith(DROPOUT) else 0.0, **moe, **mla}
    if moe and (routing := fake_gate_routing(row, moe)):
        model.update(routing)
    if moe and (capacity := token_drop_capacity(row)) is not None:
        model["moe_capacity_factor"] = capacity
    if mla:
        model.pop("num_kv_heads")
    elif width := head_dim(md):
        model["head_dim"] = width
    cluster: dict[str, Any] = {"gpu": gpu, "num_gpus": row["num_gpus"]}
    if fabric := cluster_fabric(row, gpu):
        cluster["fabric"] = fabric
    if performance := cluster_performance(row):
        cluster["performance"] = performance
    if memory := memory_variant(row["gpu"]):  # the V100 with 16 GB, Meta's Grand Teton H100 with 96 GB
        cluster["memory"] = memory
    training = {"global_batch_size": b["global_batch_size"], "seq_len": md["seq_len"], "precision": prec,
                "optimizer": "adam", "engine": engine(row), "flash_attention": not source.startswith(PRE_FLASH),
                # NeMo and Megatron-Bridge performance recipes overlap TP communication with TP.
                "tp_comm_overlap": tp > 1 and ("NeMo" in row["framework"] or "Bridge" in row["framework"])}
    if (fp32 := fp32_gradients(row)) is not None and prec in ("bf16", "fp16"):
        training["fp32_grads"] = fp32
    if (master := master_weights(row)) is not None and prec == "bf16":
        training["master_weights"] = master
    if (compiled := compiled_loss(row)) is not None:
        training["compiled_loss"] = compiled
    if (fused := fused_attention(row)) is not None:
        training["fused_attention"] = fused
    # The experts' dispatch overlapped with another micro-batch's compute where the recipe says so, or
    # where the row's runtime does: the 26.08 DeepSeek-V3 recipes set it in a helper the recipe calls
    # (Megatron-Bridge perf_recipes/deepseek/common.py, _enable_deepseek_full_iteration_mxfp8:
    # comm_overlap.overlap_moe_expert_parallel_comm = True), not in their explicit settings.
    settings = recipe_settings(row)
    if moe and (settings.get("moe_a2a_overlap") or settings.get("overlap_moe_expert_parallel_comm")
                or (row.get("moe_runtime") or {}).get("a2a_overlap") is True):
        training["moe_comm_overlap"] = True
    # DeepEP or HybridEP where the row names it and the engine would not run it by itself.
    if moe and training["engine"] == "any" and runs_deepep(row):
        training["expert_dispatch"] = "deepep"
    # The fp8 scaling and the fp8 weight gather the row states (else the engine's defaults).
    if prec == "fp8" and fp8_recipe(row["precision"]):
        training["fp8_recipe"] = fp8_recipe(row["precision"])
    gather = True if quantized_weight_gather(row["precision"]) else bridge_param_gather(row, prec)
    if prec in ("fp8", "mxfp8", "nvfp4") and gather is not None:
        training["fp8_param_gather"] = gather
    layout: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": row["num_gpus"] // (tp * pp * cp), "vpp": vpp,
                              "micro_batch_size": b["micro_batch_size"], "zero_stage": zero_stage(row),
                              "sequence_parallel": bool(sp), "recompute": recompute(row)}
    if training["engine"] == "megatron" and (modules := recompute_modules(row)):
        layout["recompute_modules"] = modules
    for key in ("ep", "etp"):
        if (par.get(key) or 1) > 1:
            layout[key] = par[key]
    layout.update(stage_split(row, md["layers"], pp, vpp))
    if mtp := mtp_layers(row, model):
        model["mtp_layers"] = mtp
        split = bridge_mtp_split(md["layers"], pp, vpp) if training["engine"] == "megatron" else None
        if (text := recipe_settings(row).get("pipeline_model_parallel_layout")) and training["engine"] == "megatron":
            from .engines.megatron.read import parse_layout_string

            split = parse_layout_string(text, pp, mtp)
        if split is not None:
            layout = {k: v for k, v in layout.items() if not k.startswith("account_for") and k != "stage_layers"}
            layout["chunk_layers"] = split
    return {"model": model, "cluster": cluster, "training": training, "layout": layout}, ""


def source_of(row: dict) -> str:
    """The short name a row's source is reported under."""
    return row["source"].split(",")[0].split("'")[0].split("(")[0].strip()[:38]
