"""Safe YAML loading that keeps line numbers and rejects duplicate keys.

Mappings come back as :class:`LineDict` (a ``dict`` with ``.line`` and ``.key_lines``), so that every validation
error can name the file and line. Only YAML's safe subset is accepted: no arbitrary object construction.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import TrackBridgeError


class MappingError(TrackBridgeError, ValueError):
    """A problem in a mapping file. ``str()`` gives ``file:line: entry: message``."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, entry: str | None = None):
        self.message, self.file, self.line, self.entry = message, file, line, entry
        where = file or "<mappings>"
        if line:
            where += f":{line}"
        text = f"{where}: {entry}: {message}" if entry else f"{where}: {message}"
        super().__init__(text)

    def __reduce__(self) -> tuple:
        # kept whole in the compiled registry cache (Registry.warnings): file, line and entry, not only the text
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type, args: tuple, state: dict) -> MappingError:
    obj: MappingError = Exception.__new__(cls)
    obj.args = args
    obj.__dict__.update(state)
    return obj


class MappingErrors(MappingError):
    """Several mapping problems at once (the loader collects them all before failing)."""

    def __init__(self, errors: list[MappingError]):
        self.errors = errors
        ValueError.__init__(self, "\n".join(str(e) for e in errors))
        self.message, self.file, self.line, self.entry = str(self), None, None, None


class LineDict(dict):
    """A YAML mapping: ``line`` (of its first key), ``key_lines`` (key -> line of the key) and ``block_keys`` (keys
    whose value is a ``|`` or ``>`` block scalar, whose text starts on the next line)."""

    line: int = 0
    key_lines: dict
    block_keys: frozenset = frozenset()


class _PyLoader(yaml.SafeLoader):
    pass


# libyaml's parser when PyYAML was built with it (the wheels are): the same safe constructors, ~10x faster
_Loader: Any = type("_Loader", (yaml.CSafeLoader,), {}) if getattr(yaml, "__with_libyaml__", False) else _PyLoader


def _construct_mapping(loader: Any, node: yaml.MappingNode, deep: bool = False) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise MappingError("mapping key is not hashable", file=loader.name, line=key_node.start_mark.line + 1)
        if key in out:
            raise MappingError(f"duplicate key {key!r} (first at line {out.key_lines[key]})",
                               file=loader.name, line=key_node.start_mark.line + 1)
        out[key] = loader.construct_object(value_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
        if getattr(value_node, "style", None) in ("|", ">"):
            out.block_keys = out.block_keys | {key}
    return out


for _cls in {_Loader, _PyLoader}:
    _cls.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _SyntaxProblem(Exception):
    """A YAML error, before it is reported as a MappingError."""

    def __init__(self, message: str, line: int | None):
        self.message, self.line = message, line


def load_yaml(path: str | Path) -> Any:
    """Load one YAML file safely; errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MappingError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raw = path.read_bytes()
        line = raw.count(b"\n", 0, exc.start) + 1
        raise MappingError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}); mapping files "
                           f"are UTF-8", file=str(path), line=line) from None
    try:
        return _parse(_Loader, text, str(path))
    except _SyntaxProblem as exc:
        problem = exc
    if _Loader is not _PyLoader:
        # libyaml words syntax errors its own way; the pure-Python parser gives the usual message (a broken file
        # is parsed twice, a good one once)
        try:
            _parse(_PyLoader, text, str(path))
        except _SyntaxProblem as exc:
            problem = exc
        except MappingError:
            pass
    raise MappingError(problem.message, file=str(path), line=problem.line)


def _parse(loader_cls: type, text: str, name: str) -> Any:
    loader = loader_cls(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except MappingError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise _SyntaxProblem(f"YAML syntax error: {exc.problem or exc}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise _SyntaxProblem(f"YAML error: {exc}", None) from None
    finally:
        loader.dispose()


def line_of(obj: Any, key: str | None = None, default: int | None = None) -> int | None:
    """The line of ``key`` in a loaded mapping (or of the mapping itself), else ``default``."""
    if isinstance(obj, LineDict):
        if key is not None and key in obj.key_lines:
            return obj.key_lines[key]
        return obj.line
    return default
