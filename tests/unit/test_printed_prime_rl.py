"""prime-rl's printed step lines and its SFT trainer (mappings/prime_rl.yaml, tests/data/frameworks/prime-rl-keys.tsv
and prime-rl-sft-keys.tsv): the real console logs of tests/data/real/prime_rl/ (provenance in its SOURCES.yaml), read
through `trackbridge.read.inputs.open_runs(path, rows=True)` as `translate` reads them, are detected as prime-rl with
the right trainer (the orchestrator's line: rl; the SFT trainer's: sft) and release range, and every printed label is
written under the canonical name of the logged key its print code formats, rounded (approximate), MFU in percent
scaled to the canonical fraction. The labels are read from the step_message f-strings of github.com/PrimeIntellect-ai/
prime-rl at the tags and at the commits the logs' runs used (`git show REF:PATH`), cited file@ref:line."""
from __future__ import annotations

from pathlib import Path

import pytest

from trackbridge.detect import detect
from trackbridge.pipeline import Translator
from trackbridge.read.inputs import open_runs
from trackbridge.schema.loader import load_registry
from trackbridge.schema.spec import parse_spec

from _support import DATA

REAL = DATA / "real" / "prime_rl"


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def read(path: Path, reg) -> tuple[object, dict[int, dict[str, float]], dict[int, dict[str, float]], dict]:
    """The detection, the raw records by step, the translated records by step and the approximate reasons of
    the file, as `trackbridge translate console:FILE` reads it."""
    runs = open_runs(f"console:{path}", rows=True)
    assert len(runs) == 1
    run = runs[0]
    tr = run.resolve().translator
    assert tr is not None and tr.detection is not None
    raw: dict[int, dict[str, float]] = {}
    out: dict[int, dict[str, float]] = {}
    approx: dict[str, str] = {}
    unmapped: set[str] = set()
    for rec in run.records():
        raw[rec.step] = dict(rec.metrics)
        res = tr.translate(dict(rec.metrics))
        out[rec.step] = dict(res.metrics)
        approx.update(res.approximate)
        unmapped |= set(res.unmapped)
    return tr.detection, raw, out, {"approximate": approx, "unmapped": unmapped}


def releases_of(reg, spec) -> list[str]:
    fw = reg.frameworks["prime_rl"]
    lo, hi = spec.bounds(len(fw.releases))
    return [r for i, r in enumerate(fw.releases) if lo <= i <= hi]


