"""Subcommands beyond translate/detect/mappings: each registers its parser and its handler here."""
from __future__ import annotations

import argparse

_HANDLERS: dict[str, object] = {}


def register(sub: "argparse._SubParsersAction") -> None:
    pass


def run(args) -> int:
    handler = _HANDLERS.get(args.command)
    if handler is None:
        raise ValueError(f"unknown command {args.command!r}")
    return handler(args)
