"""The built sdist and wheel hold every file of the source tree, and every command works from the wheel installed
with ``[all]`` in a fresh venv, on the shipped examples (issue 18: the wheel once lacked ``trackbridge.translate``
while every editable install hid it)."""
from __future__ import annotations

import json
import sqlite3
import sys
import tarfile
import zipfile

import pytest

from _support import ROOT
from _support.install import load_json, run, source_files, source_modules, wheel_names

TRACKERS = ("tensorboard", "mlflow", "wandb", "trackio")


def test_wheel_holds_every_file_of_the_source_tree(dist):
    names = wheel_names(dist.wheel)
    expected = source_files()
    assert "trackbridge/pipeline/translator.py" in expected and "trackbridge/mappings/canonical.yaml" in expected
    missing = sorted(f"{src} (as {inside})" for inside, src in expected.items() if inside not in names)
    assert not missing, "files of the source tree missing from the wheel:\n  " + "\n  ".join(missing)
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"trackbridge", f"{dist.wheel.name.split('-')[0]}-{dist.wheel.name.split('-')[1]}.dist-info"}, top
    extra = sorted(n for n in names if n.startswith("trackbridge/") and n not in expected)
    assert not extra, f"files in the wheel that are not in the source tree: {extra}"
    with zipfile.ZipFile(dist.wheel) as z:
        meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "trackbridge = trackbridge.cli:main" in z.read(meta).decode()


