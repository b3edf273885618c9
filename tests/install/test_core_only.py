"""The wheel installed alone (PyYAML is its only dependency): what needs no extra works, and every command or call
that needs one exits 2 (or raises ``MissingExtra``) with one line naming the extra to install, before it reads or
writes anything. The tracker runs read here are the demo's, written by the test environment's trackbridge (every
tracker installed), so this module does not wait for the ``[all]`` venv (tests/install/test_wheel.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _support import ROOT
from _support.install import one_line

#: every path that needs an extra: (test id, command line with {ex} = the examples, {demo} = the demo's output,
#: {tmp} = a fresh folder, {spool} = a spool file), the extra, and the package it names
NEEDS_EXTRA = [
    ("compare-report", ["compare", "{ex}/verl_console.log", "--out", "{tmp}/report"], "plot", "matplotlib"),
    ("demo", ["demo", "--out", "{tmp}/demo"], "plot", "matplotlib"),
    ("read-tensorboard", ["migrate", "tensorboard:{demo}/trackers/tensorboard", "jsonl:{tmp}/out"], "tensorboard",
     "tensorboard"),
    ("read-tensorboard-by-path", ["translate", "{demo}/trackers/tensorboard/verl_console"], "tensorboard",
     "tensorboard"),
    ("detect-tensorboard", ["detect", "{demo}/trackers/tensorboard/verl_console"], "tensorboard", "tensorboard"),
    ("read-wandb", ["migrate", "wandb:{demo}/trackers/wandb", "jsonl:{tmp}/out"], "wandb", "wandb"),
    ("read-wandb-by-path", ["compare", "{demo}/trackers/wandb", "--into", "jsonl:{tmp}/out"], "wandb", "wandb"),
    ("read-mlflow", ["migrate", "mlflow:sqlite:///{demo}/trackers/mlflow.db", "jsonl:{tmp}/out"], "mlflow",
     "mlflow"),
    ("read-mlflow-compare", ["compare", "mlflow:sqlite:///{demo}/trackers/mlflow.db", "--into", "jsonl:{tmp}/out"],
     "mlflow", "mlflow"),
    ("write-tensorboard", ["migrate", "console:{ex}/verl_console.log", "tensorboard:{tmp}/out"], "tensorboard",
     "tensorboard"),
    ("write-wandb", ["migrate", "console:{ex}/verl_console.log", "wandb:{tmp}/out"], "wandb", "wandb"),
    ("write-mlflow", ["migrate", "console:{ex}/verl_console.log", "mlflow:sqlite:///{tmp}/out/m.db"], "mlflow",
     "mlflow"),
    ("write-trackio", ["migrate", "console:{ex}/verl_console.log", "trackio:{tmp}/out"], "trackio", "trackio"),
    ("replay-tensorboard", ["replay", "{spool}", "--to", "tensorboard:{tmp}/out"], "tensorboard", "tensorboard"),
    ("replay-wandb", ["replay", "{spool}", "--to", "wandb:{tmp}/out"], "wandb", "wandb"),
    ("replay-mlflow", ["replay", "{spool}", "--to", "mlflow:sqlite:///{tmp}/out/m.db"], "mlflow", "mlflow"),
    ("replay-trackio", ["replay", "{spool}", "--to", "trackio:{tmp}/out"], "trackio", "trackio"),
    ("compare-into-tensorboard", ["compare", "{ex}/verl_console.log", "--into", "tensorboard:{tmp}/out"],
     "tensorboard", "tensorboard"),
    ("compare-into-mlflow", ["compare", "{ex}/verl_console.log", "--into", "mlflow:sqlite:///{tmp}/out/m.db"],
     "mlflow", "mlflow"),
]
SINKS = {"tensorboard": "tensorboard:{tmp}/tb", "wandb": "wandb:{tmp}/wb", "mlflow": "mlflow:sqlite:///{tmp}/m.db",
         "trackio": "trackio:{tmp}/tio"}


def test_only_pyyaml_is_installed(venv_core):
    r = venv_core.py("import importlib.metadata as m; "
                     "print(sorted(d.metadata['Name'].lower() for d in m.distributions()))")
    assert r.returncode == 0, r
    assert set(eval(r.stdout)) - {"pip", "setuptools"} == {"trackbridge", "pyyaml"}, r


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory):
    """The demo's output folder (a run in every tracker), made by the checkout's trackbridge."""
    out = tmp_path_factory.mktemp("core-demo") / "demo"
    p = subprocess.run([sys.executable, "-m", "trackbridge", "demo", "--out", str(out)], capture_output=True,
                       text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def spool(venv_core, tmp_path_factory):
    """A spool written by ``init`` in the core venv (the spool needs no extra)."""
    where = tmp_path_factory.mktemp("core-spool")
    r = venv_core.py(f"""
        import trackbridge
        with trackbridge.init(project="smoke", run_id="r1", spool={str(where)!r}, source="verl@0.4.1") as run:
            for step in range(1, 11):
                run.log({{"actor/pg_loss": 0.1 * step}}, step=step)
    """)
    assert r.returncode == 0, r
    return where / "r1.jsonl"


@pytest.mark.parametrize("case", NEEDS_EXTRA, ids=[c[0] for c in NEEDS_EXTRA])
def test_a_command_needing_an_extra_exits_2_naming_it(venv_core, demo_out, spool, tmp_path, case):
    _name, argv, extra, package = case
    demo = demo_out
    assert (demo / "trackers").is_dir(), "the demo wrote no tracker runs"
    tmp = tmp_path / "t"
    tmp.mkdir()
    args = [a.format(ex=venv_core.examples(), demo=demo, tmp=tmp, spool=spool) for a in argv]
    r = venv_core.tb(*args)
    assert r.returncode == 2, r
    line = one_line(r.stderr)
    assert f"needs the [{extra}] extra ({package} is not installed): pip install 'trackbridge[{extra}]'" in line, r
    assert line.startswith("trackbridge"), r
    assert "Traceback" not in r.stderr and not r.stdout.strip(), r
    assert list(tmp.iterdir()) == [], f"wrote {list(tmp.rglob('*'))} before failing"


@pytest.mark.parametrize("tracker", sorted(SINKS))
def test_init_with_a_sink_needing_an_extra_names_it(venv_core, tmp_path, tracker):
    loc = SINKS[tracker].format(tmp=tmp_path)
    r = venv_core.py(f"""
        import trackbridge
        from trackbridge.extras import MissingExtra
        try:
            trackbridge.init(project="p", spool={str(tmp_path / 'spool')!r}, sinks=[{loc!r}])
        except MissingExtra as exc:
            assert isinstance(exc, trackbridge.UsageError) and isinstance(exc, ImportError)
            print(exc)
    """)
    assert r.returncode == 0, r
    assert one_line(r.stdout) == (f"sink {loc!r} needs the [{tracker}] extra ({tracker} is not installed): "
                                  f"pip install 'trackbridge[{tracker}]'"), r
    assert not (tmp_path / "spool").exists() or not list((tmp_path / "spool").glob("*.jsonl")), "a run was started"


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_open_source_needing_an_extra_names_it(venv_core, demo_out, tracker):
    demo = demo_out
    loc = {"tensorboard": f"tensorboard:{demo}/trackers/tensorboard", "wandb": f"wandb:{demo}/trackers/wandb",
           "mlflow": f"mlflow:sqlite:///{demo}/trackers/mlflow.db"}[tracker]
    r = venv_core.py(f"""
        from trackbridge.trackers import open_source
        from trackbridge.extras import MissingExtra
        try:
            open_source({loc!r})
        except MissingExtra as exc:
            print(exc)
    """)
    assert r.returncode == 0, r
    assert one_line(r.stdout) == (f"the {tracker} reader needs the [{tracker}] extra ({tracker} is not installed): "
                                  f"pip install 'trackbridge[{tracker}]'"), r


def test_the_core_alone_translates_detects_lints_and_logs(venv_core, spool, tmp_path):
    ex = venv_core.examples()
    r = venv_core.tb("translate", ex / "trl_grpo_trainer_state.json")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 100, r
    r = venv_core.tb("detect", ex / "trl_ppo_console.log")
    assert r.returncode == 0 and "trl/ppo" in r.stdout, r
    for args in (["mappings", "lint"], ["mappings", "show", "reward/score/mean"],
                 ["mappings", "docs", "--out", tmp_path / "m.md"]):
        r = venv_core.tb(*args)
        assert r.returncode == 0, r
    r = venv_core.tb("migrate", f"csv:{ex / 'trl_dpo_wandb_export.csv'}", f"jsonl:{tmp_path / 'j'}", "--quiet")
    assert r.returncode == 0, r
    r = venv_core.tb("replay", spool, "--to", f"jsonl:{tmp_path / 'r'}")
    assert r.returncode == 0 and "wrote 10 records" in r.stderr, r
    r = venv_core.py("import trackbridge; print(trackbridge.translate({'actor/ppo_kl': 0.1}, source='verl@0.4.1')"
                     ".metrics)")
    assert r.returncode == 0 and "'kl/old_policy/k1': 0.1" in r.stdout, r


def test_the_trackio_reader_needs_no_extra(venv_core, demo_out, tmp_path):
    """Trackio keeps its runs in SQLite, read with the standard library: no trackio package needed to read them."""
    demo = demo_out
    r = venv_core.tb("migrate", f"trackio:{demo}/trackers/trackio", f"jsonl:{tmp_path / 'j'}", "--quiet")
    assert r.returncode == 0, r
    streams = sorted((tmp_path / "j").glob("*.jsonl"))
    assert len(streams) == 2, (streams, r)
    steps = sum(1 for s in streams for line in s.read_text().splitlines() if json.loads(line).get("type") != "run")
    assert steps == 300, steps
