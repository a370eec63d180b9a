"""The smaller answers a user reads (issue 52): `--plot` saying why it wrote nothing."""

from __future__ import annotations

import yaml

from cli_in_process import run_cli



def test_plot_says_why_it_wrote_nothing(tmp_path):
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"model": {"preset": "llama3.1-405b"}, "cluster": {"gpu": "h100-sxm-80gb",
                                                                                       "num_gpus": 8},
                                    "training": {"global_batch_size": 64, "seq_len": 4096}}))
    done = run_cli("plan", str(case), "--engine", "megatron", "--plot", str(tmp_path / "p.png"))
    assert done.returncode == 3 and not (tmp_path / "p.png").exists()
    assert "--plot: nothing fits" in done.stderr
