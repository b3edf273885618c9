"""The package's import graph, read from the source (``ast`` over ``trackbridge/**/*.py``):

* no import cycle among modules. Every ``import`` counts, those inside functions too; only imports under
  ``if TYPE_CHECKING:`` are left out (they never run). Importing ``a.b.c`` counts as importing ``a.b.c`` and the
  packages ``a.b`` it lives in (Python runs their ``__init__`` first), except the importing module's own packages;
* no tracker folder (``trackbridge/trackers/<name>/``) imports another tracker's folder, nor a file format's reader
  (``trackbridge/files/``), and those import no tracker: both build on :mod:`trackbridge.tracking` (the ``Sink`` and
  ``Source`` bases and the helpers they share), which imports neither them nor the registry (issue 22: the bases
  lived in ``sinks/`` and ``sources/``, which re-exported the registry, a package-level cycle); no module imports
  another package's private (``_name``) module;
* the layers (:data:`LAYERS`, lowest first): no module imports a module of a higher layer, deferred imports included
  (design.md "Layers"; issue 20 moved the last five that climbed: the naming-scheme specs into ``schema/``, the
  ``mappings`` views up beside the CLI, the version into a leaf, the text-safety helper out of the sink base, the
  renaming pipeline and the pending note out of the ``replay`` command);
* the core (``schema/``, ``translate/``, ``derive/``, ``record/``, ``pipeline/``, ``sync/holdings.py`` and the
  logger, ``logger/``) imports no tracker module when it is imported (imports inside functions run later and are
  not followed here; a subprocess checks the same on ``sys.modules``), and names no tracker and no framework in its
  code: identifiers and string literals are checked, comments and docstrings are not (they may say what a rule is
  for).
"""
from __future__ import annotations

import ast
import functools
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from _support import ROOT

PKG = ROOT / "trackbridge"
TRACKERS = sorted(p.name for p in (PKG / "trackers").iterdir() if (p / "__init__.py").is_file())
CORE = ["trackbridge.schema", "trackbridge.translate", "trackbridge.derive", "trackbridge.record",
        "trackbridge.pipeline", "trackbridge.sync.holdings", "trackbridge.logger", "trackbridge.doctor"]
TRACKER_NAMES = ["jsonl", "tensorboard", "tfevents", "mlflow", "wandb", "trackio"]
FRAMEWORK_NAMES = ["trl", "verl", "openrlhf", "transformers", "accelerate", "deepspeed"]
# Names the core still uses, each with the reason; the test fails for any other. None left: the spool is written by
# the canonical stream's own writer (trackbridge/stream/), no longer by the jsonl tracker's sink.
ALLOWED: set[tuple[str, str]] = set()


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _deferred_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside function bodies (they run when called, not when the module is imported)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out.update(id(n) for n in ast.walk(node) if n is not node)
    return out


def _targets(mod: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        return [target] + [f"{target}.{a.name}" for a in node.names]
    return []


def _edges(at_import_only: bool) -> dict[str, set[str]]:
    """module -> the trackbridge modules it imports (``at_import_only``: leaving out imports inside functions)."""
    return {m: set(ts) for m, ts in _parsed_edges(at_import_only).items()}


@functools.lru_cache(maxsize=2)
def _parsed_edges(at_import_only: bool) -> dict[str, frozenset[str]]:      # every module parsed once per process
    edges: dict[str, frozenset[str]] = {}
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree) | (_deferred_nodes(tree) if at_import_only else set())
        out: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for name in _targets(mod, path, node):
                parts = name.split(".")
                if parts[0] != "trackbridge":
                    continue
                while parts and ".".join(parts) not in MODULES:     # `from pkg import name`: name is no module
                    parts = parts[:-1]
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target != mod and not mod.startswith(target + "."):
                        out.add(target)
        edges[mod] = frozenset(out)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _tracker_of(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "trackers" and parts[2] in TRACKERS else None


def _is_core(mod: str) -> bool:
    return any(mod == c or mod.startswith(c + ".") for c in CORE)


# Layers, lowest first: a module may import its own layer and the layers below it, never one above (every import,
# deferred ones too). A module counts as the first of its sub-package (``sync.holdings``) and its top-level name under
# trackbridge (``schema`` for trackbridge.schema.loader) that a layer holds: a package whose modules serve different
# layers (``sync``: what a tracker holds is core, replaying a spool is the edge) has an empty ``__init__`` in the
# lowest layer and names each module.
LAYERS: list[set[str]] = [
    {"_version", "errors", "exitcodes", "extras", "limits", "sync"},    # leaves; sync/__init__ imports nothing
    {"record"},                                                 # the record and its values (record/)
    {"schema"},                                                 # the facts: load, check, compile; specs
    {"detect", "derive"},                                       # detection, the derived-rule engine
    {"translate"},                                              # the translation stages
    {"pipeline", "stream", "sync.holdings", "doctor"},          # records through the stages; the canonical stream;
                                                                # what a tracker holds; diagnostics
    {"tracking"},                                               # what trackers and readers build on; locators
    {"trackers", "files", "sync.catchup"},                      # the registry, the trackers, the file readers;
                                                                # writing what a tracker lacks
    {"logger"},                                                 # the logger
    {"integrations"},                                           # trainers' callbacks
    {"sync.replay", "migrate", "compare", "read"},              # the edge: reading runs (read/), moving them
    {"cli"},                                                    # the command line (cli/: commands, demo, views)
    {"__main__", ""},                                           # the package face
]
SUB_PACKAGES = {name for names in LAYERS for name in names if "." in name}


def _layer(mod: str) -> int:
    parts = mod.split(".")[1:]
    name = ".".join(parts[:2]) if ".".join(parts[:2]) in SUB_PACKAGES else (parts[0] if parts else "")
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"{mod} is in no layer: add it to LAYERS")


