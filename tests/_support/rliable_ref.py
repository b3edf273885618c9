"""rliable 1.2.0 (the reference for compare's group statistics), imported for the tests.

rliable 1.2.0 requires arch < 8 (arch 8 dropped the ``random_state`` keyword its StratifiedBootstrap passes), and
every arch < 8 calls pandas' private ``deprecate_kwarg("type", "plot_type")`` at import, the signature before pandas
3 (which added a leading warning class): ``import arch`` fails under the pandas 3 of the test environment in a
module (arch.univariate) rliable never uses. The decorator is given its old form while arch is imported, and put
back; nothing of rliable's or arch's bootstrap code is changed.

rliable's StratifiedBootstrap draws its resamples from numpy's global generator (``numpy.random.choice``), so
:func:`interval` seeds it with ``numpy.random.seed`` first, as a user of rliable does for a reproducible interval.
"""
from __future__ import annotations

import warnings

import pytest


def load():
    """(rliable.library, rliable.metrics); the test is skipped when rliable is not installed."""
    pytest.importorskip("rliable")
    import pandas.util._decorators as decorators
    original = decorators.deprecate_kwarg

    def old_form(*args, **kwargs):
        if args and isinstance(args[0], str):            # deprecate_kwarg(old, new): pandas < 3
            args = (FutureWarning, *args)
        return original(*args, **kwargs)

    decorators.deprecate_kwarg = old_form
    try:
        from rliable import library, metrics
    finally:
        decorators.deprecate_kwarg = original
    return library, metrics


def interval(scores, which: str, *, reps: int, seed: int):
    """rliable's point estimate and percentile interval of ``which`` ("mean" or "iqm") over a (runs, tasks) matrix."""
    import numpy as np
    library, metrics = load()
    func = {"mean": metrics.aggregate_mean, "iqm": metrics.aggregate_iqm}[which]
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # arch 7's own deprecations inside its bootstrap
        points, intervals = library.get_interval_estimates({"g": np.asarray(scores, dtype=float)},
                                                           lambda s: np.array([func(s)]), reps=reps)
    return float(points["g"][0]), (float(intervals["g"][0][0]), float(intervals["g"][1][0]))
