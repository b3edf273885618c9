"""The frameworks' files vendored for the fidelity proofs (tests/_support/vendored.py) are the release tag's own,
byte for byte, with their licence: every file under a framework's src/ is listed in its PROVENANCE.yaml with the
SHA-256 of what `git show <tag>:<path>` gave, and nothing else lies there."""
from __future__ import annotations

from _support import vendored as V


def test_every_framework_without_a_wheel_is_vendored():
    assert V.frameworks() == sorted(V.REPOSITORIES)


def test_vendored_files_are_the_tags_own_bytes():
    checked = 0
    for fw in V.frameworks():
        v = V.provenance(fw)
        assert v.repository == V.REPOSITORIES[fw], fw
        assert len(v.commit) == 40 and v.tag and v.files, fw
        assert "Apache License" in (v.root / "LICENSE").read_text()[:400], fw
        # bytecode a loader wrote is not kept (git ignores it)
        kept = {p.relative_to(v.root / "src").as_posix() for p in (v.root / "src").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
        assert kept == set(v.files), (fw, sorted(kept ^ set(v.files)))
        for path, digest in v.files.items():
            assert V.sha256(v.path(path).read_bytes()) == digest, f"{fw}: {path} differs from {v.tag}'s"
            checked += 1
    assert checked >= 5
