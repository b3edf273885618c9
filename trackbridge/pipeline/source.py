"""Where a run's names come from (stage 1 of a translation): the :class:`SourceResolver`, with its two policies.

* **Pin** (a stored run): :meth:`SourceResolver.pin` resolves the source once from the run's first records' keys
  and keeps it; later records are translated with it even when they bring new keys. A source no framework explains
  is *unknown*.
* **Detect as keys arrive** (logging, a one-shot dict): :meth:`SourceResolver.observe` detects again whenever new
  keys arrive, until :meth:`SourceResolver.try_pin` keeps what the keys so far detect.

What a spec leaves out (the framework of ``auto``, the trainer of ``FRAMEWORK``, the releases) is detected from the
keys and the run config (:func:`~.resolve.detect_source`); a spec that leaves nothing out needs no detection.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..detect import Detection
from ..schema.loader import Registry
from ..schema.spec import Spec
from ..translate.resolve import detect_source, needs_detection

UNKNOWN = Spec("unknown")       # a source no framework explains: names pass through unchanged


class SourceResolver:
    """The source of one run's names as its keys arrive: ``found`` (None while undetected), the ``detection`` behind
    it, the ``note`` it needs said, and whether it is ``pinned``."""

    def __init__(self, registry: Registry, spec: Spec, config: Mapping[str, Any]) -> None:
        self.registry, self.spec, self.config = registry, spec, config
        self.detecting = needs_detection(registry, spec)
        self.pinned = False
        self.found: Spec | None = None if self.detecting else spec
        self.detection: Detection | None = None
        self.note: str | None = None
        self.seen: set[str] = set()

    @property
    def needs_detection(self) -> bool:
        """Whether the source is still to be detected from keys (``auto``, or a framework without its trainer)."""
        return self.detecting and not self.pinned

    def observe(self, keys: Iterable[Any]) -> bool:
        """Detect from ``keys`` (with every key seen before); True when the source found changed."""
        new = {k for k in keys if isinstance(k, str)} - self.seen
        if not new and (self.found is not None or self.detection is not None):
            return False                 # nothing new to detect from
        self.seen |= new
        hit = detect_source(self.registry, self.spec, self.seen, self.config)
        if hit.spec is None:
            if self.detection is None or self.found is None:
                self.detection = hit.detection
            return False
        if self.found is not None and hit.spec == self.found:
            return False
        self.detection, self.found, self.note = hit.detection, hit.spec, hit.note
        return True

    def pin(self) -> bool:
        """Keep the source found (the spec itself, or unknown, when nothing was); True when that fallback set it."""
        self.pinned = True
        if self.found is None:
            self.found = self.spec if self.spec.kind == "framework" else UNKNOWN
            return True
        return False

    def try_pin(self) -> bool:
        """Keep the source found, if one was (True); else leave it to be detected (False)."""
        if self.found is None:
            return False
        self.pinned = True
        return True

    def fresh(self) -> "SourceResolver":
        """The resolver for a new run with the same settings: a pinned source is kept (with its note and
        detection), anything else is detected again; no key seen. A pinned resolver, or one with nothing to detect,
        holds nothing a run changes: it is shared."""
        if self.pinned or not self.detecting:
            return self
        new = SourceResolver.__new__(SourceResolver)
        new.__dict__.update(self.__dict__)
        new.seen = set()
        if not self.pinned:
            new.detection, new.note = None, None
            if self.detecting:
                new.found = None
        return new


__all__ = ["UNKNOWN", "SourceResolver"]