def test_sdist_holds_every_file_of_the_source_tree(dist):
    with tarfile.open(dist.sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = sorted(src for src in source_files().values() if src not in names)
    assert not missing, f"files missing from the sdist: {missing}"
    for f in ("pyproject.toml", "setup.py", "README.md"):
        assert f in names


def test_the_build_prints_no_setuptools_banner(dist):
    """The 'Package would be ignored' banner (a data folder that was no package) is gone for good."""
    assert "would be ignored" not in dist.log and "********" not in dist.log, dist.log[-3000:]


def test_every_module_imports_from_the_wheel(venv_all):
    """Every module of the source tree imports from the installed wheel (a module the wheel lacks fails here);
    the integrations with a framework's own classes name the extra that installs it."""
    modules = source_modules()
    assert "trackbridge.pipeline.translator" in modules and "trackbridge.mappings" in modules and len(modules) > 90
    r = venv_all.py("""
        import importlib, json, sys
        out = {}
        for name in sys.argv[1:]:
            try:
                mod = importlib.import_module(name)
                out[name] = ["ok", mod.__file__]
            except ImportError as exc:
                out[name] = [type(exc).__name__, str(exc)]
        print(json.dumps(out))
    """, *modules)
    assert r.returncode == 0, r
    got = json.loads(r.stdout)
    needs_framework = {"trackbridge.integrations.transformers": ("trl", "transformers"),
                       "trackbridge.integrations.accelerate": ("trl", "accelerate"),
                       "trackbridge.integrations.lightning": ("lightning", "lightning")}
    for name in modules:
        status, detail = got[name]
        if name in needs_framework:        # [all] holds the trackers, not the training frameworks
            extra, package = needs_framework[name]
            assert status == "MissingExtra", (name, status, detail)
            assert f"needs the [{extra}] extra ({package} is not installed)" in detail, detail
            continue
        assert status == "ok", f"{name}: {status}: {detail}"
        assert str(venv_all.path) in detail, f"{name} imported from {detail}, not from the venv"


def test_translate_and_detect(venv_all):
    ex = venv_all.examples()
    r = venv_all.tb("translate", ex / "verl_console.log")
    assert r.returncode == 0, r
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 200 and rows[0]["step"] == 101 and "reward/score/mean" in rows[0], r
    r = venv_all.tb("translate", "--from", "trl/grpo@0.14.0", "--to", "verl@0.4.1", "--derive",
                    ex / "trl_grpo_trainer_state.json")
    assert r.returncode == 0, r
    assert "critic/score/mean" in json.loads(r.stdout.splitlines()[0]), r
    r = venv_all.tb("detect", ex / "verl_console.log")
    assert r.returncode == 0 and "verl/ppo@" in r.stdout, r
    r = venv_all.tb("detect", f"csv:{ex / 'trl_dpo_wandb_export.csv'}")
    assert r.returncode == 0 and "trl/dpo@" in r.stdout, r


def test_mappings_show_lint_docs(venv_all):
    r = venv_all.tb("mappings", "show", "kl/ref/k3")
    assert r.returncode == 0 and "kl/ref/k3" in r.stdout and "verl" in r.stdout, r
    r = venv_all.tb("mappings", "show", "verl")
    assert r.returncode == 0 and "critic/score/mean" in r.stdout, r
    r = venv_all.tb("mappings", "lint")
    assert r.returncode == 0, r
    out = venv_all.work / "metrics.md"
    r = venv_all.tb("mappings", "docs", "--out", out)
    assert r.returncode == 0, r
    # the installed mappings are the checkout's: the generated reference is the one checked in
    assert out.read_text(encoding="utf-8") == (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("tracker", TRACKERS)
def test_migrate_into_each_tracker_and_back(venv_all, tracker, tmp_path):
    ex = venv_all.examples()
    dst = {"tensorboard": f"tensorboard:{tmp_path / 'tb'}", "mlflow": f"mlflow:sqlite:///{tmp_path / 'm.db'}",
           "wandb": f"wandb:{tmp_path / 'wb'}", "trackio": f"trackio:{tmp_path / 'tio'}?project=smoke"}[tracker]
    r = venv_all.tb("migrate", f"console:{ex / 'verl_console.log'}", dst, "--quiet")
    assert r.returncode == 0, r
    back = tmp_path / "back"
    r = venv_all.tb("migrate", dst.split("?")[0], f"jsonl:{back}", "--from", "canonical", "--names", "keep",
                    "--quiet")
    assert r.returncode == 0, r
    streams = list(back.glob("*.jsonl"))
    assert len(streams) == 1, (streams, r)
    rows = [json.loads(x) for x in streams[0].read_text().splitlines()]
    records = [x for x in rows if x.get("type") != "run"]
    assert len(records) == 200, (tracker, len(records))


def test_compare(venv_all, tmp_path):
    ex = venv_all.examples()
    out = tmp_path / "report"
    r = venv_all.tb("compare", f"grpo=trainer-state:{ex / 'trl_grpo_trainer_state.json'}",
                    f"verl=console:{ex / 'verl_console.log'}", "--metrics", "effectiveness", "--out", out)
    assert r.returncode == 0, r
    assert (out / "report.html").is_file() and (out / "summary.csv").is_file()
    assert len(list((out / "charts").glob("*.png"))) >= 3


def test_init_log_finish_then_replay(venv_all, tmp_path):
    """The logger from the wheel (writer process included), then ``replay`` of its spool into every tracker."""
    spool = tmp_path / "spool"
    r = venv_all.py(f"""
        import trackbridge
        with trackbridge.init(project="smoke", run_id="r1", spool={str(spool)!r}, source="verl@0.4.1",
                              sinks=["tensorboard:{tmp_path / 'tb'}"]) as run:
            for step in range(1, 21):
                run.log({{"actor/pg_loss": 0.1 * step, "critic/score/mean": 0.5}}, step=step)
        print(run.run_id)
    """)
    assert r.returncode == 0 and r.stdout.strip() == "r1", r
    assert "Traceback" not in r.stderr, r
    for tracker, loc in (("mlflow", f"mlflow:sqlite:///{tmp_path / 'm.db'}"), ("wandb", f"wandb:{tmp_path / 'wb'}"),
                         ("trackio", f"trackio:{tmp_path / 'tio'}?project=smoke"),
                         ("jsonl", f"jsonl:{tmp_path / 'j'}")):
        r = venv_all.tb("replay", spool / "r1.jsonl", "--to", loc)
        assert r.returncode == 0 and "wrote 20 records" in r.stderr, (tracker, r)


def test_demo(demo_out):
    out, r = demo_out
    assert r.returncode == 0, r
    for line in ("canonical JSON lines", "tensorboard", "mlflow", "wandb", "trackio", "comparison report"):
        assert f"  {line}" in r.stdout, (line, r)
    assert "not installed, skipped" not in r.stdout, r
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r
    assert (out / "report" / "report.html").is_file()
    manifest = load_json(out / ".trackbridge-manifest.json")
    assert isinstance(manifest, dict) and manifest["complete"] is True
    assert "the runs share no step (trl-grpo 1\u2013100, verl-ppo 101\u2013300)" in r.stdout, r
    # the derived marks in MLflow are where the README says: run tags trackbridge.derived.0 (.count)
    with sqlite3.connect(out / "trackers" / "mlflow.db") as conn:
        tags = conn.execute("SELECT key, value FROM tags WHERE key LIKE 'trackbridge.derived%'").fetchall()
    assert sorted(tags) == [("trackbridge.derived.0", '["perf/response_tokens_per_step"]'),
                            ("trackbridge.derived.0", '["perf/tokens_per_step"]'),
                            ("trackbridge.derived.count", "1"), ("trackbridge.derived.count", "1")], tags


def test_python_dash_m_and_version(venv_all, dist):
    r = venv_all.py("import runpy, sys; sys.argv = ['trackbridge', '--version']; "
                    "runpy.run_module('trackbridge', run_name='__main__')")
    version = dist.wheel.name.split("-")[1]
    assert version in r.stdout + r.stderr, r
    r = run([venv_all.exe("python"), "-m", "trackbridge", "--help"], cwd=venv_all.work, env=venv_all.env)
    assert r.returncode == 0 and "usage: trackbridge" in r.stdout, r


def test_an_editable_install_prints_no_banner(tmp_path):
    """What ``make demo`` and ``make test`` run (pip install -e, with the pip they upgrade to) says nothing but
    errors: no setuptools banner ('Package would be ignored', 'Editable installation')."""
    from _support.install import clean_env
    venv = tmp_path / "venv"
    env = clean_env(venv)
    r = run([sys.executable, "-m", "venv", venv], cwd=tmp_path, env=env)
    assert r.returncode == 0, r
    r = run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--upgrade", "pip"], cwd=tmp_path, env=env)
    assert r.returncode == 0, r
    r = run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-e", ROOT], cwd=tmp_path, env=env)
    assert r.returncode == 0, r
    out = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines()
                    if not ln.startswith("WARNING: Location"))     # this machine's pip index settings, not ours
    assert "********" not in out and "BuildBackendWarning" not in out, r
    r = run([venv / "bin" / "python", "-c", "import trackbridge.translate, trackbridge.mappings"], cwd=tmp_path,
            env=env)
    assert r.returncode == 0, r
