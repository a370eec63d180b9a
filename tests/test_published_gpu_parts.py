"""A published row's GPU name that is another part than the SXM preset, and a row that gives no GPU count."""

from __future__ import annotations

import pytest

from planner.published_runs import case_of, gpu_preset


@pytest.mark.parametrize("name", ["H100_NVL", "H100NVL", "H100 PCI-E", "H100-PCI-E-80GB", "A1000", "H1000"])
def test_another_part_or_number_of_a_family_is_no_sxm_preset(name):
    # Each was scored as the H100 / A100 SXM module, with no word.
    assert gpu_preset(name) is None


@pytest.mark.parametrize("name, preset", [("GB200 NVL72", "gb200"), ("H100 SXM5 NVLink", "h100-sxm-80gb"),
                                          ("A100-SXM4-80GB", "a100-sxm-80gb"), ("NVIDIA H200-SXM5-141GB", "h200-sxm-141gb"),
                                          ("NVIDIA Blackwell GPU (GB200) 189471 MiB", "gb200")])
def test_the_sxm_parts_and_racks_keep_their_presets(name, preset):
    assert gpu_preset(name) == preset


def test_a_row_without_num_gpus_is_skipped_naming_the_key():
    # It reached grid_problem and was "a field has the wrong type or is missing (unsupported operand ...)".
    row = {"id": "r", "record_type": "measured_throughput", "framework": "torchtitan", "gpu": "H100", "num_gpus": None,
           "precision": "bf16", "recompute": "none", "source": "s",
           "model": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "ffn_act": "swiglu",
                     "vocab": 128256, "seq_len": 8192},
           "parallel": {"dp": 64, "tp": 1, "pp": 1}, "batch": {"global_batch_size": 64, "micro_batch_size": 1},
           "measured": {"tokens_per_sec_per_gpu": 2904}}
    case, why = case_of(row)
    assert case is None and "num_gpus" in why


@pytest.mark.parametrize("local", ["2", -2, 0, 2.0, True])
def test_a_local_batch_that_is_no_whole_count_is_refused_naming_it(local):
    # It was passed over, and the batch checked against micro_batch_size without a word.
    from planner.published_runs import row_problem

    row = {"id": "r", "record_type": "measured_throughput", "framework": "NeMo AutoModel", "gpu": "H100",
           "num_gpus": 8, "source": "s", "model": {"layers": 2}, "parallel": {"tp": 1},
           "batch": {"global_batch_size": 16, "micro_batch_size": 1, "grad_accum": 1, "local_batch_size": local}}
    assert row_problem(row)[0] == "batch.local_batch_size"


@pytest.mark.parametrize("name", ["NVIDIA  H100", "  H100   SXM  ", "H100\tSXM5 80GB"])
def test_a_gpu_name_with_extra_spaces_reads_as_its_preset(name):
    """"NVIDIA  H100" and "  H100   SXM  " were refused as not supported rows where "nvidia h100" was read
    as the H100 SXM: a name's spaces are single, and its ends bare, before the presets are looked up."""
    assert gpu_preset(name) == gpu_preset("nvidia h100") == "h100-sxm-80gb"


@pytest.mark.parametrize("name", [
    # NVIDIA's A100X converged accelerator (its datasheet: an A100 80GB PCIe card with an on-board ConnectX-6
    # Dx, NVLink bridged to one other card) and H100 CNX (an H100 PCIe with a ConnectX-7): PCIe cards
    "A100X", "NVIDIA A100X 80GB", "H100 CNX",
    # no product: the NVL72 racks are GB200's and GB300's (their datasheets); H100's one NVL is a PCIe pair
    "H100 NVL72", "NVIDIA H100 NVL72", "B200 NVL72",
    # another NVLink domain than the preset's 72: GB200 NVL4 and NVL2 join 4 and 2 GPUs
    "GB200 NVL4", "GB200 NVL2",
    # the V100S is a PCIe card only; MI300A is the APU, not the MI300X
    "V100S", "MI300A",
    # PCIe and NVL boards, Grace Hopper and Ada cards, of which the presets hold none
    "H100 PCIe", "H100 NVL", "H200 NVL", "GH200", "A100 PCIe 40GB", "A100 80GB PCIe", "L40S",
])
def test_a_gpu_no_preset_is_is_read_as_none(name):
    # A100X, H100 NVL72 and the rest of the first three lines were scored as the SXM modules, with no word.
    assert gpu_preset(name) is None


