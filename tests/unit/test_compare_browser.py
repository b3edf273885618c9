"""report.html opens in headless Chromium, offline, without errors, and shows something (screenshot not blank).

Uses the system Chromium (Debian's ``chromium`` package, installed by ``.ci/run``); never downloads a browser. Skipped,
with the reason printed in pytest's summary (``-ra``), when no Chromium binary is on PATH. The browser runs with
every background service off, a fresh profile, and host resolution and proxy pointed nowhere, so the page cannot
reach the network; the report's Content-Security-Policy also makes any load attempt show up as a console message,
which fails the test.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trackbridge.compare import compare_runs
from trackbridge.compare.plot import COLORS

from _support import ROOT

GRPO = f"grpo=trainer-state:{ROOT / 'examples' / 'trl_grpo_trainer_state.json'}"
VERL = f"verl=console:{ROOT / 'examples' / 'verl_console.log'}"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WINDOW = (1200, 2000)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="browser check SKIPPED: no chromium binary on PATH "
                                                "(apt-get install chromium; .ci/run does it)"),
]


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
           "--disable-default-apps", "--no-default-browser-check", "--mute-audio",
           f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
           "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def _problems(stderr: str) -> list[str]:
    """Console messages (script errors, blocked loads) and failed loads reported by the browser."""
    bad = []
    for line in stderr.splitlines():
        if ":CONSOLE" in line or "net::ERR" in line or "Refused to" in line or "violates" in line:
            bad.append(line)
    return bad


def _screenshot(html: Path, tmp: Path, name: str):
    import matplotlib.image as mpimg
    shot = tmp / f"{name}.png"
    proc = _chromium([f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", html.resolve().as_uri()],
                     tmp / f"profile-{name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert shot.is_file(), f"no screenshot written; chromium said:\n{proc.stderr[-3000:]}"
    problems = _problems(proc.stderr)
    assert not problems, "\n".join(problems)
    img = mpimg.imread(str(shot))[..., :3]
    return img


def _hex(h: str):
    import numpy as np
    return np.array([int(h[i:i + 2], 16) for i in (1, 3, 5)], dtype=float) / 255.0


def test_report_opens_offline_without_errors(tmp_path):
    import numpy as np
    res = compare_runs([GRPO, VERL], out=tmp_path / "report")
    img = _screenshot(res.html, tmp_path, "full")
    assert img.shape[:2] == (WINDOW[1], WINDOW[0])
    assert float(np.std(img)) > 0.05, "screenshot is blank"
    assert float((img.min(axis=-1) < 0.8).mean()) > 0.01, "screenshot is almost blank (no text drawn)"
    # the DOM the browser built holds every metric's section and embedded chart
    proc = _chromium(["--dump-dom", res.html.resolve().as_uri()], tmp_path / "profile-dom")
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom = proc.stdout
    assert dom.count('class="metric"') == len(res.metrics)
    assert dom.count("data:image/png;base64,") == len(res.metrics)
    assert not _problems(proc.stderr)


def test_charts_render_in_the_browser(tmp_path):
    """A one-metric report puts the chart on screen: both runs' line colours must be in the screenshot."""
    full = compare_runs([GRPO, VERL], out=None)
    flagged = [m.name for m in full.metrics if m.approximate and len(m.stats) == 2]
    assert flagged, "no metric shared by both runs is flagged approximate"
    res = compare_runs([GRPO, VERL], metrics=flagged[0], out=tmp_path / "one")
    img = _screenshot(res.html, tmp_path, "one")
    for color in COLORS[:2]:
        close = (abs(img - _hex(color)).max(axis=-1) < 0.1).sum()
        assert close > 100, f"run colour {color} not visible: the embedded chart did not render"
    # the approximate warning box (orange border) is visible next to the metric
    assert (abs(img - _hex("#e67700")).max(axis=-1) < 0.08).sum() > 50


def test_a_chart_is_on_the_first_screen(tmp_path):
    """The report opens on its key charts: in a 1280x800 window (no scrolling), the first chart is drawn, both runs'
    line colours included, under the title and one line of context; tables and warnings come after it."""
    import numpy as np
    res = compare_runs([GRPO, VERL], out=tmp_path / "report")
    shot = tmp_path / "first-screen.png"
    proc = _chromium([f"--screenshot={shot}", "--window-size=1280,800", res.html.resolve().as_uri()],
                     tmp_path / "profile-first")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-3000:]
    assert not _problems(proc.stderr)
    import matplotlib.image as mpimg
    img = mpimg.imread(str(shot))[..., :3]
    assert img.shape[:2] == (800, 1280)
    rows = []
    for color in COLORS[:2]:
        hit = abs(img - _hex(color)).max(axis=-1) < 0.1
        assert hit.sum() > 100, f"run colour {color} not on the first screen: no chart there"
        rows.append(int(np.argmax(hit.any(axis=1))))
    assert min(rows) < 800 - 100, rows          # the chart starts well inside the first screen
