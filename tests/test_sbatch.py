"""Every engine's files hold ``sbatch.sh`` beside ``launch.sh`` (planner/emit/slurm.py): the #SBATCH
lines and the torchrun each node starts give the plan's world size, the script parses, and a case's
values stay quoted (a model name cannot become a line of shell)."""

from __future__ import annotations

import re
import subprocess

import pytest

import planner

CASES = {
    "megatron": {"model": {"preset": "llama3-70b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
                 "training": {"global_batch_size": 256, "seq_len": 4096, "engine": "megatron"},
                 "layout": {"dp": 4, "tp": 8, "pp": 2, "micro_batch_size": 1, "zero_stage": 1,
                            "sequence_parallel": True, "recompute": "full"}},
    "deepspeed": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                  "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "deepspeed"},
                  "layout": {"dp": 16, "micro_batch_size": 1, "zero_stage": 2}},
    "torchtitan": {"model": {"preset": "llama3-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
                   "training": {"global_batch_size": 64, "seq_len": 4096, "engine": "torchtitan"},
                   "layout": {"dp": 8, "tp": 2, "micro_batch_size": 1, "zero_stage": 3, "sequence_parallel": True}},
}


@pytest.mark.parametrize("engine", sorted(CASES))
def test_sbatch_starts_the_plans_world(engine, tmp_path):
    case = {**CASES[engine], "model": {**CASES[engine]["model"], "name": "x'; rm -rf / #\nnewline"}}
    est = planner.estimate(case)
    planner.emit(est, engine, tmp_path, force_unfit=not est.fits)
    path = tmp_path / "sbatch.sh"
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    sbatch = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?$", text, re.MULTILINE))
    nodes, per_node = int(sbatch["nodes"]), int(sbatch["gpus-per-node"])
    assert nodes * per_node == est.job.cluster.num_gpus
    assert sbatch["ntasks-per-node"] == "1" and "exclusive" in sbatch
    torchrun = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+)", text)
    assert (int(torchrun.group(1)), int(torchrun.group(2))) == (nodes, per_node)
    assert '--rdzv-endpoint "$HEAD_NODE:' in text and "scontrol show hostnames" in text
    # The model's name appears only inside comments.
    assert all(line.startswith("#") for line in text.splitlines() if "rm -rf" in line)
    if engine == "megatron":  # tp > 1 before Blackwell: validate_args wants it set before the processes start
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text


def _fake_tools(bin_dir, hosts: int) -> None:
    """scontrol printing ``hosts`` long host names a line at a time, flushing each (a pipe reader
    that stops early kills it with SIGPIPE, as Slurm's own, whose printf output goes out in several
    writes past a few KiB), and srun recording the command each node would run."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        f"for i in range({hosts}):\n"
        "    sys.stdout.write(f'gpu-node-{i:05d}.cluster.example.org\\n'); sys.stdout.flush()\n")
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)


@pytest.mark.parametrize("engine", sorted(CASES))
def test_sbatch_reaches_srun_on_a_long_node_list_and_stops_where_its_files_are_not(engine, tmp_path):
    """On 256 nodes and more, `scontrol show hostnames | head -n 1` under pipefail ended the job with
    scontrol's SIGPIPE before srun, printing nothing; srun gave torchrun one CPU (a step inherits no
    --cpus-per-task from sbatch since Slurm 22.05); and submitted from another folder, the launch
    started on every node without its arguments or config."""
    import os

    est = planner.estimate(CASES[engine])
    files = tmp_path / "files"
    planner.emit(est, engine, files, force_unfit=not est.fits)
    _fake_tools(tmp_path / "bin", 20_000)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[0-19999]",
           "SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "96", "SRUN_ARGS": str(tmp_path / "srun.txt"),
           "MEGATRON_LM": str(_megatron_checkout(tmp_path))}
    for _ in range(3):  # the SIGPIPE was a race: most runs on 512 nodes
        done = subprocess.run(["bash", str(files / "sbatch.sh")], env={**env, "SLURM_SUBMIT_DIR": str(files)},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        words = (tmp_path / "srun.txt").read_text().split("\n")
        assert "--cpus-per-task=96" in words and "gpu-node-00000.cluster.example.org:29500" in words
    (tmp_path / "srun.txt").unlink()
    elsewhere = subprocess.run(["bash", str(files / "sbatch.sh")], env={**env, "SLURM_SUBMIT_DIR": str(tmp_path)},
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.returncode != 0 and "No such file or directory" in elsewhere.stderr
    assert not (tmp_path / "srun.txt").exists()  # no node started


def _stand_in(tmp_path, tool: str, body: str, **env: str) -> dict:
    """The environment of a launch whose ``tool`` (torchrun, deepspeed) is a stand-in running ``body``."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / tool).write_text(f"#!/usr/bin/env bash\n{body}\n")
    (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}


