"""The package list, computed (pyproject.toml holds everything else).

setuptools cannot discover the packages from pyproject.toml alone here: two folders of the checkout ship under other
names (``mappings/`` as ``trackbridge.mappings``, ``examples/`` as ``trackbridge.examples``; ``package-dir`` in
pyproject.toml), and ``packages.find`` cannot be combined with a list. So every package under ``trackbridge/`` is
found here (namespace discovery: a folder without ``__init__.py`` still ships), and the two mapped trees are added
with every sub-folder they have (``mappings/schemas``). tests/install/test_wheel.py checks that the built wheel holds
every file of the source tree.
"""
import warnings

from setuptools import find_namespace_packages, setup
from setuptools.warnings import InformationOnly

# (name in the wheel, folder in the checkout): keep in step with package-dir in pyproject.toml
MAPPED = [("trackbridge.mappings", "mappings"), ("trackbridge.examples", "examples")]

# `pip install -e .` (make demo, make test) would print a banner saying that folders of the working directory named
# like a package may take precedence over it: they are the package here. Informational only; nothing else is hidden.
warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)


def packages() -> list[str]:
    found = find_namespace_packages(include=["trackbridge", "trackbridge.*"], exclude=["*.__pycache__"])
    for name, folder in MAPPED:
        found += [name] + [f"{name}.{sub}" for sub in find_namespace_packages(where=folder, exclude=["*__pycache__"])]
    return found


setup(packages=packages())
