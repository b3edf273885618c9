"""The console reader on real transformers output (a framework, so not in tests/unit): PrinterCallback's printed
dicts, read back with the step key used and the rounding noted (tests/unit/test_source_files.py has the rest)."""
from __future__ import annotations

import io
from contextlib import redirect_stdout
from types import SimpleNamespace

from _support import load_test_module

_files = load_test_module("unit/test_source_files.py")      # its public-log rows and one-run reader


def test_transformers_printed_dicts_with_step_key_and_rounding(tmp_path):
    """Real transformers PrinterCallback output (5.x prints floats as '{v:.4g}' strings)."""
    from transformers.trainer_callback import PrinterCallback
    src = [r for r in _files.rows("14_trl_grpo.json")]
    buf = io.StringIO()
    with redirect_stdout(buf):
        for r in src:
            PrinterCallback().on_log(None, SimpleNamespace(is_local_process_zero=True), None, logs=dict(r))
    p = tmp_path / "trl.log"
    p.write_text(buf.getvalue())
    run, recs = _files.one_run(f"console:{p}")
    assert [r.step for r in recs] == [r["step"] for r in src]       # 'step' key used, not the order
    assert run.info.extra["step_source"] == "logged"
    assert "rounded" in run.info.extra
    for rec, row in zip(recs, src):
        want = {k: v for k, v in row.items() if k not in ("step", "total_flos")}
        assert list(rec.metrics) == list(want)
        for k, v in want.items():
            assert rec.metrics[k] == (float(f"{v:.4g}") if isinstance(v, float) else v)
