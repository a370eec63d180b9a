"""DeepSpeed 0.19.8's AutoTP training at tp = 2, run on real PyTorch on CPU over a gloo group of two
ranks: ``deepspeed.initialize`` with ``tensor_parallel.autotp_size`` 2, as the emitted ds_config.json
asks, on a tiny Llama-named model. Either way AutoTP treats the LM head, every rank holds the whole
logits: a model without a Hugging Face tp plan keeps its ``lm_head`` whole (the heuristic path replaces
only the transformer layers' linears; ``replace_module.set_lm_head`` returns in training mode), and one
whose plan says ``colwise_gather_output`` (transformers' Llama) gets ``LinearLayer(gather_output=True)``,
which runs the GEMM on its tp-th of the vocabulary and all-gathers the output. What the loss holds is
what the deepspeed engine prices without a pipeline (``EngineBehaviour.gathers_logits_without_pipeline``,
``activations.logit_shards``); Megatron-DeepSpeed's tensor parallelism, with a pipeline, stays
vocab-parallel. Live tensors are counted by their storages, as ``tests/test_eager_loss_torch.py`` does."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from cost_models.activations import logit_shards, loss_gradient_bytes, saved_logit_bytes  # noqa: E402
from cost_models.flops import Gemm, head_gemm  # noqa: E402
from cost_models.kernels import gemm_time, high_precision_precision  # noqa: E402
from cost_models.layer_time import cross_entropy_time  # noqa: E402
from cost_models.memory import job_stage_parameters, stage_state_bytes  # noqa: E402
from cost_models.collectives import collective_time  # noqa: E402
from cost_models.stage_time import (gathered_logit_bytes, head_time, job_head_gemm, job_head_time,  # noqa: E402
                                   logit_gather_time, stage_time)
from cost_models.topology import group_links  # noqa: E402
from cost_models.tp_time import column_linear_input_widths  # noqa: E402
from planner.case import load_case  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# Sequence, hidden width, vocabulary, tensor-parallel width: the head's weight (V·H) is sized apart
# from the logits (S·V), and a vocabulary shard's logits (S·V/TP) apart from the whole's.
S, H, V, TP = 64, 16, 4096, 2

pytestmark = pytest.mark.slow  # its module fixture starts two DeepSpeed ranks: tens of seconds

SCRIPT = textwrap.dedent('''
import json, os, socket, sys, types
os.environ["DS_ACCELERATOR"] = "cpu"
import torch, torch.multiprocessing as mp, torch.nn as nn, torch.nn.functional as F

S, H, V, TP = SHAPE
# Llama's names, which AutoTP's heuristic parser looks for (q/k/v/o_proj, gate/up/down_proj, lm_head).
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(H, H, bias=False))
    def forward(self, x):
        core = F.scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), is_causal=True)
        return self.o_proj(core)
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, 4 * H, bias=False), nn.Linear(H, 4 * H, bias=False)
        self.down_proj = nn.Linear(4 * H, H, bias=False)
    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(H), nn.LayerNorm(H)
        self.self_attn, self.mlp = Attention(), MLP()
    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens, self.layers = nn.Embedding(V, H), nn.ModuleList([Layer(), Layer()])
        self.norm, self.lm_head = nn.LayerNorm(H), nn.Linear(H, V, bias=False)
    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))
class PlannedModel(Model):
    """A Hugging Face model's tp plan, as transformers' Llama states it (``_tp_plan``, ``base_model_tp_plan``)."""
    _tp_plan = {"lm_head": "colwise_gather_output"}
    def __init__(self):
        super().__init__()
        plan = {f"layers.*.{m}": s for m, s in (("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"),
                ("self_attn.v_proj", "colwise"), ("self_attn.o_proj", "rowwise"), ("mlp.gate_proj", "colwise"),
                ("mlp.up_proj", "colwise"), ("mlp.down_proj", "rowwise"))}
        self.config = types.SimpleNamespace(base_model_tp_plan=plan, num_attention_heads=2,
                                            num_key_value_heads=2, hidden_size=H)
class TiedModel(PlannedModel):
    """Llama's plan on a model whose head is its input embedding (tie_word_embeddings: Llama 3.2 1B's)."""
    def __init__(self):
        super().__init__()
        self.lm_head.weight = self.embed_tokens.weight

def imported():
    """DeepSpeed and what its first initialize imports (torch.optim's and its optimizer check's
    torch._dynamo and inductor: 5 s of a rank's 8), imported once, before the ranks are forked."""
    # AutoTP's update_linear_policies only compares a layer's class with transformers' GPT2Block.
    gpt2 = types.SimpleNamespace(GPT2Block=type("GPT2Block", (), {}))
    stand_in = types.ModuleType("transformers")
    stand_in.models = types.SimpleNamespace(gpt2=types.SimpleNamespace(modeling_gpt2=gpt2))
    sys.modules.setdefault("transformers", stand_in)
    import deepspeed, deepspeed.ops
    import torch._dynamo, deepspeed.runtime.zero.utils, deepspeed.runtime.zero.muon.muon_optimizer
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

def rank_main(rank, port, out):
    import gc

    imported()
    import deepspeed
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(TP),
                      LOCAL_RANK=str(rank))
    deepspeed.init_distributed(dist_backend="gloo")
    sys.path.insert(0, os.getcwd())
    from tests.live_bytes import SizedBytes
    seen = {}
    for kind, build in (("heuristic", Model), ("planned", PlannedModel), ("tied", TiedModel)):
        torch.manual_seed(0)
        model = build().to(torch.bfloat16)
        config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                  "tensor_parallel": {"autotp_size": TP},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        ids, labels = torch.randint(V, (1, S)), torch.randint(V, (1, S))
        # The bytes of every all-gather the step hands torch.distributed, forward and backward: the
        # function DeepSpeed's communication backend bound at init (deepspeed/comm/torch.py,
        # all_gather_into_tensor -> all_gather_function), wrapped so that each call's output buffer is noted.
        backend = deepspeed.comm.comm.cdb
        gather, phase, gathered = backend.all_gather_function, ["forward"], {"forward": [], "backward": []}
        def noted(output_tensor, input_tensor, group=None, async_op=False):
            gathered[phase[0]].append(output_tensor.numel() * output_tensor.element_size())
            return gather(output_tensor=output_tensor, input_tensor=input_tensor, group=group, async_op=async_op)
        backend.all_gather_function = noted
        # The bytes of every all-reduce the step hands the backend over the tensor-parallel group
        # (deepspeed/comm/comm.py, all_reduce -> cdb.all_reduce), each put down to the replaced linear
        # whose input gradient it is: a module's full backward hook runs once the gradient of its input
        # is whole, so after the all-reduce its ColumnParallel.backward ran (module_inject/layers.py).
        reduce, pending, reduced = backend.all_reduce, [], {"forward": [], "backward": {}}
        def noted_reduce(tensor, op=None, group=None, async_op=False):
            if torch.distributed.get_world_size(group) == TP:
                size = tensor.numel() * tensor.element_size()
                (reduced["forward"] if phase[0] == "forward" else pending).append(size)
            return reduce(tensor, op, group, async_op)
        def settle(name):
            def hook(module, grad_input, grad_output):
                reduced["backward"].setdefault(name, []).extend(pending)
                pending.clear()
            return hook
        hooks = [m.register_full_backward_hook(settle(n)) for n, m in engine.module.named_modules()
                 if type(m).__name__ in ("LinearLayer", "LinearAllreduce")]
        backend.all_reduce = noted_reduce
        tally = SizedBytes(S * V)
        tally.sizes = (S * V, 2 * S * V, 4 * S * V)  # a shard's bf16 logits too, beside the whole's bf16 and fp32
        with tally:
            logits = engine(ids)
            shape = list(logits.shape)
            # A storage only a reference cycle holds goes when the collector runs, which depends on what
            # the process allocated before: collected here, so that the peak is the code's, not the
            # collector's timing (one run of the suite measured S·V bytes more on Llama's plan: the size
            # of the head's bf16 shard).
            gc.collect()
            # Eager cross-entropy on fp32 logits (training.loss eager); the step drops the output first.
            loss = F.cross_entropy(logits.float().view(-1, V), labels.view(-1), reduction="sum")
            del logits
            phase[0] = "backward"
            engine.backward(loss)
        backend.all_gather_function, backend.all_reduce = gather, reduce
        for hook in hooks:
            hook.remove()
        reduced["unattributed"] = pending
        head = engine.module.lm_head
        seen[kind] = {"head": type(head).__name__, "rows": head.weight.shape[0], "logits": shape, "peak": tally.peak,
                      "embedding_rows": engine.module.embed_tokens.weight.shape[0],
                      "embedding_numel": engine.module.embed_tokens.weight.numel(), "head_numel": head.weight.numel(),
                      "o_proj": type(engine.module.layers[0].self_attn.o_proj).__name__, "gathered": gathered,
                      "reduced": reduced,
                      "tied": head.weight is engine.module.embed_tokens.weight}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = sys.argv[1]
    imported()
    # Forked, not spawned: the ranks inherit the imports; nothing ran a thread pool or a group before.
    mp.start_processes(rank_main, args=(port, out), nprocs=TP, start_method="fork")
    print(json.dumps([json.load(open(f"{out}.{rank}")) for rank in range(TP)]))
