"""Safe YAML loading that keeps line numbers and rejects duplicate keys.

Mappings come back as :class:`LineDict` (a ``dict`` with ``.line`` and ``.key_lines``), so that every validation
error can name the file and line. Only YAML's safe subset is accepted: no arbitrary object construction.

A file is a user's input, so before anything is parsed (:func:`check_file`): it must be a regular file (a FIFO would
hang the reader, ``/dev/zero`` or ``/dev/urandom`` never end) of at most :data:`MAX_BYTES` bytes (the shipped files
are under 150 KB); and its YAML may not expand, through anchors and aliases, to more than :data:`MAX_NODES` nodes
(a kilobyte "billion laughs" document expands to billions, which every later walk of the document would visit), nor
hold an alias to the node that contains it. Each is refused with one line naming the file.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from ..errors import TrackBridgeError

MAX_BYTES = 4 * 2 ** 20          # a mapping or rules file larger than this is refused unread
MAX_NODES = 500_000             # nodes a document may expand to through its aliases (the shipped files: < 10,000)


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


def check_file(path: str | Path) -> None:
    """Raise :class:`MappingError` unless ``path`` is a regular file of at most :data:`MAX_BYTES` bytes (looked at
    without opening it: opening a FIFO would wait for a writer)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise MappingError(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise MappingError(f"cannot read: {kind}, not a regular file (a mapping or rules file is a YAML file)",
                           file=str(path))
    if st.st_size > MAX_BYTES:
        raise MappingError(f"{st.st_size:,} bytes; a mapping or rules file may hold at most {MAX_BYTES:,} (the "
                           f"shipped ones hold under 150,000): refused unread", file=str(path))


def load_yaml(path: str | Path) -> Any:
    """Load one YAML file safely; errors name the file and line."""
    path = Path(path)
    check_file(path)
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
            if exc.line is not None or problem.line is None:
                problem = exc
        except MappingError:
            pass
    raise MappingError(problem.message, file=str(path), line=problem.line)


def _parse(loader_cls: type, text: str, name: str) -> Any:
    loader = loader_cls(text)
    loader.name = name
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, name)
        return loader.construct_document(node)
    except MappingError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise _SyntaxProblem(f"YAML syntax error: {exc.problem or exc}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise _SyntaxProblem(f"YAML error: {exc}", None) from None
    except RecursionError:          # the pure-Python parser or the constructors, thousands of levels down
        raise _SyntaxProblem("YAML nested too deeply to read (a mapping file nests a few levels)", None) from None
    finally:
        loader.dispose()


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Any, name: str) -> None:
    """Refuse a document that expands, through aliases, to more than :data:`MAX_NODES` nodes, or holds an alias to a
    node that contains it. Linear in the document's own size: each node's expanded size is computed once."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            size[key] = total
            if total > MAX_NODES:
                raise MappingError(f"the YAML expands through its anchors and aliases to more than {MAX_NODES:,} "
                                   f"nodes (a 'billion laughs' document?); refused", file=name,
                                   line=node.start_mark.line + 1)
            continue
        if key in size:
            continue
        if key in open_:
            raise MappingError("an alias to the node that contains it (a recursive YAML structure); refused",
                               file=name, line=node.start_mark.line + 1)
        open_.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_:
                raise MappingError("an alias to the node that contains it (a recursive YAML structure); refused",
                                   file=name, line=child.start_mark.line + 1)
            if id(child) not in size:
                stack.append((child, False))


def line_of(obj: Any, key: str | None = None, default: int | None = None) -> int | None:
    """The line of ``key`` in a loaded mapping (or of the mapping itself), else ``default``."""
    if isinstance(obj, LineDict):
        if key is not None and key in obj.key_lines:
            return obj.key_lines[key]
        return obj.line
    return default
