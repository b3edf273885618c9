"""Every code block of README.md and of the docs pages it links to runs as written (issue 18, item 3; issue 35).

The blocks run in README order in one scratch folder, as a user following the README would: ``bash`` blocks through
``bash -euo pipefail`` (every command must exit 0), ``python`` blocks each in a fresh interpreter, with the installed
``trackbridge`` command first on PATH. The folder holds the files the blocks name: the shipped ``examples/``, and
``run.jsonl``, ``old.jsonl``, ``trainer_state.json``, ``out/trainer_state.json``, ``verl.log``, ``old_runs/`` (a
TensorBoard folder as transformers writes it) and ``wandb/`` (an offline wandb run), built from the examples. A
``yaml`` block of a trackbridge format is a file the text tells the user to save: it is written under the name the
other blocks use (``my_mappings.yaml``), then linted and used to translate each of its entries.

Only the blocks in :data:`SKIP` are not run, each with its reason; the test fails if a listed block is gone (the
list never silently grows stale) or if a block is of a kind it does not know. It counts the blocks it ran and
checks that count.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from _support import ROOT

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("trackio")

README = ROOT / "README.md"
#: the README, then the pages it sends a reader to, in the order their blocks build on each other (the pages were
#: the README's sections, in this order)
PAGES = [README] + [ROOT / "docs" / f"{name}.md" for name in (
    "translation", "logger", "integrations", "migration", "comparison", "doctor", "diagnostics", "performance",
    "exit-codes", "tests")]
#: the reference pages: their YAML blocks show the formats (with ``...`` where a value is elided), so each is checked
#: against the JSON schema of its format (mappings/schemas/), not run
REFERENCE_PAGES = [ROOT / "docs" / f"{name}.md" for name in ("mapping-format", "reductions", "diagnostics")]
CHECKS_FILE = "my_checks.yaml"
MAPPING_FILE = "my_mappings.yaml"      # the name the README's commands give a user's mapping file

# first line of the block -> why it is not run
SKIP = {
    """python -m verl.trainer.main_ppo ... trainer.logger='["console","wandb"]' \\""":
        "a veRL training run on GPUs; veRL's own Tracking inside a Ray actor with the hook is "
        "tests/frameworks/test_integrations_ray.py::test_verl_tracking_in_a_task_runner_reaches_every_tracker, "
        "the override reaching ray.init ::test_verl_main_ppo_override_reaches_ray_init",
    ("TRACKBRIDGE_SINKS=tensorboard:/abs/runs/tb,mlflow:sqlite:////abs/runs/mlflow.db "
     "TRACKBRIDGE_SPOOL=/abs/runs/spool \\"):
        "an OpenRLHF training run on GPUs; the launcher is "
        "tests/frameworks/test_integrations_ray.py::test_the_launcher_runs_a_framework_module_with_the_hook, "
        "OpenRLHF's loggers in an actor ::test_openrlhf_ppo_trainer_loggers_in_an_actor",
    "import trackbridge.integrations.transformers  # registers report_to=\"trackbridge\"":
        "a fragment (GRPOConfig without its trainer); report_to='trackbridge' with real trainers is "
        "tests/frameworks/test_integrations_by_name.py::test_report_to_trackbridge_plain_trainer and "
        "::test_report_to_trackbridge_grpo",
    'TRACKBRIDGE_SINKS="tensorboard:runs/tb,mlflow:sqlite:///runs/mlflow.db" \\':
        "names a Hub model and dataset; the same route with a real `trl sft` on a tiny local model is "
        "tests/frameworks/test_integrations_by_name.py::test_trl_cli_route_report_to_trackbridge",
    "from trackbridge.integrations.lightning import TrackBridgeLogger":
        "a fragment without a LightningModule; Trainer.fit with the logger is "
        "tests/frameworks/test_integrations_lightning.py",
    "make demo   # creates .venv, installs, runs the demo on the example runs, prints what it does, where the output "
    "is and how to open it":
        "sets up a virtualenv and runs the whole test suite (`make test`), of which this test is a part; CI runs "
        "`make demo` and `make test` themselves",
    "from trackbridge.integrations.transformers import TrackBridgeCallback":
        "a fragment with the user's placeholders (GRPOTrainer(model=..., reward_funcs=[...], args=args, "
        "train_dataset=ds)); the callback with a real GRPOTrainer is tests/frameworks/test_integrations_trl.py",
    "trackbridge migrate tensorboard:/shared/runs/ mlflow:http://mlflow.internal:5000 --engine ray \\":
        "names a Ray cluster and a tracking server of the user's; the same command against a one-node cluster on "
        "127.0.0.1 is tests/trackers/test_migrate_ray.py::test_cli_engine_ray_reaches_the_cluster",
    "make test        # lint, then the whole suite on 3 workers (pytest-xdist): what CI runs (.ci/run)":
        "runs the whole test suite, of which this test is a part (CI runs `make test` itself; `make smoke` is "
        "tests/install)",
    "mappings/            the facts: canonical.yaml (the hub: names, config names, splits, compare axes, presets,":
        "the layout of the repository (a tree, not code)",
}
RUN_KINDS = {"bash", "python"}


def blocks(path: Path = README) -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block of ``path`` (README.md)."""
    out, lang, start, buf = [], None, 0, []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^```\s*([\w+-]*)\s*$", line)
        if fence and lang is None:
            lang, start, buf = fence.group(1), i, []
        elif line.startswith("```") and lang is not None:
            out.append((start, lang, "\n".join(buf) + "\n"))
            lang = None
        elif lang is not None:
            buf.append(line)
    assert lang is None, f"{path.name}:{start}: a code block is never closed"
    return out