''')


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("autotp")
    script = folder / "autotp.py"
    script.write_text(SCRIPT.replace("SHAPE", repr((S, H, V, TP))))
    run = subprocess.run([sys.executable, str(script), str(folder / "seen")], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    if run.returncode != 0 and "gloo" in run.stderr.lower() and "Error" in run.stderr:
        pytest.skip("this platform cannot run a gloo group: " + run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def deepspeed_job(pp: int = 1, loss: str = "eager", vocab: int = V, tied: bool = False, hidden: int = H,
                  seq: int = S, **model):
    """A DeepSpeed job of the script's shape at tp 2: AutoTP without a pipeline, Megatron-DeepSpeed with one."""
    return load_case({"model": {"num_layers": 2, "hidden_size": hidden, "num_attention_heads": 4, "vocab_size": vocab,
                                "tied_embeddings": tied, **model},
                      "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": TP * pp},
                      "training": {"global_batch_size": 2, "seq_len": seq, "engine": "deepspeed", "loss": loss},
                      "layout": {"dp": 1, "tp": TP, "pp": pp, "zero_stage": 1, "micro_batch_size": 1,
                                 "recompute": "none"}}).job()


def test_autotp_leaves_every_rank_the_whole_logits(ranks):
    for seen in ranks:
        heuristic, planned = seen["heuristic"], seen["planned"]
        assert heuristic["o_proj"] == planned["o_proj"] == "LinearAllreduce"  # the layers are tensor-parallel
        # No tp plan: the head stays an nn.Linear of the whole vocabulary. Llama's plan: its GEMM runs on
        # V/tp rows, then the output is gathered.
        assert (heuristic["head"], heuristic["rows"]) == ("Linear", V)
        assert (planned["head"], planned["rows"]) == ("LinearLayer", V // TP)
        assert heuristic["logits"] == planned["logits"] == [1, S, V]


def test_autotp_leaves_the_input_embedding_whole_on_every_rank(ranks):
    # Neither path shards the embedding (the heuristic one replaces the transformer layers' linears, and
    # Llama's plan names none for embed_tokens): V rows on every rank, which the deepspeed engine prices
    # without a pipeline (EngineBehaviour.whole_embedding_without_pipeline; docs/fidelity.md).
    for seen in ranks:
        assert seen["heuristic"]["embedding_rows"] == seen["planned"]["embedding_rows"] == V


def test_the_deepspeed_engine_prices_the_embedding_and_head_autotp_leaves_each_rank(ranks):
    # What each rank holds of the two vocabulary matrices, per vocabulary row: the whole embedding on both
    # paths, the head whole without a tp plan and a tp-th with Llama's. The engine prices the plan's (the
    # head split, as its GEMM on V/tp is priced: below) and the embedding whole, under ZeRO 1 over dp 1 at
    # 16 bytes a parameter held (2 of bf16 weights, 2 of gradients, 12 of fp32 master and moments:
    # cost_models/model_states). A vocabulary twice the script's adds V rows of each matrix and nothing else.
    planned, heuristic = ranks[0]["planned"], ranks[0]["heuristic"]
    assert planned["embedding_numel"] == heuristic["embedding_numel"] == V * H
    assert (planned["head_numel"], heuristic["head_numel"]) == (V * H // TP, V * H)
    held = planned["embedding_numel"] + planned["head_numel"]
    job, wider = deepspeed_job(), deepspeed_job(vocab=2 * V)
    assert job_stage_parameters(wider, 0).total - job_stage_parameters(job, 0).total == held
    assert stage_state_bytes(wider, 0).total - stage_state_bytes(job, 0).total == 16 * held
    # Megatron-DeepSpeed's layers, with a pipeline: both vocab-parallel, V·H/tp each on its stage.
    piped, piped_wider = deepspeed_job(pp=2, loss="megatron"), deepspeed_job(pp=2, loss="megatron", vocab=2 * V)
    for stage in (0, 1):
        assert job_stage_parameters(piped_wider, stage).total - job_stage_parameters(piped, stage).total \
            == V * H / TP


def test_the_loss_on_autotps_gathered_logits_peaks_at_what_the_deepspeed_engine_prices(ranks):
    # The eager loss on whole logits: its saved fp32 log-softmax and the backward's two fp32 gradients,
    # 4 + 4 + 4 a logit (tests/test_eager_loss_torch.py), of all S·V logits on each rank.
    for seen in ranks:
        assert seen["heuristic"]["peak"] == seen["planned"]["peak"] == 12 * S * V
    job = deepspeed_job()
    assert logit_shards(job.layout, job.training.engine) == 1
    priced = saved_logit_bytes(job.training) * S * V + loss_gradient_bytes(job.model, job.layout, job.training)
    assert priced == ranks[0]["planned"]["peak"]


def test_megatron_deepspeeds_tensor_parallelism_keeps_the_logits_vocab_parallel():
    # With a pipeline the tp is the model's own Megatron-style layers (BLOOM's): Megatron's
    # vocab-parallel cross-entropy keeps its fp32 softmax of V/tp logits a position and writes the
    # gradient into it, handing back one bf16 copy, 2 a logit.
    job = deepspeed_job(pp=2, loss="megatron")
    assert logit_shards(job.layout, job.training.engine) == TP
    assert loss_gradient_bytes(job.model, job.layout, job.training) == 2 * S * V / TP


def test_autotps_loss_runs_on_the_whole_logits_and_its_gemm_on_a_shard(ranks):
    # Llama's plan (the head's V/tp rows measured above): the GEMM, forward and both backward GEMMs, on
    # V/tp of the vocabulary; the loss over the S·V logits every rank holds.
    job = deepspeed_job()
    training, gpu = job.training, job.cluster.gpu
    assert ranks[0]["planned"]["rows"] == V // TP
    gemm = 3 * gemm_time(head_gemm(job.model, S, TP, V), gpu, high_precision_precision(training))
    assert head_time(job.model, training, gpu, TP, S, logit_shards(job.layout, training.engine)) \
        == pytest.approx(gemm + cross_entropy_time(S * V, training, gpu), rel=1e-12)


def test_autotps_head_all_gathers_in_forward_the_bytes_the_deepspeed_engine_prices(ranks):
    # Llama's plan: one all-gather per step, in the forward, of the S·V bf16 logits, its backward only
    # narrowing the gradient to the rank's shard (GatherFromTensorParallelRegion; the head's input is
    # all-reduced in backward, below); the whole head of the
    # heuristic path gathers nothing, and neither path's layers gather (AutoTP has no sequence parallelism).
    for seen in ranks:
        assert seen["planned"]["gathered"] == {"forward": [2 * S * V], "backward": []}
        assert seen["heuristic"]["gathered"] == {"forward": [], "backward": []}
    job = deepspeed_job()
    measured = ranks[0]["planned"]["gathered"]["forward"][0]
    assert gathered_logit_bytes(job.model, job.training, TP, S) == measured
    # Priced in the stage's tensor-parallel time as one exposed all-gather of those bytes over the
    # tensor-parallel group, per micro-batch, beside its layers' all-reduces (the stage's whole
    # tensor-parallel time is checked against the measured collectives below; the deepspeed engine
    # launches its collectives at no extra cost: collective_launch_s 0).
    # The split head is a column-parallel LinearLayer too: its backward all-reduces its input's gradient,
    # the S·H bf16 hidden states (ColumnParallel.backward), which the whole heads of the other paths do not.
    for seen in ranks:
        assert seen["planned"]["reduced"]["backward"]["lm_head"] == [2 * S * H]
        assert "lm_head" not in seen["heuristic"]["reduced"]["backward"]
        assert "lm_head" not in seen["tied"]["reduced"]["backward"]
    reduced = ranks[0]["planned"]["reduced"]["backward"]["lm_head"][0]
    lay, cluster = job.layout, job.cluster
    links, perf = group_links(cluster, lay, "tp"), cluster.gpu.performance
    assert logit_gather_time(job) == pytest.approx(collective_time("all_gather", measured, links, perf)
                                                   + collective_time("all_reduce", reduced, links, perf), rel=1e-9)
    # Megatron-DeepSpeed's tensor parallelism, with a pipeline, keeps the logits vocab-parallel: none.
    assert logit_gather_time(deepspeed_job(pp=2, loss="megatron")) == 0.0


@pytest.mark.parametrize("vocab, tp", [(50257, 4), (32001, 2), (128256, 8)])
def test_the_gathered_buffer_holds_tp_of_autotps_widest_vocabulary_shards(vocab, tp):
    # A vocabulary tp does not divide: DeepSpeed's near-even split of the head's rows (the lm_head's
    # get_shard_size_list, at the default tp_grain_size 1), each shard padded to the widest before the
    # all_gather_into_tensor (GatherFromTensorParallelRegion.forward).
    from deepspeed.module_inject.tp_shard import AutoTPMeta, get_shard_size_list
    widest = max(get_shard_size_list(vocab, tp, AutoTPMeta(), "lm_head"))
    job = deepspeed_job(vocab=vocab)
    assert gathered_logit_bytes(job.model, job.training, tp, S) == 2 * S * tp * widest


def test_autotp_leaves_a_tied_head_whole_and_the_deepspeed_engine_prices_its_gemm_on_all_the_vocabulary(ranks):
    # Llama's plan on a tied model: AutoTP leaves the head and the embedding it shares replicated
    # (module_inject/auto_tp.py, _configure_gathered_column_tie_fallbacks), so every rank's head GEMM,
    # forward and both backward GEMMs, runs over all V rows, and its output is whole without a gather.
    for seen in ranks:
        tied = seen["tied"]
        assert tied["tied"] and (tied["head"], tied["rows"], tied["embedding_rows"]) == ("Linear", V, V)
        assert tied["logits"] == [1, S, V] and tied["gathered"] == {"forward": [], "backward": []}
        assert tied["peak"] == 12 * S * V  # the eager loss on the whole logits, as on the other paths
    rows, width = ranks[0]["tied"]["rows"], ranks[0]["tied"]["logits"][-1]
    job = deepspeed_job(tied=True)
    # The GEMM the engine prices: S tokens by the measured rows (N = V) by H, no all-gather of its output.
    assert job_head_gemm(job) == Gemm("lm_head", S, rows, H)
    assert logit_shards(job.layout, job.training.engine) == 1 and logit_gather_time(job) == 0.0
    # And the stage's head time: three GEMMs of that N and the loss on the S·V logits each rank holds,
    # at a size where a GEMM's time follows its shape (the script's is one launch whatever its N).
    big = deepspeed_job(tied=True, hidden=4096, seq=4096)
    training, gpu = big.training, big.cluster.gpu
    gemm = 3 * gemm_time(Gemm("lm_head", 4096, rows, 4096), gpu, high_precision_precision(training))
    assert job_head_time(big) == pytest.approx(gemm + cross_entropy_time(4096 * width, training, gpu), rel=1e-12)
    # Memory: the one V·H matrix each rank holds, head and embedding alike, at 16 bytes a parameter.
    wider = deepspeed_job(vocab=2 * V, tied=True)
    held = ranks[0]["tied"]["embedding_numel"]
    assert held == ranks[0]["tied"]["head_numel"] == V * H
    assert job_stage_parameters(wider, 0).total - job_stage_parameters(job, 0).total == held
    assert stage_state_bytes(wider, 0).total - stage_state_bytes(job, 0).total == 16 * held


# The script's layer as AutoTP replaces it: which linears all-reduce their input's gradient in backward.
COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj", "mlp.down_proj")


def test_each_autotp_column_linear_all_reduces_its_input_gradient_in_backward(ranks):
    # LinearLayer runs its input through ColumnParallel, whose backward all-reduces the input's gradient:
    # one all-reduce of the S·H bf16 hidden states per column-parallel linear, five a Llama layer, none
    # coalesced; the row-parallel LinearAllreduce reduces in forward only (RowParallel.backward passes the
    # gradient on). Every path alike (the heuristic parser, Llama's tp plan, a tied head).
    for seen in ranks:
        for kind in ("heuristic", "planned", "tied"):
            backward = seen[kind]["reduced"]["backward"]
            assert seen[kind]["reduced"]["unattributed"] == []
            for layer in range(2):
                assert {name: backward[f"layers.{layer}.{name}"] for name in COLUMN + ROW} \
                    == {**{name: [2 * S * H] for name in COLUMN}, **{name: [] for name in ROW}}
            # The forward: o_proj's and down_proj's all-reduce of the S·H outputs, two a layer.
            assert [size for size in seen[kind]["reduced"]["forward"] if size == 2 * S * H] == [2 * S * H] * 4


def test_the_deepspeed_engine_prices_the_all_reduces_autotps_layers_run(ranks):
    # The script's model at tp 2 without a pipeline, gated as its MLP is: the stage's tensor-parallel time,
    # beside the head's gather of the logits (priced above), is each layer's measured all-reduces, two in
    # forward and five in backward, priced one by one over the tensor-parallel group.
    job = deepspeed_job(activation="swiglu", ffn_hidden_size=4 * H)
    seen = ranks[0]["heuristic"]["reduced"]
    links, perf = group_links(job.cluster, job.layout, "tp"), job.cluster.gpu.performance
    backward = [size for name, sizes in seen["backward"].items() if name.startswith("layers.0.") for size in sizes]
    forward = [2 * S * H] * 2
    layer = sum(collective_time("all_reduce", size, links, perf) for size in forward + backward)
    assert len(backward) == len(column_linear_input_widths(job.model)) == 5
    assert stage_time(job, 0).tp_comm - logit_gather_time(job) == pytest.approx(job.model.num_layers * layer,
                                                                              rel=1e-12)
    # Grouped-query attention narrows k_proj's and v_proj's outputs, not their input: the same bytes.
    gqa = deepspeed_job(activation="swiglu", ffn_hidden_size=4 * H, num_kv_heads=2)
    assert stage_time(gqa, 0).tp_comm == stage_time(job, 0).tp_comm
    # Megatron-DeepSpeed's layers, with a pipeline, reduce once a sub-layer each way: two a pass.
    piped = deepspeed_job(pp=2, loss="megatron", activation="swiglu", ffn_hidden_size=4 * H)
    one = collective_time("all_reduce", 2 * S * H, group_links(piped.cluster, piped.layout, "tp"), perf)
    assert stage_time(piped, 0).tp_comm == pytest.approx(4 * one, rel=1e-12)  # the stage's one layer
