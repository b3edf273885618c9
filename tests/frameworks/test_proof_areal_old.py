"""Fingerprint proofs of AReaL's ``grpo_actor/`` entries (v0.3.1 .. v0.4.0) and of the legacy realhf system's
``ppo_actor/`` entries (trainer realhf, v0.3.0 .. v0.5.1), both at the tag v0.4.0.

areal/: the tag's own PPOActor
(``compute_advantages``, ``ppo_update``, ``grpo_loss_fn``, ``ppo_actor_loss_fn``) and stats_tracker, vendored
(tests/_support/proofs_areal_old.py says what is loaded and what stands in), on two simulated data-parallel ranks.

What runs per rank, as examples/math/gsm8k_grpo.py@v0.4.0:183-192 calls it: ``actor.compute_advantages(batch)``,
then, in ``stats_tracker.scope("grpo_actor")``, ``actor.ppo_update(batch)``: its batch statistics (advantages,
task_reward, seq_len, prompt_len, no_eos_ratios) exported once (actor.py@v0.4.0:255-266), then one
``engine.train_batch`` per PPO mini-batch with ``grpo_loss_fn`` and one export per mini-batch (:276-296), the first
export updated with the batch statistics: the list StatsLogger.commit logs one row per export
(areal/utils/stats_logger.py@v0.4.0:136-147). The engine (:class:`Engine`) stands for FSDPEngine.train_batch on a
CPU: it splits each mini-batch into micro-batches, packs each one's sequences (1-D, ``cu_seqlens``), calls the loss
function with logits and back-propagates.

The batch is uneven at every level: ranks of 5 and 6 sequences of different prompt and response lengths (one or two
per rank as long as the rank's padded batch: no EOS), mini-batches of different sizes, micro-batches of different
sizes. The per-token and per-sequence values each fingerprint reduces are the ones the framework's code handed
its tracker (every ``stat``/``denominator`` call is recorded on its way in): what is tested is how the tracker and
ppo_update's exports reduce them into each logged row.

realhf: the tag's PPOActorInterface.train_step (realhf/impl/model/interface/ppo_interface.py@v0.4.0:527-833) on a
rank's packed batch: GAE, the batch statistics exported once under ``ppo_actor`` (:705-786), then per PPO mini-batch
(sequence i to mini-batch i % n_minibatches in count, :803-811) the model's ``train_batch`` with
``_ppo_actor_loss_from_model_outputs`` (:61-190) and one export per mini-batch (:816-827), the first updated with the
batch statistics. The stand-ins (:class:`Sample` for SequenceSample, :class:`RealhfEngine` for the model's
train_batch) are described where they are defined; advantage normalisation is off in the proof's config (with it
on, the advantages' batch mean is 0 under every reduction).
"""
from __future__ import annotations

import itertools
import math
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("colorlog", reason="make test installs colorlog (areal/utils/logging.py imports it)")

from _support import vendored  # noqa: E402
from _support.framework_code import run_ranks  # noqa: E402
from _support.proofs_areal_old import (  # noqa: E402
    FW,
    RELEASE,
    TAG,
    areal_actor,
    rank_stats_tracker,
    realhf_actor,
    realhf_call_time_modules,
    realhf_rank_stats_tracker,
)
from _support.proven import proof  # noqa: E402

PROMPTS = [[2, 3, 1, 2, 4], [1, 2, 3, 2, 1, 2]]
RESPONSES = [[3, 1, 5, 2, 4], [1, 2, 4, 2, 6, 1]]
MINI = [[[0, 1], [2, 3, 4]], [[0, 1, 2, 3], [4, 5]]]             # ppo_update's mini-batches (sequence indices)
MICRO = {2: [[0], [1]], 3: [[0, 1], [2]], 4: [[0, 1, 2], [3]]}     # positions inside a mini-batch of n sequences
#: the rewards of two runs: the extremes on rank 0, then on rank 1 (a rank's own extreme is not the all-reduced one)
REWARDS = ([[-1.5, -1.0, 2.0, -0.25, -2.5], [1.0, -1.25, 1.25, -2.0, 0.25, 0.75]],
           [[-1.5, -1.0, 1.0, -0.25, -1.75], [1.0, -1.25, 2.25, -2.0, 0.25, 0.75]],
           [[-1.0, -2.0, 0.5, 1.5, -0.75], [-1.5, 0.25, -1.0, 1.0, -0.5, 2.0]],
           [[0.75, -1.75, -1.0, -1.25, 1.0], [-2.0, -0.5, 1.5, -1.0, 0.5, -0.25]])
