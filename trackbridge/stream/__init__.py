"""The canonical stream on disk: the one module that knows its JSON-lines form, for writing and for reading.

One file per run (:func:`stream_file`: ``DIR/<run_id>.jsonl``). The first line is the **header**, the run's
:class:`~trackbridge.record.RunInfo` with ``"type": "run"``, the line format (``"format": "trackbridge.stream/1"``)
and the canonical schema in force when it was written (``"schema": "canonical@1.1.0"``, the ``version:`` of
``mappings/canonical.yaml``). Every other line is one :class:`~trackbridge.record.Record` (``step``, ``wall_time``,
``metrics``, ``derived``, and ``axis`` for a record on an x axis of its own), compact JSON with NaN and
infinities as strings so that the file stays strict JSON. Why
this shape: anyone with ``json`` can read it, it is appended without rewriting, and it is enough to rebuild the run in
any tracker.

Writing (:class:`StreamWriter`): every batch is handed to the operating system before :meth:`StreamWriter.write`
returns (``fsync=True`` also forces it to the disk), whole or not at all: a write the disk cuts short (full) is cut
back to where it started, so a retry neither doubles lines nor glues one onto a torn line. A crash *during* a write
can leave a partial last line; reopening with ``resume=True`` first ends that line, so that new lines are never glued
onto it. A resumed stream written under
another canonical schema version gets a new header line, so every record is read under the schema it was written in.

Reading: :func:`read_stream` (the records, numbered, from a record number or, with a :class:`StreamCursor`, from
where an earlier read stopped; from a step on) and :func:`scan_stream` (header, record count, highest step). They
count records the same way: complete lines only (a last line without its newline may still be being
written), header lines not counted, a line that is not JSON skipped and reported as ``FILE:LINE: ...``. The *last
step* of a stream is its highest step (what resume needs: steps may go back), in :func:`scan_stream` and
:func:`last_step` alike. Streams without a schema stamp (written before it existed) are read as they are; a stream
stamped with an older canonical version has its canonical names upgraded through the ``versions:`` renames of
``canonical.yaml`` (:meth:`~trackbridge.schema.model.CanonicalSchema.upgrade`). Names the writer recorded as
sanitized (``RunInfo.sanitized``) are restored.

:func:`iter_lines` and :class:`RecordDecoder` are the parts a reader with its own damage policy builds on (the
``jsonl`` source, which also reads JSON lines that are not this stream).

Needs nothing but the standard library (the mapping files only to stamp a stream and to upgrade an old one's names).
The format is known in this one package: :mod:`.lines` (the file, the header and the line), :mod:`.read` (records
and scans) and :mod:`.write` (:class:`StreamWriter`); this module is their public face.
"""
from __future__ import annotations

from .lines import (
           HEADER_TYPE,
           LEARNT,
           SUFFIX,
           Line,
           Reject,
           closing_header,
           header_json,
           is_header,
           iter_lines,
           learnt,
           parse_line,
           schema_stamp,
           stream_file,
)
from .read import RecordDecoder, StreamCursor, StreamScan, holdings, last_step, read_stream, scan_stream
from .write import StreamWriter

__all__ = ["HEADER_TYPE", "LEARNT", "Line", "RecordDecoder", "Reject", "SUFFIX", "closing_header", "header_json",
           "learnt", "StreamCursor", "StreamScan", "StreamWriter", "holdings", "is_header", "iter_lines", "last_step",
           "parse_line", "read_stream", "scan_stream", "schema_stamp", "stream_file"]
