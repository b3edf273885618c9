"""Naming-scheme specs: ``canonical``, ``auto``, ``FRAMEWORK[/TRAINER][@VERSION]`` and ``FRAMEWORK@LO..HI``.

Examples: ``trl/grpo@0.14.0``, ``trl@1.16.0``, ``trl-legacy``, ``verl@0.4.1``, ``openrlhf``, ``canonical@1.0.0``,
``verl/ppo@v0.4.0..v0.7.0`` (a release range, as detection reports it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import TrackBridgeError
from .loader import Registry
from .versions import VersionError, version_key
from .yamlfile import MappingError


class SpecError(TrackBridgeError, ValueError):
    """A naming-scheme spec that cannot be parsed or names an unknown framework, trainer or release."""


@dataclass(frozen=True)
class Spec:
    """A parsed naming-scheme spec (see the module docstring); ``lo``/``hi`` bound the framework releases meant."""

    kind: str                       # "canonical" | "auto" | "framework"
    framework: str | None = None
    trainer: str | None = None
    lo: float = 0.0                 # release index range (inclusive); half-indices fall between known releases
    hi: float = float("inf")
    version: str | None = None      # the release asked for, as written
    canonical_version: str | None = None
    note: str | None = field(default=None, compare=False)   # a release asked for that trackbridge does not list

    def describe(self, registry: Registry | None = None) -> str:
        """The spec as text; with a registry, a release range is named by its first and last release."""
        if self.kind != "framework" or self.framework is None:
            return self.kind + (f"@{self.canonical_version}" if self.canonical_version else "")
        text = self.framework + (f"/{self.trainer}" if self.trainer else "")
        if self.version:
            return f"{text}@{self.version}"
        if registry is not None and (self.lo > 0 or self.hi != float("inf")):
            fw = registry.frameworks[self.framework]
            lo = fw.release_name(int(max(self.lo, 0)))
            hi = fw.release_name(int(min(self.hi, len(fw.releases) - 1)))
            return f"{text}@{lo}" if lo == hi else f"{text}@{lo}..{hi}"
        return text

    def bounds(self, n_releases: int) -> tuple[float, float]:
        """The release-index range, the upper end capped just past the last of ``n_releases`` releases."""
        return self.lo, min(self.hi, n_releases - 1 + 0.5)


def parse_spec(text: str, registry: Registry, *, allow_auto: bool = True) -> Spec:
    """Parse a naming-scheme spec against the registry's frameworks, aliases and releases; raises SpecError."""
    raw = (text or "").strip()
    if not raw:
        raise SpecError("empty naming scheme; expected canonical, auto, or FRAMEWORK[/TRAINER][@VERSION]")
    name, _, version_text = raw.partition("@")
    name = name.strip().lower()
    version = version_text.strip() or None
    if name == "canonical":
        known = [v for v, _ in registry.canonical.renames] or [registry.canonical.version]
        if version and not any(v.lstrip("v") == version.lstrip("v") for v in known):
            raise SpecError(f"{raw!r}: the canonical schema has no version {version!r}; known: {', '.join(known)}")
        return Spec("canonical", canonical_version=version)
    if name == "auto":
        if not allow_auto:
            raise SpecError("'auto' is only allowed for the source naming scheme")
        return Spec("auto")
    fw_name, _, trainer_text = name.partition("/")
    resolved = registry.resolve_alias(fw_name)
    if resolved is None:
        known = sorted(set(registry.frameworks) | {a for f in registry.frameworks.values() for a in f.aliases})
        raise SpecError(f"{raw!r}: unknown framework {fw_name!r}; known: canonical, auto, {', '.join(known)}")
    fw_name, alias = resolved
    fw = registry.frameworks[fw_name]
    trainer: str | None = trainer_text or alias.get("trainer")
    if trainer and trainer not in fw.trainers:
        raise SpecError(f"{raw!r}: unknown {fw_name} trainer {trainer!r}; known: {', '.join(sorted(fw.trainers))}")
    lo, hi = 0.0, float("inf")
    if alias.get("since"):
        lo = fw.release_index(str(alias["since"]))
    if alias.get("until"):
        hi = fw.release_index(str(alias["until"]))
    notes: list[str] = []
    if version:
        try:
            if ".." in version:
                a, _, b = version.partition("..")
                lo, hi = _release(fw, a.strip(), raw, notes), _release(fw, b.strip(), raw, notes)
            else:
                lo = hi = _release(fw, version, raw, notes)
        except (VersionError, MappingError) as exc:
            raise SpecError(f"{raw!r}: {exc}") from None
        if lo > hi:
            raise SpecError(f"{raw!r}: the range runs backwards")
    return Spec("framework", framework=fw_name, trainer=trainer or None, lo=lo, hi=hi, version=version,
                note="; ".join(notes) or None)


def _release(fw: Any, version: str, raw: str, notes: list[str]) -> float:
    """The release index of ``version`` (see ``FrameworkMapping.release_index``), with what trackbridge says about
    a release it does not list: one older than the first, or of a newer major version than the newest, is a usage
    error naming the known range (its names may differ entirely); one between two listed releases is read as the
    one before it, and one newer than the newest of the same major version as the newest, with a note each."""
    known = f"trackbridge knows {fw.name} {fw.releases[0]}..{fw.releases[-1]}"
    if not version:
        raise SpecError(f"{raw!r}: empty release; {known}")
    idx = fw.release_index(version)
    if fw.has_release(version):
        return idx
    if idx < 0:
        raise SpecError(f"{raw!r}: {version} is older than the first {fw.name} release trackbridge knows; {known}")
    newest = fw.releases[-1]
    if version_key(version) > version_key(newest):
        if version_key(version)[:1] != version_key(newest)[:1]:
            raise SpecError(f"{raw!r}: {version} is a newer major version than any {fw.name} release trackbridge "
                            f"knows ({known}); its names may differ: give a known release, or update trackbridge")
        notes.append(f"{fw.name} {version} is newer than the newest release trackbridge knows ({newest}): read "
                     f"with {newest}'s names; keys added since are passed through and reported")
        return idx
    notes.append(f"{fw.name} {version} is not a release trackbridge knows ({known}): read as "
                 f"{fw.release_name(idx)}, the release before it")
    return idx
