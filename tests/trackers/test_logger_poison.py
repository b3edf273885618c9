"""One bad value must never stop a sink (or the spool): a fault matrix.

Faults: a histogram holding NaN/inf, an empty key, a step beyond 2**53 - 1, a key and a string value holding a lone
surrogate, a config holding NaN, a Path, a set and an arbitrary object; plus the same poisons handed straight to the
dispatcher (past the door in ``log()``), so that the sinks' own per-key isolation is tested too.

Trackers: the JSONL spool, TensorBoard, MLflow (one SQLite store shared by every cell), wandb offline, Trackio (one
local folder and project shared by every cell). Each cell logs 50 steps of good keys with the poison at step 10,
finishes, and reads its tracker back with the tracker's own tools (EventAccumulator, MlflowClient, sqlite3 on
Trackio's database, json on the spool; trackbridge's reader for wandb, whose offline files have no public reader).
"""
from __future__ import annotations

import json
import math
import pathlib
import sqlite3
import time
import warnings

import pytest

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker
import trackbridge  # noqa: E402
from trackbridge.logger import LoggerWarning  # noqa: E402
from trackbridge.record import Histogram, decode_value, encode_value  # noqa: E402

from _support.expect import logger_warnings  # noqa: E402

N = 50
POISON_AT = 10
GOOD = ("loss", "reward/mean")
TRACKERS = ("jsonl", "tensorboard", "mlflow", "wandb", "trackio")
FAULTS = ("nan_histogram", "empty_key", "huge_step", "surrogate_key", "surrogate_value", "odd_config", "past_the_door")


class Odd:
    def __repr__(self) -> str:
        return "Odd()"


ODD_CONFIG = {"lr": float("nan"), "clip": float("inf"), "out": pathlib.Path("/tmp/out"), "seeds": {3, 1, 2},
              "obj": Odd(), "opt": {"beta": 0.9}, "opt/beta": 0.95, "plain": 1}


def _good(i: int) -> dict:
    return {"loss": 1.0 / (i + 1), "reward/mean": i * 0.5}


