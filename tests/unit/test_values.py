"""Value normalisation for log(): numbers, numpy/torch scalars and tensors (duck typed), lists -> histograms."""
import decimal
import math
import subprocess
import sys

import numpy as np
import pytest

from trackbridge.record import Histogram
from trackbridge.record.values import UnsupportedValue, normalize, normalize_metrics

from _support import ROOT


def test_plain_values_kept():
    out, problems = normalize_metrics({"a": 1, "b": 0.5, "c": "text", "d": None, "e": float("nan"),
                                       "f": float("-inf")})
    assert problems == []
    assert out["a"] == 1 and type(out["a"]) is int
    assert out["b"] == 0.5 and out["c"] == "text" and out["d"] is None
    assert math.isnan(out["e"]) and out["f"] == float("-inf")


def test_numpy_scalars_and_arrays():
    out, _ = normalize_metrics({"f32": np.float32(1.5), "i64": np.int64(7), "b": np.bool_(True),
                                "zero_d": np.array(2.25), "arr": np.array([[1.0, 2.0], [3.0, 4.0]]),
                                "nan": np.float64("nan")})
    assert out["f32"] == 1.5 and type(out["f32"]) is float
    assert out["i64"] == 7 and type(out["i64"]) is int
    assert out["b"] == 1
    assert out["zero_d"] == 2.25
    assert isinstance(out["arr"], Histogram) and out["arr"].values == [1.0, 2.0, 3.0, 4.0]
    assert out["arr"].num == 4 and out["arr"].min == 1.0 and out["arr"].max == 4.0
    assert math.isnan(out["nan"])


def test_lists_nested_dicts_and_other_numbers():
    out, problems = normalize_metrics({"env/reward_dist": [0.1, 0.2, [0.3]], "grp": {"x": 1, "y": {"z": 2}},
                                       "dec": decimal.Decimal("1.5"), "flag": True})
    assert problems == []
    assert out["env/reward_dist"].values == [0.1, 0.2, 0.3]
    assert out["grp/x"] == 1 and out["grp/y/z"] == 2
    assert out["dec"] == 1.5 and out["flag"] == 1


def test_unstorable_values_are_reported_not_raised():
    out, problems = normalize_metrics({"ok": 1.0, "raw": b"bytes", "obj": object(), "mix": [1, "a"]})
    assert list(out) == ["ok"]
    assert len(problems) == 3
    assert any("'raw'" in p and "bytes" in p for p in problems)
    assert any("'mix'" in p and "not a number" in p for p in problems)
    with pytest.raises(UnsupportedValue, match="'k'.*complex"):
        normalize(1 + 2j, "k")


def test_bad_containers_raise_type_error():
    with pytest.raises(TypeError, match="dict of metric name -> value, got list"):
        normalize_metrics([1, 2])
    with pytest.raises(TypeError, match="did you mean"):
        normalize_metrics(0.5)
    with pytest.raises(TypeError, match="must be strings, got int key 3"):
        normalize_metrics({3: 1.0})
    with pytest.raises(TypeError, match="under 'outer'"):
        normalize_metrics({"outer": {("t",): 1.0}})


def test_no_torch_or_numpy_import():
    code = ("import sys, trackbridge, trackbridge.record.values, trackbridge.logger, trackbridge.sync.replay\n"
            "bad = [m for m in ('torch', 'numpy', 'wandb', 'mlflow', 'tensorboard', 'trackio') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout
