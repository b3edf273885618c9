"""Proof status in tests (issue 20: a pair is exact only when both entries' stated reductions are equal *and* both
were proven by running the framework's code, mappings/proofs.yaml).

* :func:`assume_proven`: a registry built from small fixture mapping files (whose entries no proof can have seen)
  with every entry counted proven, for tests of the reduction engine itself: what two stated reductions make of a
  run's config. The proof gate is tested on the shipped mappings (tests/unit/test_proofs_gate.py).
* :func:`only_unproven`: a reason that says nothing but "stated, not proven" (the stated reductions agree).
"""
from __future__ import annotations

from typing import Any

from trackbridge.schema.proofs import only_unproven

__all__ = ["assume_proven", "only_unproven", "agrees", "gate_holds", "EveryEntryProven"]


class EveryEntryProven(dict):
    """A ``Registry.proven`` that holds every entry."""

    def __contains__(self, key: object) -> bool:
        return True


def assume_proven(reg: Any) -> Any:
    reg.proven = EveryEntryProven()
    return reg


def agrees(reason: str | None) -> bool:
    """The stated reductions agree: exact, or approximate only for want of a proof."""
    return reason is None or only_unproven(reason)


def gate_holds(reg: Any, entry: Any, reason: str | None) -> bool:
    """The mark of a key whose stated reduction is the one compared with: none when ``entry`` is proven (in
    ``reg.proven``), else the proof gate's reason alone."""
    return reason is None if (entry.file, entry.line) in reg.proven else only_unproven(reason)