GRAD_NORMS = (2.5, 0.75)                                           # the optimizer step's norm, per mini-batch
LR = 3e-6
VOCAB = 6
CONFIG = {"actor.ppo_n_minibatches": len(GRAD_NORMS), "actor.c_clip": 3.0}


def _batch(rank: int, run: int) -> dict:
    """A rank's padded rollout batch as the workflow hands it to the trainer: input_ids, attention_mask, loss_mask
    over the response tokens, the inference engine's ``logprobs`` at the response tokens, the rewards."""
    gen = torch.Generator().manual_seed(40 + rank + 100 * run)
    lens = [p + r for p, r in zip(PROMPTS[rank], RESPONSES[rank])]
    width = max(lens)
    bs = len(lens)
    attn = torch.zeros(bs, width, dtype=torch.long)
    loss_mask = torch.zeros(bs, width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS[rank], RESPONSES[rank])):
        attn[i, :p + r] = 1
        loss_mask[i, p:p + r] = 1
    logprobs = -(0.3 + 4.5 * torch.rand(bs, width, generator=gen)) * loss_mask
    rewards = torch.tensor(REWARDS[run][rank])
    return {"input_ids": torch.randint(0, VOCAB, (bs, width), generator=gen), "attention_mask": attn,
            "loss_mask": loss_mask, "logprobs": logprobs, "rewards": rewards}


class Recorder:
    """Every stat()/denominator() call the framework's code makes on a rank's tracker, with where it was made (the
    batch statistics, or mini-batch m's micro-batch u), passed on to the tracker unchanged."""

    def __init__(self, st):
        self.where: tuple = ("batch",)
        self.calls: list[tuple] = []
        self.masks: dict[tuple, dict[str, torch.Tensor]] = {}
        self.bounds: dict[tuple, list[int]] = {}           # where -> the packed sequences' cumulative lengths
        stat, denominator = st.stat, st.denominator

        def rec_stat(denominator: str, reduce_type=None, **kw):
            for k, v in kw.items():
                self.calls.append((self.where, k, v.detach().clone(), denominator))
            return stat(denominator=denominator, reduce_type=reduce_type, **kw)

        def rec_denominator(**kw):
            self.masks.setdefault(self.where, {}).update({k: v.detach().clone() for k, v in kw.items()})
            return denominator(**kw)
        st.stat, st.denominator = rec_stat, rec_denominator

    def values(self, key: str) -> list[tuple[tuple, list[list[float]]]]:
        """[(where, [the valid values of each sequence])] of every call that recorded ``key``."""
        out = []
        for where, k, v, den in self.calls:
            if k != key:
                continue
            mask = self.masks[where][den].bool()
            cu = self.bounds.get(where)
            if v.dim() == 2:                                   # padded [sequence, position]
                seqs = [[float(x) for x in v[i][mask[i]]] for i in range(v.shape[0])]
            elif cu is not None and v.shape[0] == cu[-1]:      # packed: the sequences by their cumulative lengths
                seqs = [[float(v[j]) for j in range(int(a), int(b)) if mask[j]] for a, b in zip(cu[:-1], cu[1:])]
            else:                                              # one value per sequence
                seqs = [[float(v[i])] for i in range(v.shape[0]) if mask[i]]
            out.append((where, seqs))
        return out


class Engine:
    """The test's CPU stand-in for FSDPEngine as PPOActor calls it (train, eval, data_parallel_group, train_batch)."""

    data_parallel_group = "dp"

    def __init__(self, rank: int, recorder: Recorder, run: int):
        self.rank, self.recorder, self.run, self.mini = rank, recorder, run, 0

    def train(self) -> None:
        pass

    def eval(self) -> None:
        pass

    def train_batch(self, mb: dict, loss_fn, loss_weight_fn) -> dict:
        bs = mb["attention_mask"].shape[0]
        for u, rows in enumerate(MICRO[bs]):
            lens = [int(mb["attention_mask"][i].sum()) for i in rows]
            packed = {k: torch.cat([v[i, :n] for i, n in zip(rows, lens)]) for k, v in mb.items()
                      if torch.is_tensor(v) and v.dim() == 2 and k != "attention_mask"}
            cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
            packed["cu_seqlens"] = cu
            gen = torch.Generator().manual_seed(1000 * self.rank + 10 * self.mini + u + 7919 * self.run)
            logits = (2.5 * torch.randn(int(cu[-1]), VOCAB, generator=gen)).requires_grad_()
            self.recorder.where = ("micro", self.mini, u)
            self.recorder.bounds[self.recorder.where] = cu.tolist()
            loss = loss_fn(logits, packed)
            loss.backward()
            assert logits.grad is not None and loss_weight_fn(packed) == packed["loss_mask"].count_nonzero()
        self.recorder.where = ("batch",)
        out = {"update_successful": 1.0, "grad_norm": GRAD_NORMS[self.mini], "lr": LR}
        self.mini += 1
        return out


