"""What the Megatron-LM files tell a user to add before a launch."""
from __future__ import annotations

import planner

CASE = {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "megatron"},
        "layout": {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective",
                   "sequence_parallel": True}}


def test_the_files_say_that_without_save_no_checkpoint_is_written(tmp_path):
    """The headers listed data, tokenizer, learning-rate and run-length arguments as what to add: a user
    who added exactly those launched a run of weeks that saved nothing, since pretrain_gpt.py writes a
    checkpoint only with --save (and --save-interval). Each file names the checkpoint flags too."""
    emitted = planner.emit(planner.estimate(CASE), "megatron", tmp_path / "run")
    texts = {path.name: path.read_text() for path in map(type(tmp_path), emitted.paths)}
    for name in ("megatron_args.txt", "launch.sh", "sbatch.sh"):
        head = "".join(line for line in texts[name].splitlines(keepends=True) if line.startswith("#"))
        assert "--save" in head and "--load" in head, (name, head)
    assert "--data-path" in texts["megatron_args.txt"] and "--tokenizer-type" in texts["megatron_args.txt"]