def test_a_split_package_has_an_empty_init_and_every_module_named():
    """``sync`` serves three layers: its ``__init__`` imports nothing, and each of its modules has a layer of its own
    (a module added there without one would take the leaves' layer)."""
    split = {name.split(".")[0] for name in SUB_PACKAGES}
    assert split == {"sync"}
    for pkg in split:
        init = PKG / pkg / "__init__.py"
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], init
        mods = sorted(m for m in MODULES if m.startswith(f"trackbridge.{pkg}."))
        assert mods and [m for m in mods if m.split(".", 1)[1] not in SUB_PACKAGES] == []


def test_every_module_is_in_a_layer_and_none_imports_upward():
    edges = _edges(at_import_only=False)
    assert len(edges) > 80
    upward = sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets if _layer(t) > _layer(m))
    assert upward == []


def test_the_five_moves_that_stopped_climbing_stay():
    """Named, so that a new import that climbs the same way fails with its reason."""
    edges = _edges(at_import_only=False)
    schema = {m: t for m, t in edges.items() if m.startswith("trackbridge.schema")}
    outside = sorted(f"{m} -> {x}" for m, ts in schema.items() for x in ts
                     if not x.startswith("trackbridge.schema") and x not in ("trackbridge.errors",
                                                                            "trackbridge._version"))
    assert outside == [], "the schema layer reads and compiles the facts; printing views live in cli/mappings.py"
    assert "trackbridge.spec" not in MODULES, "naming-scheme specs live in trackbridge.schema.spec"
    assert "trackbridge" not in edges["trackbridge.schema.cache"], "the version is in the leaf trackbridge._version"
    logger = sorted(f"{m} -> {x}" for m, ts in edges.items() if m.startswith("trackbridge.logger") for x in ts
                    if x.split(".")[1] in ("migrate", "compare", "cli") or x == "trackbridge.sync.replay")
    assert logger == [], "the logger renames through trackbridge.pipeline and keeps its pending note in logger/"
    stream = sorted(x for x in edges["trackbridge.stream"] if x.split(".")[1] in ("tracking", "trackers"))
    assert stream == [], "the canonical stream's writer uses trackbridge.record.values.printable"


def test_no_import_cycle():
    assert _cycles(_edges(at_import_only=False)) == []


def test_no_tracker_imports_another():
    bad = [(m, t) for m, targets in _edges(at_import_only=False).items() if _tracker_of(m)
           for t in targets if _tracker_of(t) and _tracker_of(t) != _tracker_of(m)]
    assert bad == []


