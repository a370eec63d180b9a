"""`diagnose --config launch.sh`: a DeepSpeed launch script is followed to the ds_config its command
passes, as `diagnose --megatron-args` follows a Megatron-LM launch script to its arguments. Given the
planner's own launch.sh, diagnose answered "expected Hjson, as DeepSpeed reads its config: Extra data at
line 42": true of the file, and no help to the user who gave it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("deepspeed")

import planner  # noqa: E402
from planner.configs import render  # noqa: E402
from planner.diagnose import diagnose  # noqa: E402
from planner.errors import CaseError  # noqa: E402
from planner.files import Output, write_all  # noqa: E402

from cli_in_process import run_cli  # noqa: E402

CASE = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16},
        "training": {"global_batch_size": 128, "seq_len": 4096, "engine": "deepspeed"}}


def _emitted(folder):
    """The files `plan CASE --emit deepspeed --out folder` writes."""
    best = planner.plan(CASE, target="deepspeed", top_k=0).best
    files, _ = render(best, "deepspeed", "<generated>")
    write_all([Output(folder / name, text) for name, text in files.items()], force=False)
    return folder


def _followed(result, script) -> list[str]:
    return [n for n in result.notes if n.startswith(f"{script}: a launch script: read the ds_config")]


def _same_but_the_note(direct, through, script) -> None:
    """What diagnose says of the launch script is what it says of the ds_config, but for the one note
    that says the script was followed."""
    said, followed = direct.to_dict(), through.to_dict()
    assert len(_followed(through, script)) == 1
    followed["notes"] = [n for n in followed["notes"] if n not in _followed(through, script)]
    assert followed == said


@pytest.mark.parametrize("name", ["launch.sh", "sbatch.sh"])
def test_the_planners_own_launch_script_is_read_as_the_ds_config_it_passes(tmp_path, name):
    folder = _emitted(tmp_path / "emitted")
    assert '--deepspeed_config "$HERE/ds_config.json"' in (folder / "launch.sh").read_text()
    direct = diagnose(CASE, config=folder / "ds_config.json")
    through = diagnose(CASE, config=folder / name)
    _same_but_the_note(direct, through, folder / name)
    assert str((folder / "ds_config.json").resolve()) in _followed(through, folder / name)[0]
    # The API's read_config reads it so too.
    assert planner.read_config(CASE, "deepspeed", folder / name) == direct.estimate.job.layout


DEEPSPEED = 'deepspeed --num_gpus "$NGPUS" train.py --model_name_or_path llama \\\n    {} --bf16\n'
# accelerate/commands/launch.py, launch_command_parser: --deepspeed_config_file, handed to DeepSpeed as it is
ACCELERATE = 'accelerate launch --num_processes "$NGPUS" --use_deepspeed {} \\\n    train.py --bf16\n'


@pytest.mark.parametrize("command, passes", [(DEEPSPEED, p) for p in (
    "--deepspeed_config ds.json", "--deepspeed_config=ds.json", "--deepspeed ds.json", "--deepspeed=ds.json",
    "--deepspeed --deepspeed_config ds.json", '--deepspeed_config "$CONFIG"')] + [
    (ACCELERATE, "--deepspeed_config_file ds.json"), (ACCELERATE, "--deepspeed_config_file=ds.json")])
def test_a_hand_written_script_is_followed_to_its_config_beside_it(tmp_path, monkeypatch, command, passes):
    """DeepSpeed's --deepspeed_config (deepspeed/__init__.py, _add_core_arguments; its --deepspeed a switch),
    accelerate launch's --deepspeed_config_file and the Hugging Face Trainer's --deepspeed PATH
    (TrainingArguments.deepspeed): a relative path resolved against the script's directory, not the caller's."""
    config = _emitted(tmp_path / "emitted") / "ds_config.json"
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "ds.json").write_text(config.read_text())
    script = jobs / "train.sh"
    script.write_text('#!/bin/bash\nset -e\nCONFIG=ds.json\nNGPUS=${NGPUS:-8}\n' + command.format(passes))
    monkeypatch.chdir(tmp_path)  # elsewhere than the script
    through = diagnose(CASE, config=script)
    _same_but_the_note(diagnose(CASE, config=config), through, script)
    assert "line 5" in _followed(through, script)[0] and str(jobs / "ds.json") in _followed(through, script)[0]


def test_a_script_that_passes_no_config_is_refused_in_one_line(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 train.py --deepspeed --bf16\n")
    (tmp_path / "case.json").write_text(json.dumps(CASE))
    done = run_cli("diagnose", str(tmp_path / "case.json"), "--config", str(script))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: {script}: ") and "give diagnose --config the ds_config.json" in done.stderr
    # A path that names no file: the flag and the path, resolved where the script lies.
    script.write_text("python train.py --deepspeed_config missing.json\n")
    with pytest.raises(CaseError, match="missing.json: no such file, resolved against the script's directory") as error:
        diagnose(CASE, config=script)
    assert (error.value.source, error.value.key) == (str(script), "--deepspeed_config")
    # An unset variable: said as read empty.
    script.write_text('#!/bin/bash\npython train.py --deepspeed_config "$CFG" --bf16\n')
    with pytest.raises(CaseError, match="leaves CFG unset"):
        diagnose(CASE, config=script)


def test_an_hjson_config_is_not_taken_for_a_script(tmp_path):
    """Hjson without braces, or behind a comment, is DeepSpeed's config all the same (hjson.loads)."""
    import hjson

    text = "# the run's\ntrain_batch_size: 128\ntrain_micro_batch_size_per_gpu: 4\nbf16: {enabled: true}\n" \
           "zero_optimization: {stage: 1}\n"
    assert hjson.loads(text)["train_micro_batch_size_per_gpu"] == 4
    path = tmp_path / "ds_config.hjson"
    path.write_text(text)
    layout = diagnose(CASE, config=path).estimate.job.layout
    assert (layout.micro_batch_size, layout.zero_stage) == (4, 1)
