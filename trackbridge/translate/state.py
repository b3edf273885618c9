"""The state a :class:`~trackbridge.translate.Translator` keeps, declared once for its parts (:mod:`.resolve`,
:mod:`.plan`, :mod:`.derived`), each a mixin of the translator; set by ``Translator.__init__``. The methods one part
calls on another are declared here too; the part that defines them comes before this class in the translator's
method order, so these bodies never run."""
from __future__ import annotations

from typing import Any, Mapping

from ..detect import Detection
from ..schema.loader import Registry
from ..schema.model import Entry, FrameworkMapping
from ..spec import Spec
from .entries import Plan


class State:
    registry: Registry
    source_spec: Spec
    target_spec: Spec
    origin_spec: Spec | None                      # a canonical source's origin (the framework it came from)
    input_fidelity: dict[str, str]                # canonical name -> why it is approximate (a canonical source's)
    raw_config: dict[str, Any]
    flat_config: dict[str, Any]
    detection: Detection | None
    notes: list[str]
    _src: Spec | None                             # the source in use (None: not detected yet)
    _src_note: str | None
    _tgt_trainer: str | None | bool               # False: not resolved yet
    _tgt_note: str | None
    _tgt_from_keys: bool
    _source_cache: tuple[Any, ...] | None
    _pinned: bool
    _seen: set[str]
    _plans: dict[str, Plan | None]
    _rev_cache: dict[str, tuple[Entry, dict[str, str] | None] | None]
    _deriver: Any
    _derive: bool
    _mapping_paths: list[str]
    _outside: list[str]

    def _framework(self, spec: Spec) -> FrameworkMapping:
        """The mapping of a framework spec's framework."""
        assert spec.framework is not None, spec
        return self.registry.frameworks[spec.framework]

    # defined by the parts (see the module docstring)
    def _get_deriver(self) -> Any:
        raise NotImplementedError

    def _resolve_target_trainer(self, metrics: Mapping[str, Any] | None = None) -> str | None:
        raise NotImplementedError

    def _canonical_out(self, canon_key: str) -> str:
        raise NotImplementedError

    def _framework_out(self, rev: Entry, caps: dict[str, str] | None, split: str | None) -> str:
        raise NotImplementedError

    def _reverse(self, canon: str) -> tuple[Entry, dict[str, str] | None] | None:
        raise NotImplementedError

    def translate_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def source_spec_text(self) -> str | None:
        raise NotImplementedError