class Cells:
    """Runs each fault once (all five trackers at once) and keeps what a test needs to read them back."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.db = root / "mlflow.db"          # one MLflow store for every cell (schema creation costs ~1 s)
        self.trackio = root / "trackio"       # one Trackio project for every cell
        self.done: dict[str, dict] = {}

    def get(self, fault: str) -> dict:
        if fault not in self.done:
            self.done[fault] = self._run(fault)
        return self.done[fault]

    def _run(self, fault: str) -> dict:
        d = self.root / fault
        sinks = [f"tensorboard:{d}/tb", f"mlflow:sqlite:///{self.db}?experiment={fault}", f"wandb:{d}/wb",
                 f"trackio:{self.trackio}?project=poison"]
        config = dict(ODD_CONFIG) if fault == "odd_config" else {"lr": 1e-3}
        raised = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = trackbridge.init(project="poison", name=fault, sinks=sinks, source="canonical",
                                   spool=str(d / "spool"), run_id=f"cell-{fault}", config=config,
                                   options=trackbridge.LoggerOptions(retries=1, backoff=0.01))
            for i in range(N):
                metrics, step = _good(i), i
                if i == POISON_AT:
                    if fault == "nan_histogram":
                        metrics["weights"] = [1.0, float("nan"), float("inf"), 2.0, float("-inf")]
                    elif fault == "empty_key":
                        metrics[""] = 1.0
                    elif fault == "huge_step":
                        step = 2 ** 63
                    elif fault == "surrogate_key":
                        metrics["bad\ud800name"] = 1.0
                    elif fault == "surrogate_value":
                        metrics["note"] = "half a pair: \ud800"
                    elif fault == "past_the_door":
                        # straight into the dispatcher, as if log() had not checked: the sinks must cope themselves
                        metrics.update({"": 1.0, "bad\ud800": 2.0, "note": "x\ud800",
                                        "h": Histogram(values=[1.0, float("nan")], min=1.0, max=1.0, num=2.0),
                                        "huge": 10 ** 400})
                        run._inbox.put((time.time(), step, metrics))
                        continue
                try:
                    run.log(metrics, step=step)
                except ValueError as exc:
                    raised.append(str(exc))
            if fault == "past_the_door":      # a record at a step no tracker but the spool can hold
                run._inbox.put((time.time(), 2 ** 63, {"loss": 0.0}))
            status = run.finish()
        return {"dir": d, "run": run, "status": status, "raised": raised, "fault": fault,
                "warnings": [str(w.message) for w in caught]}


@pytest.fixture(scope="module")
def cells(tmp_path_factory, wandb_env):
    return Cells(tmp_path_factory.mktemp("poison"))


def _expected_steps(fault: str) -> list[int]:
    return [i for i in range(N) if not (fault == "huge_step" and i == POISON_AT)]


def _strict_json(text: str):
    def refuse(const):
        raise ValueError(f"not strict JSON: {const}")
    return json.loads(text, parse_constant=refuse)


# -- read each tracker back with its own tools ---------------------------------------------------------------
def _read_jsonl(cell: dict) -> tuple[dict[str, list[int]], dict]:
    path = cell["run"].spool_path
    lines = path.read_text(encoding="utf-8").splitlines()
    objs = [_strict_json(line) for line in lines]          # the spool stays strict JSON
    header, recs = objs[0], objs[1:]
    steps = {k: sorted(r["step"] for r in recs if k in r["metrics"]) for k in GOOD}
    return steps, {"header": header, "records": recs}


def _read_tensorboard(cell: dict) -> tuple[dict[str, list[int]], dict]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = [p for p in (cell["dir"] / "tb").iterdir() if p.is_dir()]
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    steps = {k: sorted(e.step for e in ea.Scalars(k)) for k in GOOD}
    info = json.loads((folder / "trackbridge-run.json").read_text(encoding="utf-8"))
    return steps, {"info": info}


def _read_mlflow(cell: dict, root: pathlib.Path) -> tuple[dict[str, list[int]], dict]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name(cell["fault"])
    (mrun,) = client.search_runs([exp.experiment_id])
    steps = {k: sorted(m.step for m in client.get_metric_history(mrun.info.run_id, k)) for k in GOOD}
    return steps, {"params": mrun.data.params, "metrics": mrun.data.metrics}


def _read_wandb(cell: dict) -> tuple[dict[str, list[int]], dict]:
    from trackbridge.trackers.wandb.source import WandbSource

    (reader,) = list(WandbSource(str(cell["dir"] / "wb")).runs())
    recs = list(reader.records())
    steps = {k: sorted(r.step for r in recs if k in r.metrics) for k in GOOD}
    return steps, {"info": reader.info, "records": recs}


def _read_trackio(cell: dict, root: pathlib.Path) -> tuple[dict[str, list[int]], dict]:
    (db,) = list((root / "trackio").glob("*.db"))
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, metrics FROM metrics WHERE run_id = ?", (cell["run"].run_id,)).fetchall()
        (cfg,) = con.execute("SELECT config FROM configs WHERE run_id = ?", (cell["run"].run_id,)).fetchone()
    rows = [(s, _strict_json(m)) for s, m in rows]
    steps = {k: sorted(s for s, m in rows if k in m) for k in GOOD}
    return steps, {"rows": rows, "config": _strict_json(cfg)}


def _read(tracker: str, cell: dict, root: pathlib.Path):
    if tracker == "jsonl":
        return _read_jsonl(cell)
    if tracker == "tensorboard":
        return _read_tensorboard(cell)
    if tracker == "mlflow":
        return _read_mlflow(cell, root)
    if tracker == "wandb":
        return _read_wandb(cell)
    return _read_trackio(cell, root)




@pytest.mark.parametrize("tracker", TRACKERS)
@pytest.mark.parametrize("fault", FAULTS)
def test_poison_cell(cells, fault, tracker, fault_cell):
    cell = cells.get(fault)
    st = cell["status"]
    assert [s["state"] for s in st["sinks"]] == ["closed"] * 5, cell["run"].summary()
    assert all(s["failures"] == 0 for s in st["sinks"]), cell["run"].summary()
    want = _expected_steps(fault)
    steps, extra = _read(tracker, cell, cells.root)
    kept_past_door = fault == "past_the_door" and tracker == "jsonl"     # the spool keeps the step 2**63 point
    fault_cell(f"poison: {fault}", tracker, len(GOOD) * len(want) + kept_past_door, sum(len(steps[k]) for k in GOOD))
    for key in GOOD:
        if fault == "past_the_door" and tracker == "jsonl":
            assert steps[key] == (want + [2 ** 63] if key == "loss" else want), key
        else:
            assert steps[key] == want, f"{tracker}: {key}: {len(steps[key])} points, want {len(want)} (no loss, no dup)"

    # what happened to the poison itself
    if fault == "huge_step":
        assert len(cell["raised"]) == 1 and "2**53 - 1" in cell["raised"][0]
    if fault in ("empty_key", "surrogate_key", "surrogate_value"):
        named = {"empty_key": "metric ''", "surrogate_key": "bad\\\\ud800name", "surrogate_value": "metric 'note'"}
        assert sum(named[fault] in w for w in cell["warnings"]) == 1, cell["warnings"]     # once, naming the key
    if fault == "nan_histogram" and tracker == "jsonl":
        (rec,) = [r for r in extra["records"] if "weights" in r["metrics"]]
        h = decode_value(rec["metrics"]["weights"])
        assert h.values == [1.0, 2.0] and h.nonfinite == 3 and h.num == 2
    if fault == "nan_histogram" and tracker == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        (folder,) = [p for p in (cell["dir"] / "tb").iterdir() if p.is_dir()]
        ea = EventAccumulator(str(folder), size_guidance={"histograms": 0})
        ea.Reload()
        (hv,) = ea.Histograms("weights")
        assert hv.step == POISON_AT and hv.histogram_value.num == 2
    if fault == "nan_histogram" and tracker == "mlflow":
        assert extra["metrics"]["weights/count"] == 2
    if fault == "odd_config":
        _check_config(tracker, cell, extra)
    if fault == "past_the_door":
        rejected = [w for w in cell["warnings"] if "cannot take metric" in w or "cannot store step" in w]
        assert rejected, cell["warnings"]
        assert not any("failed" in w for w in cell["warnings"]), cell["warnings"]


SANE = {"lr": "NaN", "clip": "Infinity", "out": "/tmp/out", "seeds": [1, 2, 3], "obj": "Odd()",
        "opt": {"beta": 0.9}, "opt/beta": 0.95, "plain": 1}


def _check_config(tracker: str, cell: dict, extra: dict) -> None:
    ws = cell["warnings"]
    for key in ("'lr'", "'seeds'", "'obj'"):
        assert sum(f"config {key}" in w for w in ws) == 1, (key, ws)
    # said once: the run has TensorBoard, whose hparams flatten the config with "/" (every cell is one run to all)
    assert sum("both flatten to 'opt/beta'" in w for w in ws) == 1, ws
    if tracker == "jsonl":
        assert {k: extra["header"]["config"][k] for k in SANE} == SANE     # (plus canonical names added)
    elif tracker == "tensorboard":
        assert {k: extra["info"]["config"][k] for k in SANE} == SANE
    elif tracker == "mlflow":
        assert extra["params"]["lr"] == "NaN" and extra["params"]["seeds"] == "[1, 2, 3]"
        assert extra["params"]["obj"] == "Odd()" and extra["params"]["out"] == "/tmp/out"
    elif tracker == "wandb":
        cfg = extra["info"].config
        assert {k: cfg.get(k) for k in ("lr", "out", "seeds", "obj")} == {k: SANE[k] for k in ("lr", "out", "seeds",
                                                                                                 "obj")}
    else:
        assert {k: extra["config"][k] for k in SANE} == SANE


def test_string_nan_round_trips_and_old_spools_still_read_nan():
    for text in ("NaN", "Infinity", "-Infinity", "nan", "hello"):
        assert decode_value(json.loads(json.dumps(encode_value(text)))) == text
    for x in (float("inf"), float("-inf")):
        assert decode_value(encode_value(x)) == x
    assert math.isnan(decode_value(encode_value(float("nan"))))
    # a spool written before the tagged form: the bare words are floats, as they always were
    assert math.isnan(decode_value("NaN")) and decode_value("-Infinity") == float("-inf")
    assert encode_value(float("nan")) == "NaN"        # the float form is unchanged (old readers keep working)


def test_string_nan_and_user_step_key_through_the_logger(tmp_path, wandb_env):
    from trackbridge.sync.replay import iter_spool
    from trackbridge.trackers.wandb.source import WandbSource

    run = trackbridge.init(project="p", name="words", sinks=[f"wandb:{tmp_path}/wb"], source="canonical",
                           spool=str(tmp_path / "spool"), run_id="words")
    for i in range(5):
        run.log({"note": "NaN", "trackbridge/step": 100 + i, "loss": 0.5}, step=i)
    st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "closed"]
    spool = [r for _s, r in iter_spool(run.spool_path)]
    assert [r.metrics["note"] for r in spool] == ["NaN"] * 5
    (reader,) = list(WandbSource(str(tmp_path / "wb")).runs())
    recs = list(reader.records())
    assert [r.step for r in recs] == list(range(5))                        # the true step is still the step
    assert [r.metrics["trackbridge/step"] for r in recs] == [100 + i for i in range(5)]   # the user's key kept


def test_out_of_range_steps_refused_at_log(tmp_path):
    run = trackbridge.init(sinks=[], source="canonical", spool=str(tmp_path / "spool"), run_id="steps")
    for bad in (-1, 2 ** 53, 2 ** 63):
        with pytest.raises(ValueError, match="between 0 and 2\\*\\*53 - 1"):
            run.log({"loss": 1.0}, step=bad)
    with pytest.warns(LoggerWarning, match="progress/step"):
        run.log({"loss": 2.0, "progress/step": 1e30})       # logged at the next step (0) instead
        run.log({"loss": 1.0}, step=2 ** 53 - 1)
        st = run.finish()
    assert st["sinks"][0]["state"] == "closed" and st["sinks"][0]["written"] == 2


class _Picky:
    """A tracker that refuses a whole batch when one value is 'boom' (what the worker's backstop is for)."""

    def __new__(cls, down: bool = False, slow: float = 0.0):
        from trackbridge.tracking.sink import Sink

        class Picky(Sink):
            kind = "picky"

            def __init__(self) -> None:
                super().__init__("mem")
                self.points: list[tuple[int, str]] = []
                self.down = down
                self.calls = 0

            def open(self, run, *, resume=False):
                self.run = run

            def write(self, records):
                self.calls += 1
                if self.down:
                    time.sleep(slow)
                    raise OSError("tracker down")
                if any(v == "boom" for r in records for v in r.metrics.values()):
                    raise RuntimeError("tracker refused the batch")
                self.points += [(r.step, k) for r in records for k in r.metrics]

            def close(self):
                pass

        return Picky()


def test_worker_backstop_isolates_the_refused_key(tmp_path):
    sink = _Picky()
    with pytest.warns(LoggerWarning, match="cannot take metric 'bad'"):
        run = trackbridge.init(sinks=[sink], source="canonical", spool=str(tmp_path / "spool"), run_id="picky",
                               options=trackbridge.LoggerOptions(retries=0, backoff=0.0))
        for i in range(N):
            run.log({**_good(i), **({"bad": "boom"} if i == POISON_AT else {})}, step=i)
        st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "closed"], run.summary()
    for key in GOOD:
        assert sorted(s for s, k in sink.points if k == key) == list(range(N))
    assert not any(k == "bad" for _s, k in sink.points)


