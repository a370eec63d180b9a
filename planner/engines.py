"""What each training engine can express: the one place the search consults.

- Megatron-LM (``megatron/training/arguments.py``): TP, PP with virtual stages, CP,
  sequence parallelism, the distributed optimizer (ZeRO-1; ZeRO-3 only through its
  separate FSDP path, not offered here), selective and full recomputation.
- DeepSpeed (``deepspeed/runtime/pipe/engine.py``): its pipeline engine refuses ZeRO
  stages 2 and 3 (``assert self.zero_optimization_stage() < 2``) and has no
  interleaving; tensor parallelism through AutoTP without sequence parallelism, and not
  with pipelining (AutoTP builds its groups over all ranks, ignoring the pipeline grid:
  ``engine._configure_tensor_parallel_states``); no context parallelism of Megatron's kind.
- torchtitan (``torchtitan/distributed/parallel_dims.py``): FSDP2 sharding (ZeRO-3) or
  pure replication (ZeRO-0), TP always with sequence parallelism on the norms, PP
  with interleaved schedules, CP (whose ranks always join the FSDP shard mesh);
  selective and full activation checkpointing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSupport:
    name: str
    zero_stages: tuple[int, ...]
    max_zero_with_pp: int  # highest ZeRO stage the engine combines with pipeline parallelism
    interleaving: bool
    context_parallel: bool
    sequence_parallel: tuple[bool, ...]  # allowed values when tp > 1
    recompute: tuple[str, ...]
    partial_recompute: bool  # full recomputation of only some layers per stage
    tp_with_pp: bool = True  # tensor and pipeline parallelism together
    # Context-parallel ranks always share the sharded model states (torchtitan folds cp into
    # its FSDP mesh), so cp > 1 needs a sharded (ZeRO ≥ 1) layout.
    cp_shards_states: bool = False
    # TP collectives pipelined with their GEMMs (training.tp_comm_overlap): Megatron's
    # --tp-comm-overlap, torchtitan's async TP; DeepSpeed's AutoTP has none.
    tp_comm_overlap: bool = True

    def allows(self, tp: int, pp: int, cp: int, vpp: int, zero_stage: int, sequence_parallel: bool,
               recompute: str) -> bool:
        if zero_stage not in self.zero_stages or (pp > 1 and zero_stage > self.max_zero_with_pp):
            return False
        if vpp > 1 and not self.interleaving:
            return False
        if cp > 1 and not self.context_parallel:
            return False
        if tp > 1 and sequence_parallel not in self.sequence_parallel:
            return False
        if tp > 1 and pp > 1 and not self.tp_with_pp:
            return False
        if cp > 1 and zero_stage == 0 and self.cp_shards_states:
            return False
        return recompute in self.recompute


ENGINES = {
    "megatron": EngineSupport("megatron", zero_stages=(0, 1), max_zero_with_pp=1, interleaving=True,
                              context_parallel=True, sequence_parallel=(False, True),
                              recompute=("none", "selective", "full"), partial_recompute=True),
    "deepspeed": EngineSupport("deepspeed", zero_stages=(0, 1, 2, 3), max_zero_with_pp=1, interleaving=False,
                               context_parallel=False, sequence_parallel=(False,),
                               recompute=("none", "full"), partial_recompute=False, tp_with_pp=False,
                               tp_comm_overlap=False),
    "torchtitan": EngineSupport("torchtitan", zero_stages=(0, 3), max_zero_with_pp=3, interleaving=True,
                                context_parallel=True, sequence_parallel=(True,),
                                recompute=("none", "selective", "full"), partial_recompute=False,
                                cp_shards_states=True),
    "any": EngineSupport("any", zero_stages=(0, 1, 2, 3), max_zero_with_pp=3, interleaving=True,
                         context_parallel=True, sequence_parallel=(False, True),
                         recompute=("none", "selective", "full"), partial_recompute=True),
}
