"""The typed public contract: every name in ``trackbridge.__all__`` exists, is documented, and the package ships
its type information (``py.typed``)."""
from __future__ import annotations

import inspect
from pathlib import Path

import trackbridge


def _public_names() -> list[str]:
    return [n for n in trackbridge.__all__ if n != "__version__"]


def test_all_names_resolve_and_are_listed_by_dir():
    assert len(set(trackbridge.__all__)) == len(trackbridge.__all__)
    for name in trackbridge.__all__:
        assert getattr(trackbridge, name) is not None, name
        assert name in dir(trackbridge), name
    assert isinstance(trackbridge.__version__, str) and trackbridge.__version__


def test_every_public_name_has_its_own_docstring():
    missing = []
    for name in _public_names():
        obj = getattr(trackbridge, name)
        doc = obj.__doc__   # its own, not one inherited through inspect.getdoc
        if not (isinstance(doc, str) and doc.strip()):
            missing.append(name)
    assert missing == []


def test_public_callables_are_annotated():
    """A function or class in ``__all__`` declares its return type and the type of every parameter (mypy checks
    that the annotations are right; this checks that they are there at run time, for users' tools)."""
    unannotated = []
    for name in _public_names():
        obj = getattr(trackbridge, name)
        fn = obj.__init__ if inspect.isclass(obj) else obj
        if inspect.isclass(obj) and fn is object.__init__:
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue        # exceptions take what BaseException takes
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name not in ("self", "cls")]
        if sig.return_annotation is inspect.Signature.empty or any(
                p.annotation is inspect.Parameter.empty for p in params):
            unannotated.append(name)
    assert unannotated == []


def test_the_package_ships_py_typed():
    assert (Path(trackbridge.__file__).parent / "py.typed").is_file()


def test_public_members_of_exported_classes_are_documented():
    """The methods and properties a user calls on ``Run``, ``NoOpRun``, ``LoggerOptions``, ``Translator`` and
    ``Translation`` (and the trackbridge classes they derive from) each have a docstring."""
    missing = []
    for name in _public_names():
        cls = getattr(trackbridge, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        members = {}
        for klass in reversed(cls.__mro__):
            if klass.__module__.startswith("trackbridge"):
                members.update(vars(klass))
        for attr, value in members.items():
            if attr.startswith("_"):
                continue
            fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
            if isinstance(fn, property):
                fn = fn.fget
            if not callable(fn):
                continue
            if not (fn.__doc__ or "").strip():
                missing.append(f"{name}.{attr}")
    assert missing == []
