"""``wandb:DIR`` -- read wandb runs from their local ``.wandb`` transaction logs, with no server and no upload.

``DIR`` may be a folder holding ``wandb/`` (what ``wandb.init(dir=DIR)`` makes), the ``wandb/`` folder itself, one
run folder (``offline-run-*`` or ``run-*``), or a ``run-<id>.wandb`` file. Folders of the same run id (a resumed
run) are read as one run, in folder order. ``wandb.Api()`` cannot read offline runs, and wandb 0.31 no longer ships
``wandb.sdk.internal.datastore``, so the file is parsed here;
see :mod:`trackbridge.trackers.wandb.records` for the file's framing.

Read: the ``run`` record (id, project, display name, tags, config, start time), ``config`` updates, and ``history``
rows (0.31 writes ``nested_key`` paths; older files ``key``). A row becomes one :class:`Record`: its step is
``trackbridge/step`` when present (see :mod:`trackbridge.trackers.wandb.sink`), else ``_step``; its wall time is
``_timestamp``; ``_``-keys are dropped; ``{"_type": "histogram"}`` values become :class:`Histogram`; other wandb
media types are skipped and reported. A ``_trackbridge`` config entry restores the :class:`RunInfo` and its recorded
name sanitization. Damage (bad CRC, a truncated tail) is skipped and reported as ``file:offset``.

Several x axes: a run that declares its own step metrics with ``define_metric`` (slime: ``train/*`` on
``train/step``, ``rollout/*`` and ``perf/*`` on ``rollout/step``, ``eval/*`` on ``eval/step``) gives, for each
row, one record per axis: the metrics on that axis, ``axis`` its step metric's name and ``step`` the step metric's
value in the row (or its last value: wandb's ``step_sync``); the step metrics themselves are axes, not metrics.
Exact-name definitions win over globs, globs are tried in the order declared (``fnmatch``), and metrics on no axis
(or on ``trackbridge/step``, what this package's sink declares for ``*``) keep the row's step.
"""
from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterator

from ...record import Histogram, Record, RunInfo
from ...tracking.source import RunReader, Source, SourceError, mark_derived
from .records import META_KEY, STEP_KEY, find_wandb_files, folder_order, read_payloads, run_id_of


