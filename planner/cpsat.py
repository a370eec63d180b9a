"""CP-SAT models written as CP-SAT's own message, without OR-tools' Python layer.

`plan` and `size` state small models over a table of scored layouts: booleans or an index
over its rows, linear constraints, element and product constraints and a linear objective.
OR-tools' Python layer (``ortools.sat.python.cp_model``) imports numpy and pandas when it loads
(numpy alone 0.05–0.09 s on the 2-core machine: a sixth of a plan), and its ``Domain`` loads
numpy on first use; the same model written into the ``CpModelProto`` that its compiled helper
(``ortools.sat.python.cp_model_helper``) holds, and solved by that helper's ``SolveWrapper``,
loads neither. The messages are those of OR-tools' ``ortools/sat/cp_model.proto``: a
variable's domain is a sorted list of closed intervals ``[lo0, hi0, lo1, hi1, ...]``; a linear
constraint is ``Σ coeff·var ∈ domain``; ``element`` is ``target = exprs[index]``; ``int_prod``
is ``target = Π exprs``; the objective minimises ``Σ coeff·var``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ortools.sat.python import cp_model_helper as helper

INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1  # CP-SAT's unbounded ends (cp_model.py's INT_MIN, INT_MAX)


@dataclass(frozen=True)
class Linear:
    """Σ coeffs[i] · variable vars[i] + offset, variables by their index in the model."""

    vars: tuple[int, ...]
    coeffs: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def of(var: int) -> "Linear":
        return Linear((var,), (1,))

    def __sub__(self, other: "Linear") -> "Linear":
        return Linear(self.vars + other.vars, self.coeffs + tuple(-c for c in other.coeffs),
                      self.offset - other.offset)


def intervals(values: Iterable[int]) -> list[int]:
    """A set of integers as a domain: its runs of consecutive values, ``[lo, hi, lo, hi, ...]``."""
    flat: list[int] = []
    for value in sorted(set(values)):
        if flat and value == flat[-1] + 1:
            flat[-1] = value
        else:
            flat += [value, value]
    return flat


@dataclass(frozen=True)
class Answer:
    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, MODEL_INVALID or UNKNOWN
    values: tuple[int, ...]  # each variable's value where a solution was found

    @property
    def found(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")


class Model:
    """One CP-SAT model: variables by index, constraints and objective added in place."""

    def __init__(self) -> None:
        self.proto = helper.CpModelProto()

    def new_var(self, values: Iterable[int], name: str) -> int:
        """A variable over these values (at least one)."""
        return self._new(intervals(values), name)

    def new_range(self, low: int, high: int, name: str) -> int:
        """A variable over low..high."""
        return self._new([low, high], name)

    def _new(self, domain: list[int], name: str) -> int:
        variable = self.proto.variables.add()
        variable.name = name
        variable.domain.extend(domain)
        return len(self.proto.variables) - 1

    def new_bool(self, name: str) -> int:
        return self.new_var((0, 1), name)

    def add_in(self, expr: Linear, domain: Sequence[int]) -> None:
        """expr ∈ domain (a list of closed intervals)."""
        linear = self.proto.constraints.add().linear
        linear.vars.extend(expr.vars)
        linear.coeffs.extend(expr.coeffs)
        linear.domain.extend([INT_MIN if d == INT_MIN else INT_MAX if d == INT_MAX else d - expr.offset
                              for d in domain])

    def add_between(self, expr: Linear, low: int | None = None, high: int | None = None) -> None:
        self.add_in(expr, [INT_MIN if low is None else low, INT_MAX if high is None else high])

    def add_equal(self, expr: Linear, value: int) -> None:
        self.add_between(expr, value, value)

    def add_not_equal(self, expr: Linear, value: int) -> None:
        self.add_in(expr, [INT_MIN, value - 1, value + 1, INT_MAX])

    def add_exactly_one(self, literals: Sequence[int]) -> None:
        self.proto.constraints.add().exactly_one.literals.extend(literals)

    def add_element(self, index: int, values: Sequence[int], target: int) -> None:
        """target = values[index]."""
        element = self.proto.constraints.add().element
        _write(element.linear_index, Linear.of(index))
        _write(element.linear_target, Linear.of(target))
        for value in values:
            element.exprs.add().offset = value

    def add_product(self, target: Linear, factors: Sequence[int]) -> None:
        """target = Π factors (variables)."""
        product = self.proto.constraints.add().int_prod
        _write(product.target, target)
        for factor in factors:
            _write(product.exprs.add(), Linear.of(factor))

    def minimize(self, expr: Linear) -> None:
        self.proto.clear_objective()
        objective = self.proto.objective
        objective.vars.extend(expr.vars)
        objective.coeffs.extend(expr.coeffs)
        objective.offset = expr.offset
        objective.scaling_factor = 1.0

    def solve(self) -> Answer:
        """Solved on one worker (the tables are small: fastest, and the same answer each time),
        leaving SIGINT to the process: Ctrl-C interrupts the command (exit 130) rather than
        ending the search early as a time limit would."""
        parameters = helper.SatParameters()
        parameters.num_workers = 1
        parameters.catch_sigint_signal = False
        wrapper = helper.SolveWrapper()
        wrapper.set_parameters(parameters)
        response = wrapper.solve(self.proto)
        status = response.status.name
        return Answer(status, tuple(response.solution) if status in ("OPTIMAL", "FEASIBLE") else ())


def _write(message, expr: Linear) -> None:
    message.vars.extend(expr.vars)
    message.coeffs.extend(expr.coeffs)
    message.offset = expr.offset