def test_worker_backstop_still_fails_a_tracker_that_is_down(tmp_path):
    sink = _Picky(down=True)
    with logger_warnings("sink picky", "failed"):
        run = trackbridge.init(sinks=[sink], source="canonical", spool=str(tmp_path / "spool"), run_id="down",
                               options=trackbridge.LoggerOptions(retries=0, backoff=0.0, retry_interval=3600))
        for i in range(5):
            run.log(_good(i), step=i)
        st = run.finish()
    assert [s["state"] for s in st["sinks"]] == ["closed", "failed"]


@pytest.mark.parametrize("slow, probes", [(0.0, 3), (0.3, 0)])
def test_a_tracker_that_fails_slowly_is_not_probed_value_by_value(tmp_path, monkeypatch, slow, probes):
    """A refusal is quick: a batch that failed fast is written again record by record, then in halves, to find a
    value the tracker refuses (three attempts before it is judged down). A tracker that takes ISOLATE_WITHIN seconds
    to fail (a timeout, a locked MLflow store: 20 s a call) is down: probing it would multiply the wait (80 s instead
    of 20 for a locked store)."""
    from trackbridge.logger import worker
    monkeypatch.setattr(worker, "ISOLATE_WITHIN", 0.2)
    sink = _Picky(down=True, slow=slow)
    with logger_warnings("sink picky", "failed"):
        run = trackbridge.init(sinks=[sink], source="canonical", spool=str(tmp_path / "spool"), run_id="slow",

                               options=trackbridge.LoggerOptions(retries=0, backoff=0.0, retry_interval=3600,
                                                                 writer="thread"))
        run.log(_good(0), step=0)
        deadline = time.monotonic() + 30
        while run.status["sinks"][1]["state"] != "failed":
            assert time.monotonic() < deadline, run.status
            time.sleep(0.02)
        assert sink.calls == 1 + probes, sink.calls
        run.finish(timeout=5)


@pytest.mark.parametrize("sinks, said", [(["jsonl", "wandb"], 0), (["jsonl", "tensorboard"], 1)])
def test_keys_that_flatten_alike_are_said_only_where_a_tracker_flattens(tmp_path, sinks, said):
    """"opt/beta" and {"opt": {"beta"}} are two keys to the spool and to wandb, one to TensorBoard's hparams: a run
    with no tracker that flattens the config says nothing, one with TensorBoard says it once."""
    import trackbridge

    where = {"jsonl": f"jsonl:{tmp_path}/runs", "wandb": f"wandb:{tmp_path}/wb",
             "tensorboard": f"tensorboard:{tmp_path}/tb"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = trackbridge.init(project="p", name="flat", sinks=[where[s] for s in sinks], source="canonical",
                               spool=str(tmp_path / "spool"), run_id="flat",
                               config={"opt": {"beta": 0.9}, "opt/beta": 0.95})
        run.log({"reward/mean": 1.0}, step=0)
        run.finish()
    texts = [str(w.message) for w in caught]
    assert sum("both flatten to 'opt/beta'" in w for w in texts) == said, texts
    assert [w for w in texts if "failed" in w] == []