def run(n: int = 0) -> tuple[list[list[dict]], list[Recorder]]:
    """Every rank's ppo_update result (one export per mini-batch) and its recorder, with the rewards of run ``n``."""
    def rank(r: int):
        st = rank_stats_tracker()
        recorder = Recorder(st)

        def split_mini_batches(data: dict, mb_spec) -> object:   # stands for split_padded_tensor_dict_into_mb_list
            assert mb_spec.n_mbs == len(MINI[r])
            bs = data["attention_mask"].shape[0]
            return type("MBList", (), {"mbs": [{k: v[rows] for k, v in data.items()
                                                if torch.is_tensor(v) and v.shape[:1] == (bs,)}
                                               for rows in MINI[r]]})()

        A = areal_actor(st, split_mini_batches)
        cfg = A.PPOActorConfig(**{k.removeprefix("actor."): v for k, v in CONFIG.items()})
        actor = A.PPOActor(cfg, Engine(r, recorder, n))
        batch = _batch(r, n)
        actor.compute_advantages(batch)                    # gsm8k_grpo.py@v0.4.0:183-185
        with st.scope("grpo_actor"):                       # gsm8k_grpo.py@v0.4.0:187-190
            rows = actor.ppo_update(batch)
        return rows, recorder

    areal_actor(rank_stats_tracker(), None)        # parse the tag's files once, before the rank threads (CPython
    #                                                3.11's AST recursion check trips on parsing in threads)
    out = run_ranks(rank)
    return [o[0] for o in out], [o[1] for o in out]


def batch_steps(recorders: list[Recorder], key: str) -> list:
    """fingerprint's nesting of a batch statistic: one logged step, one mini-batch, each rank one micro-batch."""
    ranks = []
    for rec in recorders:
        (only,) = rec.values(key)
        ranks.append([only[1]])
    return [[ranks]]


def mini_steps(recorders: list[Recorder], key: str, m: int) -> list:
    """fingerprint's nesting of a loss statistic of mini-batch ``m``'s row: its micro-batches on each rank."""
    return [[[[seqs for where, seqs in rec.values(key) if where[0] == "micro" and where[1] == m]
               for rec in recorders]]]


