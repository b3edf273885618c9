"""``trackbridge --help`` and ``trackbridge COMMAND --help`` import neither the logger, the translator nor any
tracker (package or folder): a subprocess prints ``sorted(sys.modules)`` after the help, through a small ``-c``
wrapper around ``python -m trackbridge``. ``import trackbridge`` is as light, and ``trackbridge.translate`` is still
the function (imported on first use)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from _support import ROOT

WRAPPER = ("import json, runpy, sys\n"
           "sys.argv = ['trackbridge', *sys.argv[1:]]\n"
           "try:\n"
           "    runpy.run_module('trackbridge', run_name='__main__', alter_sys=True)\n"
           "except SystemExit as exc:\n"
           "    code = exc.code\n"
           "else:\n"
           "    code = None\n"
           "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))\n")
TRACKER_PACKAGES = ("wandb", "mlflow", "tensorboard", "tensorboardX", "trackio", "torch", "numpy", "transformers")
HEAVY = ("trackbridge.logger", "trackbridge.translate", "trackbridge.trackers", "trackbridge.pipeline",
         "trackbridge.schema", "trackbridge.migrate", "trackbridge.compare", "trackbridge.stream")


def _modules(*argv: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, None), (argv, result["code"])
    return result["modules"]


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in TRACKER_PACKAGES
            or any(m == h or m.startswith(h + ".") for h in HEAVY)]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["translate", "--help"], ["detect", "--help"],
                                  ["mappings", "--help"], ["mappings", "lint", "--help"], ["migrate", "--help"],
                                  ["replay", "--help"], ["compare", "--help"], ["demo", "--help"],
                                  ["doctor", "--help"]])
def test_help_imports_no_logger_translator_or_tracker(argv):
    modules = _modules(*argv)
    assert "trackbridge.cli" in modules            # the wrapper did run the command line
    assert _heavy(modules) == []


def test_import_trackbridge_is_light_and_translate_is_the_function():
    code = ("import sys, trackbridge\n"
            "before = sorted(m for m in sys.modules if m.startswith('trackbridge'))\n"
            "import trackbridge.translate as via_import\n"
            "from trackbridge import translate, Translator\n"
            "import trackbridge.pipeline\n"
            "print(before)\n"
            "print(callable(translate) and translate is trackbridge.translate is via_import,\n"
            "      Translator.__module__, sys.modules['trackbridge.pipeline'].translate is translate,\n"
            "      hasattr(sys.modules['trackbridge.translate'], 'translate'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    before, same = out.stdout.strip().splitlines()
    assert before == "['trackbridge', 'trackbridge._version', 'trackbridge.errors']"
    # the function is the one-shot pipeline's; the submodule of the same name holds compiled facts only
    assert same == "True trackbridge.pipeline True False"
