"""Values from torch (a framework, so not in tests/unit): log()'s value normalisation and the translation engine take
torch scalars and tensors, duck typed, without importing torch themselves."""
import numpy as np
import pytest

from trackbridge.pipeline import Translator
from trackbridge.record import Histogram
from trackbridge.record.values import normalize_metrics

from _support import load_test_module

torch = pytest.importorskip("torch")


reg = load_test_module("unit/test_translate_engine.py").reg      # its small synthetic mappings


def test_torch_tensors():
    w = torch.tensor(3.0, requires_grad=True)
    loss = w * 2
    t = torch.tensor(0.25)
    out, problems = normalize_metrics({"loss": loss, "t": t, "one": torch.tensor([5.0]),
                                       "vec": torch.arange(4, dtype=torch.float32), "i": torch.tensor(3)})
    assert problems == []
    assert out["loss"] == 6.0 and out["t"] == 0.25 and out["i"] == 3 and type(out["i"]) is int
    assert isinstance(out["one"], Histogram) and out["one"].values == [5.0]
    assert out["vec"].values == [0.0, 1.0, 2.0, 3.0]
    t += 1  # in-place update after logging must not change what was logged
    assert out["t"] == 0.25



def test_torch_values_never_crash_translation(reg):
    res = Translator("alpha/grpo", "canonical", registry=reg).translate(
        {"timing_ms/gen": torch.tensor(2500.0), "timing_ms/upd": np.array([1500.0]),
         "entropy": torch.tensor([1.0, 2.0])})
    assert res.metrics["time/gen"] == pytest.approx(2.5) and res.metrics["time/upd"] == pytest.approx(1.5)
    assert list(res.metrics["policy/entropy"]) == [1.0, 2.0]      # not a scalar: carried through untouched
