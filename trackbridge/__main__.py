"""``python -m trackbridge``: the command line (:func:`trackbridge.cli.main`); importing this module runs nothing."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
