"""The corpus of real public logs (issue 29): logs users pasted into public issues or committed to public
repositories, kept verbatim with their provenance (tests/data/real/<framework>/SOURCES.yaml, tests/data/real/README.md),
read as a new user reads them (tests/_support/real_corpus.py: the commands' own reader, detection from the keys and
the run config, then every record translated).

What each log must show: its framework and trainer recognised, a detected release range that contains the real
release (where the log's release is one the mapping lists), at least 90% of its numeric keys placed (translated to a
canonical name, or a key the framework's mapping knows and passes through on purpose), and the sampled keys written
under the canonical name the framework's source says (each `expect:` row cites the source line)."""
from __future__ import annotations

import pytest

from trackbridge.schema.loader import load_registry

from _support.real_corpus import Outcome, logs, run

ALL = logs()
LOGS = [log for log in ALL if log.metric_log]
OTHER = [log for log in ALL if not log.metric_log]
# the corpus as collected (issue 29 asks for 60, 4 per framework: what public material holds is short of it for
# OpenRLHF, SkyRL and ROLL, whose users post screenshots and configs; the routes tried are in each folder's
# SOURCES.yaml): a floor
MIN_LOGS = 60
MIN_PER_FRAMEWORK = {"trl": 18, "verl": 18, "openrlhf": 2, "slime": 6, "nemo_rl": 5, "prime_rl": 4, "skyrl": 2,
                     "areal": 5}
MIN_PLACED = 0.9


@pytest.fixture(scope="module")
def reg():
    return load_registry()


@pytest.fixture(scope="module")
def outcomes(reg) -> dict[str, Outcome]:
    return {log.id: run(log, reg) for log in LOGS}


def test_the_corpus_is_there():
    assert len(LOGS) >= MIN_LOGS, len(LOGS)
    per = {}
    for log in LOGS:
        per[log.framework] = per.get(log.framework, 0) + 1
        assert log.path.is_file(), log.id
        assert log.origin.get("repository") and (log.origin.get("commit") or log.origin.get("url")), log.id
    for fw, n in MIN_PER_FRAMEWORK.items():
        assert per.get(fw, 0) >= n, (fw, per)


def test_files_without_per_step_metrics_say_why_and_read_cleanly(reg):
    """A check table, a summary over steps: kept as users paste them, read without a traceback."""
    assert OTHER, "the corpus keeps such files"
    for log in OTHER:
        assert log.why, log.id
        o = run(log, reg)
        assert not o.error, (log.id, o.error)


def test_every_expectation_names_a_canonical_metric(reg):
    checked = 0
    for log in LOGS:
        for e in log.expect:
            assert e["canonical"] is None or reg.canonical.find(e["canonical"]) is not None, (log.id, e)
            assert "@" in e.get("source", ""), (log.id, e, "cite file@release")
            checked += 1
    assert checked >= 2 * len(LOGS)


def _unmapped_trainer(log) -> bool:
    fw = load_registry().frameworks.get(log.framework)
    return fw is not None and log.trainer not in fw.trainers


PARAMS = [pytest.param(log, id=log.id, marks=pytest.mark.xfail(
              strict=True, reason=f"{log.framework} trainer {log.trainer!r} is not mapped")) if _unmapped_trainer(log)
          else pytest.param(log, id=log.id) for log in LOGS]


@pytest.mark.parametrize("log", PARAMS)
def test_each_log_is_recognised_and_placed(log, outcomes, reg):
    o = outcomes[log.id]
    assert not o.error, o.error
    assert o.numeric, "no numeric keys read"
    want = (log.framework, log.trainer)
    assert (o.framework, o.trainer) == want, f"want {'/'.join(want)}, got {o.source}"
    right = o.release_right(reg)
    assert right is not False, f"real release {log.release}, detected {o.source}"
    if right is None:       # a release no mapping lists (a fork, an unreleased main): its new keys cannot be placed;
        return              # it counts in the corpus figures (README) and test_the_corpus_as_a_whole
    assert o.share_known >= MIN_PLACED, (f"{len(o.known)} of {len(o.numeric)} placed; not: "
                                         f"{sorted(o.numeric - o.known)[:12]}")
    for e in log.expect:
        assert e["key"] in o.numeric, (e, "the key is not in the log")
        if e["canonical"] is None:          # the framework logs it without a canonical name: passed through
            assert e["key"] in o.known and e["key"] not in o.mapped, e
            continue
        want = f"{e['split']}/{e['canonical']}" if e.get("split") else e["canonical"]
        assert want in o.canonical.get(e["key"], set()), (e, o.canonical.get(e["key"]))


def test_the_corpus_as_a_whole(outcomes, reg):
    """The issue's bar: at least 95% recognised with the release right, at least 90% of the numeric keys placed
    (of the logs of releases the mappings list: a fork's or an unreleased main's new keys cannot be placed)."""
    recognised = [o for o in outcomes.values() if o.recognised and o.release_right(reg) is not False]
    listed = [o for o in outcomes.values() if o.release_right(reg) is not None]
    numeric = sum(len(o.numeric) for o in listed)
    placed = sum(len(o.known) for o in listed)
    assert len(recognised) >= 0.95 * len(outcomes), sorted(set(outcomes) - {o.log.id for o in recognised})
    assert placed >= 0.9 * numeric, (placed, numeric)


def test_the_corpus_readme_is_current():
    from _support.real_corpus import REAL, readme
    assert (REAL / "README.md").read_text() == readme(), "run: python tests/_support/real_corpus.py --readme"


def test_the_readme_frameworks_table_says_what_the_mappings_and_the_corpus_say(outcomes, reg):
    """README 'Frameworks mapped': each framework's releases as its mapping lists them, and the corpus figures."""
    from _support import ROOT
    from _support.real_corpus import summary, update_main_readme
    text = (ROOT / "docs" / "translation.md").read_text()
    figures = summary(list(outcomes.values()), reg)
    assert update_main_readme(text, figures) == text, "run: python tests/_support/real_corpus.py --readme"
    rows = [ln for ln in text.split("**Frameworks mapped**", 1)[1].splitlines()[:40] if ln.startswith("|")]
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    table: dict[str, dict[str, str]] = {}
    for ln in rows[2:]:
        cells = dict(zip(head, (c.strip() for c in ln.strip("|").split("|"))))
        table.setdefault(cells["file"].strip("`").removesuffix(".yaml"), cells)
    assert set(table) == set(reg.frameworks), sorted(set(table) ^ set(reg.frameworks))
    for name, fw in reg.frameworks.items():
        span = fw.releases[0] if len(fw.releases) == 1 else f"{fw.releases[0]} .. {fw.releases[-1]}"
        assert table[name]["releases read"] == span, (name, table[name]["releases read"], span)
        assert table[name]["real logs"] == figures[name]["real logs"], name


def test_the_thresholds_leave_room_with_the_real_logs(outcomes, reg):
    """trackbridge.detect's calibration on the corpus: every recognised log well above MIN_CONFIDENCE (the module
    docstring gives the figure), and the records of frameworks the mappings lack (test_detect_unknown) below it."""
    from trackbridge.detect import MIN_CONFIDENCE
    known = [o.confidence for o in outcomes.values() if o.recognised]
    assert len(known) >= 0.9 * len(outcomes)
    assert min(known) >= 0.8 > MIN_CONFIDENCE, min(known)
