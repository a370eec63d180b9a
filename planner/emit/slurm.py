"""``sbatch.sh``: a Slurm batch script beside every engine's ``launch.sh``.

One task per node (``exec srun --ntasks-per-node=1``: a signal to the script reaches srun), each starting torchrun with the GPUs of its node;
the rendezvous (torchrun's c10d backend) on the first node of the allocation
(``scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p``), keyed by the job id; the whole
nodes (``--exclusive``), every CPU of a node to its task. The folder of the files is the one ``sbatch`` was called from
(``$SLURM_SUBMIT_DIR``: Slurm runs a copy of the script from its spool directory). Every value
that comes from the case goes through :func:`quoting.shell_word` or a comment, as in ``launch.sh``.
"""

from __future__ import annotations

from .quoting import comment, shell_word

SBATCH_FILE = "sbatch.sh"


def launch_nodes(cluster, engine: str) -> tuple[int, int]:
    """(nodes, processes per node) every engine's launch takes: the cluster's nodes, full but for a
    cluster inside one node. torchrun, the deepspeed launcher and Slurm's ``--gpus-per-node`` start
    the same number of processes on every node, while the plan was priced on full nodes and the rest
    on one more (20 GPUs of 8 a node: 8 + 8 + 4): spread evenly (4 × 5 or 2 × 10) the ranks would fill
    nodes and NVLink domains the plan did not price, a tensor-parallel group across two of them. Such
    a cluster is refused, naming the sizes around it that launch as priced."""
    from ..errors import CaseError

    n, per_node = cluster.num_gpus, cluster.gpu.gpus_per_node
    if n <= per_node:
        return 1, n
    if n % per_node == 0:
        return n // per_node, per_node
    full = n // per_node
    divisors = [d for d in range(2, per_node) if n % d == 0]
    other = (f", or give cluster.gpus_per_node: {divisors[-1]} where the nodes hold {divisors[-1]} GPUs each"
             if divisors else "")
    raise CaseError("--emit", engine, f"{n} GPUs do not fill whole {per_node}-GPU nodes: the plan was priced on "
                                      f"{full} full node(s) and {n - full * per_node} GPU(s) of one more, which no "
                                      f"launch that starts the same number of processes on every node runs; plan "
                                      f"for {full * per_node} or {(full + 1) * per_node} GPUs{other}")


def master_addr(nodes: int) -> str:
    """launch.sh's ``--master-addr`` word: torchrun's rendezvous runs on node 0, so every other node
    must be told where it is. One node defaults to localhost; several stop with the reason where
    MASTER_ADDR is unset, as localhost would leave nodes 1.. waiting on themselves until the
    rendezvous times out (torch/distributed/run.py: ``--master-addr`` defaults to 127.0.0.1)."""
    return '"${MASTER_ADDR:-localhost}"' if nodes == 1 else \
        '"${MASTER_ADDR:?set MASTER_ADDR to node 0 (the node run with NODE_RANK=0) on every node}"'


def rack_placement(cluster, nodes: int) -> list[str]:
    """Where an NVLink domain spans several nodes (an NVL72 rack of 18 trays), the plan was priced
    with the domain's GPUs (``cluster.gpu.nvlink_domain``: 64 where a job runs on 16 trays of each
    rack) filled before the next: Slurm places nodes so only with its topology/block plugin, in
    segments of that many nodes of one block (sbatch ``--segment``; CoreWeave's SUNK and NVIDIA's
    GB200 clusters configure it). Said, not set: ``--segment`` means nothing on other topologies."""
    per_node, domain = cluster.gpu.gpus_per_node, cluster.gpu.nvlink_domain
    if domain <= per_node or domain % per_node:
        return []
    segment = min(domain // per_node, nodes)
    return [f"Priced with {segment} node(s) ({segment * per_node} GPUs) of each NVLink domain (rack), ranks filling "
            "one before the next:", f"    on Slurm's topology/block plugin, sbatch --segment={segment} "
            f"{SBATCH_FILE} [extra arguments]"]


def sbatch(header: str, nodes: int, per_node: int, entry: str, env: str = "", cluster=None,
           files: str = "") -> str:
    """The batch script: ``header`` (comment lines), ``env`` (shell lines the engine needs before its
    processes start), ``files`` (assignments that read the files beside it from ``$HERE``: an
    assignment whose command substitution fails stops the script under ``set -e``, naming the
    file, before any node starts, where a substitution inside the launch's arguments escapes it and
    every rank started without them: Megatron-LM stopped on "either num-layers or
    encoder-num-layers should be specified", the cause hidden), ``entry`` (what torchrun runs, with
    its arguments, already quoted); for a ``cluster`` whose NVLink domains span several nodes, how to
    place them (:func:`rack_placement`).

    The node list is read whole (``sed -n 1p``): ``head -n 1`` exits after the first line, and
    scontrol, still writing a long list (256 nodes and more), died of SIGPIPE, which ``pipefail``
    made the job's end before srun. srun gives torchrun every CPU of its node
    (``--cpus-per-task=$SLURM_CPUS_ON_NODE``): from Slurm 22.05 a step inherits no
    ``--cpus-per-task`` from sbatch (sbatch(1), "NOTE: Beginning with 22.05 ..."), and one task
    with its eight ranks and their data loaders was bound to one core where the site binds tasks."""
    return (
        "#!/usr/bin/env bash\n"
        + header  # comments: Slurm reads #SBATCH lines up to the first command
        + f"#SBATCH --nodes={int(nodes)}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={int(per_node)}\n"
        "#SBATCH --exclusive\n"
        + comment([f"Slurm: {nodes} node(s) x {per_node} GPUs, one torchrun per node. Submit from this folder:",
                   f"    sbatch {SBATCH_FILE} [extra arguments]",
                   *(rack_placement(cluster, nodes) if cluster is not None else [])])
        + "set -euo pipefail\n"
        "set -f  # no globbing of the arguments\n"
        + env
        + 'HERE="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"\n'
        + (comment([f"The files beside {SBATCH_FILE}, from the folder sbatch was called in: "
                    "the job stops here where they are not."]) + files if files else "")
        + 'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\n'
        # exec: srun is the batch script's process, so a signal to the script (scancel --batch, the
        # --signal=B: warning) reaches srun, which forwards it to every node's torchrun.
        f"exec srun --nodes={shell_word(nodes)} --ntasks-per-node=1 --cpus-per-task=\"$SLURM_CPUS_ON_NODE\" \\\n"
        f"    torchrun --nnodes {shell_word(nodes)} --nproc-per-node {shell_word(per_node)} \\\n"
        '    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:${MASTER_PORT:-29500}" \\\n'
        f"    {entry}\n"
    )