def _megatron_checkout(tmp_path):
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir(exist_ok=True)
    (checkout / "pretrain_gpt.py").write_text("")
    return checkout


def test_megatrons_files_say_what_the_user_adds_and_sbatch_stops_without_a_checkout(tmp_path):
    """megatron_args.txt asked for data, tokenizer and learning-rate arguments, not the run's length,
    which pretrain_gpt.py needs (update_train_iters: train_samples // global_batch_size, a TypeError on
    None); and sbatch.sh, submitted from its own folder, ran ./pretrain_gpt.py there on every node
    where MEGATRON_LM was not exported, which only launch.sh's header named."""
    import os

    files = tmp_path / "files"
    planner.emit(planner.estimate(CASES["megatron"]), "megatron", files)
    header = [line for line in (files / "megatron_args.txt").read_text().splitlines() if line.startswith("#")]
    assert any("--train-samples" in line and "--train-iters" in line for line in header)
    assert "MEGATRON_LM" in "".join(line for line in (files / "sbatch.sh").read_text().splitlines()
                                    if line.startswith("#"))
    _fake_tools(tmp_path / "bin", 2)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[0-1]",
           "SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "96", "SRUN_ARGS": str(tmp_path / "srun.txt"),
           "SLURM_SUBMIT_DIR": str(files)}
    env.pop("MEGATRON_LM", None)
    done = subprocess.run(["bash", str(files / "sbatch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "MEGATRON_LM" in done.stderr
    assert not (tmp_path / "srun.txt").exists()  # no node started
    done = subprocess.run(["bash", str(files / "sbatch.sh")], env={**env, "MEGATRON_LM": str(_megatron_checkout(tmp_path))},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path}/Megatron-LM/pretrain_gpt.py" in (tmp_path / "srun.txt").read_text().split("\n")


def test_launch_scripts_are_executable_as_written(tmp_path):
    """launch.sh and sbatch.sh were written 0644: ./launch.sh and `srun ./launch.sh` were "Permission denied"."""
    import stat

    planner.emit(planner.estimate(CASES["megatron"]), "megatron", tmp_path)
    for name in ("launch.sh", "sbatch.sh"):
        mode = (tmp_path / name).stat().st_mode
        assert mode & stat.S_IXUSR and (mode & stat.S_IRGRP == 0 or mode & stat.S_IXGRP)
    assert not (tmp_path / "megatron_args.txt").stat().st_mode & stat.S_IXUSR


def test_deepspeeds_multi_node_launch_refuses_a_folder_its_launcher_would_split(tmp_path):
    """DeepSpeed's pdsh runner writes `cd FOLDER; SCRIPT ...` into one remote shell line unquoted
    (launcher/multinode_runner.py, PDSHRunner.get_cmd): from a folder with a space, every node ran
    `cd` on half the path. The launch says so before starting; the hosts come from HOSTFILE."""
    import os

    est = planner.estimate(CASES["deepspeed"])  # 2 nodes
    folder = tmp_path / "my runs"
    planner.emit(est, "deepspeed", folder)
    env = _stand_in(tmp_path, "deepspeed", 'printf "%s\\n" "$@" > "$DS_ARGS"', DS_ARGS=str(tmp_path / "ds.txt"))
    done = subprocess.run(["bash", str(folder / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "holds a space" in done.stderr and not (tmp_path / "ds.txt").exists()
    os.rename(folder, tmp_path / "runs")
    done = subprocess.run(["bash", str(tmp_path / "runs" / "launch.sh")], env={**env, "HOSTFILE": "/etc/my hosts"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ds.txt").read_text().split("\n")[:4] == ["--hostfile", "/etc/my hosts", "--num_nodes", "2"]


def test_torchtitans_launch_imports_its_config_from_a_folder_holding_a_colon(tmp_path):
    """launch.sh puts its folder on PYTHONPATH for the ranks' `import torchtitan_config`, but PYTHONPATH
    splits at ':' (Python's sys.path initialisation, os.pathsep), so from a folder such as `run:1` started
    from elsewhere every rank failed with ModuleNotFoundError after torchrun had started. Run from that
    folder, the ranks (python -m) import it from their working folder, as python puts it on sys.path;
    from elsewhere the launch says so before starting anything. The stand-in torchrun imports the config
    as a rank would."""
    import sys

    folder = tmp_path / "run:1"
    planner.emit(planner.estimate(CASES["torchtitan"]), "torchtitan", folder)
    env = _stand_in(tmp_path, "torchrun", f'exec {sys.executable} -c "import torchtitan_config"', MASTER_ADDR="localhost")
    env.pop("PYTHONSAFEPATH", None)
    inside = subprocess.run(["bash", "launch.sh"], env=env, cwd=folder, capture_output=True, text=True, timeout=60)
    assert inside.returncode == 0, inside.stderr
    outside = subprocess.run(["bash", str(folder / "launch.sh")], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert outside.returncode == 1 and "ModuleNotFoundError" not in outside.stderr
    assert outside.stderr.count("\n") == 1 and "holds a ':'" in outside.stderr, outside.stderr


def _recording_launcher(bin_dir, names, pid_file) -> None:
    """Stand-ins for the launchers the scripts start (torchrun, deepspeed, srun): each writes its
    process id and sleeps as that same process, as torchrun's agent waits on its ranks."""
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text(f'#!/usr/bin/env bash\necho $$ > "{pid_file}"\nexec sleep 60\n')
        (bin_dir / name).chmod(0o755)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("script", ["launch.sh", "sbatch.sh"])
@pytest.mark.parametrize("engine", sorted(CASES))
def test_a_signal_to_the_script_reaches_the_launcher_it_starts(engine, script, tmp_path):
    """A scheduler or a user ends a launch by signalling its process (kill, a container's stop,
    scancel --batch): bash, waiting on a foreground command, dies of SIGTERM and leaves it running,
    orphaned, with every rank it started (bash(1), SIGNALS: a trap is run only once the command
    completes). Started with exec, the launcher is the script's process and takes the signal itself:
    torchrun's agent stops its ranks on SIGTERM (torch/distributed/elastic/multiprocessing/api.py,
    _terminate_process_handler), as DeepSpeed's runner does (deepspeed/launcher/runner.py,
    sigkill_handler), and srun forwards it to the step's tasks (srun(1), SIGNALS AND ESCAPE SEQUENCES)."""
    import os
    import signal
    import time

    est = planner.estimate(CASES[engine])
    files = tmp_path / "files"
    planner.emit(est, engine, files, force_unfit=not est.fits)
    pid_file = tmp_path / "launcher.pid"
    _fake_tools(tmp_path / "bin", 2)
    _recording_launcher(tmp_path / "bin", ["torchrun", "deepspeed", "srun"], pid_file)
    (files / "train.py").write_text("")  # DeepSpeed's, the user's to write
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[0-1]",
           "SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "96", "SLURM_SUBMIT_DIR": str(files), "MASTER_ADDR": "gpu0",
           "HOSTFILE": str(tmp_path / "hostfile"), "MEGATRON_LM": str(_megatron_checkout(tmp_path))}
    proc = subprocess.Popen(["bash", str(files / script)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    launcher = None
    try:
        for _ in range(200):  # until the launcher has started (or the script has ended)
            if pid_file.exists() and pid_file.read_text().strip() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        launcher = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert not _alive(launcher), f"{script} ended on SIGTERM and left {launcher} running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if launcher is not None and _alive(launcher):
            os.kill(launcher, signal.SIGKILL)


def test_megatrons_launch_stops_before_torchrun_where_its_arguments_file_is_not(tmp_path):
    """launch.sh read megatron_args.txt inside torchrun's arguments: a command substitution there that
    fails does not stop the script under set -e (bash(1), set -e: only a simple command's status
    counts, not an expansion's inside it), so without the file every rank started with no
    arguments and Megatron-LM stopped on "either num-layers or encoder-num-layers should be specified"
    (megatron/training/arguments.py), the cause hidden, as sbatch.sh once did."""
    files = tmp_path / "files"
    planner.emit(planner.estimate(CASES["megatron"]), "megatron", files)
    env = _stand_in(tmp_path, "torchrun", f'printf "%s\\n" "$@" > "{tmp_path / "torchrun.txt"}"', MASTER_ADDR="gpu0")
    done = subprocess.run(["bash", str(files / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--tensor-model-parallel-size" in (tmp_path / "torchrun.txt").read_text().split("\n")
    (tmp_path / "torchrun.txt").unlink()
    (files / "megatron_args.txt").unlink()
    done = subprocess.run(["bash", str(files / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "megatron_args.txt" in done.stderr
    assert not (tmp_path / "torchrun.txt").exists()  # no rank started
