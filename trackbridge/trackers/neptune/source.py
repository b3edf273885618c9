"""neptune-exporter Parquet reader: ``neptune:DIR[?project=WORKSPACE/PROJECT&run=RUN&step_multiplier=N]``.

``DIR`` is the exporter's data folder (one folder per project), one project's folder, or one part file. A run is a
``<run>_part_0.parquet`` (the exporter's mark of a complete run) and its later parts, read in part order with
pyarrow; every file's columns are checked against the layout first (:func:`~.format.check_schema`: a file of an
unknown layout is refused with one line, never guessed at).

* ``float_series`` points are numbers, ``string_series`` texts, ``histogram_series`` histograms (``edges`` and
  ``values`` become right edges and counts; min and max are the outer edges); ``file``/``file_series`` rows are
  reported and skipped (their payload lies in the exporter's ``--files-path``, not here);
* steps are ``decimal(18, 6)``: multiplied by ``step_multiplier`` (as the exporter's loaders do, default 1) they must
  be whole numbers; a point whose step is not is skipped and reported (no step is made up);
* wall times are the ``timestamp`` column (milliseconds);
* points become records as in every reader of stored points (:func:`~trackbridge.tracking.source.gather`): in the
  order the files hold them for runs trackbridge wrote, in time order for runs the exporter wrote (it writes one
  attribute after another);
* the run: a ``trackbridge/run`` attribute restores the RunInfo exactly; otherwise ``sys/custom_run_id``,
  ``sys/name`` and ``sys/tags`` name it and every other single-value attribute (``parameters/lr`` ...) is its config,
  under its attribute path.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from ...record import Histogram, Record, RunInfo
from ...tracking.source import RunReader, Source, SourceError, gather, mark_derived, nest_config
from .format import CONFIG_PREFIX, FILE_TYPES, PART, RUN_ATTRIBUTE, SERIES_TYPES, check_schema, part_files, step_of

_COLS = ["project_id", "run_id", "attribute_path", "attribute_type", "step", "timestamp", "int_value", "float_value",
         "string_value", "bool_value", "datetime_value", "string_set_value", "histogram_value"]


class NeptuneRunReader(RunReader):
    """One exported run: its part files."""

    def __init__(self, parts: list[Path], multiplier: int) -> None:
        super().__init__()
        self.parts = parts
        self.multiplier = multiplier
        self._info: RunInfo | None = None
        self.ours = False

    def _tables(self, columns: list[str]) -> Iterator[tuple[Path, Any]]:
        import pyarrow.parquet as pq
        for part in self.parts:
            try:
                f = pq.ParquetFile(part)
            except Exception as exc:  # noqa: BLE001 - a damaged part: reported, the others read
                self.skip(str(part), f"not a readable Parquet file ({type(exc).__name__}: {exc})")
                continue
            why = check_schema(f.schema_arrow, str(part))
            if why:
                raise SourceError(why)
            yield part, f.read(columns=columns)

    @property
    def info(self) -> RunInfo:
        if self._info is None:
            self._info = self._read_info()
        return self._info

    def _read_info(self) -> RunInfo:
        cols = ["project_id", "run_id", "attribute_path", "attribute_type", "int_value", "float_value",
                "string_value", "bool_value", "datetime_value", "string_set_value"]
        single: dict[str, Any] = {}
        project = run_id = None
        for _part, t in self._tables(cols):
            data = {c: t.column(c).to_pylist() for c in cols}
            for i, typ in enumerate(data["attribute_type"]):
                project = project or data["project_id"][i]
                run_id = run_id or data["run_id"][i]
                if typ in SERIES_TYPES or typ in FILE_TYPES:
                    continue
                col = {"float": "float_value", "int": "int_value", "string": "string_value", "bool": "bool_value",
                       "datetime": "datetime_value", "string_set": "string_set_value"}.get(typ)
                if col is None:
                    continue
                v = data[col][i]
                single[data["attribute_path"][i]] = v.isoformat() if typ == "datetime" and v is not None else v
        ours = single.pop(RUN_ATTRIBUTE, None)
        if isinstance(ours, str):
            try:
                info = RunInfo.from_json(json.loads(ours))
                self.ours = True
                info.extra = {**(info.extra or {}), "neptune": {"project_id": project, "run_id": run_id}}
                return info
            except (json.JSONDecodeError, TypeError):
                self.skip(f"{self.parts[0]} {RUN_ATTRIBUTE}", "not the JSON of a run; read as a parameter")
                single[RUN_ATTRIBUTE] = ours
        tags_raw = single.pop("sys/tags", None) or []
        tags = dict(t.split("=", 1) if "=" in t else (t, "") for t in tags_raw)
        name = single.pop("sys/name", None)
        custom = single.pop("sys/custom_run_id", None)
        sys_attrs = {k: single.pop(k) for k in [k for k in single if k.startswith("sys/")]}
        config = {k[len(CONFIG_PREFIX):] if k.startswith(CONFIG_PREFIX) else k: v for k, v in single.items()}
        return RunInfo(name=name or custom or run_id, project=project, run_id=custom or run_id,
                       config=nest_config(config), tags=tags,
                       extra={"neptune": {"project_id": project, "run_id": run_id, **sys_attrs}})

    def records(self) -> Iterator[Record]:
        info = self.info
        return mark_derived(info, gather(self._points()))

    def _points(self) -> Iterator[tuple[int | None, float | None, str, Any]]:
        import pyarrow as pa
        cols = ["attribute_path", "attribute_type", "step", "timestamp", "float_value", "string_value",
                "histogram_value"]
        points: list[tuple[int, int, int, str, Any]] = []
        n = 0
        for part, t in self._tables(cols):
            paths = t.column("attribute_path").to_pylist()
            types = t.column("attribute_type").to_pylist()
            steps = t.column("step").to_pylist()
            ms = t.column("timestamp").cast(pa.int64()).to_pylist()
            floats = t.column("float_value").to_pylist()
            texts = t.column("string_value").to_pylist()
            hists = t.column("histogram_value").to_pylist()
            for i, typ in enumerate(types):
                if typ not in SERIES_TYPES:
                    if typ in FILE_TYPES:
                        self.skip(f"{part} row {i}", f"{paths[i]!r}: {typ} payloads are not in the Parquet files")
                    continue
                step = step_of(steps[i], self.multiplier)
                if step is None:
                    self.skip(f"{part} row {i}", f"{paths[i]!r}: step {steps[i]} is not a whole number (times "
                                                 f"?step_multiplier={self.multiplier}); point skipped")
                    continue
                if typ == "float_series":
                    value: Any = floats[i]
                elif typ == "string_series":
                    value = texts[i]
                else:
                    h = hists[i] or {}
                    edges, counts = h.get("edges") or [], h.get("values") or []
                    if len(edges) != len(counts) + 1 or not counts:
                        self.skip(f"{part} row {i}", f"{paths[i]!r}: a histogram whose edges do not bound its "
                                                     f"values; point skipped")
                        continue
                    value = Histogram(limits=list(edges[1:]), counts=list(counts), min=edges[0], max=edges[-1],
                                      num=float(sum(counts)))
                if value is None:
                    continue
                points.append((ms[i] if ms[i] is not None else -1, step, n, paths[i], value))
                n += 1
        if not self.ours:       # the exporter writes one attribute after another: put the points in time order
            points.sort(key=lambda p: (p[0], p[1], p[2]))
        for when, step, _n, path, value in points:
            yield step, (when / 1000 if when >= 0 else None), path, value


class NeptuneSource(Source):
    """Runs in neptune-exporter's Parquet layout (see the module docstring)."""
    signature = (b"PAR1", "a Parquet file")

    kind = "neptune"
    option_names = ("project", "run", "step_multiplier")

    def runs(self) -> Iterator[RunReader]:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise SourceError("the neptune reader needs pyarrow: pip install 'trackbridge[neptune]'") from None
        try:
            mult = int(self.options.get("step_multiplier") or 1)
        except ValueError:
            raise SourceError(f"neptune:{self.location}: step_multiplier="
                              f"{self.options.get('step_multiplier')!r} is not an integer") from None
        root = Path(self.location).expanduser()
        if not root.exists():
            raise SourceError(f"neptune:{self.location}: no such file or folder")
        if root.is_file():
            m = PART.match(root.name)
            if not m:
                raise SourceError(f"neptune:{self.location}: not a <run>_part_<n>.parquet file")
            runs = [(root.parent, m.group("run"))]
        else:
            folders = [root] if any(root.glob("*_part_0.parquet")) else sorted(p for p in root.iterdir() if p.is_dir())
            runs = [(f, PART.match(p.name).group("run"))       # type: ignore[union-attr]
                    for f in folders for p in sorted(f.glob("*_part_0.parquet")) if PART.match(p.name)]
        want_project, want_run = self.options.get("project"), self.options.get("run")
        found = 0
        for folder, prefix in runs:
            reader = NeptuneRunReader(part_files(folder, prefix), mult)
            info = reader.info
            neptune = (info.extra or {}).get("neptune") or {}
            if want_project and want_project not in (neptune.get("project_id"), info.project):
                continue
            if want_run and want_run not in (neptune.get("run_id"), info.run_id, info.name):
                continue
            found += 1
            yield reader
        if not found:
            what = " matching the options" if (want_project or want_run) else ""
            raise SourceError(f"neptune:{self.location}: no exported run{what} (no <run>_part_0.parquet)")
