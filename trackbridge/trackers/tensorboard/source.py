"""``tensorboard:DIR`` -- read TensorBoard event files without TensorFlow (and without size-guidance sampling).

Every folder under ``DIR`` that directly holds ``events.out.tfevents.*`` files is one run (named by its path
relative to ``DIR``); its files are read in name order, one at a time, record by record (streaming). The TFRecord
framing is parsed here, so damage is reported precisely: a record whose length CRC is wrong is skipped by scanning
forward to the next valid record, a record whose data CRC is wrong or whose Event does not parse is skipped, and a
truncated last record ends that file -- each reported as ``file:offset``. An event file with no value in it (0
bytes, or only the ``file_version`` header a writer puts first) is reported naming the file; a run whose files are
all like that has nothing to read (a fatal problem: ``migrate`` creates no empty run for it). ``?verify=0`` skips
data CRC checks (3-5x
faster in pure Python; length CRCs are always checked).

What is read from each ``Summary.Value``:

* legacy ``simple_value`` scalars and tensor-form scalars (TF2, ``tensorboard.summary.Writer``, plugin ``scalars``;
  the plugin is remembered per tag because such writers send metadata only with a tag's first value) -> float;
* ``HistogramProto`` and tensor-form histograms (``(k, 3)`` ``[left, right, count]``) -> :class:`Histogram`
  (limits = right edges, counts, min, max, num; sum and sum_squares only where the proto has them);
* text plugin tensors -> ``str``;
* the hparams plugin's ``session_start_info`` -> the run's config (when the run has no ``trackbridge/run``);
* the run's training arguments and model config as transformers' ``TensorBoardCallback`` writes them
  (``add_text("args", args.to_json_string())``, ``add_text("model_config", ...)``: tags ``args/text_summary`` and
  ``model_config/text_summary``, at step 0; bare ``args``/``model_config`` text tags when they hold JSON) ->
  ``config["args"]`` and ``config["model_config"]``, parsed from the JSON text (text that is not JSON is kept as
  the string and reported), not metrics (when the run has no ``trackbridge/run``; a later, different text under
  those tags stays a text metric, so nothing is lost);
* ``trackbridge/run`` (written by :class:`~.sink.TensorBoardSink`) -> the run info, exactly;
* anything else (images, audio, PR curves, ...) is skipped and counted in one problem per tag.

Grouping: values are gathered into one :class:`Record` per Event for files written by trackbridge (one Event per
record). For other writers (one Event per value: ``SummaryWriter.add_scalar``, tensorboardX) consecutive Events are
merged into one record, with the first Event's wall time, per step and split (see :mod:`trackbridge.tracking.source`):
same step, same split (``eval/``/``eval_``, ``test/``/``test_``, else train; the epoch is of none), wall times at
most :data:`~trackbridge.tracking.source.WALL_TIME_TOLERANCE` (1 s) from the record's first, no tag twice. The values
of one logged row (microseconds apart) are one record; the evaluation row transformers writes at the same step after
evaluating is a record of its own, with its own wall time.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from ...record import Histogram, Record, RunInfo
from ...tracking.source import WALL_TIME_TOLERANCE, RunReader, Source, SourceError, mark_derived, same_row, splits_of
from .events import (
    DERIVED_DESCRIPTION,
    HPARAMS_TAG,
    INFO_FILE,
    RUN_TAG,
    event_file_problem,
    event_files,
    read_event_records,
)

_INFO_SCAN_EVENTS = 64     # how many events at the start of each file are searched for run metadata
# text tags that transformers' TensorBoardCallback writes at train begin: the run's config, not metrics
CONFIG_TEXT_TAGS = {"args": "args", "args/text_summary": "args",
                    "model_config": "model_config", "model_config/text_summary": "model_config"}


def _truthy(value: str | None, default: bool = True) -> bool:
    if value is None:
        return default
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _hparams_config(value: Any) -> dict[str, Any] | None:
    try:
        from tensorboard.plugins.hparams import plugin_data_pb2
    except ImportError:  # pragma: no cover
        return None
    data = plugin_data_pb2.HParamsPluginData()
    data.ParseFromString(value.metadata.plugin_data.content)
    if data.WhichOneof("data") != "session_start_info":
        return None
    out: dict[str, Any] = {}
    for k, v in data.session_start_info.hparams.items():
        kind = v.WhichOneof("kind")
        out[k] = getattr(v, kind) if kind else None
    return out


class TensorBoardRunReader(RunReader):
    """One run folder (all of its event files)."""

    def __init__(self, folder: Path, *, name: str | None = None, verify: bool = True,
                 files: list[Path] | None = None) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.name = name or self.folder.name
        self.verify = verify
        self.files = files if files is not None else event_files(self.folder)
        self.hparams_files: list[Path] = []        # a SummaryWriter's add_hparams sub-folders: config, not records
        self._info: RunInfo | None = None
        self._ours = False
        self._config_texts: dict[str, str] = {}     # tag -> the text read into the config (not a metric)

    # -- run info --------------------------------------------------------------------------------------------
    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = self._scan_info()
        return self._info

    def _scan_info(self) -> RunInfo:
        from tensorboard.compat.proto import event_pb2

        run_json = None
        config: dict[str, Any] = {}
        texts: dict[str, tuple[str, str]] = {}       # tag -> (where, text) of the last config text
        for path in [*self.hparams_files, *self.files]:
            for n, (offset, data) in enumerate(read_event_records(path, None, verify=self.verify)):
                if n >= _INFO_SCAN_EVENTS:
                    break
                ev = event_pb2.Event()
                try:
                    ev.ParseFromString(data)
                except Exception:
                    continue
                for v in ev.summary.value:
                    if v.tag == RUN_TAG and v.tensor.string_val:
                        run_json = v.tensor.string_val[0].decode("utf-8", errors="replace")
                    elif v.metadata.plugin_data.plugin_name == "hparams":
                        hp = _hparams_config(v)
                        if hp:
                            config.update(hp)
                    elif (v.tag in CONFIG_TEXT_TAGS and v.WhichOneof("value") == "tensor" and v.tensor.string_val
                          and v.metadata.plugin_data.plugin_name == "text"):
                        texts[v.tag] = (f"{path}:{offset}",
                                        "\n".join(x.decode("utf-8", errors="replace") for x in v.tensor.string_val))
        final = self.folder / INFO_FILE
        if final.is_file():                     # the run info as the sink closed it: newer than the opening one
            try:
                run_json = final.read_text(encoding="utf-8")
            except OSError as exc:
                self.skip(str(final), f"unreadable ({exc}); using the run info of the event files")
        if run_json is not None:
            try:
                info = RunInfo.from_json(json.loads(run_json))
                self._ours = True
                return info
            except (ValueError, TypeError) as exc:
                self.skip(f"{self.folder}", f"unreadable {RUN_TAG} text ({exc}); using folder name and hparams")
        for tag, (where, text) in texts.items():
            key = CONFIG_TEXT_TAGS[tag]
            try:
                value = json.loads(text)
            except ValueError as exc:
                if "/" not in tag:            # a bare "args" text (not a SummaryWriter's): config only as JSON
                    continue
                value = text
                self.skip(where, f"text {tag!r} is not JSON ({exc}); kept as a string in the run config "
                                 f"under {key!r}")
            config[key] = value
            self._config_texts[tag] = text
        return RunInfo(name=self.name, run_id=self.name, config=config)

    # -- records ---------------------------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, self._stored_records())

    def _stored_records(self) -> Iterator[Record]:
        from tensorboard.compat.proto import event_pb2

        info = self.info
        rename = info.sanitized
        merge = not self._ours
        self._derived: set[str] = set(info.extra.get("derived") or ()) if isinstance(info.extra, dict) else set()
        plugins: dict[str, str] = {}
        unsupported: dict[str, int] = {}
        cur: Record | None = None
        cur_splits: frozenset[str] = frozenset()
        split_cache: dict[str, frozenset[str]] = {}
        interned: dict[frozenset[str], frozenset[str]] = {}

        def splits_for(names: Any) -> frozenset[str]:
            out: frozenset[str] = frozenset()
            for n in names:
                fs = split_cache.get(n)
                if fs is None:
                    fs = splits_of((n,))
                    fs = split_cache[n] = interned.setdefault(fs, fs)     # one object per split: `is` compares
                out = (out | fs if fs is not out else out) if out else fs
            return out

        for path in self.files:
            events = with_values = 0
            for offset, data in read_event_records(path, self, verify=self.verify):
                events += 1
                ev = event_pb2.Event()
                try:
                    ev.ParseFromString(data)
                except Exception as exc:
                    self.skip(f"{path}:{offset}", f"record is not an Event ({exc}); skipped")
                    continue
                if not ev.HasField("summary") or not ev.summary.value:
                    continue
                with_values += 1
                metrics = self._values(ev, plugins, unsupported)
                if not metrics:
                    continue
                if rename:
                    metrics = {rename.get(k, k): v for k, v in metrics.items()}
                derived = [rename.get(t, t) for t in self._derived if t in metrics or rename.get(t, t) in metrics] \
                    if self._derived else []
                if merge:
                    splits = split_cache.get(next(iter(metrics))) if len(metrics) == 1 else None
                    if splits is None:
                        splits = splits_for(metrics)
                    # records per step and split (same_row), with the common case (one split, cached) inline
                    if (cur is not None and cur.step == ev.step
                            and (abs(ev.wall_time - cur.wall_time) <= WALL_TIME_TOLERANCE
                                 if splits is cur_splits and len(splits) == 1 else
                                 same_row(cur.step, cur.wall_time, cur_splits, ev.step, ev.wall_time, splits))
                            and not (metrics.keys() & cur.metrics.keys())):
                        cur.metrics.update(metrics)
                        if derived:
                            cur.derived += derived
                        if splits is not cur_splits:
                            cur_splits = cur_splits | splits
                        continue
                else:
                    splits = cur_splits
                if cur is not None:
                    yield cur
                cur = Record(step=int(ev.step), wall_time=ev.wall_time, metrics=metrics, derived=sorted(derived))
                cur_splits = splits
            if not with_values:
                self._empty_file(path, events)
        if cur is not None:
            yield cur
        for tag, count in unsupported.items():
            self.skip(f"{self.folder}", f"tag {tag!r}: {count} value(s) of an unsupported kind "
                                        f"({plugins.get(tag) or 'no plugin'}) skipped")

    def _empty_file(self, path: Path, events: int) -> None:
        """An event file with no value in it is reported (a fatal problem for that file: there is nothing to read)
        rather than read as nothing in silence."""
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        if size == 0:
            why = "empty event file (0 bytes): the writer created it and wrote nothing; nothing read from it"
        elif events == 0:
            why = f"event file of {size} bytes without one readable record; nothing read from it"
        else:
            why = (f"event file holds no values ({events} event(s): only the file_version header or other "
                   f"events without a summary); nothing read from it")
        self.stop(str(path), why)

    def _values(self, ev: Any, plugins: dict[str, str], unsupported: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for v in ev.summary.value:
            tag = v.tag
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                out[tag] = v.simple_value
                if v.HasField("metadata") and v.metadata.summary_description == DERIVED_DESCRIPTION:
                    self._derived.add(tag)
                continue
            plugin = v.metadata.plugin_data.plugin_name if v.HasField("metadata") else ""
            if plugin:
                plugins[tag] = plugin
            else:
                plugin = plugins.get(tag, "")
            if tag == RUN_TAG or tag == HPARAMS_TAG or plugin == "hparams":
                continue
            if tag in self._config_texts and kind == "tensor" and plugin == "text" and \
                    "\n".join(x.decode("utf-8", errors="replace") for x in v.tensor.string_val) \
                    == self._config_texts[tag]:
                continue                         # read into the run config (see _scan_info)
            if kind == "histo":
                h = v.histo
                out[tag] = Histogram(limits=list(h.bucket_limit), counts=list(h.bucket), min=h.min, max=h.max,
                                     num=h.num, sum=h.sum, sum_squares=h.sum_squares)
            elif kind == "tensor":
                val = self._tensor_value(v.tensor, plugin)
                if val is _UNSUPPORTED:
                    unsupported[tag] = unsupported.get(tag, 0) + 1
                else:
                    out[tag] = val
            else:
                unsupported[tag] = unsupported.get(tag, 0) + 1
                plugins.setdefault(tag, kind or "")
        return out

    @staticmethod
    def _tensor_value(tensor: Any, plugin: str) -> Any:
        if plugin == "text":
            if tensor.string_val:
                texts = [s.decode("utf-8", errors="replace") for s in tensor.string_val]
                return texts[0] if len(texts) == 1 else "\n".join(texts)
            return _UNSUPPORTED
        if plugin not in ("scalars", "histograms", ""):
            return _UNSUPPORTED
        from tensorboard.util import tensor_util

        try:
            arr = tensor_util.make_ndarray(tensor)
        except Exception:
            return _UNSUPPORTED
        if plugin == "histograms" or (plugin == "" and arr.ndim == 2 and arr.shape[-1] == 3):
            if arr.ndim != 2 or (arr.size and arr.shape[1] != 3):
                return _UNSUPPORTED
            lefts = [float(x) for x in arr[:, 0]] if arr.size else []
            rights = [float(x) for x in arr[:, 1]] if arr.size else []
            counts = [float(x) for x in arr[:, 2]] if arr.size else []
            return Histogram(limits=rights, counts=counts, min=lefts[0] if lefts else None,
                             max=rights[-1] if rights else None, num=float(sum(counts)))
        if arr.size != 1 or arr.dtype.kind not in "fiub":
            return _UNSUPPORTED
        x = arr.reshape(()).item()
        return float(x)


_UNSUPPORTED = object()


class TensorBoardSource(Source):
    """Every folder under ``DIR`` holding event files. Options: ``run=NAME`` (folder path or run name/id),
    ``verify=0`` (skip data CRC checks)."""
    head_problem = staticmethod(event_file_problem)

    kind = "tensorboard"
    option_names = ("run", "verify")

    def __init__(self, location: str, **options: str) -> None:
        super().__init__(location, **options)
        self.root = Path(location).expanduser()
        if not self.root.exists():
            raise SourceError(f"tensorboard source: no such file or folder: {location}")
        self.verify = _truthy(options.get("verify"), True)

    def run_folders(self) -> list[tuple[str, Path, list[Path] | None]]:
        """``(run name, folder, event files or None for all of the folder's)`` of every run under the root (a single
        event file as the root: that file alone)."""
        if self.root.is_file():
            return [(self.root.parent.name, self.root.parent, [self.root])]
        found: list[tuple[str, Path, list[Path] | None]] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            if any("tfevents" in f for f in filenames):
                folder = Path(dirpath)
                rel = folder.relative_to(self.root).as_posix()
                found.append((self.root.name if rel == "." else rel, folder, None))
        if not found:
            raise SourceError(f"tensorboard source: no events.out.tfevents.* files under {self.root}")
        return found

    def runs(self) -> Iterator[RunReader]:
        want = self.options.get("run")
        folders = self.run_folders()
        runs = {folder: name for name, folder, _files in folders}
        hparams: dict[Path, list[Path]] = {}
        absorbed: set[Path] = set()
        for name, folder, files in folders:
            parent = _run_above(folder, runs)
            if parent is not None and files is None and _only_hparams(event_files(folder), self.verify):
                hparams.setdefault(parent, []).extend(event_files(folder))
                absorbed.add(folder)
        for name, folder, files in folders:
            if folder in absorbed:
                continue            # the hparams of the run above it (SummaryWriter.add_hparams): not a run
            reader = TensorBoardRunReader(folder, name=name, verify=self.verify, files=files)
            reader.hparams_files = hparams.get(folder, [])
            if want and want not in (name, reader.info.name, reader.info.run_id):
                continue
            yield reader


def _run_above(folder: Path, runs: dict[Path, str]) -> Path | None:
    """The nearest folder above ``folder`` that is a run itself (its event files beside ``folder``)."""
    for up in folder.parents:
        if up in runs:
            return up
    return None


def _only_hparams(files: list[Path], verify: bool) -> bool:
    """Whether event files hold nothing but the hparams plugin's summaries: what ``SummaryWriter.add_hparams``
    writes to a sub-folder of the writer's own (named by ``time.time()``; Accelerate's TensorBoard tracker calls it
    in ``init_trackers``) -- the config of the run above, not a run of its own. A folder with any other value (a
    scalar, a text, a tensor) is a run."""
    from tensorboard.compat.proto import event_pb2

    seen = False
    for path in files:
        for n, (_offset, data) in enumerate(read_event_records(path, None, verify=verify)):
            if n >= _INFO_SCAN_EVENTS:
                return False
            ev = event_pb2.Event()
            try:
                ev.ParseFromString(data)
            except Exception:
                return False
            if ev.WhichOneof("what") in ("file_version", None):
                continue
            if ev.WhichOneof("what") != "summary":
                return False
            for v in ev.summary.value:
                if v.metadata.plugin_data.plugin_name != "hparams":
                    return False
                seen = True
    return seen
