"""Release versions: parsing and ordering (``v0.1rc``, ``0.2.0.post2``, ``1.0.0rc1``, ``v0.10``)."""
from __future__ import annotations

import re
from functools import lru_cache

from ..errors import TrackBridgeError

_VER = re.compile(
    r"^v?(?P<rel>\d+(?:\.\d+)*)"
    r"(?:[.\-_]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)(?P<pren>\d*))?"
    r"(?:[.\-_]?(?:post|rev|r)(?P<post>\d*))?"
    r"(?:[.\-_]?dev(?P<dev>\d*))?$", re.I)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class VersionError(TrackBridgeError, ValueError):
    pass


@lru_cache(maxsize=4096)
def version_key(text: str) -> tuple:
    """A sortable key for a release name. Raises VersionError for text that is not a version."""
    m = _VER.match(str(text).strip())
    if not m:
        raise VersionError(f"not a version: {text!r}")
    rel = tuple(int(x) for x in m.group("rel").split("."))
    rel = rel + (0,) * (4 - len(rel)) if len(rel) < 4 else rel
    dev = m.group("dev")
    if m.group("pre"):
        pre = (_PRE_RANK[m.group("pre").lower()], int(m.group("pren") or 0))
    elif dev is not None and m.group("post") is None:
        pre = (-1, 0)          # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (3, 0)
    post = int(m.group("post") or 0) if m.group("post") is not None else -1
    return rel + pre + (post, int(dev or 0) if dev is not None else 1 << 30)


def is_version(text: str) -> bool:
    try:
        version_key(text)
        return True
    except VersionError:
        return False


def normalize(text: str) -> str:
    """``0.4.1`` and ``v0.4.1`` name the same release."""
    return str(text).strip().lstrip("vV")
