"""Readers of the configs a team already has, one module per engine beside its emitter
(:mod:`planner.emit`): ``read(path, case, ...) -> cost_models.specs.Layout``."""