def _first_line(text: str) -> str:
    return next((ln.rstrip() for ln in text.splitlines() if ln.strip()), "")


def _write_fixtures(d: Path, env: dict[str, str]) -> None:
    ex = ROOT / "examples"
    shutil.copytree(ex, d / "examples")
    shutil.copy(ex / "trl_grpo_trainer_state.json", d / "trainer_state.json")
    (d / "out").mkdir()
    shutil.copy(ex / "trl_grpo_trainer_state.json", d / "out" / "trainer_state.json")
    shutil.copy(ex / "verl_console.log", d / "verl.log")
    verl = [{"step": s, "actor/pg_loss": 0.1 / s, "actor/ppo_kl": 0.001 * s, "critic/score/mean": 0.4 + 0.01 * s,
             "timing_s/gen": 12.5, "my_key": s} for s in range(1, 6)]
    (d / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in verl))
    grpo = [{"step": s, "completion_length": 30.0 + s, "reward": 0.1 * s, "reward_std": 0.05, "kl": 0.001 * s,
             "rewards/accuracy_reward": 0.1 * s, "loss": 0.01, "learning_rate": 1e-6} for s in range(1, 6)]
    (d / "old.jsonl").write_text("".join(json.dumps(r) + "\n" for r in grpo))
    from torch.utils.tensorboard import SummaryWriter  # old_runs/: as transformers' TensorBoardCallback
    w = SummaryWriter(str(d / "old_runs" / "grpo-1"))
    w.add_text("args", json.dumps({"learning_rate": 1e-6, "beta": 0.04, "num_generations": 8}), 0)
    for r in grpo:
        for k, v in r.items():
            if k != "step":
                w.add_scalar(f"train/{k}", v, r["step"])
    w.close()
    r = subprocess.run([sys.executable, "-m", "trackbridge", "migrate", "--quiet", "console:verl.log", "wandb:wandb"],
                       cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr                 # wandb/: an offline wandb run
    assert list((d / "wandb").rglob("run-*.wandb"))


def _mapping_file(d: Path, text: str, env: dict[str, str]) -> None:
    """A user's mapping file from the README: saved, linted, and each entry translated (generic: key, canonical,
    framework and since are what any mapping entry has)."""
    doc = yaml.safe_load(text)
    assert doc.get("format") == "trackbridge.mapping/1", doc
    (d / MAPPING_FILE).write_text(text)
    r = subprocess.run([sys.executable, "-m", "trackbridge", "mappings", "lint", MAPPING_FILE], cwd=d, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    import trackbridge

    def filled(name: str) -> str:
        return re.sub(r"\{[^}]*\}", "x", name)

    assert doc["entries"], "the README's mapping example has no entries"
    for e in doc["entries"]:
        source = doc["framework"] + (f"@{str(e['since']).lstrip('v')}" if e.get("since") else "")
        res = trackbridge.translate({filled(e["key"]): 1.0}, source=source, mappings=[str(d / MAPPING_FILE)])
        assert res.metrics == {filled(e["canonical"]): 1.0}, (e, res.metrics, res.notes)


def _checks_file(d: Path, text: str, env: dict[str, str]) -> None:
    """A user's checks file (docs/diagnostics.md): saved and linted as the page says, and its checks load."""
    doc = yaml.safe_load(text)
    assert doc.get("format") == "trackbridge.checks/1", doc
    (d / CHECKS_FILE).write_text(text)
    r = subprocess.run([sys.executable, "-m", "trackbridge", "mappings", "lint", CHECKS_FILE], cwd=d, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    from trackbridge.doctor.checks import load_checks
    ids = [c.id for c in load_checks(paths=[str(d / CHECKS_FILE)])]
    assert {c["id"] for c in doc["checks"]} <= set(ids), ids


def _elided(value: Any) -> Any:
    """A YAML block with ``...`` for what it leaves out: list items ``...`` dropped (the rest of a list)."""
    if isinstance(value, dict):
        return {k: _elided(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_elided(v) for v in value if v != "..."]
    return value


def _partial_paths(value: Any, path: tuple = ()) -> set[tuple]:
    """The paths of the mappings that elide a value (``description: ...``): a required field missing there is
    what the ``...`` stands for."""
    out: set[tuple] = set()
    if isinstance(value, dict):
        if "..." in value.values():
            out.add(path)
        for k, v in value.items():
            out |= _partial_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out |= _partial_paths(v, (*path, i))
    return out


def _schemas() -> dict[str, dict]:
    out = {}
    for path in (ROOT / "mappings" / "schemas").glob("*.schema.json"):
        doc = json.loads(path.read_text(encoding="utf-8"))
        out[doc["properties"]["format"]["const"]] = doc
    return out


def _fragment_schema(root: dict, key: str) -> dict | None:
    """The schema of a top-level key of a format fragment (``reduce:``, ``config:``, ``levels:``): the file's own
    property, else an entry's."""
    for where in (root.get("properties", {}), *(d.get("properties", {}) for d in root.get("$defs", {}).values())):
        if key in where:
            return {"$defs": root.get("$defs", {}), **where[key]}
    return None


def test_reference_pages_show_what_the_schemas_accept():
    """docs/mapping-format.md, reductions.md and diagnostics.md show the mapping formats in YAML blocks: each parses,
    and each is what its format's JSON schema accepts (a whole file by its ``format:``; a fragment key by key, as
    the framework file's schema states that key), ``...`` standing for what the page leaves out. Found once: the
    schema refused `until: null`, which the page and the loader allow."""
    import jsonschema
    schemas = _schemas()
    checked = []
    for page in REFERENCE_PAGES:
        for line, lang, text in blocks(page):
            if lang != "yaml":
                continue
            where = f"{page.relative_to(ROOT)}:{line}"
            raw = yaml.safe_load(text)
            assert isinstance(raw, dict), where
            doc, partial = _elided(raw), _partial_paths(raw)
            if "format" in doc:
                parts = [(schemas[doc["format"]], doc, ())]
            else:
                root = schemas["trackbridge.mapping/1"]
                parts = []
                for key, value in doc.items():
                    sub = _fragment_schema(root, key)
                    assert sub is not None, f"{where}: {key!r} is no field of the mapping format"
                    parts.append((sub, value, (key,)))
            for schema, value, at in parts:
                for err in jsonschema.Draft202012Validator(schema).iter_errors(value):
                    path = (*at, *err.absolute_path)
                    if err.validator == "required" and path in partial:
                        continue
                    raise AssertionError(f"{where}: {'.'.join(map(str, path))}: {err.message}")
            checked.append(where)
    assert len(checked) >= 7, checked          # 7 today: 4 on mapping-format.md, 2 on reductions.md, 1 checks file


def test_every_readme_block_runs_as_written(tmp_path, env):
    work = tmp_path / "user"
    work.mkdir()
    run_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "TRACKBRIDGE_STATE_DIR": str(tmp_path / "state")}
    run_env.pop("PYTHONPATH", None)
    run_env.pop("WANDB_SERVICE", None)      # a user's shell: not this test process's wandb-core (wandb.init sets it)
    _write_fixtures(work, run_env)
    all_blocks = [(page.relative_to(ROOT), line, lang, text) for page in PAGES for line, lang, text in blocks(page)]
    assert {page for page, *_ in all_blocks} == {p.relative_to(ROOT) for p in PAGES if blocks(p)}
    ran, skipped, files = [], [], []
    # the files the README asks the user to save come first (the command list near the top lints my_mappings.yaml)
    for page, line, lang, text in all_blocks:
        if lang == "yaml" and "format: trackbridge.checks/" in text:
            _checks_file(work, text, run_env)
            files.append(f"{page}:{line}")
        elif lang == "yaml" and "format: trackbridge." in text:
            _mapping_file(work, text, run_env)
            files.append(f"{page}:{line}")
    for page, line, lang, text in all_blocks:
        first = _first_line(text)
        where = f"{page}:{line}"
        if first in SKIP:
            skipped.append(first)
            continue
        if where in files:
            continue
        assert lang in RUN_KINDS, f"{where}: a ```{lang} block this test does not know how to run: run it or add " \
                                  f"it to SKIP with the reason"
        cmd = ["bash", "-euo", "pipefail", "-c", text] if lang == "bash" else [sys.executable, "-c", text]
        r = subprocess.run(cmd, cwd=work, env=run_env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{where} ({lang}) failed with exit {r.returncode}:\n{text}\n{r.stderr[-4000:]}"
        assert "Traceback" not in r.stderr, f"{where}: {r.stderr[-4000:]}"
        ran.append(where)
    assert sorted(skipped) == sorted(SKIP), f"SKIP lists blocks the README no longer has: {set(SKIP) - set(skipped)}"
    assert files, "the README's own mapping file example was not found"
    assert len(ran) == len(all_blocks) - len(SKIP) - len(files), (ran, skipped, files)
    assert len(ran) >= 9, ran          # 9 today (5 bash, 4 python blocks): fewer means blocks went unrecognised
    # what the blocks made is really there
    assert (work / "report" / "report.html").is_file() and (work / "compare-report" / "report.html").is_file()
    assert (work / "report.json").is_file() and (work / "mlflow.db").is_file() and (work / "all.db").is_file()
    assert list((work / "tb").rglob("events.out.tfevents.*"))


def test_the_examples_readme_runs_as_written(tmp_path):
    """examples/README.md's code, run as a user would from a clone's root (it once imported a module that no longer
    existed): every block is Python, and each exits 0 without a traceback."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    found = blocks(ROOT / "examples" / "README.md")
    assert found, "examples/README.md has no code block"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for line, lang, text in found:
        assert lang == "python", f"examples/README.md:{line}: a ```{lang} block this test does not run"
        r = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"examples/README.md:{line}:\n{r.stderr[-3000:]}"
        assert "points," in r.stdout, r.stdout