def _set_path(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        nxt = target.get(part)
        if not isinstance(nxt, dict):
            nxt = target[part] = {}
        target = nxt
    target[path[-1]] = value


def _item_path(item: Any) -> list[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _loads(text: str) -> Any:
    return json.loads(text) if text else None


def _histogram(obj: dict[str, Any]) -> Histogram | None:
    counts = obj.get("values")
    bins = obj.get("bins")
    packed = obj.get("packedBins")
    if bins is None and isinstance(packed, dict):
        lo, size, n = packed.get("min"), packed.get("size"), packed.get("count")
        if lo is not None and size is not None and n is not None:
            bins = [lo + size * i for i in range(int(n) + 1)]
    if not isinstance(counts, list) or not isinstance(bins, list) or len(bins) != len(counts) + 1:
        return None
    counts = [float(c) for c in counts]
    return Histogram(limits=[float(b) for b in bins[1:]], counts=counts, min=float(bins[0]),
                     max=float(bins[-1]), num=float(sum(counts)))


class WandbRunReader(RunReader):
    """One wandb run: its ``.wandb`` file(s), oldest first."""

    def __init__(self, files: list[Path], *, run_id: str | None = None) -> None:
        super().__init__()
        if not files:
            raise SourceError("wandb source: a run needs at least one .wandb file")
        self.files = list(files)
        self.run_id = run_id or run_id_of(self.files[0])
        self._info: RunInfo | None = None
        # define_metric declarations: exact name -> step metric, (glob, step metric) in order, the step metrics
        self._exact_axes: dict[str, str] = {}
        self._glob_axes: list[tuple[str, str]] = []
        self._axis_cache: dict[str, str | None] = {}

    # -- run info --------------------------------------------------------------------------------------------
    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = self._scan_info()
        return self._info

    def _scan_info(self) -> RunInfo:
        from wandb.proto import wandb_internal_pb2 as pb

        config: dict[str, Any] = {}
        name = project = entity = None
        tags: list[str] = []
        for path in self.files:
            for _, data in read_payloads(path, None):
                rec = pb.Record()
                try:
                    rec.ParseFromString(data)
                except Exception:
                    continue
                kind = rec.WhichOneof("record_type")
                if kind == "run":
                    r = rec.run
                    name = r.display_name or name
                    project = r.project or project
                    entity = r.entity or entity
                    if r.tags:
                        tags = list(r.tags)
                    self._apply_config(config, r.config)
                elif kind == "config":
                    self._apply_config(config, rec.config)
                elif kind == "metric":
                    self._define(rec.metric)
        config.pop("_wandb", None)
        meta = config.pop(META_KEY, None)
        if isinstance(meta, dict):
            info = RunInfo.from_json(meta)
            info.config = config
            return info
        tag_map: dict[str, str] = {}
        for t in tags:
            k, sep, v = t.partition("=")
            tag_map[k] = v if sep else ""
        extra = {"wandb_entity": entity} if entity else {}
        return RunInfo(name=name or self.run_id, project=project, run_id=self.run_id, config=config,
                       tags=tag_map, extra=extra)

    def _define(self, metric: Any) -> None:
        """One ``define_metric`` record: a name or glob declared on a step metric (anything else is no axis)."""
        step_metric = metric.step_metric
        if not step_metric:
            return
        if metric.glob_name:
            self._glob_axes.append((metric.glob_name, step_metric))
        elif metric.name:
            self._exact_axes[metric.name] = step_metric

    def _axis_of(self, key: str) -> str | None:
        """The step metric ``key`` is declared on (None: the row's own step)."""
        try:
            return self._axis_cache[key]
        except KeyError:
            pass
        axis = self._exact_axes.get(key)
        if axis is None:
            axis = next((a for g, a in self._glob_axes if fnmatchcase(key, g)), None)
        if axis == STEP_KEY:
            axis = None
        self._axis_cache[key] = axis
        return axis

    @staticmethod
    def _apply_config(config: dict[str, Any], record: Any) -> None:
        for item in record.update:
            try:
                _set_path(config, _item_path(item), _loads(item.value_json))
            except ValueError:
                continue
        for item in getattr(record, "remove", []):
            path = _item_path(item)
            target: Any = config
            for part in path[:-1]:
                target = target.get(part, {}) if isinstance(target, dict) else {}
            if isinstance(target, dict):
                target.pop(path[-1], None)

    # -- records ---------------------------------------------------------------------------------------------
    def _rows(self, report: bool = True) -> Iterator[tuple[Path, int, dict[str, Any]]]:
        from wandb.proto import wandb_internal_pb2 as pb

        for path in self.files:
            for offset, data in read_payloads(path, self if report else None):
                rec = pb.Record()
                try:
                    rec.ParseFromString(data)
                except Exception as exc:
                    if report:
                        self.skip(f"{path}:{offset}", f"not a wandb Record ({exc}); skipped")
                    continue
                if rec.WhichOneof("record_type") != "history":
                    continue
                row: dict[str, Any] = {}
                bad = False
                for item in rec.history.item:
                    try:
                        _set_path(row, _item_path(item), _loads(item.value_json))
                    except ValueError:
                        bad = True
                        if report:
                            self.skip(f"{path}:{offset}", f"history value of {'/'.join(_item_path(item))!r} "
                                                          f"is not JSON; row skipped")
                        break
                if not bad:
                    yield path, offset, row

    def last_steps(self) -> tuple[int | None, int | None]:
        """``(last wandb _step, highest true step)`` over all history rows (used by the sink to resume)."""
        last_w = best = None
        for _, _, row in self._rows(report=False):
            w = row.get("_step")
            if isinstance(w, int) and (last_w is None or w > last_w):
                last_w = w
            s = row.get(STEP_KEY, w)
            if isinstance(s, int) and (best is None or s > best):
                best = s
        return last_w, best

    def records(self) -> Iterator[Record]:
        return mark_derived(self.info, self._stored_records())

    def _stored_records(self) -> Iterator[Record]:
        rename = self.info.sanitized          # reading the info also reads the define_metric declarations
        axis_names = {a for a in (*self._exact_axes.values(), *(a for _, a in self._glob_axes)) if a != STEP_KEY}
        last_axis_step: dict[str, int] = {}
        skipped_types: dict[str, int] = {}
        for path, offset, row in self._rows():
            step = row.pop(STEP_KEY) if STEP_KEY in row else row.get("_step")
            step = step if isinstance(step, int) or step is None else int(step)
            wall = row.get("_timestamp")
            wall_time = float(wall) if isinstance(wall, (int, float)) else None
            if not axis_names:
                metrics: dict[str, Any] = {}
                for key, value in row.items():
                    if key.startswith("_"):
                        continue
                    self._add(metrics, key, value, skipped_types)
                if rename:
                    metrics = {rename.get(k, k): v for k, v in metrics.items()}
                yield Record(step=step, wall_time=wall_time, metrics=metrics)
                continue
            groups: dict[str | None, dict[str, Any]] = {}
            for key, value in row.items():
                if key.startswith("_") or key in axis_names:
                    continue
                self._add(groups.setdefault(self._axis_of(key), {}), key, value, skipped_types)
            for axis, metrics in groups.items():
                at = step
                if axis is not None:
                    v = row.get(axis)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        at = last_axis_step[axis] = int(v)
                    else:                                    # not in this row: its last value (step_sync)
                        at = last_axis_step.get(axis)
                if rename:
                    metrics = {rename.get(k, k): v for k, v in metrics.items()}
                yield Record(step=at, wall_time=wall_time, metrics=metrics,
                             axis=None if axis is None else rename.get(axis, axis))
        for t, n in skipped_types.items():
            self.skip(f"{self.files[0]}", f"{n} value(s) of wandb type {t!r} skipped (not a number, text or "
                                          f"histogram)")

    def _add(self, metrics: dict[str, Any], key: str, value: Any, skipped: dict[str, int]) -> None:
        if isinstance(value, dict):
            t = value.get("_type")
            if t == "histogram":
                h = _histogram(value)
                if h is not None:
                    metrics[key] = h
                    return
            if t is not None:
                skipped[str(t)] = skipped.get(str(t), 0) + 1
                return
            for k, v in value.items():          # a logged nested dict: wandb shows it as a.b
                self._add(metrics, f"{key}.{k}", v, skipped)
            return
        if isinstance(value, list):
            skipped["list"] = skipped.get("list", 0) + 1
            return
        metrics[key] = value


class WandbSource(Source):
    """wandb runs under a folder (see the module doc). Option: ``run=ID`` (run id or name)."""
    signature = (b":W&B", "a wandb transaction log (.wandb)")

    kind = "wandb"
    option_names = ("mode", "run")

    def __init__(self, location: str, **options: str) -> None:
        super().__init__(location, **options)
        self.path = Path(location).expanduser()
        if not self.path.exists():
            raise SourceError(f"wandb source: no such file or folder: {location}")
        if options.get("mode", "offline") != "offline":
            raise SourceError("wandb source reads local .wandb files only; online runs need the wandb API "
                              "(not supported here)")

    def runs(self) -> Iterator[RunReader]:
        files = find_wandb_files(self.path)
        if not files:
            raise SourceError(f"wandb source: no run-*.wandb files in {self.path} (looked in it, its wandb/ "
                              f"folder and their run folders)")
        by_id: dict[str, list[Path]] = {}
        for f in files:
            by_id.setdefault(run_id_of(f), []).append(f)
        want = self.options.get("run")
        for run_id, group in by_id.items():
            reader = WandbRunReader(sorted(group, key=folder_order), run_id=run_id)
            if want and want not in (run_id, reader.info.run_id, reader.info.name):   # the file's id or the run's
                continue
            yield reader
