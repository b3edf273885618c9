"""The frameworks' files vendored for the fidelity proofs (tests/_support/vendored.py) are the release tag's own,
byte for byte, with their licence: every file under a tag's src/ is listed in its PROVENANCE.yaml with the SHA-256
of what `git show <tag>:<path>` gave, and nothing else lies there; a framework may hold several tags (its primary
one in its folder, each further one in <framework>/<tag>/), and two tags of one framework load without colliding."""
from __future__ import annotations

from _support import vendored as V


def test_every_framework_without_a_wheel_is_vendored():
    assert set(V.REPOSITORIES) - V.WHEELS <= set(V.frameworks()) <= set(V.REPOSITORIES)
    for fw in V.frameworks():
        assert V.tags(fw), fw
        # a framework with a wheel vendors older tags only (the wheel is its primary code)
        assert (V.FOLDER / fw / "PROVENANCE.yaml").exists() == (fw not in V.WHEELS), fw


def test_vendored_files_are_the_tags_own_bytes():
    checked = 0
    for fw in V.frameworks():
        tags = V.tags(fw)
        assert len(set(tags)) == len(tags), (fw, tags)
        for tag in tags:
            v = V.provenance(fw, tag)
            assert v.tag == tag and v.repository == V.REPOSITORIES[fw], (fw, tag)
            assert len(v.commit) == 40 and v.files, (fw, tag)
            assert "Apache License" in (v.root / "LICENSE").read_text()[:400], (fw, tag)
            # bytecode a loader wrote is not kept (git ignores it)
            kept = {p.relative_to(v.root / "src").as_posix() for p in (v.root / "src").rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts}
            assert kept == set(v.files), (fw, tag, sorted(kept ^ set(v.files)))
            for path, digest in v.files.items():
                assert V.sha256(v.path(path).read_bytes()) == digest, f"{fw}: {path} differs from {tag}'s"
                checked += 1
    assert checked >= 5


def test_each_tag_runs_as_its_own_release():
    for fw in V.frameworks():
        releases = V.releases(fw)
        assert len(set(releases)) == len(releases), (fw, releases)
        for tag, release in zip(V.tags(fw), releases):
            assert V.tag_of(fw, release) == tag
            assert V.release(fw, tag) == release



def test_the_primary_tag_loads_as_before():
    fw = "prime_rl"
    v = V.provenance(fw)
    assert v.primary and v.root == V.FOLDER / fw and V.tags(fw)[0] == v.tag
