"""What tests/unit must never import: a tracker package or a framework. ``pytest --check-unit-imports``
(tests/conftest.py) fails the session when one of them is in sys.modules at its end; tests/unit/test_unit_imports.py
uses both."""
from __future__ import annotations

import sys

FORBIDDEN = ("wandb", "tensorboard", "tensorboardX", "tbparse", "mlflow", "trackio",
             "torch", "transformers", "trl", "datasets", "accelerate", "verl", "openrlhf", "deepspeed", "ray")


def imported() -> list[str]:
    """The forbidden top-level packages this process has imported."""
    return sorted({m.split(".")[0] for m in sys.modules} & set(FORBIDDEN))
