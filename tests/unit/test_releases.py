"""tests/releases.txt, the older releases of the wheel frameworks the proofs of older entries run (issue 33;
tests/_support/releases.py): what it lists, and how a bad line reads."""
from __future__ import annotations

import os
import re

import pytest

from _support import ROOT
from _support import releases as R


def pinned() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_every_listed_release_is_an_older_release_of_a_wheel_framework():
    got = R.listed()
    assert set(got) <= set(R.DISTS.values()), sorted(set(got) - set(R.DISTS.values()))
    pins = pinned()
    count = 0
    for dist, versions in got.items():
        assert len(versions) == len(set(versions)), (dist, versions)
        assert pins[dist] not in versions, f"{dist} {pins[dist]} is the pinned release, not an older one"
        count += len(versions)
    assert count >= 1


def test_a_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "releases.txt"
    path.write_text("# comment\nverl==0.8.0\ntrl 1.12.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"releases\.txt:3: expected name==version, got 'trl 1\.12\.0'"):
        R.listed(path)
    path.write_text("verl==0.8.0  # why\n\nverl==0.5.0\n", encoding="utf-8")
    assert R.listed(path) == {"verl": ["0.8.0", "0.5.0"]}
    path.write_text("trl==0.11.4 transformers==4.44.2  accelerate==0.34.2\nverl==0.5.0\n", encoding="utf-8")
    assert R.listed(path) == {"trl": ["0.11.4"], "verl": ["0.5.0"]}
    assert R.companions("trl", "0.11.4", path) == ["transformers==4.44.2", "accelerate==0.34.2"]
    assert R.companions("verl", "0.5.0", path) == []
    path.write_text("trl==0.11.4 transformers\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"releases\.txt:1: a companion must be pinned as name==version, got "
                                         r"'transformers'"):
        R.listed(path)


def test_the_installed_releases_are_the_listed_ones():
    """make installs every listed release (each folder holds that version's dist-info); in CI a missing one fails,
    so no proof of an older release is skipped unnoticed."""
    missing = []
    for dist, versions in R.listed().items():
        for v in versions:
            where = R.folder(dist, v)
            if not R.installed_as_listed(dist, v):
                missing.append(f"{dist}=={v}")
                continue
            for req in [f"{dist}=={v}", *R.companions(dist, v)]:
                name, _, version = req.partition("==")
                norm = re.sub(r"[-_.]+", "_", name).lower()
                held = [p.name[:-len(".dist-info")].rsplit("-", 1) for p in where.glob("*.dist-info")]
                versions_held = [ver for stem, ver in held if re.sub(r"[-_.]+", "_", stem).lower() == norm]
                assert versions_held == [version], f"{where}: {req} held as {versions_held}"
    if missing and not os.environ.get("CI"):
        pytest.skip(f"not installed: {', '.join(missing)} (make .venv/.test-installed installs them)")
    assert not missing, f"not installed: {missing}"