def _under(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def test_trackers_and_file_readers_import_the_base_downward():
    edges = _edges(at_import_only=False)
    assert "trackbridge.sinks" not in MODULES and "trackbridge.sources" not in MODULES
    base = {m: ts for m, ts in edges.items() if _under(m, "trackbridge.tracking")}
    assert len(base) >= 4
    up = sorted(f"{m} -> {t}" for m, ts in base.items() for t in ts
                if not _under(t, "trackbridge.tracking") and _layer(t) >= _layer("trackbridge.trackers"))
    assert up == [], "trackbridge.tracking imports no tracker, no file reader and not the registry"
    for name in TRACKERS:
        sink, source = f"trackbridge.trackers.{name}.sink", f"trackbridge.trackers.{name}.source"
        assert "trackbridge.tracking.sink" in edges[sink], sink
        assert "trackbridge.tracking.source" in edges[source], source
    files = [m for m in MODULES if _under(m, "trackbridge.files")]
    assert {"trackbridge.files.csv", "trackbridge.files.console", "trackbridge.files.trainer_state"} <= set(files)
    for m in files:
        assert not [t for t in edges[m] if _under(t, "trackbridge.trackers")], m
    for m in (m for m in MODULES if _tracker_of(m)):
        assert not [t for t in edges[m] if _under(t, "trackbridge.files")], m
    assert _layer("trackbridge.tracking") < _layer("trackbridge.trackers") == _layer("trackbridge.files")


def test_no_module_imports_another_packages_private_module():
    private = [m for m in MODULES if m.rsplit(".", 1)[-1].startswith("_") and not m.endswith("__init__")]
    assert "trackbridge.integrations._tee" in private
    bad = sorted(f"{m} -> {t}" for m, ts in _edges(at_import_only=False).items() for t in ts
                 if t in private and not _under(m, t.rsplit(".", 1)[0]))
    assert bad == []


# The trackers issue 22 added as one folder each: no module outside its folder names it, but the registry's one line
ADDED_AS_FOLDERS = ("swanlab", "clearml", "comet", "neptune")


def test_the_trackers_added_as_folders_are_named_only_in_their_folder_and_one_registry_line():
    registry = PKG / "trackers" / "__init__.py"
    for name in ADDED_AS_FOLDERS:
        assert (PKG / "trackers" / name / "sink.py").is_file() and (PKG / "trackers" / name / "source.py").is_file()
        word = re.compile(rf"(?<![A-Za-z]){name}(?![A-Za-z])", re.I)
        outside = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                   if (PKG / "trackers" / name) not in p.parents and p != registry
                   and word.search(p.read_text(encoding="utf-8"))]
        assert outside == [], f"{name} is named outside trackers/{name}/: {outside}"
        lines = [line for line in registry.read_text(encoding="utf-8").splitlines() if word.search(line)]
        assert len(lines) == 1 and lines[0].startswith(f'register_tracker("{name}",'), lines


def test_every_tracker_folder_is_registered_once():
    from trackbridge.extras import MissingExtra
    from trackbridge.trackers import kinds, tracker
    missing = []
    for name in TRACKERS:
        assert name in kinds("sink") and name in kinds("source"), name
        entry = tracker(name)
        assert entry.sniff == f"trackbridge.trackers.{name}:sniff"
        try:
            assert entry.sink_class().__module__ == f"trackbridge.trackers.{name}.sink"
            assert entry.source_class().__module__ == f"trackbridge.trackers.{name}.source"
        except MissingExtra as exc:          # make test-quick installs no tracker package (make test every one)
            missing.append(str(exc).split(":")[0])
    registry = (PKG / "trackers" / "__init__.py").read_text(encoding="utf-8")
    assert len(re.findall(r"^register_tracker\(", registry, flags=re.M)) == len(kinds())
    if missing:
        pytest.skip(f"the classes of these could not be imported: {'; '.join(missing)}")


def test_the_core_imports_no_tracker_when_imported():
    edges = _edges(at_import_only=True)
    for core in [m for m in MODULES if _is_core(m)]:
        seen, todo = set(), [core]
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo += edges.get(m, ())
        assert not [m for m in seen if _tracker_of(m)], core
    code = ("import sys\n" + "".join(f"import {m}\n" for m in CORE) +
            "print(sorted(m for m in sys.modules if m.startswith('trackbridge.trackers.') or "
            f"m.split('.')[0] in {TRACKER_NAMES + ['torch', 'numpy']!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
                    isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def test_the_core_names_no_tracker_and_no_framework():
    word = re.compile(r"(?<![A-Za-z])(" + "|".join(TRACKER_NAMES + FRAMEWORK_NAMES) + r")(?![A-Za-z])", re.I)
    found = set()
    for mod, path in MODULES.items():
        if not _is_core(mod):
            continue
        text = path.read_text(encoding="utf-8")
        docs = _docstring_lines(ast.parse(text))
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.NAME, tokenize.STRING) or (tok.type == tokenize.STRING and
                                                                     tok.start[0] in docs):
                continue
            for m in word.finditer(tok.string):
                found.add((str(path.relative_to(ROOT)), m.group(1).lower(), tok.start[0]))
    assert sorted(f for f in found if (f[0], f[1]) not in ALLOWED) == []


def test_every_error_class_of_the_package_is_a_trackbridge_error():
    """``except trackbridge.TrackBridgeError`` catches every error class the library defines (each keeps its
    built-in base too, so ``except ValueError`` still works)."""
    import ast
    import importlib
    import pathlib

    import trackbridge
    root = pathlib.Path(trackbridge.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name == "Unreachable"):
                mod = ".".join(path.relative_to(root.parent).with_suffix("").parts).replace(".__init__", "")
                found.append(getattr(importlib.import_module(mod), node.name))
    assert len(found) >= 14
    not_ours = [c.__qualname__ for c in found if not issubclass(c, trackbridge.TrackBridgeError)]
    assert not not_ours, not_ours
    with __import__("pytest").raises(trackbridge.TrackBridgeError):
        trackbridge.init(sinks=["nosuchkind:x"], spool="/nonexistent-trackbridge-spool")