@proof("areal", trainer="ppo", release=RELEASE, config=CONFIG)
def test_areal_040_grpo_actor_rows(p):
    rows, recorders = run()
    more = [run(n) for n in (2, 3)]                        # two more batches for the loss statistics
    again = run(1)              # another batch: the batch statistics' extremes on the other rank, other policies
    p.check(rows[0] == rows[1], "after the all-reduce every rank exports the same rows")
    p.check(len(rows[0]) == len(GRAD_NORMS), "ppo_update returns one export per PPO mini-batch (one row each)")
    first, second = rows[0]
    # the batch statistics: in the first row only, reduced over every rank's sequences / valid tokens
    batch_keys = [k for k in first if k.startswith("grpo_actor/") and not k.startswith("grpo_actor/actor_loss")]
    p.check("grpo_actor/task_reward/avg" in first and "grpo_actor/task_reward/avg" not in second,
            f"the batch statistics sit in the first row only ({sorted(batch_keys)[:4]} ...)")
    for name, stats in (("task_reward", ("avg", "max", "min")), ("seq_len", ("avg",)), ("prompt_len", ("avg",)),
                        ("no_eos_ratios", ("avg",))):
        for s in stats:
            key = f"grpo_actor/{name}/{s}"
            kw = {"stats": ({"avg": "mean"}.get(s, s),)} if s != "avg" else {}
            obs = [(first[key], batch_steps(recorders, name)), (again[0][0][0][key], batch_steps(again[1], name))]
            p.assert_stated(key, obs, levels=("processes",), tokens=("per_seq",), **kw)
    no_eos = [v for rec in recorders for _, seqs in rec.values("no_eos_ratios") for (v,) in seqs]
    p.check(0 < sum(no_eos) < len(no_eos), "some sequences fill their rank's padded batch (no EOS), some do not")
    for s in ("avg", "max", "min"):
        key = f"grpo_actor/advantages/{s}"
        kw = {"stats": ({"avg": "mean"}.get(s, s),)} if s != "avg" else {}
        obs = [(first[key], batch_steps(recorders, "advantages")),
               (again[0][0][0][key], batch_steps(again[1], "advantages"))]
        # a token quantity: its extremes are over tokens (the per-sequence candidates read one value a sequence)
        p.assert_stated(key, obs, levels=("processes",), **({"tokens": ("token_mean",), **kw} if kw else {}))
    # the loss function's statistics: each row is its own mini-batch's, pooled over its micro-batches and the ranks
    for name in ("actor_loss", "entropy", "approx_kl", "clip_ratio", "dual_clip_ratio"):
        key = f"grpo_actor/{name}/avg"
        obs = [(row[key], mini_steps(recs, name, m)) for out, recs in ((rows, recorders), again, *more)
               for m, row in enumerate(out[0])]           # every run's rows: 0/1 fractions coincide less often
        p.check(not math.isclose(obs[0][0], obs[1][0], rel_tol=1e-6), f"{key}: the two rows differ")
        p.assert_stated(key, obs, levels=("micro_batches", "processes"))
    dual = [v for rec in recorders for _, seqs in rec.values("dual_clip_ratio") for seq in seqs for v in seq]
    p.check(0 < sum(dual) < len(dual), "c_clip 3: some tokens are dual-clipped, some not")
    # the optimizer step's scalars: one mini-batch's per row (the same on every rank, as FSDP's global grad norm)
    for m, row in enumerate((first, second)):
        for key, value in (("grpo_actor/grad_norm", GRAD_NORMS[m]), ("grpo_actor/lr", LR)):
            p.check(math.isclose(row[key], value, rel_tol=1e-6), f"{key} in row {m} is mini-batch {m}'s")
            # the norm of the all-reduced gradient is the same on every rank: no batch tells the process
            # reductions apart, so the batch is one rank's (the row's one mini-batch, one value)
            p.assert_stated(key, row[key], [[[[[[value]]]]]], levels=(), tokens=("none",))


# ---------------------------------------------------------------------------------------------- realhf (v0.3.0 ..)
class Sample:
    """The test's stand-in for realhf's SequenceSample as PPOActorInterface.train_step and the engine use it: packed
    tensors and per-sequence lengths (``seqlens[key]``: one ``[length]`` per sequence), ``from_default``,
    ``shuffled`` and ``split_with_spec``. The real ``shuffled`` permutes the sequences with a seeded generator
    before the mini-batch split; the stand-in keeps their order, so which sequences form a mini-batch is known (the
    split's sizes are train_step's own: sequence i goes to mini-batch i % n_minibatches in count)."""

    def __init__(self, data: dict, lens: list[int]):
        self.data, self.lens = data, lens
        self.seqlens = {"packed_input_ids": [[n] for n in lens]}
        self.bs = len(lens)

    def _get_split_key(self) -> str:
        return "packed_input_ids"

    @classmethod
    def from_default(cls, ids, data, seqlens) -> "Sample":
        assert len(ids) == len(seqlens)
        return cls(dict(data), list(seqlens))

    @staticmethod
    def shuffled(sample: "Sample") -> "Sample":
        return sample

    def select(self, rows: list[int]) -> "Sample":
        """The sequences ``rows``: each tensor sliced by its own lengths (the whole sequence, or one token less for
        the shifted quantities: log-probs, advantages, the loss mask)."""
        out = {}
        for k, v in self.data.items():
            lens = self.lens if v.shape[0] == sum(self.lens) else [n - 1 for n in self.lens]
            assert v.shape[0] == sum(lens), k
            cu = [0, *itertools.accumulate(lens)]
            out[k] = torch.cat([v[cu[i]:cu[i + 1]] for i in rows])
        return Sample(out, [self.lens[i] for i in rows])

    def split_with_spec(self, spec) -> list["Sample"]:
        cu = [0, *itertools.accumulate(spec.sizes)]
        return [self.select(list(range(a, b))) for a, b in zip(cu[:-1], cu[1:])]


