"""MLflow sink: ``mlflow:URI[?experiment=NAME&run=RUN_ID&artifacts=DIR]`` written through ``MlflowClient``.

Why the client and not the fluent API: several runs (and several sinks) must coexist in one process, and the fluent
API keeps one global active run.

Locations (``URI``):

* ``sqlite:///path.db`` (MLflow's default store since 3.7), or a bare ``path.db``;
* ``http://127.0.0.1:PORT`` (a tracking server);
* a directory or ``file:`` URI (the deprecated file store: MLflow >= 3.7 refuses it unless
  ``MLFLOW_ALLOW_FILE_STORE=true``, which this sink sets for that location only if it is unset).

This sink (and the reader) also set ``MLFLOW_DISABLE_TELEMETRY=true`` when unset: MLflow otherwise tries to reach a
telemetry host even for a local store; and ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false`` when unset.

What goes where in the MLflow run:

* metrics -> ``log_batch`` in chunks of at most 1000, with ``timestamp = round(wall_time * 1000)`` (ms) and the
  record's step (records without a step continue from the last one); for a local SQLite store the same rows are
  inserted in bulk (:mod:`trackbridge.trackers.mlflow.bulk`, ``?bulk=0`` to use ``log_batch`` there too);
* ``run.config`` -> params, flattened with dotted keys (``optim.lr``); values are JSON for non-strings, cut to 6000
  characters; params are immutable in MLflow, so on resume existing keys are skipped;
* ``run.tags`` -> tags (values cut to 8000 characters);
* names MLflow refuses (``@ , [ ] ( )``, ``//``, over 250 characters ...) are escaped reversibly by
  :mod:`~trackbridge.trackers.mlflow.names` (``mean@1`` -> ``mean_x40_1``); tag ``trackbridge.key_escape`` names the
  scheme and the chunked JSON tag ``trackbridge.names`` holds every stored -> original pair (needed for shortened
  names);
* histograms -> summary metrics ``<name>/mean``, ``/std``, ``/min``, ``/max``, ``/count``; the chunked JSON tag
  ``trackbridge.histogram_summaries`` lists the histogram names so readers know these are summaries;
* strings -> a JSON-lines text artifact per written batch, ``trackbridge/text/<content hash>.jsonl``, each line
  ``{"step", "timestamp" (ms), "wall_time", "name", "value"}`` (the content hash makes rewriting the same batch
  idempotent);
* the :class:`~trackbridge.record.RunInfo` itself -> chunked JSON tag ``trackbridge.run`` so name, tags and config
  round-trip exactly (params alone are flattened strings).

A "chunked JSON tag" ``P`` is stored as tags ``P.count`` and ``P.0`` .. ``P.<count-1>`` (at most 7000 characters
each, under MLflow's 8000-character tag limit), joined in order.

Values: NaN is stored as NaN; MLflow clamps +-inf to +-1.7976931348623157e308 (the largest double); the reader
turns that value back into +-inf for runs marked by this sink. ``None`` values are skipped (MLflow has no
"missing"), booleans become 0.0/1.0. The SQL store ignores a row identical in (key, value, timestamp, step) to one
it already holds, so replaying the same records into the same run adds nothing; the file store does not
de-duplicate.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ...record import Record, RunInfo
from ...record.values import flat_config, printable, utf8_ok
from ...tracking import names as _sanitize
from ...tracking.sink import HISTOGRAM, TEXT, Capabilities, Sink, SinkError, Unreachable, check_reachable, value_kind
from .bulk import BulkWriter
from .client import (
    TAG_DERIVED,
    TAG_ESCAPE,
    TAG_HIST,
    TAG_NAMES,
    TAG_RUN,
    TAG_RUN_ID,
    TEXT_DIR,
    chunk_tags,
    make_client,
    read_chunked,
    retry_locked,
    tracking_uri,
)
from .held import held as read_held
from .held import last_step as read_last_step
from .names import mlflow_key, mlflow_valid
from .store import check_sqlite_store, create_sqlite_store, sqlite_path

if TYPE_CHECKING:       # pragma: no cover
    from ...sync.holdings import Holdings

MAX_METRICS_PER_BATCH = 1000
#: points per transaction of the SQLite bulk path: a batch of 10,000 keys x 100 steps is 20 transactions, each a tick
#: of :attr:`progress`, so that a store busy with a big batch is never judged stalled (and other writers of a shared
#: store wait for one chunk, not the whole batch); INSERT OR IGNORE makes a chunk retried after a failure harmless
BULK_CHUNK = 50_000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_PARAM_VAL = 6000
MAX_TAG_VAL = 8000
SUMMARY_STATS = ("mean", "std", "min", "max", "count")


def _check_reachable(location: str) -> None:
    """For a tracking server, a quick TCP connect: a server that is down fails at once with a clear error."""
    uri = tracking_uri(location)
    if uri.startswith(("http://", "https://")):
        try:
            check_reachable(uri, timeout=3.0)
        except Unreachable as exc:
            raise SinkError(f"mlflow:{location}: tracking server {exc.host}:{exc.port} is not reachable "
                            f"({exc.reason})") from None


def param_value(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)
    return text[:MAX_PARAM_VAL]


class _Point(NamedTuple):
    """A metric point for the bulk path (the fields of ``mlflow.entities.Metric`` it reads)."""
    key: str
    value: float
    timestamp: int
    step: int


def _metric_key(m: Any) -> str:
    return m.key


def _ms(wall_time: float | None) -> int:
    return int(round((time.time() if wall_time is None else wall_time) * 1000))


# -- the sink ---------------------------------------------------------------------------------------------
class MlflowSink(Sink):
    """Writes records to one MLflow run (see the module docstring for the layout)."""

    kind = "mlflow"
    option_names = ("experiment", "run", "artifacts", "bulk")
    #: a param value keeps its first 6,000 characters (``param_value``): ``init`` says so per key (..limits)
    config_value_chars = MAX_PARAM_VAL
    capabilities = Capabilities(histograms=False, text=True, nan=True, wall_time=True,
                                flat_config=(".", "MLflow's params"), resolution=(
        "wall times to the millisecond", "histograms as summary statistics (<name>/mean, /std, /min, /max, /count)"))

    def __init__(self, location: str = "", **options: str) -> None:
        super().__init__(location, **options)
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._names = _sanitize.NameCache(mlflow_key)
        self._hist: set[str] = set()
        self._keys: dict[str, str] = {}     # name -> stored key, for names already taken as plain numbers
        self._next_step = 0
        self._closed = False
        self._text_seq = 0
        self._last_auto_ms = 0      # records without a wall time get distinct, increasing timestamps
        self._bulk: BulkWriter | None = None   # local SQLite store: bulk inserts (see bulk.py)

    @classmethod
    def check_location(cls, location: str) -> None:
        check_sqlite_store(location)          # an SQLite file that is not an MLflow store is refused

    @classmethod
    def local_path(cls, location: str) -> Path | None:
        db = sqlite_path(location)
        if db is not None or "://" in location or location.startswith("file:"):
            return db
        return Path(location).expanduser()

    # -- open ------------------------------------------------------------------------------------------
    def open(self, run: RunInfo, *, resume: bool = False) -> None:
        self.run = run
        self._closed = False                  # reopened after a failure: close() must end the run again
        _check_reachable(self.location)       # fail in a moment, not after MLflow's HTTP retries
        check_sqlite_store(self.location)     # an SQLite file that is not an MLflow store: refused, left untouched
        db = sqlite_path(self.location)
        if db is not None:
            create_sqlite_store(db)           # a new store is made whole beside it, then moved into place
        try:
            self.client = make_client(self.location)
        except Exception as exc:  # noqa: BLE001 - report which sink failed and why
            raise SinkError(f"mlflow:{self.location}: cannot create an MLflow client: {exc}") from exc
        if self.options.get("bulk", "1") != "0":
            self._bulk = BulkWriter.for_client(self.client, tracking_uri(self.location))
        run_id = self.options.get("run")
        try:
            if run_id:                      # an explicit MLflow run id: reopen exactly that run
                self._reopen(run_id)
            elif resume and run.run_id and (found := self._find(run)) is not None:
                self._reopen(found)         # trackbridge's run id is kept in a tag of the MLflow run
            else:
                self._create(run)
            self._log_params(run)
            self._put_tags({TAG_ESCAPE: _sanitize.SCHEME, **self._run_tags()})
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SinkError(f"mlflow:{self.location}: cannot open run: {exc}") from exc
        last = self.last_step()
        self._next_step = 0 if last is None else last + 1

    def _experiment(self, run: RunInfo) -> str:
        name = self.options.get("experiment") or run.project or "trackbridge"
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        artifact_location = self.options.get("artifacts")
        uri = tracking_uri(self.location)
        if artifact_location is None and uri.startswith("sqlite:///"):
            # keep artifacts next to the database instead of under the current directory
            db = Path(uri[len("sqlite:///"):])
            artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
        elif artifact_location is not None and "://" not in artifact_location:
            artifact_location = Path(artifact_location).resolve().as_uri()
        from mlflow.exceptions import MlflowException
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:
            # another process or worker made it between the look-up and here (a new store or server, several
            # writers: RESOURCE_ALREADY_EXISTS, or the store's raw UNIQUE constraint on the name): theirs is ours
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _find(self, run: RunInfo) -> str | None:
        """The MLflow run that holds trackbridge run ``run.run_id`` in this experiment, if any."""
        name = self.options.get("experiment") or run.project or "trackbridge"
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            return None
        rid = str(run.run_id).replace("'", "")
        found = self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_RUN_ID}` = '{rid}'",
                                        max_results=1)
        return found[0].info.run_id if found else None

    def _create(self, run: RunInfo) -> None:
        self.experiment_id = self._experiment(run)
        tags = {self._names(k) if not mlflow_valid(k) else k: str(v)[:MAX_TAG_VAL]
                for k, v in (run.tags or {}).items()}
        if run.run_id:
            tags[TAG_RUN_ID] = str(run.run_id)
        created = self.client.create_run(self.experiment_id, run_name=run.name, tags=tags)
        self.run_id = created.info.run_id
        self._existing_params: dict[str, str] = {}

    def _reopen(self, run_id: str) -> None:
        from mlflow.exceptions import MlflowException
        try:
            existing = self.client.get_run(run_id)
        except MlflowException as exc:
            raise SinkError(f"mlflow:{self.location}: no run {run_id!r} to resume ({exc.message})") from None
        self.run_id = run_id
        self.experiment_id = existing.info.experiment_id
        self._existing_params = dict(existing.data.params)
        tags = existing.data.tags
        names = read_chunked(tags, TAG_NAMES)
        if names:
            for stored, original in json.loads(names).items():
                self._names._cache[original] = stored
                self._names.changed[stored] = original
        hist = read_chunked(tags, TAG_HIST)
        if hist:
            self._hist.update(json.loads(hist))
        if existing.info.status != "RUNNING":
            self.client.update_run(run_id, status="RUNNING")

    def _log_params(self, run: RunInfo) -> None:
        from mlflow.entities import Param
        params = []
        for key, value in flat_config(run.config or {}).items():
            stored = self._names(key)
            if stored in self._existing_params:
                continue   # params are immutable: a resumed run keeps what it has
            params.append(Param(stored, param_value(value)))
            self._existing_params[stored] = params[-1].value
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    def _run_tags(self) -> dict[str, str]:
        """The RunInfo, name map and histogram list as chunked tags."""
        assert self.run is not None
        info = self.run.to_json()
        info["sanitized"] = dict(self._names.changed)
        info["extra"] = {**(info.get("extra") or {}), "histogram_summaries": sorted(self._hist)}
        tags = chunk_tags(TAG_RUN, json.dumps(info, ensure_ascii=False, default=str, allow_nan=True))
        tags.update(chunk_tags(TAG_NAMES, json.dumps(self._names.changed, ensure_ascii=False)))
        tags.update(chunk_tags(TAG_HIST, json.dumps(sorted(self._hist), ensure_ascii=False)))
        derived = (self.run.extra or {}).get("derived")
        if derived:       # derived (not logged) metrics, marked where a user sees them: a run tag
            tags.update(chunk_tags(TAG_DERIVED, json.dumps(derived, ensure_ascii=False)))
        return tags

    def _put_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag
        items = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=items[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    # -- write -----------------------------------------------------------------------------------------
    def write(self, records: list[Record]) -> None:
        if self.client is None or self.run_id is None:
            raise SinkError(f"mlflow:{self.location}: write() before open()")
        from mlflow.entities import Metric
        point = _Point if self._bulk is not None else Metric    # the bulk path needs no MLflow entity
        keys = self._keys
        metrics: list[Any] = []
        texts: list[dict[str, Any]] = []
        hist_before = len(self._hist)
        for rec, step, wall in self.points(records, why="MLflow keeps steps in signed 64-bit integers; the record "
                                                        "is left out"):
            ts = _ms(wall)
            if rec.wall_time is None:
                # two records of one step written in the same millisecond would otherwise be merged by readers
                # (points are grouped by (step, timestamp)) and identical rows dropped by the SQL store
                ts = self._last_auto_ms = max(ts, self._last_auto_ms + 1)
            for name, value in rec.metrics.items():
                t = type(value)
                if (t is float or t is int) and name in keys:     # the common case, cheaply
                    metrics.append(point(keys[name], float(value), ts, step))
                elif value is not None:
                    self._add(point, metrics, texts, name, value, ts, step, rec.wall_time)
        # by key (stable: steps keep their order): each log_batch then touches few keys, and MLflow's SQL store
        # updates latest_metrics per key of a batch -- 1.75x faster with 500 keys per step (benchmarks/bench_migrate.py)
        metrics.sort(key=_metric_key)
        if self._bulk is not None:
            for i in range(0, len(metrics), BULK_CHUNK):
                retry_locked(self._bulk.write, self.run_id, metrics[i:i + BULK_CHUNK])   # a held store: waited for
                self.progress += 1
        else:
            for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                self._log_metrics(metrics[i:i + MAX_METRICS_PER_BATCH])
                self.progress += 1
        if texts:
            self._write_texts(texts)
        new = self._names.take_new()
        if new:
            self.record_sanitized(new)
        derived = self.note_derived(records)
        axes = self.note_axes(records)
        if new or derived or axes or len(self._hist) != hist_before:
            self._put_tags(self._run_tags())

    def _add(self, point: Any, metrics: list[Any], texts: list[dict[str, Any]], name: str, value: Any, ts: int,
             step: int, wall_time: float | None) -> None:
        """One value that is not a plain number under a known name: a histogram, a text, a new name, or one MLflow
        cannot take (left out of this record only, reported through :meth:`Sink.reject`)."""
        try:
            kind = value_kind(value)
            if kind is HISTOGRAM:
                summary = [(self._key(f"{name}/{stat}"), float(v)) for stat, v in value.summary().items()]
                self._hist.add(name)
                metrics.extend(point(k, v, ts, step) for k, v in summary)
            elif kind is TEXT:
                if not (utf8_ok(name) and utf8_ok(value)):
                    raise ValueError("a lone surrogate (invalid Unicode) in the name or the text")
                texts.append({"step": step, "timestamp": ts, "wall_time": wall_time, "name": name, "value": value})
            else:
                try:
                    number = float(value)
                except (TypeError, ValueError, OverflowError):
                    raise ValueError(f"cannot store a {type(value).__name__} value {str(value)[:40]}") from None
                metrics.append(point(self._key(name), number, ts, step))
                if type(value) in (float, int):
                    self._keys[name] = metrics[-1].key
        except (SinkError, ValueError) as exc:     # this key only: the rest of the record is written
            self.reject_value(name, step, printable(str(exc))[:300])

    def _log_metrics(self, chunk: list[Any]) -> None:
        """One ``log_batch`` request. A server refuses a whole request holding a point it already has (UNIQUE
        constraint: same key, step, timestamp and value; a request that landed before its answer was lost, or a
        catch-up racing a late write): then only the points it lacks are sent again."""
        from mlflow.exceptions import MlflowException
        try:
            self.client.log_batch(self.run_id, metrics=chunk)
        except MlflowException as exc:
            if "UNIQUE constraint" not in str(exc) and "IntegrityError" not in str(exc):
                raise
            held = self._held_exact(chunk)
            rest = [m for m in chunk if (m.key, m.step, m.timestamp, m.value) not in held]
            if rest:
                self.client.log_batch(self.run_id, metrics=rest)

    def _held_exact(self, chunk: list[Any]) -> set[tuple[str, int, int, float]]:
        """(key, step, timestamp, value) of the stored points of the keys in ``chunk`` at its steps."""
        low = min(m.step for m in chunk)
        out = set()
        for key in {m.key for m in chunk}:
            for m in self.client.get_metric_history(self.run_id, key):
                if m.step >= low:
                    out.add((m.key, m.step, m.timestamp, m.value))
        return out

    def _key(self, name: str) -> str:
        if not utf8_ok(name):
            raise SinkError(f"mlflow:{self.location}: metric name with a lone surrogate (invalid Unicode)")
        try:
            return self._names(name)
        except ValueError as exc:
            raise SinkError(f"mlflow:{self.location}: {exc}") from None

    def _write_texts(self, texts: list[dict[str, Any]]) -> None:
        body = "".join(json.dumps(t, ensure_ascii=False, allow_nan=True) + "\n" for t in texts)
        digest = hashlib.sha1(body.encode("utf-8")).hexdigest()[:16]
        self.client.log_text(self.run_id, body, f"{TEXT_DIR}/{digest}.jsonl")

    # -- close / resume --------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed or self.client is None or self.run_id is None:
            self._closed = True
            return
        self._closed = True
        self._put_tags(self._run_tags())
        status = {"failed": "FAILED", "killed": "KILLED"}.get(self.outcome, "FINISHED")
        self.client.set_terminated(self.run_id, status=status)

    def last_step(self) -> int | None:
        """Highest step among the run's latest metric values (MLflow keeps the max-step point per key)."""
        if self.client is None or self.run_id is None:
            return None
        return read_last_step(self.client, self.run_id)

    def held(self, since: int | None = None) -> Holdings | None:
        """The run's metric points, read from MLflow, under the names this sink was given (:mod:`.held`)."""
        if self.client is None or self.run_id is None:
            return None
        return read_held(self.client, self.location, self.run_id, changed=dict(self._names.changed),
                         hist=self._hist, since=since)

    def describe(self) -> str:
        return f"mlflow:{self.location}" + (f" (run {self.run_id})" if self.run_id else "")
