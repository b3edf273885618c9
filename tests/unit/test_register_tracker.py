"""A tracker from outside the package plugs in with one call to ``trackbridge.register_tracker``: the logger writes to
it, ``migrate`` copies into it, ``open_source`` reads it back, ``guess_locator`` recognises its folders.

The tracker here ("mytracker") is defined in this file: one ``<run_id>.mytrk`` file per run in a folder, a JSON header
line with the run info, then ``step,wall_time,key,value`` lines (CSV-like)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Iterator

import pytest

import trackbridge
from trackbridge.logger import LoggerWarning
from trackbridge.record import Record, RunInfo
from trackbridge.trackers import guess_locator, kinds, make_sink, open_source
from trackbridge.tracking.locators import LocatorError
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
    # writer="auto" takes threads for a tracker registered only in this process, and says why
    with pytest.warns(LoggerWarning, match="registered in this process .* threads of the training process"):
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
    with pytest.raises(trackbridge.UsageError, match="registered already"):
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


class _NoWrite(Sink):
    def open(self, run: RunInfo, *, resume: bool = False) -> None: ...
    def close(self) -> None: ...


@pytest.mark.parametrize("kwargs, message", [
    ({"sink": object}, r"sink <class 'object'> is not a subclass of trackbridge\.tracking\.Sink"),
    ({"sink": MySource}, r"sink .*MySource.* is not a subclass of trackbridge\.tracking\.Sink"),
    ({"source": MySink}, r"source .*MySink.* is not a subclass of trackbridge\.tracking\.Source"),
    ({"sink": MySink()}, r"is not a subclass of trackbridge\.tracking\.Sink"),
    ({"sink": _NoWrite}, r"sink _NoWrite does not implement write"),
    ({"source": MySource, "sniff": "not callable"}, r"sniff='not callable' is not 'package\.module:attribute'"),
    ({"source": MySource, "sniff": 42}, r"sniff 42 is not callable"),
    ({"sink": "no colon here"}, r"sink='no colon here' is not 'package\.module:attribute'"),
    ({"sink": MySink, "requires": "wandb"}, r"requires='wandb' must be a list of import names"),
    ({"sink": MySink, "requires": ("not a module",)}, r"must be a list of import names"),
    ({"sink": MySink, "extra": "Not An Extra"}, r"extra='Not An Extra' must be the name of a trackbridge extra"),
])
def test_registration_checks_what_accelerate_checks(kwargs, message):
    """Accelerate's ``register_tracker_class`` (huggingface/accelerate@665444ce, src/accelerate/tracking.py) refuses
    a class that is not a ``GeneralTracker`` subclass or lacks its required attributes, at registration; so does
    ``register_tracker``, for each role, with one line naming the kind, the role and what is wrong."""
    with pytest.raises(trackbridge.UsageError, match=message):
        trackbridge.register_tracker("checked", **kwargs)
    assert "checked" not in kinds()


def test_a_registration_by_name_is_checked_when_first_used(tmp_path):
    trackbridge.register_tracker("lazy", sink="tests_nowhere.module:Thing")
    trackbridge.register_tracker("lazy2", sink="trackbridge.record:Record")
    trackbridge.register_tracker("lazy3", sink="trackbridge.record:NoSuchName")
    try:
        with pytest.raises(ModuleNotFoundError):
            make_sink(f"lazy:{tmp_path}")
        with pytest.raises(trackbridge.UsageError, match=r"lazy2.*'trackbridge.record:Record' is not a subclass"):
            make_sink(f"lazy2:{tmp_path}")
        with pytest.raises(trackbridge.UsageError, match=r"names no attribute 'NoSuchName' of trackbridge.record"):
            make_sink(f"lazy3:{tmp_path}")
    finally:
        for k in ("lazy", "lazy2", "lazy3"):
            trackbridge.unregister_tracker(k)


def test_replacing_a_built_in_tracker_warns_and_a_sink_says_its_registered_kind(tmp_path):
    from trackbridge.trackers import tracker
    builtin, order = tracker("jsonl"), kinds()
    with pytest.warns(UserWarning, match="replaces the built-in jsonl tracker"):
        trackbridge.register_tracker("jsonl", sink=MySink, replace=True)
    try:
        sink = make_sink(f"jsonl:{tmp_path}")
        assert isinstance(sink, MySink)
    finally:
        with pytest.warns(UserWarning):
            trackbridge.register_tracker("jsonl", sink=builtin.sink, source=builtin.source, sniff=builtin.sniff,
                                         replace=True)
    assert kinds() == order                      # a replaced kind keeps its place in the order sniff() is tried
    # the same class under another name: its locator (what replay and the writer process re-open) names that kind
    trackbridge.register_tracker("other-name", sink=MySink)
    try:
        assert make_sink(f"other-name:{tmp_path}").locator() == f"other-name:{tmp_path}"
    finally:
        trackbridge.unregister_tracker("other-name")


@pytest.mark.parametrize("locator, message", [
    ("jsonl:{d}?fsnyc=1", r"jsonl:.*: unknown option 'fsnyc' \(did you mean 'fsync'\?\); the jsonl sink takes fsync"),
    pytest.param("mlflow:sqlite:///{d}/m.db?experimnet=grpo",
                 r"unknown option 'experimnet' \(did you mean 'experiment'\?\); the mlflow sink takes artifacts, "
                 r"bulk, experiment, run",
                 marks=pytest.mark.skipif(importlib.util.find_spec("mlflow") is None,
                                          reason="needs the [mlflow] extra (make test installs it)")),
    ("tensorboard:{d}?zzz=1", r"unknown option 'zzz'; the tensorboard sink takes bins$"),
])
def test_a_misspelt_sink_option_is_refused_naming_the_known_ones(tmp_path, locator, message):
    loc = locator.format(d=tmp_path)
    with pytest.raises(LocatorError, match=message):
        make_sink(loc)
    with pytest.raises(trackbridge.UsageError, match=message.rstrip("$")):
        trackbridge.init(sinks=[loc], spool=str(tmp_path / "spool"))
    from trackbridge.cli import main
    assert main(["migrate", f"jsonl:{tmp_path / 'spool'}", loc, "--quiet"]) == 2
    assert not (tmp_path / "m.db").exists()


def test_a_misspelt_reader_option_is_refused_everywhere(tmp_path, capsys):
    log = tmp_path / "verl.log"
    log.write_text("step:1 - actor/pg_loss:0.5\n")
    with pytest.raises(LocatorError, match=r"unknown option 'stpe' \(did you mean 'step'\?\); the console reader "
                                           r"takes from, step"):
        open_source(f"console:{log}?stpe=x")
    from trackbridge.cli import main
    for argv in (["translate", f"console:{log}?stpe=x"], ["detect", f"console:{log}?stpe=x"],
                 ["migrate", f"console:{log}?stpe=x", f"jsonl:{tmp_path / 'out'}", "--quiet"],
                 ["compare", f"console:{log}?stpe=x", "--out", str(tmp_path / "cmp")]):
        assert main(argv) == 2, argv
        assert "unknown option 'stpe'" in capsys.readouterr().err, argv
    assert not (tmp_path / "out").exists()
    assert main(["translate", f"console:{log}?from=verl&step=step"]) == 0        # the known ones still work


def test_every_built_in_reader_and_sink_declares_its_options():
    from trackbridge.extras import MissingExtra
    from trackbridge.trackers import tracker
    missing, checked = [], 0
    for kind in kinds():
        entry = tracker(kind)
        for role in ("sink", "source"):
            if getattr(entry, role) is not None:
                try:
                    cls = entry.sink_class() if role == "sink" else entry.source_class()
                except MissingExtra as exc:      # make test-quick installs no tracker package (make test every one)
                    missing.append(str(exc).split(":")[0])
                    continue
                assert isinstance(cls.option_names, tuple), (kind, role)
                checked += 1
    assert checked >= 8, checked                 # the jsonl, file readers and tensorboard ones at least
    if missing:
        pytest.skip(f"the classes of these could not be imported: {'; '.join(missing)}")


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
                         spool=str(tmp_path / "spool"), options=trackbridge.LoggerOptions(writer="process"))


def test_a_missing_package_of_a_reader_or_sink_is_one_line_naming_the_extra(tmp_path):
    """The registry asks for a kind's packages when its sink or reader class is asked for, before anything is read
    or written; the reader may need other packages than the sink (``source_requires``)."""
    from trackbridge.extras import MissingExtra
    from trackbridge.trackers import open_source

    trackbridge.register_tracker("needy", sink=MySink, source=MySource, requires=("no_such_package_xyz",),
                                 extra="needy")
    trackbridge.register_tracker("halfneedy", sink=MySink, source=MySource, requires=("no_such_package_xyz",),
                                 source_requires=(), extra="needy")
    try:
        with pytest.raises(MissingExtra) as err:
            make_sink(f"needy:{tmp_path / 'n'}")
        assert str(err.value) == ("the needy sink needs the [needy] extra (no_such_package_xyz is not installed): "
                                  "pip install 'trackbridge[needy]'")
        assert isinstance(err.value, trackbridge.UsageError) and isinstance(err.value, ImportError)
        assert err.value.name == "no_such_package_xyz" and err.value.extra == "needy"
        with pytest.raises(MissingExtra, match="^the needy reader needs the \\[needy\\] extra"):
            open_source(f"needy:{tmp_path}")
        assert open_source(f"halfneedy:{tmp_path}").location == str(tmp_path)      # its reader needs nothing
        with pytest.raises(MissingExtra, match="^the halfneedy sink needs"):
            make_sink(f"halfneedy:{tmp_path / 'n'}")
        assert not (tmp_path / "n").exists()
    finally:
        trackbridge.unregister_tracker("needy")
        trackbridge.unregister_tracker("halfneedy")


def test_missing_extra_message_without_an_extra_names_the_package():
    from trackbridge.extras import MissingExtra, installed, require

    assert installed("yaml") and not installed("no_such_package_xyz")
    require(("yaml", "json"), "core", "this")                   # nothing missing: no error
    with pytest.raises(MissingExtra) as err:
        require(("yaml", "no_such_package_xyz"), "", "my tracker")
    assert str(err.value) == "my tracker needs the 'no_such_package_xyz' package, which is not installed"
    assert str(err.value.about("sink 'x:y'")).startswith("sink 'x:y' needs the 'no_such_package_xyz' package")


class PickySink(MySink):
    """Refuses one key, as a tracker refuses what it cannot hold (SwanLab a re-logged step, ClearML a NaN)."""

    capabilities = Capabilities(wall_time=True, resolution=("values rounded to the cent",))

    def write(self, records: list[Record]) -> None:
        kept = []
        for rec in records:
            if "bad" in rec.metrics:
                self.reject("bad", rec.step, "this tracker cannot take it")
            kept.append(Record(rec.step, rec.wall_time, {k: v for k, v in rec.metrics.items() if k != "bad"}))
        super().write(kept)


def test_migrate_names_what_the_destination_left_out_and_its_resolution(tmp_path, capsys):
    trackbridge.register_tracker("picky", sink=PickySink, source=MySource)
    try:
        src = tmp_path / "in.jsonl"
        src.write_text("".join(json.dumps({"step": s, "wall_time": 100.0 + s, "good": s * 1.5, "bad": 1.0}) + "\n"
                               for s in range(1, 4)))
        from trackbridge.cli import main
        assert main(["migrate", f"jsonl:{src}", f"picky:{tmp_path / 'out'}", "--names", "keep"]) == 1
        err = capsys.readouterr().err
        assert "left out by picky in in: bad, 3 point(s) from step 1 (this tracker cannot take it)" in err
        assert "kept to picky's resolution: values rounded to the cent" in err
        assert _points(f"picky:{tmp_path / 'out'}") == {s: {"good": s * 1.5} for s in (1, 2, 3)}
    finally:
        trackbridge.unregister_tracker("picky")