class SplitSpec:
    def __init__(self, sizes: list[int]):
        self.sizes = sizes


class RealhfEngine:
    """The test's stand-in for the ReaL model's train_batch (the Megatron/FSDP backend): the mini-batch's
    micro-batches (:data:`MICRO`), logits from a seeded head for each, the loss function called and
    back-propagated; the optimizer step's grad_norm of the mini-batch."""

    def __init__(self, rank: int, recorder: Recorder):
        self.rank, self.recorder, self.mini = rank, recorder, 0

    def eval(self) -> None:
        pass

    def train_batch(self, input_, mb_spec, version_steps, loss_fn, loss_weight_fn, token_normalize_scope) -> dict:
        for u, rows in enumerate(MICRO[input_.bs]):
            micro = input_.select(rows)
            gen = torch.Generator().manual_seed(500 + 1000 * self.rank + 10 * self.mini + u)
            head = (2.5 * torch.randn(sum(micro.lens), VOCAB, generator=gen)).requires_grad_()
            self.recorder.where = ("micro", self.mini, u)
            self.recorder.bounds[self.recorder.where] = [0, *itertools.accumulate(n - 1 for n in micro.lens)]
            loss = loss_fn(head * 1.0, micro)                  # the model's output (not a leaf: divided in place)
            loss.backward()
            assert head.grad is not None and loss_weight_fn(micro) == micro.data["ppo_loss_mask"].count_nonzero()
        self.recorder.where = ("batch",)
        self.mini += 1
        return {"grad_norm": GRAD_NORMS[self.mini - 1]}


def _realhf_sample(rank: int, run: int) -> Sample:
    """A rank's packed PPO batch as the master worker hands train_step (prompt + response tokens per sequence,
    the generation's log-probs and the reference's at the shifted positions, rewards, the no-EOS flags)."""
    gen = torch.Generator().manual_seed(70 + rank + 100 * run)
    lens = [p + r for p, r in zip(PROMPTS[rank], RESPONSES[rank])]
    prompt_mask = torch.cat([torch.tensor([True] * p + [False] * r) for p, r in zip(PROMPTS[rank], RESPONSES[rank])])
    shifted = sum(lens) - len(lens)
    data = {"packed_input_ids": torch.randint(0, VOCAB, (sum(lens),), generator=gen), "prompt_mask": prompt_mask,
            "rewards": torch.tensor(REWARDS[run][rank]), "task_ids": torch.zeros(len(lens), dtype=torch.long),
            "seq_no_eos_mask": torch.tensor([n == max(lens) for n in lens]),
            "packed_logprobs": -(0.3 + 4.5 * torch.rand(shifted, generator=gen)),
            "packed_ref_logprobs": -(0.3 + 4.5 * torch.rand(shifted, generator=gen))}
    return Sample(data, lens)


#: adv_norm off: masked_normalization (all-reduced over the ranks) makes the advantages' token mean over the batch 0
#: whatever the reduction, so no batch could tell the reductions of ppo_actor/advantages/avg apart
REALHF_CONFIG = {"ppo.ppo_n_minibatches": 2, "ppo.c_clip": 3.0, "ppo.disable_value": True, "ppo.adv_norm": False}


def run_realhf(n: int = 0) -> tuple[list[list[dict]], list[Recorder]]:
    """Every rank's PPOActorInterface.train_step result (one export per mini-batch) and its recorder, with the
    rewards of run ``n``."""
    def rank(r: int):
        st = realhf_rank_stats_tracker()
        recorder = Recorder(st)
        A = realhf_actor(st, Sample, SplitSpec, lambda **kw: types.SimpleNamespace(temperature=1.0, n=1, **kw))
        iface = A.PPOActorInterface(n_minibatches=REALHF_CONFIG["ppo.ppo_n_minibatches"],
                                    c_clip=REALHF_CONFIG["ppo.c_clip"],
                                    disable_value=REALHF_CONFIG["ppo.disable_value"],
                                    adv_norm=REALHF_CONFIG["ppo.adv_norm"])
        model = types.SimpleNamespace(module=RealhfEngine(r, recorder), device="cpu",
                                      version=types.SimpleNamespace(global_step=0), inc_version=lambda: None)
        sample = _realhf_sample(r, n)
        recorder.bounds[("batch",)] = [0, *itertools.accumulate(n - 1 for n in sample.lens)]   # shifted tokens
        rows = iface.train_step(model, sample, mb_spec=None)
        return rows, recorder

    realhf_actor(realhf_rank_stats_tracker(), Sample, SplitSpec, None)    # parse once, before the rank threads
    with vendored.active(FW, TAG, extra=realhf_call_time_modules()):
        out = run_ranks(rank)
    return [o[0] for o in out], [o[1] for o in out]


