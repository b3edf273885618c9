"""The registry of fingerprinted entries: what a proof established about a mapping entry, read by the proofs report
(tests/_support/fidelity_proofs.py -> docs/fidelity-proofs.md).

How to write a proof (issue 20, docs/reductions.md "Proof by fingerprint"): decorate a test with :func:`proof`,
naming the framework, trainer, release (the installed wheel's) and the run config the framework's code runs with;
the test receives a :class:`Proving` (and any pytest fixture it names after it), runs the framework's own code on a
batch built so that every candidate reduction gives a different number, and calls :meth:`Proving.assert_stated` for
each key it read back::

    from _support.proven import proof

    @proof("verl", trainer="ppo", release="0.9.1",
           config={"actor_rollout_ref.actor.ppo_mini_batch_size": 2, "data.train_batch_size": 4})
    def test_verl_actor_losses(p):
        logged, steps = run_verls_train_mini_batch(...)          # the framework's code, the batch it was given
        p.assert_stated("actor/kl_loss", logged["actor/kl_loss"], steps, levels=("micro_batches", "mini_batches"))
        p.check(logged["actor/pg_loss"] < 0, "...")             # any other assertion, counted

``assert_stated`` finds the mapping entry trackbridge uses for that key (trainer, release and config as declared),
resolves its ``reduce:`` under the config (switches, counts) with :func:`trackbridge.translate.fidelity.resolve`,
fingerprints the logged value (``fingerprint.assert_stated``: the value must be the stated reduction and no other
on this batch; keyword arguments go to it) and records a :class:`Fingerprinted` in :data:`RECORDS`. An entry that
states no reduction fails the proof. A proof that makes no assertion fails (:data:`MIN_ASSERTIONS`).

The report imports every module of :data:`PROOF_MODULES` and runs each registered proof itself (a proof may ask for
``tmp_path`` only; the report gives it a temporary folder), so docs/fidelity-proofs.md never depends on which tests
ran before. A proof of a framework that is not installed is skipped by pytest and reported as unproven, with why.
"""
from __future__ import annotations

import functools
import inspect
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from _support import ROOT
from _support import fingerprint as FP

#: the modules whose proofs the report runs (globs, relative to tests/)
PROOF_MODULES = ("frameworks/test_proof_*.py", "frameworks/test_fidelity_*.py")
MIN_ASSERTIONS = 1


@dataclass
class Fingerprinted:
    """One entry's reduction established by running the framework: what the report reads."""

    framework: str
    key: str
    trainer: str | None
    release: str
    config: tuple[tuple[str, Any], ...]
    entry: Any                                  # the trackbridge Entry the key translates with
    found: FP.Reduction                         # what the logged value was computed with
    stated: FP.Reduction                        # what the entry states, resolved for the config
    logged: float
    steps: Any                                  # the batch (fingerprint's nesting), to measure gaps on
    norm_len: int = 0
    proof: str = ""                             # module::function

    @property
    def ident(self) -> tuple[str, str, int]:
        return entry_ident(self.entry)

    def value_of(self, red: FP.Reduction) -> float:
        """What another reduction makes of this proof's batch (the gap to the logged value)."""
        return FP.value_of(self.steps, red, self.norm_len)


def entry_ident(e: Any) -> tuple[str, str, int]:
    return (e.framework, Path(e.file).name, e.line)


@dataclass
class Proof:
    """A registered proof: the function and where it runs."""

    fn: Callable[..., Any]
    framework: str
    trainer: str | None
    release: str
    config: tuple[tuple[str, Any], ...]
    name: str
    mappings: tuple[str, ...] = ()              # user mapping files (a unit test's small framework)
    assertions: int = 0
    records: list[Fingerprinted] = field(default_factory=list)

    def run(self, **fixtures: Any) -> "Proving":
        from _support import releases
        p = Proving(self)
        self.records = []
        if releases.runs_elsewhere(self.framework, self.release):
            # an older release of a wheel framework: its code runs in a child process (tests/_support/releases.py);
            # what it asserted is replayed here against that release's entries
            calls, checks = releases.run_in_child(self, fixtures)
            for key, observed, steps, kw in calls:
                p.assert_stated(key, observed, steps, **kw)
            p.assertions += checks
        else:
            self.fn(p, **fixtures)
        assert p.assertions >= MIN_ASSERTIONS, f"proof {self.name} made {p.assertions} assertion(s)"
        self.assertions = p.assertions
        self.records = list(p.records)
        return p


