"""wandb reader: runs written by wandb itself (no trackbridge), folder forms, truncated and damaged files."""
from __future__ import annotations

import os
import struct

import pytest

# wandb offline, hubs offline, scratch cache dirs: tests/conftest.py (pytest_configure), set before any
# test module imports a tracker
wandb = pytest.importorskip("wandb")

from trackbridge.trackers import open_source  # noqa: E402
from trackbridge.trackers.wandb.records import BLOCK, read_payloads, run_files  # noqa: E402
from trackbridge.trackers.wandb.source import WandbSource  # noqa: E402
from trackbridge.tracking.source import SourceError  # noqa: E402

ROWS = 300
KEYS = 20


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A run written with wandb's own API (as a trainer would), large enough to span several 32 KiB blocks."""
    home = tmp_path_factory.mktemp("wandb-home")
    saved = {k: os.environ.get(k) for k in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                                           "XDG_CACHE_HOME")}
    for k in saved:
        os.environ[k] = str(home / k.lower())
    folder = tmp_path_factory.mktemp("native")
    settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False, silent=True,
                              x_disable_meta=True)
    run = wandb.init(mode="offline", dir=str(folder), project="native-proj", name="native run", id="nat1",
                     config={"lr": 0.5, "model": {"layers": 2}}, tags=["baseline", "team=rl"],
                     reinit="create_new", settings=settings)
    for step in range(ROWS):
        row = {f"train/m{k:02d}": step * 100 + k + 0.5 for k in range(KEYS)}
        row["_timestamp"] = 1700000000.0 + step
        if step == 5:
            row["nested"] = {"a": 1, "b": {"c": 2}}
            row["table"] = wandb.Table(columns=["x"], data=[[1]])
        run.log(row, step=step * 2)
    run.finish()
    (path,) = run_files(folder / "wandb", "nat1")
    import time

    from trackbridge.trackers.wandb.records import has_exit_record
    deadline = time.monotonic() + 60
    while not has_exit_record(path) and time.monotonic() < deadline:     # finish() may return before the flush
        time.sleep(0.05)
    yield folder, path
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_native_run(native):
    folder, path = native
    assert path.stat().st_size > 2 * BLOCK
    (reader,) = WandbSource(str(folder)).runs()
    info = reader.info
    assert (info.name, info.project, info.run_id) == ("native run", "native-proj", "nat1")
    assert info.config == {"lr": 0.5, "model": {"layers": 2}}
    assert info.tags == {"baseline": "", "team": "rl"}
    got = list(reader.records())
    assert len(got) == ROWS
    assert [r.step for r in got[:3]] == [0, 2, 4]                      # wandb's _step when no trackbridge/step
    assert got[7].wall_time == 1700000007.0
    assert got[7].metrics == {f"train/m{k:02d}": 700 + k + 0.5 for k in range(KEYS)}
    assert got[5].metrics["nested.a"] == 1 and got[5].metrics["nested.b.c"] == 2
    assert "table" not in got[5].metrics
    assert any("table" in p.what for p in reader.problems)
    assert all("table" in p.what for p in reader.problems)


def test_folder_forms(native):
    folder, path = native
    for loc in (folder, folder / "wandb", path.parent, path):
        (reader,) = open_source(f"wandb:{loc}").runs()
        assert reader.info.run_id == "nat1"
    assert list(open_source(f"wandb:{folder}?run=other").runs()) == []
    with pytest.raises(SourceError, match="no run-"):
        list(WandbSource(str(folder / "wandb" / path.parent.name / "files")).runs())
    with pytest.raises(SourceError, match="no such"):
        WandbSource(str(folder / "missing"))


@pytest.mark.parametrize("cut", [BLOCK + 100, 2 * BLOCK - 3, 50_000])
def test_truncated_file(native, tmp_path, cut):
    _, path = native
    bad = tmp_path / "run-nat1.wandb"
    bad.write_bytes(path.read_bytes()[:cut])
    (reader,) = WandbSource(str(bad)).runs()
    got = list(reader.records())
    assert 0 < len(got) < ROWS
    assert [r.step for r in got] == [2 * i for i in range(len(got))]    # a valid prefix, nothing invented
    assert all(len(r.metrics) >= KEYS for r in got)
    trunc = [p for p in reader.problems if "truncated" in p.what]
    assert trunc and all(p.where.startswith(f"{bad}:") for p in trunc)
    assert all(int(p.where.rsplit(":", 1)[1]) <= cut for p in trunc)


def test_bad_crc_skips_to_next_block(native, tmp_path):
    _, path = native
    data = bytearray(path.read_bytes())
    offsets = [off for off, _ in read_payloads(path)]
    target = next(o for o in offsets if o > BLOCK + 1000)                 # a record inside the second block
    data[target + 10] ^= 0xFF
    bad = tmp_path / "run-nat1.wandb"
    bad.write_bytes(bytes(data))
    (reader,) = WandbSource(str(bad)).runs()
    got = list(reader.records())
    assert ROWS - 60 < len(got) < ROWS                                   # one block's rows lost, the rest kept
    steps = [r.step for r in got]
    assert steps == sorted(steps) and steps[-1] == 2 * (ROWS - 1)
    crc = [p for p in reader.problems if "CRC" in p.what]
    assert crc and crc[0].where == f"{bad}:{target}"


def test_not_a_wandb_file(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"hello world" * 10)
    (reader,) = WandbSource(str(bad)).runs()
    assert list(reader.records()) == []
    assert "not a wandb transaction log" in reader.problems[0].what


def test_header_and_chunk_format(native):
    _, path = native
    head = path.read_bytes()[:7]
    assert head[:4] == b":W&B" and struct.unpack("<H", head[4:6])[0] == 0xBEE1 and head[6] == 0