@pytest.mark.parametrize("name, preset", [
    ("B200", "b200"), ("GB200", "gb200"), ("GB200 NVL72", "gb200"), ("B300", "b300"),
    ("B300 NVL16", "b300"), ("GB300", "gb300"), ("GB300 NVL72", "gb300"), ("H100SXM5", "h100-sxm-80gb"),
    # AMD's names with or without the vendor: "MI300X" alone was refused where "AMD-MI300X" was read
    ("MI300X", "mi300x"), ("AMD MI300X", "mi300x"), ("AMD Instinct MI325X", "mi325x"), ("MI355X", "mi355x"),
])
def test_the_modules_and_racks_the_presets_hold_read_as_them(name, preset):
    assert gpu_preset(name) == preset


@pytest.mark.parametrize("name, preset", [
    # nvidia-smi's --query-gpu=name on each SXM module, as a user pastes it: the V100's carries NVIDIA's
    # old "Tesla" brand (its datasheet: "NVIDIA Tesla V100"), and was refused as no preset's GPU
    ("Tesla V100-SXM2-32GB", "v100-sxm-32gb"), ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"), ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
    ("H100 80GB HBM3", "h100-sxm-80gb"), ("H100-SXM5-80GB", "h100-sxm-80gb"),
])
def test_nvidia_smi_names_of_the_sxm_modules_read_as_their_presets(name, preset):
    assert gpu_preset(name) == preset


def test_nvidia_smi_names_of_other_v100_parts_stay_refused():
    # the V100 PCIe card, as nvidia-smi names it, with the brand taken off like the SXM module's
    assert gpu_preset("Tesla V100-PCIE-32GB") is None and gpu_preset("Tesla T4") is None


@pytest.mark.parametrize("name, preset", [
    # NVIDIA's DGX and HGX systems hold 8 of the SXM module on one NVSwitch board (DGX H100 and DGX B200
    # datasheets: "8x NVIDIA H100 / B200 Tensor Core GPUs", 4 and 2 NVSwitch chips; HGX B300: 8 Blackwell
    # Ultra SXM GPUs): a run on one ran on the preset's module. Each was refused as no preset's GPU.
    ("DGX B200", "b200"), ("DGX-B200", "b200"), ("HGX B300", "b300"), ("HGX B300 NVL16", "b300"),
    ("HGX H100", "h100-sxm-80gb"), ("DGX H100", "h100-sxm-80gb"), ("DGX-H100", "h100-sxm-80gb"),
    ("NVIDIA DGX H100", "h100-sxm-80gb"), ("HGX H200", "h200-sxm-141gb"), ("DGX A100", "a100-sxm-80gb"),
    ("HGX A100 40GB", "a100-sxm-40gb"), ("DGX GB200 NVL72", "gb200"),
    # the published rows' way, the module with its system beside it, reads as before
    ("B200 (DGX B200)", "b200"), ("H100-SXM-80GB (DGX-H100)", "h100-sxm-80gb"),
])
def test_a_dgx_or_hgx_system_reads_as_the_module_it_holds(name, preset):
    assert gpu_preset(name) == preset


@pytest.mark.parametrize("name", [
    # no model number: DGX-1 held P100s or V100s, DGX-2 16 V100s on 12 NVSwitches (another NVLink domain)
    "DGX-2", "DGX-1", "DGX",
    # 4 GPUs joined to each other without NVSwitch (DGX Station A100; the HGX A100 and H100 4-GPU boards):
    # not the 8-GPU NVSwitch domain the presets hold
    "DGX Station A100", "HGX A100 4-GPU", "HGX H100 4-GPU",
    # Grace Hopper, of which the presets hold none
    "DGX GH200",
])
def test_a_dgx_or_hgx_system_of_no_preset_is_refused(name):
    assert gpu_preset(name) is None