@proof("areal", trainer="realhf", release=RELEASE, config=REALHF_CONFIG)
def test_areal_040_realhf_ppo_actor_rows(p):
    rows, recorders = run_realhf()
    p.check(rows[0] == rows[1], "after the all-reduce every rank exports the same rows")
    p.check(len(rows[0]) == 2, "train_step returns one export per PPO mini-batch (one row each)")
    first = rows[0][0]
    again = run_realhf(1)                                  # another batch: the extremes on the other rank
    more = [run_realhf(n) for n in (2, 3)]                 # two more batches: 0/1 fractions coincide less often
    p.check("ppo_actor/task_reward/avg" in first and "ppo_actor/task_reward/avg" not in rows[0][1],
            "the batch statistics sit in the first row only")
    for name, stats, tokens in (("advantages", ("avg", "max", "min"), "token_mean"),
                                ("task_reward", ("avg", "max", "min"), "per_seq"), ("seq_len", ("avg",), "per_seq"),
                                ("prompt_len", ("avg",), "per_seq"), ("no_eos_ratios", ("avg",), "per_seq")):
        for s in stats:
            key = f"ppo_actor/{name}/{s}"
            kw = {"stats": (s,), "tokens": (tokens,)} if s != "avg" else (
                {"tokens": ("per_seq",)} if tokens == "per_seq" else {})
            obs = [(out[0][0][key], batch_steps(recs, name)) for out, recs in ((rows, recorders), again, *more)]
            p.assert_stated(key, obs, levels=("processes",), **kw)
    for m, row in enumerate(rows[0]):
        # the loss function's denominator, exported as its SUM over the row's mini-batch on every rank (the
        # batch's own count is popped from the export): the count of the row's valid tokens, micro-batches and
        # ranks pooled, not one rank's nor the step's; as the 1.0.4 proof of ppo_actor/n_valid_tokens, the entry
        # (stat: value) is fingerprinted as that one count
        per_rank = [sum(len(seq) for micro in rank for seq in micro)
                    for rank in mini_steps(recorders, "dual_clip_ratio", m)[0][0]]
        step = sum(len(seq) for rec in recorders for _, seqs in rec.values("dual_clip_ratio") for seq in seqs)
        count = row["ppo_actor/n_valid_tokens"]
        p.check(count == sum(per_rank) and count not in per_rank and count != step,
                f"row {m}: n_valid_tokens {count} is its mini-batch's count over the ranks {per_rank}")
        p.assert_stated("ppo_actor/n_valid_tokens", count, [[[[[[float(sum(per_rank))]]]]]], levels=())
    obs = [(row["ppo_actor/dual_clip_ratio/avg"], mini_steps(recs, "dual_clip_ratio", m))
           for out, recs in ((rows, recorders), again, *more) for m, row in enumerate(out[0])]
    dual = [v for rec in recorders for _, seqs in rec.values("dual_clip_ratio") for seq in seqs for v in seq]
    p.check(0 < sum(dual) < len(dual), "c_clip 3: some tokens are dual-clipped, some not")
    p.assert_stated("ppo_actor/dual_clip_ratio/avg", obs, levels=("micro_batches", "processes"))
    # the loss function's other statistics: each row its own mini-batch's, micro-batches and ranks pooled
    for name in ("actor_loss", "entropy", "approx_kl", "clip_ratio"):
        key = f"ppo_actor/{name}/avg"
        obs = [(row[key], mini_steps(recs, name, m)) for out, recs in ((rows, recorders), again, *more)
               for m, row in enumerate(out[0])]
        p.assert_stated(key, obs, levels=("micro_batches", "processes"))
    for m, row in enumerate(rows[0]):                      # the optimizer step's norm: its mini-batch's, per row
        p.check(math.isclose(row["ppo_actor/grad_norm"], GRAD_NORMS[m]), f"row {m} holds mini-batch {m}'s norm")
        p.assert_stated("ppo_actor/grad_norm", row["ppo_actor/grad_norm"], [[[[[[GRAD_NORMS[m]]]]]]], levels=(),
                        tokens=("none",))
