"""planner/cpsat.py writes CP-SAT's message by hand: each constraint it states must mean what its
name says. Random small models are solved and checked against every assignment enumerated."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.cpsat import Linear, Model, intervals


def test_intervals_are_the_runs_of_consecutive_values():
    assert intervals([5, 1, 2, 3, 9, 8, 2]) == [1, 3, 5, 5, 8, 9]
    assert intervals([0]) == [0, 0]


@pytest.mark.parametrize("seed", range(40))
def test_a_random_model_has_the_optimum_of_every_assignment_enumerated(seed):
    rng = random.Random(seed)
    domains = [sorted(rng.sample(range(-3, 9), rng.randint(1, 5))) for _ in range(4)]
    m = Model()
    xs = [m.new_var(d, f"x{i}") for i, d in enumerate(domains)]
    checks = []
    for _ in range(rng.randint(1, 3)):  # Σ c·x ∈ [low, high], either end open
        vars_ = tuple(rng.sample(xs, 2))
        coeffs = tuple(rng.choice([-3, -1, 1, 2, 5]) for _ in vars_)
        offset = rng.randint(-4, 4)
        low, high = rng.choice([None, rng.randint(-10, 5)]), rng.choice([None, rng.randint(0, 20)])
        m.add_between(Linear(vars_, coeffs, offset), low, high)
        checks.append(lambda v, a=vars_, c=coeffs, o=offset, lo=low, hi=high:
                      (lo is None or sum(ci * v[ai] for ai, ci in zip(a, c)) + o >= lo)
                      and (hi is None or sum(ci * v[ai] for ai, ci in zip(a, c)) + o <= hi))
    a, b = rng.sample(xs, 2)
    value = rng.randint(-2, 6)
    m.add_not_equal(Linear.of(a) - Linear.of(b), value)
    checks.append(lambda v, a=a, b=b, k=value: v[a] - v[b] != k)
    index = m.new_range(0, 3, "index")
    table = [rng.randint(-3, 8) for _ in range(4)]
    m.add_element(index, table, xs[0])
    checks.append(lambda v, t=table, i=index: v[xs[0]] == t[v[i]])
    product = m.new_range(-30, 80, "product")
    m.add_product(Linear.of(product), xs[1:3])
    checks.append(lambda v, p=product: v[p] == v[xs[1]] * v[xs[2]])
    objective = Linear((*xs, index), tuple(rng.randint(-4, 4) for _ in range(5)), 7)
    m.minimize(objective)
    answer = m.solve()

    best = None
    for values in itertools.product(*domains, range(4)):
        v = dict(zip((*xs, index), values))
        v[product] = v[xs[1]] * v[xs[2]]
        if -30 <= v[product] <= 80 and all(check(v) for check in checks):
            cost = sum(c * v[x] for x, c in zip(objective.vars, objective.coeffs)) + objective.offset
            best = cost if best is None else min(best, cost)
    if best is None:
        assert answer.status == "INFEASIBLE"
    else:
        assert answer.status == "OPTIMAL"
        v = answer.values
        assert all(check(v) for check in checks)
        assert sum(c * v[x] for x, c in zip(objective.vars, objective.coeffs)) + objective.offset == best