def test_the_orchestrator_line_of_pr_1318(reg):
    """01 (main of 2025-11-29, between v0.1 and v0.2): `Step N | Time: {step_time:.2f}s | Reward:
    {results_df.reward.mean():.4f} | Throughput: {throughput:.1f} tokens/s | Seq. Length: {...:.1f} tokens/sample |
    Async Level: ... | Max. Off-Policy Level: ...` (orchestrator.py@2a7a767:428; @v0.2:496). Reward is the logged
    reward/mean (:375), Time time/step (:383), Seq. Length seq_len/mean (:360), Throughput the orchestrator's
    perf/throughput (:373, num_tokens / generate_completions_time at :333)."""
    det, raw, out, info = read(REAL / "01_pr1318_orchestrator.log", reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    found = releases_of(reg, det.spec)
    # the colon form is printed from v0.2 (the first tag after the run) through v0.5.0; v0.6.0 prints no colons
    assert found[0] == "v0.2" and found[-1] == "v0.5.0", found
    assert sorted(raw) == [28, 29, 30, 31]
    step = out[28]
    assert step["reward/score/mean"] == 0.3887 and step["time/step"] == 73.77
    assert step["sequence/length/mean"] == 345.6 and step["perf/tokens_per_s"] == 2408.9
    for canon in ("reward/score/mean", "time/step", "sequence/length/mean"):
        assert "rounded" in (info["approximate"].get(canon) or ""), (canon, info["approximate"])
    # one label, two processes' quantities: the entry says so
    assert "two quantities" in (info["approximate"].get("perf/tokens_per_s") or ""), info["approximate"]
    assert "orchestrator" in info["approximate"]["time/step"]
    fw = reg.frameworks["prime_rl"]
    for key in ("Async Level", "Max. Off-Policy Level"):      # scheduler.async_level, max_off_policy_level
        assert key in info["unmapped"] and fw.logs_unmapped(key) and step[key] == raw[28][key], key


def test_the_orchestrator_line_of_pr_2280_has_no_throughput(reg):
    """02 (main of 2026-04-14, between v0.5.0 and v0.6.0): the line has no Throughput (orchestrator.py@52b1ae14:697,
    @v0.5.0:844); Reward is reward_mean = by_example.reward.mean().mean() (:696), logged as reward/all/mean (:613)."""
    det, raw, out, _ = read(REAL / "02_pr2280_orchestrator.log", reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    assert "v0.5.0" in releases_of(reg, det.spec)
    assert out[9]["reward/score/mean"] == 0.9912 and out[10]["time/step"] == 2.2
    assert out[10]["sequence/length/mean"] == 332.0
    assert "Throughput" not in raw[9] and "perf/tokens_per_s" not in out[9]


def test_the_sft_trainer_line_of_pr_999(reg):
    """03 (main of 2025-09-23, between v0.1 and v0.2): `Step N | Time: {step_time:.2f}s | Loss: {batch_loss.item():.4f}
    | Grad. Norm: {grad_norm:.4f} | LR: {current_lr:.2e} | Throughput: {throughput:.0f} tokens/s | MFU: {mfu:.1f}% |
    Peak Mem.: {peak_memory:.1f}/{max_memory:.1f} GiB (...%) | Max Vio: ...` (trainer/sft/train.py@2536f759:272-274;
    @v0.2:319-321): Loss is loss/mean (:305), Grad. Norm optim/grad_norm (:299), LR optim/lr (:298, read before
    scheduler.step() at :248-249), Throughput perf/throughput (:288), MFU perf/mfu in percent (:291)."""
    det, raw, out, info = read(REAL / "03_pr999_sft_trainer.log", reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "sft"), det.to_json()
    found = releases_of(reg, det.spec)
    assert found[0] == "v0.2" and found[-1] == "v0.5.0", found
    assert sorted(raw) == [0, 1, 2, 3, 4]
    step = out[1]
    assert step["loss/total"] == 12.3125 and step["optim/grad_norm"] == 28.4812 and step["optim/lr"] == 1e-06
    assert step["perf/tokens_per_s"] == 3324 and step["time/step"] == 0.6
    assert step["perf/mfu/policy_update"] == pytest.approx(raw[1]["MFU"] / 100) == pytest.approx(0.01)   # percent
    assert "Peak Mem." not in raw[1]                         # '5.2/23.7 GiB (22.1%)' is no number
    for canon in ("loss/total", "optim/grad_norm", "optim/lr", "perf/tokens_per_s", "perf/mfu/policy_update"):
        reason = info["approximate"].get(canon) or ""
        assert "rounded" in reason or "significant digits" in reason, (canon, reason)
    assert "Max Vio" in info["unmapped"] and reg.frameworks["prime_rl"].logs_unmapped("Max Vio")


def test_the_rl_trainer_line(reg, tmp_path):
    """The RL trainer's line as trainer/rl/train.py@v0.5.0:505-510 prints it (`Step N | Time: | Loss:
    {tensor_stats['loss/mean']:.4f} | Entropy: {tensor_stats['entropy/mean']:.4f} | Mismatch KL: ... | Grad. Norm: |
    LR: {current_lr:.2e} | Throughput: {throughput:.0f} tokens/s | MFU: {mfu:.1f}% | Peak Mem.: {peak_memory:.1f}
    GiB`): the rl trainer (it prints Entropy and Mismatch KL, which the SFT line never does), Peak Mem. read as
    perf/peak_memory's GiB (train.py@v0.5.0:501)."""
    line = ("10:00:01 SUCCESS Step 7 | Time: 12.34s | Loss: 0.0123 | Entropy: 0.4567 | Mismatch KL: 0.0012 | "
            "Grad. Norm: 0.2345 | LR: 1.00e-06 | Throughput: 5432 tokens/s | MFU: 23.4% | Peak Mem.: 41.2 GiB\n")
    path = tmp_path / "trainer.log"
    path.write_text(line + line.replace("Step 7", "Step 8"))
    det, raw, out, info = read(path, reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    step = out[7]
    assert step["policy/entropy"] == 0.4567 and step["kl/rollout/k3"] == 0.0012 and step["loss/total"] == 0.0123
    assert step["perf/memory/max_reserved_gb"] == 41.2 and step["perf/mfu/policy_update"] == pytest.approx(0.234)
    assert step["optim/lr"] == 1e-06 and step["perf/tokens_per_s"] == 5432 and step["time/step"] == 12.34
    assert "policy drift" in info["approximate"]["kl/rollout/k3"]


def test_printed_labels_are_never_written_back(reg):
    """The labels are console prints (reverse false): canonical -> prime-rl writes the logged keys."""
    res = Translator("canonical", "prime_rl/rl@v0.5.0", registry=reg).translate(
        {"optim/lr": 1e-6, "policy/entropy": 0.5, "perf/memory/max_reserved_gb": 40.0})
    assert {"optim/lr", "entropy/mean", "perf/peak_memory"} <= set(res.metrics), res.metrics
    assert not {"LR", "Entropy", "Peak Mem."} & set(res.metrics)


# The SFT trainer's logged dicts at v0.5.0 (trainer/sft/train.py@v0.5.0:431-486: progress, perf, optim, loss, time).
SFT_V05 = ["progress/epoch", "progress/num_samples", "progress/num_tokens", "perf/throughput",
           "perf/throughput_per_gpu", "perf/peak_memory", "perf/mfu", "optim/lr", "optim/grad_norm",
           "optim/zero_grad_ratio", "loss/mean", "loss/nan_count", "time/step", "time/save_ckpt",
           "time/forward_backward"]


def test_an_sft_log_is_the_sft_trainer(reg):
    det = detect(set(SFT_V05), reg)
    assert det.spec is not None and (det.spec.framework, det.spec.trainer) == ("prime_rl", "sft"), det.to_json()
    assert "v0.5.0" in releases_of(reg, det.spec) and "v0.1" not in releases_of(reg, det.spec)
    spec = parse_spec("prime_rl/sft@v0.5.0", reg)
    assert (spec.framework, spec.trainer) == ("prime_rl", "sft")
    res = Translator("prime_rl/sft@v0.5.0", "canonical", registry=reg).translate(
        {k: 2.0 + i for i, k in enumerate(SFT_V05)})
    for key, canon in (("progress/num_samples", "progress/samples"), ("progress/num_tokens", "progress/tokens"),
                       ("perf/throughput", "perf/tokens_per_s"), ("perf/throughput_per_gpu", "perf/throughput"),
                       ("perf/peak_memory", "perf/memory/max_reserved_gb"), ("loss/mean", "loss/total"),
                       ("optim/lr", "optim/lr"), ("time/forward_backward", "time/forward_backward")):
        assert res.metrics[canon] == 2.0 + SFT_V05.index(key), key
    assert res.metrics["perf/mfu/policy_update"] == pytest.approx((2.0 + SFT_V05.index("perf/mfu")) / 100)
    # the SFT trainer reads the LR before scheduler.step() (sft/train.py@v0.5.0:404-405), the RL trainer after
    # (rl/train.py@v0.5.0:477-480): the two are not the same snapshot
    sft = reg.frameworks["prime_rl"]
    lr = [e for e, _ in sft.lookup("optim/lr") if e.trainers == {"sft"}]
    assert lr and lr[0].reduce.get("snapshot") == "before_scheduler_step"
    cross = Translator("prime_rl/sft@v0.5.0", "prime_rl/rl@v0.5.0", registry=reg).translate({"optim/lr": 1e-6})
    assert cross.metrics["optim/lr"] == 1e-6 and "snapshot" in (cross.approximate.get("optim/lr") or ""), cross
    # whole epochs (sft/data.py@v0.2:312, (step - 1) // num_examples): passed through, not the fractional epoch
    assert "progress/epoch" in res.unmapped and sft.logs_unmapped("progress/epoch")


def test_an_rl_log_stays_the_rl_trainer(reg):
    """The RL trainer logs loss/mean, optim/lr and perf/* too: its tensor statistics and the orchestrator's keys
    keep it rl (trainer/rl/train.py@v0.5.0:513-545)."""
    keys = ["loss/mean", "loss/std", "entropy/mean", "mismatch_kl/mean", "optim/lr", "optim/grad_norm",
            "perf/throughput", "perf/throughput_per_gpu", "perf/mfu", "perf/peak_memory", "time/step",
            "time/forward_backward", "reward/all/mean", "progress/total_tokens"]
    det = detect(set(keys), reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()


def test_the_labels_printed_without_colons_from_v0_6_0(reg):
    """From v0.6.0 the lines print `Label value` (no colon) and the step time unlabelled: the orchestrator's `Step N
    | {format_time(step_time):>7} | Reward {eff.reward.mean():.4f} | Trainable ... | Turns ... | Branches ... | Max
    Off-Policy ... | Error ...% | Truncation ...%` (orchestrator.py@v0.8.0:823-827; Branches from @v0.7.0:740, no
    Branches at @v0.6.0:765-768), the RL trainer's `Loss ... | Entropy ... | ... | Throughput {throughput:.0f}
    tokens/s | MFU {mfu:.1f}% | Peak Mem. ... GiB` (trainer/rl/train.py@v0.8.0:674-679). A record of those labels
    (the console reader reads the colon form only) is prime-rl's from v0.7.0, and Reward is the effective
    rollouts' (approximate, population), Throughput the forward-backward rate (train.py@v0.6.0:597)."""
    orch = {"Reward": 0.41, "Turns": 1.0, "Branches": 1.0, "Max Off-Policy": 1, "Error": 0.0, "Truncation": 2.5}
    det = detect(set(orch), reg)
    assert (det.spec.framework, det.spec.trainer) == ("prime_rl", "rl"), det.to_json()
    # the passed-through labels are counted where they are printed: Branches from v0.7.0 (orchestrator.py@v0.7.0:740)
    assert releases_of(reg, det.spec) == ["v0.7.0", "v0.8.0", "v0.8.1.dev67"], det.to_json()
    res = Translator("prime_rl@v0.8.0", "canonical", registry=reg).translate(
        {**orch, "Loss": 0.01, "Throughput": 5000, "MFU": 30.0, "Peak Mem.": 60.1, "Entropy": 0.3})
    assert res.metrics["reward/score/mean"] == 0.41 and "effective" in res.approximate["reward/score/mean"]
    assert res.metrics["perf/tokens_per_s"] == 5000 and "forward-backward" in res.approximate["perf/tokens_per_s"]
    assert res.metrics["perf/mfu/policy_update"] == pytest.approx(0.30)
    assert res.metrics["perf/memory/max_reserved_gb"] == 60.1 and res.metrics["policy/entropy"] == 0.3
    assert {"Turns", "Branches", "Max Off-Policy", "Error", "Truncation"} <= set(res.unmapped)
    # at v0.6.0 the reward is over the surviving rollouts (orchestrator.py@v0.6.0:759), not the effective ones
    old = Translator("prime_rl@v0.6.0", "canonical", registry=reg).translate({"Reward": 0.41})
    assert "surviving" in old.approximate["reward/score/mean"]
