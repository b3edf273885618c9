"""What the MLflow sink and reader share: the tracking URI of a location, the client, and the tags trackbridge
keeps its run info under (chunked JSON tags: ``P.count`` and ``P.0`` .. ``P.<count-1>``, see :func:`chunk_tags`)."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import SQLITE_SUFFIXES

if TYPE_CHECKING:       # pragma: no cover
    from mlflow import MlflowClient

TAG_ESCAPE = "trackbridge.key_escape"
TAG_NAMES = "trackbridge.names"
TAG_HIST = "trackbridge.histogram_summaries"
TAG_RUN = "trackbridge.run"
TAG_DERIVED = "trackbridge.derived"    # metrics computed by trackbridge's derived rules, not logged by the trainer
TAG_RUN_ID = "trackbridge.run_id"      # trackbridge's run id, to find the MLflow run again on resume
TEXT_DIR = "trackbridge/text"
CHUNK = 7000          # characters per tag of a chunked tag (MLflow's limit: 8000)


def tracking_uri(location: str) -> str:
    """The MLflow tracking URI for a locator's location; sets the environment MLflow needs for local stores."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    loc = location.strip()
    if loc.startswith(("sqlite:", "http://", "https://", "postgresql", "mysql", "mssql", "databricks")):
        return loc
    if loc.lower().endswith(SQLITE_SUFFIXES):
        return f"sqlite:///{Path(loc).expanduser().resolve()}"
    # a directory or file: URI -> the deprecated file store
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if loc.startswith("file:"):
        return loc
    return Path(loc).expanduser().resolve().as_uri()


def make_client(location: str) -> MlflowClient:
    """An ``MlflowClient`` for ``location`` (imports MLflow here, not at module import).

    For a tracking server, MLflow's own HTTP retries (7 retries with exponential back-off and a 120 s timeout by
    default: minutes per call against a dead server) are bounded to 2 retries and a 15 s timeout, unless the user set
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``: the logger retries a failed sink itself,
    and nothing is lost meanwhile (the spool holds every record)."""
    uri = tracking_uri(location)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    import logging
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):   # "Creating initial MLflow database
        logging.getLogger(name).setLevel(logging.WARNING)                 # tables..." on every new store
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def chunk_tags(prefix: str, text: str) -> dict[str, str]:
    """Split ``text`` into tags ``prefix.count``, ``prefix.0`` ... (see the module docstring)."""
    pieces = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)] or [""]
    tags = {f"{prefix}.{i}": p for i, p in enumerate(pieces)}
    tags[f"{prefix}.count"] = str(len(pieces))
    return tags


def read_chunked(tags: dict[str, str], prefix: str) -> str | None:
    """Join a chunked tag written by :func:`chunk_tags`; ``None`` when absent or incomplete."""
    count = tags.get(f"{prefix}.count")
    if count is None or not count.isdigit():
        return None
    parts = [tags.get(f"{prefix}.{i}") for i in range(int(count))]
    if any(p is None for p in parts):
        return None
    return "".join(parts)  # type: ignore[arg-type]




def restore_inf(value: float) -> float:
    """MLflow stores +-inf as +-max double; map that back (only for runs this sink wrote)."""
    if value == 1.7976931348623157e308:
        return math.inf
    if value == -1.7976931348623157e308:
        return -math.inf
    return value
