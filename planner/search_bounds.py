"""What lets `plan`'s search skip a layout before the full cost model scores it (:mod:`planner.search`):

- a lower bound on the step time of each group and micro-batch (:class:`StepBounds`), from
  per-layer times cached by shape: it orders the groups, most promising first, and skips the
  micro-batches that cannot beat the incumbents;
- the step with neither recomputation nor offload (:func:`floor`), which each only add to, priced
  one pipeline stage at a time while a stage alone already takes the step past the incumbents;
- the model states alone (:func:`states_cannot_fit`): where they overflow the GPU, no layout of a
  grid and ZeRO stage fits, whatever its micro-batch, recomputation or offload;
- the incumbents themselves (:class:`Incumbents`): the fastest layouts found so far, and how slow
  a layout may be and still reach the solver's table.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional

from cost_models.experts import dispatch_combine_time, moe_mlp_time_floor
from cost_models.layer_time import layer_time_bound, layer_time_for, moe_layer_time_for
from cost_models.memory import peak_candidates, stage_memories
from cost_models.pipeline_time import pipeline
from cost_models.specs import Job, Layout, SpecError, moe_layers_per_stage
from cost_models.stage_time import cp_exposed_per_layer, head_time, stage_time
from cost_models.optimizer_time import least_offload_time
from cost_models.step_time import StepTime, step_time_under
from cost_models.tp_time import moe_layer_tp_share, tp_exposed_per_layer

from .case import Case
from .search_memory import case_job, fit_limit
from .search_options import SearchSpec
from .search_recompute import offload_options
from .search_rows import Group

# The bound's MoE layer at the least weight-quantize share (0): a time no stage ever asks the
# cost model's cache for, so it is computed past that cache, which it would only crowd.
_moe_layer_time_uncached = getattr(moe_layer_time_for, "__wrapped__", moe_layer_time_for)


# StepBounds' figures by (model, training, GPU, fabric): see StepBounds.__init__.
_SHARED: dict[tuple, tuple[dict, ...]] = {}


class StepBounds:
    """Lower bounds on the step time of a group's layouts, one per micro-batch size:
    m · the heaviest stage + (p − 1)/v · the lightest, each stage at its layers ·
    (3 · t_layer + 4 · t_tp + t_cp) — every micro-batch runs the forward and backward of the
    heaviest stage, and the bubble those of the p − 1 stages but the slowest
    (``pipeline_time.Pipeline.bubble``), none lighter than the lightest; its layers with
    their four tensor-parallel collectives each and what their context-parallel ring cannot hide
    (an MoE layer: its compute, half or all of the TP pair, the ring, and its dispatches and
    combines, of those only what no compute can hide where they overlap it), the last stage with
    its LM head and multi-token prediction — and the rest of the step only adds to that. Layer
    times are cached per shape: many groups share one."""

    def __init__(self, case: Case):
        self.case = case
        # Shared by every search of this model, training and GPU type, whatever the cluster's size: no
        # figure below depends on it (a group's links, on its stride and size alone: topology.group_links),
        # and `size` searches thousands of sizes (Mixtral on up to 65,536 GPUs: 8,161 of them, each
        # computing these again, 28 s).
        key = (case.model, case.training, case.cluster.gpu, case.cluster.fabric)
        shared = _SHARED.get(key)
        if shared is None:
            if len(_SHARED) >= 16:
                _SHARED.clear()
            shared = _SHARED[key] = tuple({} for _ in range(6))
        self._dense: dict[tuple, tuple[float, float, float]]  # (tp, cp, mbs, sp) -> _dense_layer's
        self._moe: dict[tuple, float]  # (tp, cp, mbs, sp, ep, etp) -> MoE layer
        self._moe_floor: dict[tuple, float]  # (tp, cp, mbs, sp, etp) -> under every ep's MoE layer
        self._least: dict[tuple, float]  # least()'s, by what it depends on (dp included)
        self._stages: dict[tuple, frozenset]  # (stage_layers, vpp) -> _composition's
        self._heads: dict[tuple, float]  # (tp, cp, mbs) -> the last stage's heads
        self._dense, self._moe, self._moe_floor, self._least, self._stages, self._heads = shared

    def _dense_layer(self, tp: int, cp: int, mbs: int, sp: bool) -> tuple[float, float, float]:
        """(a dense layer with its TP and CP traffic, its TP collectives, its CP ring's exposed part)."""
        shape = (tp, cp, mbs, sp)
        if shape not in self._dense:
            model, training, cluster = self.case.model, self.case.training, self.case.cluster
            layer = layer_time_bound(model, training, cluster.gpu, tp, cp, mbs, sp)
            collectives = sum(tp_exposed_per_layer(model, training, cluster, tp, cp, mbs, sp))
            ring = 0.0 if cp == 1 else cp_exposed_per_layer(
                model, training, cluster, tp, cp, mbs, layer_time_for(model, training, cluster.gpu, tp, cp, mbs, sp,
                                                                      True, 0.0).core)
            self._dense[shape] = (layer + collectives + ring, collectives, ring)
        return self._dense[shape]

    def _moe_layer(self, tp: int, cp: int, mbs: int, sp: bool, ep: int, etp: int, collectives: float,
                   ring: float) -> float:
        shape = (tp, cp, mbs, sp, ep, etp)
        if shape not in self._moe:
            model, training, cluster = self.case.model, self.case.training, self.case.cluster
            dispatches = 2 * dispatch_combine_time(model, training, cluster, tp, cp, mbs, ep, etp)
            if training.moe_comm_overlap:
                # Run beside other micro-batches' compute, the stage's dispatches and combines E show
                # E − ov·min(E, C) of themselves (``stage_time``, ``collectives.exposed``): never less
                # than (1 − ov)·E, whatever the stage's compute C.
                dispatches *= 1 - cluster.gpu.performance.comm_overlap
            self._moe[shape] = \
                _moe_layer_time_uncached(model, training, cluster.gpu, tp, cp, mbs, sp, ep, etp, 0.0).total \
                + collectives * moe_layer_tp_share(model) + ring + dispatches
        return self._moe[shape]

    def least(self, group: Group) -> Optional[float]:
        """A bound under the least of :meth:`of`'s, at a fraction of its cost, for an MoE model (None
        for a dense one, whose bounds cost no more): each MoE layer at its attention half, its share
        of the TP pair and the CP ring, and an expert part no expert-parallel size goes under
        (``experts.moe_mlp_time_floor``), without its dispatches. These shapes leave out ep, which
        :meth:`of`'s MoE layers hold: DeepSeek-V3's groups on 2,048 GPUs need 5,316 of those."""
        if not self.case.model.is_moe:
            return None
        g = group
        etp = g.etp or g.tp
        # Groups that differ only in ep share it.
        key = (g.tp, g.cp, g.pp, g.dp, g.stage_layers, g.vpp, g.sequence_parallel, etp, g.micro_batches)
        if key in self._least:
            return self._least[key]
        global_batch = self.case.training.global_batch_size
        bubble = (g.pp - 1) / g.vpp
        composition = self._composition(g)
        least = math.inf
        for mbs in g.micro_batches:
            shape = (g.tp, g.cp, mbs, g.sequence_parallel)
            dense, collectives, ring = self._dense.get(shape) or self._dense_layer(*shape)
            moe = self._moe_floor.get(shape + (etp,)) or self._moe_layer_floor(*shape, etp, collectives, ring)
            head = self._heads.get(shape[:3]) or self._head(*shape[:3])
            times = [(n - k) * dense + k * moe + (head if last else 0.0) for n, k, last in composition]
            heaviest, lightest = max(times), min(times)
            least = min(least, global_batch // (mbs * g.dp) * heaviest + bubble * lightest)
        self._least[key] = least
        return least

    def _moe_layer_floor(self, tp: int, cp: int, mbs: int, sp: bool, etp: int, collectives: float,
                         ring: float) -> float:
        """Under :meth:`_moe_layer` at every ep: see :meth:`least`."""
        shape = (tp, cp, mbs, sp, etp)
        if shape not in self._moe_floor:
            model, training, gpu = self.case.model, self.case.training, self.case.cluster.gpu
            self._moe_floor[shape] = \
                layer_time_for(model, training, gpu, tp, cp, mbs, sp, weight_share=0.0, mlp=False).total \
                + moe_mlp_time_floor(model, training, gpu, tp, cp, mbs, etp, 0.0) \
                + collectives * moe_layer_tp_share(model) + ring
        return self._moe_floor[shape]

    def _composition(self, group: Group) -> frozenset:
        """The (layers, MoE layers, whether last) of the group's stages: the last with the multi-token
        prediction layers it also runs (``stage_time``)."""
        key = (group.stage_layers, group.vpp)
        if key not in self._stages:
            model = self.case.model
            moe_counts = moe_layers_per_stage(model, group.stage_layers, group.vpp)
            last = len(group.stage_layers) - 1
            self._stages[key] = frozenset(
                (n + model.mtp_layers, k + model.mtp_moe_layers, True) if i == last else (n, k, False)
                for i, (n, k) in enumerate(zip(group.stage_layers, moe_counts)))
        return self._stages[key]

    def _head(self, tp: int, cp: int, mbs: int) -> float:
        """The last stage's LM head and loss, and any multi-token prediction heads (``stage_time.head_time``)."""
        shape = (tp, cp, mbs)
        if shape not in self._heads:
            training = self.case.training
            # The loss on a tp-th of the logits and the GEMM on a tp-th of the vocabulary: at most what any
            # layout's take (DeepSpeed's AutoTP runs the loss on the whole logits, activations.logit_shards,
            # and a tied head's GEMM on all of the vocabulary, parameters.head_shards), so the bound stays a bound.
            self._heads[shape] = head_time(self.case.model, training, self.case.cluster.gpu, tp,
                                           mbs * training.seq_len / cp)
        return self._heads[shape]

    def of(self, group: Group) -> dict[int, float]:
        """The bound at each of the group's micro-batch sizes, in their order."""
        g = group
        global_batch = self.case.training.global_batch_size
        bubble = (g.pp - 1) / g.vpp  # the bubble, in micro-batches
        dense_layers, is_moe = self._dense, self.case.model.is_moe
        composition = self._composition(g)
        etp = g.etp or g.tp
        out = {}
        for mbs in g.micro_batches:
            shape = (g.tp, g.cp, mbs, g.sequence_parallel)
            dense, collectives, ring = dense_layers.get(shape) or self._dense_layer(*shape)
            moe = (self._moe.get(shape + (g.ep, etp)) or self._moe_layer(*shape, g.ep, etp, collectives, ring)) \
                if is_moe else 0.0
            head = self._heads.get(shape[:3]) or self._head(*shape[:3])
            times = [(n - k) * dense + k * moe + (head if last else 0.0) for n, k, last in composition]
            heaviest, lightest = max(times), min(times)
            out[mbs] = global_batch // (mbs * g.dp) * heaviest + bubble * lightest
        return out


def _heaviest_stages(job: Job) -> list[int]:
    """Stages to price first when only a bound is needed: the last (it also runs the LM head and
    any multi-token prediction) and the first with the most layers, each once. Each is the first
    stage of its kind, the one ``pipeline_time.pipeline`` prices for the kind: the last is alone in
    its kind, and no stage before the first with the most layers holds as many."""
    layers = job.stage_layers
    return list(dict.fromkeys((len(layers) - 1, layers.index(max(layers)))))


def floor(case: Case, base: Layout, threshold: float) -> tuple[float, Optional[StepTime]]:
    """The least step time any layout built on ``base`` can take: ``base``'s own, with neither
    recomputation nor offload, since each only adds work (a recomputed forward, a copy to or
    from the host) to the step; its memory is not needed for that. With that step where it
    took all of it: where the micro-batches and the bubble alone pass ``threshold`` at the pace
    of one stage, or of the slowest, or with the rest of the step but its data-parallel traffic, the
    rest is not priced (the first figure is then only a bound that passes ``threshold``, and holds no
    data-parallel traffic). (0, None) where ``base`` alone is not a layout the
    cost models take."""
    try:
        job = case_job(case, base)
    except SpecError:
        return 0.0, None
    if job.layout.pp > 1 and threshold < math.inf:
        times: list[float] = []
        for stage in _heaviest_stages(job):
            times.append(stage_time(job, stage).total)
            # The slowest stage sets the pace, no faster than these; the bubble runs every stage but the
            # slowest (Pipeline.least_step, Pipeline.bubble): these but the heaviest of them at least.
            least = job.num_microbatches * max(times) + (sum(times) - max(times)) / job.layout.vpp
            if least > threshold:
                return least, None
    stages = pipeline(job)
    least = stages.least_step(job)
    if least > threshold:
        return least, None
    # The step's parts but its data-parallel traffic next, and that last (step_time_under): the caller
    # adds ZeRO-3's least traffic (search._Search._zero3_traffic, under the step's dp_comm_s) to a
    # figure returned without the step, as to the bound, so none may hold the data-parallel traffic.
    return step_time_under(job, stages, threshold)


def states_fit(case: Case, spec: SearchSpec, base: Layout) -> Optional[str]:
    """Where the model states on the GPU alone, with the fixed buffers, fit in its usable memory:
    "plain" without offload, else "offload" under the most offload the search may try for
    ``base``'s ZeRO stage, else None. They depend on neither the micro-batch nor the recomputation:
    where they fit under neither, no layout on ``base``'s grid and ZeRO stage fits
    (:func:`states_cannot_fit`); where only under offload, every layout that fits offloads the
    optimizer (:func:`offload_floor`). Offload moves states off the GPU, but an engine's defaults may
    hold more on it once the optimizer is offloaded (Megatron keeps non-delayed fp8 weights in 16
    bits there: ``EngineBehaviour.quantized_param_gather_offloaded``), so both ends are priced."""

    def least_states(changes: dict) -> float:
        job = case_job(case, base.with_changes(**changes))
        return max(m.total for m in stage_memories(job, peak_candidates(job), activations=False))

    strongest = ([{}] + offload_options(spec, base.zero_stage))[-1]
    try:
        limit = fit_limit(case_job(case, base), spec.headroom)
        if least_states({}) <= limit:
            return "plain"
        return "offload" if strongest and least_states(strongest) <= limit else None
    except SpecError:
        return "plain"


def states_cannot_fit(case: Case, spec: SearchSpec, base: Layout) -> bool:
    """Whether no layout on ``base``'s grid and ZeRO stage fits: its model states fit neither without
    offload nor under the most offload (:func:`states_fit`)."""
    return states_fit(case, spec, base) is None


def offload_floor(case: Case, spec: SearchSpec, base: Layout) -> float:
    """The least offload time a layout on ``base``'s grid and ZeRO stage takes where its model states
    fit only under offload (:func:`states_fit` "offload"): each such layout offloads the optimizer, at the
    least share the search tries (``search_recompute.offload_options``), and takes at least its
    step on the CPU and the weights back in (``optimizer_time.least_offload_time``)."""
    shares = [o["offload_optimizer"] for o in offload_options(spec, base.zero_stage)]
    if not shares:
        return 0.0
    try:
        job = case_job(case, base.with_changes(offload_optimizer=min(shares), offload_params=False))
    except SpecError:
        return 0.0
    return least_offload_time(job)


class Incumbents:
    """The top_k + 1 fastest step times found so far, and the threshold a layout must come under
    to matter: within ``keep_within`` of the fastest, or among those top_k + 1 (never over
    ``ceiling``)."""

    def __init__(self, top_k: int, keep_within: Optional[float], ceiling: float):
        self.top_k, self.keep_within, self.ceiling = top_k, keep_within, ceiling
        self._fastest: list[float] = []  # a max-heap of negated times
        self.threshold = ceiling

    @property
    def fastest(self) -> float:
        """The fastest step time found (infinite before any)."""
        return -max(self._fastest) if self._fastest else math.inf

    @property
    def kth(self) -> float:
        """The slowest of the top_k + 1 fastest so far (the ceiling while fewer are found): a layout
        slower than it is neither the fastest nor one of the alternatives."""
        return -self._fastest[0] if len(self._fastest) > self.top_k else self.ceiling

    def add(self, seconds: float) -> None:
        fastest = self._fastest
        heapq.heappush(fastest, -seconds)
        if len(fastest) > self.top_k + 1:
            heapq.heappop(fastest)
        if self.keep_within is not None and len(fastest) > self.top_k:
            self.threshold = min(self.ceiling, max(self.kth, self.fastest * (1 + self.keep_within)))


class SimplerFaster:
    """The layouts found so far that fit at their memory band's upper end, kept as those no other is
    both simpler and faster than (``complexity.layout_complexity``, step time).

    They bound what a layout may take and still be the robust pick (``plan.robust_choice``: among the
    layouts within the gap the model cannot tell apart from the fastest, the first that fits at its
    band's upper end, then the simplest, then the fastest). A layout at least as complex as one of
    these and slower can never be that pick: wherever it is within the gap of the fastest, that one
    is too, and comes first."""

    def __init__(self) -> None:
        self._front: list[tuple[tuple, float]] = []  # (complexity, step time), complexity ascending

    def add(self, complexity: tuple, seconds: float) -> None:
        if self.slowest_pick(complexity) <= seconds:
            return
        self._front = [(c, t) for c, t in self._front if not (c >= complexity and t >= seconds)]
        self._front.append((complexity, seconds))
        self._front.sort()

    def fastest_simpler(self, complexity: tuple) -> float:
        """The least step time of those found less complex (infinite where none is)."""
        least = math.inf
        for c, t in self._front:
            if c >= complexity:
                break
            least = min(least, t)
        return least

    def slowest_pick(self, complexity: tuple) -> float:
        """The most a layout at least this complex may take and still be the robust pick: the least
        step time of those found no more complex (infinite where none is)."""
        least = math.inf
        for c, t in self._front:
            if c > complexity:
                break
            least = min(least, t)
        return least
