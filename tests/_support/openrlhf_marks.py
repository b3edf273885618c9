"""The fidelity mark trackbridge gives an OpenRLHF key, computed from the entry's stated reduction (issue 20;
trackbridge/translate/fidelity.py), for the tests of mappings/openrlhf.yaml.

``judged(reg, key, config, trainer=None, release=None)`` picks the entry the translator picks for the key (the same
``choose`` over the same release range: one release, or every release when ``release`` is None, i.e. left out),
resolves its ``reduce:`` under the run config and judges it against the canonical reference: ``(entry, resolved,
reason, name)`` with ``reason`` None when exact and ``name`` the canonical name (a template filled in).
``tags(reason)`` lists the fields a reason names (``[mini_batches]``...).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from trackbridge.translate.entries import choose, flatten_config
from trackbridge.translate.fidelity import Resolved, judge, reference, resolve


def judged(reg: Any, key: str, config: Mapping[str, Any] | None = None, *, trainer: str | None = None,
           release: str | None = None) -> tuple[Any, Resolved, str | None, str]:
    fw = reg.frameworks["openrlhf"]
    if release is None:
        lo, hi = 0, len(fw.releases) - 1
    else:
        lo = hi = fw.release_index(release)
    cfg = flatten_config(dict(config or {}))
    hits = fw.lookup(key)
    if not hits:
        split, rest = fw.split_prefix(key)
        hits = fw.lookup(rest) if split else []
    hit = choose(hits, trainer, lo, hi, cfg) if hits else None
    assert hit is not None, f"openrlhf has no entry for {key!r}"
    entry, caps = hit
    name = entry.canonical_template.fill(caps) if entry.canonical_template and caps else entry.canonical
    res = resolve(entry, fw, trainer, lo, hi, cfg)
    assert res is not None, f"{key!r} ({entry.file}:{entry.line}) states no reduction"
    ref = reference(reg.canonical.metrics[entry.canonical])
    assert ref is not None, f"canonical {entry.canonical!r} states no reference reduction"
    return entry, res, judge(res, ref), name


def tags(reason: str | None) -> set[str]:
    """The fields a generated reason names: ``... [mini_batches]; ... [tokens]`` -> {"mini_batches", "tokens"}."""
    return set(re.findall(r"\[([a-z_]+)\]", reason or ""))
