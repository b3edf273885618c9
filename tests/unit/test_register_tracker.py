"""A tracker from outside the package plugs in with one call to ``trackbridge.register_tracker``: the logger writes to
it, ``migrate`` copies into it, ``open_source`` reads it back, ``guess_locator`` recognises its folders.

The tracker here ("mytracker") is defined in this file: one ``<run_id>.mytrk`` file per run in a folder, a JSON header
line with the run info, then ``step,wall_time,key,value`` lines (CSV-like)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

import trackbridge
from trackbridge.locators import LocatorError
from trackbridge.record import Record, RunInfo
from trackbridge.trackers import guess_locator, kinds, make_sink, open_source
from trackbridge.tracking.sink import Capabilities, Sink
from trackbridge.tracking.source import RunReader, Source, SourceError


class MySink(Sink):
    kind = "mytracker"
    capabilities = Capabilities(wall_time=True)

    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        folder = Path(self.location)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{run.run_id}.mytrk"
        if not (resume and self.path.exists()):
            self.path.write_text(json.dumps(run.to_json()) + "\n")

    def write(self, records: list[Record]) -> None:
        with open(self.path, "a") as fh:
            for rec in records:
                for key, value in rec.metrics.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        fh.write(f"{rec.step},{rec.wall_time},{key},{value!r}\n")

    def close(self) -> None:
        pass


class MyRun(RunReader):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._info = RunInfo.from_json(json.loads(path.read_text().splitlines()[0]))

    @property
    def info(self) -> RunInfo:
        return self._info

    def records(self) -> Iterator[Record]:
        rows: dict[int, Record] = {}
        for line in self.path.read_text().splitlines()[1:]:
            step, wall, key, value = line.split(",", 3)
            rec = rows.setdefault(int(step), Record(step=int(step), wall_time=float(wall), metrics={}))
            rec.metrics[key] = float(value)
        yield from (rows[s] for s in sorted(rows))


class MySource(Source):
    kind = "mytracker"

    def runs(self) -> Iterator[RunReader]:
        files = sorted(Path(self.location).glob("*.mytrk"))
        if not files:
            raise SourceError(f"mytracker:{self.location}: no runs")
        return (MyRun(f) for f in files)


def my_sniff(path_or_uri: str) -> bool:
    p = Path(path_or_uri)
    return p.is_dir() and any(p.glob("*.mytrk"))


@pytest.fixture
def mytracker():
    entry = trackbridge.register_tracker("mytracker", sink=MySink, source=MySource, sniff=my_sniff)
    yield entry
    trackbridge.unregister_tracker("mytracker")


def _points(loc: str) -> dict[int, dict[str, float]]:
    (reader,) = list(open_source(loc).runs())
    return {rec.step: rec.metrics for rec in reader.records()}


def test_logger_migrate_and_readers_use_a_registered_tracker(mytracker, tmp_path):
    out = tmp_path / "mine"
    run = trackbridge.init(project="p", name="r", run_id="r1", sinks=[f"mytracker:{out}"],
                           spool=str(tmp_path / "spool"), source="canonical")
    for step in range(1, 4):
        run.log({"loss": 1.0 / step, "reward/mean": float(step)}, step=step)
    run.finish()
    assert _points(f"mytracker:{out}") == {s: {"loss": 1.0 / s, "reward/mean": float(s)} for s in (1, 2, 3)}
    assert guess_locator(str(out)) == f"mytracker:{out}"

    from trackbridge.cli import main
    copy = tmp_path / "copy"
    assert main(["migrate", f"jsonl:{tmp_path / 'spool'}", f"mytracker:{copy}", "--quiet"]) == 0
    assert _points(f"mytracker:{copy}") == _points(f"mytracker:{out}")
    (reader,) = list(open_source(f"mytracker:{copy}").runs())
    assert reader.info.name == "r"


def test_registration_is_checked(mytracker, tmp_path):
    assert "mytracker" in kinds("sink") and "mytracker" in kinds("source")
    with pytest.raises(ValueError, match="registered already"):
        trackbridge.register_tracker("mytracker", sink=MySink)
    with pytest.raises(ValueError, match="bad name"):
        trackbridge.register_tracker("my tracker", sink=MySink)
    with pytest.raises(ValueError, match="a sink, a source or both"):
        trackbridge.register_tracker("nothing")
    trackbridge.register_tracker("readonly", source=MySource)
    try:
        with pytest.raises(LocatorError, match="unknown kind 'readonly'"):
            make_sink(f"readonly:{tmp_path}")
        assert "readonly" in kinds("source") and "readonly" not in kinds("sink")
    finally:
        trackbridge.unregister_tracker("readonly")
    trackbridge.unregister_tracker("mytracker")
    with pytest.raises(LocatorError, match="unknown kind 'mytracker'"):
        make_sink(f"mytracker:{tmp_path}")


def test_a_missing_package_fails_init_naming_the_extra(tmp_path):
    trackbridge.register_tracker("needy", sink=MySink, requires=("no_such_package_xyz",), extra="needy")
    try:
        with pytest.raises(ValueError, match="no_such_package_xyz.*trackbridge\\[needy\\]"):
            trackbridge.init(sinks=[f"needy:{tmp_path / 'n'}"], spool=str(tmp_path / "spool"))
    finally:
        trackbridge.unregister_tracker("needy")


@pytest.mark.parametrize("file, target, kind", [
    ("events.out.tfevents.1.host", ".", "tensorboard"),
    ("run-x.wandb", "run-x.wandb", "wandb"),
    ("trainer_state.json", ".", "trainer-state"),
    ("a.jsonl", ".", "jsonl"),
    ("a.csv", "a.csv", "csv"),
    ("train.log", "train.log", "console"),
])
def test_built_in_sniffers(tmp_path, file, target, kind):
    (tmp_path / file).write_text("")
    path = tmp_path if target == "." else tmp_path / target
    assert guess_locator(str(path)) == f"{kind}:{path}"


def test_sniffers_tell_mlflow_and_trackio_databases_apart(tmp_path):
    import sqlite3
    for name, tables in (("ml.db", ("experiments", "latest_metrics")), ("tio.db", ("metrics", "configs")),
                         ("other.sqlite", ("stuff",))):
        with sqlite3.connect(tmp_path / name) as conn:
            for t in tables:
                conn.execute(f"CREATE TABLE {t} (x)")
    assert guess_locator(str(tmp_path / "ml.db")) == f"mlflow:{tmp_path / 'ml.db'}"
    assert guess_locator(f"sqlite:///{tmp_path / 'ml.db'}") == f"mlflow:sqlite:///{tmp_path / 'ml.db'}"
    assert guess_locator(str(tmp_path / "tio.db")) == f"trackio:{tmp_path / 'tio.db'}"
    assert guess_locator(str(tmp_path / "other.sqlite")) is None
    assert guess_locator(str(tmp_path / "missing")) is None


def test_writer_process_refuses_a_tracker_it_cannot_load(mytracker, tmp_path):
    """A tracker registered in this process does not exist in the writer process: said at init, naming it."""
    with pytest.raises(ValueError, match=r"mytracker:.*writer='thread'"):
        trackbridge.init(project="p", name="r", sinks=[f"mytracker:{tmp_path / 'mine'}"],
                         spool=str(tmp_path / "spool"), writer="process")
