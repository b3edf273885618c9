"""Further vendored tags run their own files (tests/_support/vendored.py): loading a further tag's module (AReaL
v0.4.0's stats_tracker, which imports torch: so not a unit test) leaves the process's own modules as they were."""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch")

from _support import vendored as V  # noqa: E402


def test_a_further_tag_is_kept_apart_from_the_process_modules():
    """areal v0.4.0's stats_tracker imports its own tag's logging.py, and neither is left in sys.modules (where the
    installed areal 1.0.4, or another tag, lives)."""
    before = {k: m for k, m in sys.modules.items() if k.split(".")[0] == "areal"}
    log = V.load("areal", "areal/utils/logging.py", tag="v0.4.0")
    other = V.stand_in("areal.platforms", current_platform=None)
    datapack = V.stand_in("areal.utils.datapack", flat2d=lambda x: x)
    st = V.load("areal", "areal/utils/stats_tracker.py", tag="v0.4.0",
                stand_ins={"areal.platforms": other, "areal.utils.datapack": datapack})
    assert st.logging is log
    assert st.__file__ == str(V.provenance("areal", "v0.4.0").path("areal/utils/stats_tracker.py"))
    assert {k: m for k, m in sys.modules.items() if k.split(".")[0] == "areal"} == before
    assert V.load("areal", "areal/utils/logging.py", tag="v0.4.0") is log, "a tag's module is loaded once"