PROOFS: dict[str, Proof] = {}            # name -> proof (every decorated function, once its module is imported)
RECORDS: dict[tuple[str, str, int], list[Fingerprinted]] = {}    # entry -> what proofs found (pytest or the report)


class Proving:
    """What a proof function receives: :meth:`assert_stated` and :meth:`check`, both counted."""

    def __init__(self, proof: Proof):
        self.proof = proof
        self.assertions = 0
        self.records: list[Fingerprinted] = []

    def check(self, condition: Any, message: str = "") -> None:
        self.assertions += 1
        assert condition, message

    def entry(self, key: str) -> tuple[Any, Any]:
        """(Entry, resolved reduction) trackbridge uses for ``key`` under the proof's trainer, release and config."""
        from trackbridge.schema.loader import load_registry
        from trackbridge.translate.entries import choose, flatten_config
        from trackbridge.translate.fidelity import resolve
        pr = self.proof
        reg = load_registry(list(pr.mappings) or None)
        fw = reg.frameworks[pr.framework]
        idx = fw.release_index(pr.release)
        cfg = flatten_config(dict(pr.config))
        hits = fw.lookup(key)
        if not hits:
            split, rest = fw.split_prefix(key)
            hits = fw.lookup(rest) if split else []
        hit = choose(hits, pr.trainer, idx, idx, cfg) if hits else None
        assert hit is not None, f"{pr.framework} has no entry for {key!r} ({pr.trainer}@{pr.release})"
        entry = hit[0]
        assert entry.reduce is not None, (f"{pr.framework} {key!r} ({entry.file}:{entry.line}) states no reduction: "
                                          "write its reduce: first")
        res = resolve(entry, fw, pr.trainer, idx, idx, cfg)
        return entry, res

    def assert_stated(self, key: str, observed: Any, steps: Any = None, **kw: Any) -> FP.Reduction:
        """Fingerprint ``key``'s logged value (or ``[(value, steps), ...]``) and assert it is the entry's stated
        reduction; returns the reduction found. Keyword arguments go to ``fingerprint.assert_stated`` (``levels``,
        ``tokens``, ``norm_len`` ...)."""
        entry, res = self.entry(key)
        want = to_fingerprint(res.stated)
        found = FP.assert_stated(observed, steps, as_fields(want), **kw)
        self.assertions += 1
        first = (float(observed), steps) if steps is not None else (float(observed[0][0]), observed[0][1])
        rec = Fingerprinted(self.proof.framework, key, self.proof.trainer, self.proof.release, self.proof.config,
                            entry, found, want, first[0], first[1], int(kw.get("norm_len", 0)), self.proof.name)
        self.records.append(rec)
        RECORDS.setdefault(rec.ident, []).append(rec)
        return found


