"""Charts free their figures one by one, and the cycle collector walks one chart's objects, not the whole heap
(trackbridge.compare.plot.charting): a report of 79 charts took 15 s in a fresh process, 52 ms of it per chart in
``gc.collect``, and over 100 s in a test process that had imported MLflow, wandb and torch. The memory side is
measured on real inputs by tests/trackers/test_streaming_memory.py."""
from __future__ import annotations

import gc

import pytest

from trackbridge.compare.plot import Chart, Line, charting, draw


def _chart(i: int) -> Chart:
    xs = [float(x) for x in range(200)]
    return Chart(f"metric_{i}", "value", "step", [Line("a", xs, [x * i for x in xs]), Line("b", xs, xs[::-1])],
                 warning="approximate in b")


def _figures() -> list[object]:
    from matplotlib.figure import Figure
    return [o for o in gc.get_objects() if isinstance(o, Figure)]


@pytest.fixture
def no_automatic_collection():
    """What the test sees is what charting() and draw() did, not a collection the interpreter happened to run."""
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


def test_no_figure_outlives_its_chart_and_the_collector_is_left_as_found(tmp_path, no_automatic_collection):
    gc.collect()
    assert gc.get_freeze_count() == 0 and _figures() == []
    with charting():
        for i in range(3):
            path = draw(_chart(i), tmp_path / f"{i}.png")
            assert path.stat().st_size > 5_000
            assert gc.get_freeze_count() > 0          # what is alive is set aside from the next collection
    assert gc.get_freeze_count() == 0
    # a figure frozen while still referenced would be back in the collector's generations now, uncollected
    assert _figures() == []


def _tracked(obj: object) -> bool:
    """Whether the cycle collector walks ``obj`` (frozen objects are in none of its generations)."""
    return any(o is obj for o in gc.get_objects())


def test_a_process_that_froze_its_own_objects_keeps_them_frozen(tmp_path, no_automatic_collection):
    mine = [["a container of the process, frozen by it"]]
    assert _tracked(mine)
    gc.freeze()
    try:
        assert not _tracked(mine)
        with charting():
            draw(_chart(1), tmp_path / "1.png")
        assert not _tracked(mine)                       # charting() did not unfreeze what the process froze
        assert _figures() == []                         # and the chart was still collected
    finally:
        gc.unfreeze()
    assert _tracked(mine)