def to_fingerprint(fields: Mapping[str, str]) -> FP.Reduction:
    """A resolved reduction (trackbridge's fields) as the fingerprint's candidate: ``gather`` (values pooled before
    the statistic) is the reduction that equals pooling for the statistic (the fingerprint's own ``gather``, the
    pooling, for a std; a sum for a count), ``fraction`` a mean of 0/1 values,
    ``value`` (a scalar such as the lr: ``tokens: none``, one value per micro-batch) its mean, ``window: pooled`` the
    fingerprint's pooled window (``none``), ``processes: none`` with a ``micro_batches`` level the fingerprint's
    ``driver`` (one process combining the values of its batches), and ``processes: gather`` under a ``var`` level the
    ``driver`` too (the ranks' values gathered into one list, whose variance is taken: docs/reductions.md)."""
    stat = {"fraction": "mean", "value": "mean"}.get(fields["stat"], fields["stat"])
    processes = fields["processes"]
    if processes == "gather" and "var" in (fields["micro_batches"], fields["mini_batches"]):
        processes = "driver"       # the ranks' values gathered into the list whose variance is taken (TRL's ratio_var)
    elif processes == "gather":    # a std of the pooled values is no combination of the ranks' stds: the pooling
        processes = {"max": "max", "min": "min", "sum": "sum", "count": "sum",
                     "std": "gather"}.get(stat, "all_reduce_weighted")
    if processes == "none" and fields["micro_batches"] != "none":
        processes = "driver"       # one process combining its batches (fingerprint.PROCESSES_EXTRA)
    std = fields.get("std")
    window = {"pooled": "none"}.get(fields["window"], fields["window"])
    return FP.Reduction(fields["tokens"], stat, fields["micro_batches"], fields["mini_batches"], processes,
                        window, None if std in (None, "none") else std)


def as_fields(red: FP.Reduction) -> dict[str, Any]:
    return {"tokens": red.tokens, "stat": red.stat, "micro_batches": red.micro_batches,
            "mini_batches": red.mini_batches, "processes": red.processes, "window": red.window, "std": red.std}


def proof(framework: str, *, trainer: str | None, release: str, config: Mapping[str, Any] | None = None,
          mappings: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a proof (see the module docstring); the decorated function stays a pytest test. ``mappings``: user
    mapping files to load besides the shipped ones (a unit test's small framework)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        where = Path(inspect.getsourcefile(fn) or fn.__module__)
        name = f"{where.name}::{fn.__name__}"      # the same proof when pytest and the report both import its file
        pr = Proof(fn, framework, trainer, str(release).lstrip("v"), tuple(sorted((config or {}).items())), name,
                   tuple(str(m) for m in mappings))
        PROOFS[name] = pr

        @functools.wraps(fn)
        def test(**fixtures: Any) -> None:
            pr.run(**fixtures)
        params = list(inspect.signature(fn).parameters.values())[1:]       # pytest fixtures after the Proving
        test.__signature__ = inspect.Signature(params)                     # type: ignore[attr-defined]
        test.proof = pr                                                    # type: ignore[attr-defined]
        return test
    return wrap


def run_all() -> tuple[list[Proof], dict[str, str]]:
    """Import every proof module and run every proof (for the report): (proofs that ran, {name or module: why a
    proof or a module could not run})."""
    import importlib.util
    import sys

    import pytest
    failed: dict[str, str] = {}
    for pattern in PROOF_MODULES:
        for path in sorted((ROOT / "tests").glob(pattern)):
            name = "_proofs." + path.stem
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except pytest.skip.Exception as exc:
                failed[path.name] = f"skipped: {exc}"
    ran = []
    RECORDS.clear()
    # only the proofs of the proof modules: a test elsewhere (tests/unit/test_proven_registry.py) registers proofs
    # of a made-up framework in this process, and the report must not depend on which tests ran before it
    files = {path.name for pattern in PROOF_MODULES for path in (ROOT / "tests").glob(pattern)}
    for pr in [p for p in PROOFS.values() if p.name.split("::")[0] in files]:
        wanted = [p for p in inspect.signature(pr.fn).parameters][1:]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                pr.run(**{w: Path(tmp) for w in wanted if w == "tmp_path"})
            ran.append(pr)
        except pytest.skip.Exception as exc:
            failed[pr.name] = f"skipped: {exc}"
        except AssertionError as exc:
            failed[pr.name] = f"failed: {str(exc).splitlines()[0] if str(exc) else 'assertion'}"
    return ran, failed


def close(x: float, y: float, tol: float = 1e-6) -> bool:
    return math.isclose(x, y, rel_tol=tol, abs_tol=tol)
