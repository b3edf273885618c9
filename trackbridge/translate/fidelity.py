"""Fidelity, computed (docs/reductions.md, "Fidelity, computed"): an entry's stated reduction resolved for a run,
two resolved reductions compared, and the reason generated from the fields that differ.

    a = resolve(entry, fw, trainer, lo, hi, config)       # config switches and level counts read from the run config
    b = reference(registry.canonical.metrics[entry.canonical])
    why = judge(a, b)                                     # None: exact; else "verl 'actor/kl_loss' averages ..."

:func:`resolve` reads each config switch from the run config (or the framework's default, remembered in
``Resolved.defaults``), evaluates each level's count, and normalises each level: a level holding one item, or
reduced so that it pools its items (a token mean weighted by tokens, ``gather``, the max of maxima ...), is the
identity. Two resolved reductions are equal when every field is; ``tool_tokens: none`` (no tool tokens possible)
equals anything, and a ``deviation`` other than ``none`` equals nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..schema.model import CanonicalMetric, Entry, FrameworkMapping
from ..schema.proofs import UNPROVEN
from ..schema.reductions import ANY, FIELDS, LEVELS, NO_DEFAULT, Reduce, Switch, parse_count

UNKNOWN = "?"                  # a field a switch cannot resolve under the run config
EVAL = "eval"                  # the snapshot of every value of an evaluation (a key under a split other than train)
_IDENTITY = {"micro_batches": "none", "mini_batches": "none", "processes": "none", "window": "step"}
#: the levels as a value is built, innermost first: each micro-batch is reduced over the processes as it is computed
#: (an all-reduce or gather per micro-batch or per optimizer step), then the micro-batches of an optimizer step, the
#: optimizer steps of a logged step, the logged steps of a row (docs/reductions.md, "The levels")
NESTING = ("processes", "micro_batches", "mini_batches", "window")
_STEP_NORMED = ("token_sum_step_norm", "token_sum_dp_norm", "token_sum_global_norm")
_ITEMS = {"micro_batches": "micro-batches", "mini_batches": "mini-batches (optimizer steps)",
          "processes": "processes", "window": "logged steps"}


@dataclass(frozen=True)
class Count:
    """How many items a level holds in a run: ``n`` (None: unknown), the expression and the config values it read
    (key, value, whether the framework's default was assumed)."""

    n: float | None
    expr: str | None = None
    keys: tuple[tuple[str, Any, bool], ...] = ()
    declared: bool = False          # False: the framework declares no count for this level
    why: str | None = None          # why the count is unknown, when the run config is not the reason

    @property
    def one(self) -> bool:
        return self.n is not None and abs(self.n - 1.0) < 1e-9

    def text(self, level: str) -> str:
        """``mini_batches = data.train_batch_size / ... = 4, with data.train_batch_size=1024 (default), ...``."""
        if self.why:
            return self.why
        if not self.declared:
            return f"the mapping gives no count for {level}"
        if self.expr is None:
            return "how many is unknown from the config"
        n = "unknown" if self.n is None else _num(self.n)
        expr = self.expr.strip()
        if len(self.keys) == 1 and self.keys[0][0] == expr:
            key, have, defaulted = self.keys[0]
            return f"{level} = {expr} = {n}" + (" (the default)" if defaulted else "") + \
                ("" if have is not None else ", not set and no default")
        vals = ", ".join(f"{k}={v}" + (" (default)" if d else "") if v is not None or d else f"{k} not set"
                         for k, v, d in self.keys)
        return f"{level} = {expr} = {n}" + (f", with {vals}" if vals else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Resolved:
    """A reduction resolved for one run: every field's value (normalised), and where each came from."""

    who: str                                           # "verl 'actor/kl_loss'", "canonical 'kl/ref/k3'"
    fields: dict[str, str]                             # normalised; UNKNOWN where a switch cannot tell
    stated: dict[str, str]                             # before the levels were normalised
    counts: dict[str, Count] = field(default_factory=dict)
    switched: dict[str, tuple[str, Any, bool]] = field(default_factory=dict)   # field -> (key, value, defaulted)
    defaults: tuple[tuple[str, Any], ...] = ()         # config defaults assumed (key, value), in reading order
    reference: bool = False                            # a canonical reference


def _read(key: str, config: Mapping[str, Any], fw: FrameworkMapping | None, trainer: str | None, lo: float,
          hi: float, fallback: Any = NO_DEFAULT) -> tuple[bool, Any, bool]:
    """(known, value, defaulted) of a config key: the run config's, else ``fallback``, else the framework's default."""
    if key in config:
        return True, config[key], False
    if fallback is not NO_DEFAULT:
        return True, fallback, True
    if fw is not None:
        known, value = fw.config_default(key, trainer, lo, hi, config)
        if known:
            return True, value, True
    return False, None, False


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def pools(level: str, value: str, tokens: str, stat: str) -> bool:
    """Whether combining a level's items with ``value`` gives what one computation over their pooled population
    gives, when each item is itself computed over its pooled population (then the level is the identity, whatever
    its count). A logging window never pools: a row over several steps is not one step's value."""
    if level == "window":
        return False
    mean_like = stat in ("mean", "fraction")
    if value in ("token_weighted", "all_reduce_weighted") and tokens == "token_mean" and mean_like:
        return True
    if value in ("seq_weighted", "all_reduce_weighted") and mean_like and \
            tokens in ("seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "per_seq"):
        return True
    if value == "gather":
        return True
    if value == "sum" and (stat in ("sum", "count") or tokens == "token_sum"):
        return True
    return value in ("max", "min") and stat == value


def _one(out: Mapping[str, str], counts: Mapping[str, Count], level: str) -> bool:
    """Whether a level holds one item (or is not reduced at all)."""
    c = counts.get(level)
    return out[level] == _IDENTITY[level] or (c is not None and c.one)


def _step_normed(out: dict[str, str], counts: Mapping[str, Count]) -> None:
    """The globally normalised token sums (OpenRLHF's ``aggregate_loss``, prime-rl's RL loss) where they are a token
    mean after all:
    ``token_sum_step_norm`` (each micro-batch's token sum over the optimizer step's tokens per rank and micro-batch,
    G x D x S_ur / T) is the step's token mean once averaged unweighted over the micro-batches and the ranks (or with
    one of each); ``token_sum_dp_norm`` (D x S_ur / T_u) is micro-batch u's token mean over the ranks once averaged
    unweighted over the ranks (or on one rank); ``token_sum_global_norm`` (prime-rl's RL loss: S_ur / T, T the step's
    tokens over every rank and micro-batch) is the step's token mean once summed over the micro-batches and the ranks,
    and averaged over them the token mean divided by G x D: a token mean only with one micro-batch on one rank.
    Anything else (merged by tokens over several micro-batches or ranks, a global sum averaged over several) stays
    what it is: not a token mean (:func:`differing` then reports ``tokens`` even against a reference's ``any``)."""
    if out["tokens"] not in _STEP_NORMED or out["stat"] != "mean":
        return
    if out["tokens"] == "token_sum_global_norm":
        # summed over both levels (or a level holding one item), the pooled token sum over T: the token mean
        if all(_one(out, counts, lv) or out[lv] == "sum" for lv in ("micro_batches", "processes")):
            out.update(tokens="token_mean", micro_batches="none", processes="none")
        return
    if not (_one(out, counts, "processes") or out["processes"] == "all_reduce_mean"):
        return
    # every rank divides by the same normaliser: their unweighted mean is the ranks' pooled sum over it
    out["processes"] = "none"
    if out["tokens"] == "token_sum_dp_norm":
        out["tokens"] = "token_mean"
    elif _one(out, counts, "micro_batches") or out["micro_batches"] == "mean":
        out.update(tokens="token_mean", micro_batches="none")


def _normalise(stated: dict[str, str], counts: Mapping[str, Count]) -> dict[str, str]:
    """Each level that holds one item, or pools items that are each pooled themselves, becomes the identity, from
    the innermost level out (:data:`NESTING`): a token mean weighted by tokens over micro-batches pools them only
    if each micro-batch was pooled over the processes. ``window: last`` is the identity: the row holds its own
    step's value (the steps between rows are not logged, which no logged value suffers from)."""
    out = dict(stated)
    _step_normed(out, counts)
    for i, level in enumerate(NESTING):
        v = out[level]
        ident = _IDENTITY[level]
        if v in (ident, UNKNOWN):
            continue
        if v == "var":
            continue     # a variance of one value is undefined, of several a spread: never the identity
        c = counts.get(level)
        if (c is not None and c.one) or (level == "window" and v == "last"):
            out[level] = ident
        elif v == "gather" and "var" in (out["micro_batches"], out["mini_batches"]):
            continue     # the ranks' values gathered into the list a variance is taken of: no pooled population
        elif pools(level, v, out["tokens"], out["stat"]) and \
                all(out[inner] == _IDENTITY[inner] or (v in ("max", "min", "sum") and out[inner] == v)
                    for inner in NESTING[:i]):
            out[level] = ident
    return out


def resolve(entry: Entry, fw: FrameworkMapping, trainer: str | None, lo: float, hi: float,
            config: Mapping[str, Any] | None, *, label: str | None = None, split: str | None = None
            ) -> Resolved | None:
    """The entry's reduction under the run ``config`` (flattened), for ``trainer`` and releases lo..hi; None when the
    entry states none (legacy). ``split``: the key's split when it is not the training split (``eval``, ``test``):
    see :data:`_EVAL_BATCHES`."""
    red = entry.reduce
    if red is None:
        return None
    return _resolve(red, f"{fw.name} {(label or entry.key)!r}", fw, trainer, lo, hi, config or {}, split=split)


#: A value of an evaluation (a key under the eval or test split) is taken with the policy as it is when the
#: evaluation runs and logged once per evaluation, whatever the entry says of its training rows (one entry serves both
#: when the split is a prefix): snapshot ``eval``, window ``step``. The training run's micro-batch and optimizer-step
#: counts (the file's ``levels:``) do not count an evaluation's batches: unknown, unless the entry states its own
#: ``counts:``.
_EVAL_BATCHES = "an evaluation's batches are not counted by the run config"


def _resolve(red: Reduce, who: str, fw: FrameworkMapping | None, trainer: str | None, lo: float, hi: float,
             config: Mapping[str, Any], reference: bool = False, split: str | None = None) -> Resolved:
    defaults: dict[str, Any] = {}
    stated: dict[str, str] = {}
    switched: dict[str, tuple[str, Any, bool]] = {}
    for name in FIELDS:
        v = red.get(name)
        if isinstance(v, Switch):
            known, have, defaulted = _read(v.key, config, fw, trainer, lo, hi, v.default)
            picked = v.pick(have) if known else None
            switched[name] = (v.key, have if known else None, defaulted)
            if defaulted:
                defaults.setdefault(v.key, have)
            stated[name] = picked if picked is not None else UNKNOWN
        else:
            stated[name] = str(v)
    counts: dict[str, Count] = {}
    if split:
        stated.update(snapshot=EVAL, window="step")
    for level in LEVELS:
        if stated[level] == _IDENTITY[level]:
            continue
        here, expr = red.count_expr(level)
        if split and not here and level in ("micro_batches", "mini_batches"):
            counts[level] = Count(None, None, (), True, _EVAL_BATCHES)
            continue
        declared = here
        if not here and fw is not None:
            declared, expr, _ = fw.level_count(level, trainer, lo, hi)
        if not declared or expr is None:
            counts[level] = Count(None, None, (), declared)
            continue
        used: list[tuple[str, Any, bool]] = []

        def value_of(key: str) -> float | None:
            known, have, defaulted = _read(key, config, fw, trainer, lo, hi)
            used.append((key, have if known else None, defaulted))
            if defaulted:
                defaults.setdefault(key, have)
            return _number(have) if known else None
        n = parse_count(expr).evaluate(value_of)
        counts[level] = Count(n, expr, tuple(dict.fromkeys(used)), True)
    return Resolved(who, _normalise(stated, counts), stated, counts, switched, tuple(defaults.items()), reference)


def reference(metric: CanonicalMetric, split: str | None = None) -> Resolved | None:
    """The canonical reference of a metric (None when canonical.yaml states none); under the eval or test ``split``
    the quantity an evaluation takes (snapshot ``eval``)."""
    if metric.reduce is None:
        return None
    name = f"{split}/{metric.name}" if split else metric.name
    return _resolve(metric.reduce, f"canonical {name!r}", None, None, 0, 0, {}, reference=True, split=split)


# ------------------------------------------------------------------------------------------------ comparing
def differing(a: Resolved, b: Resolved) -> list[str]:
    """The fields in which two resolved reductions differ (in FIELDS order)."""
    out = []
    for name in FIELDS:
        x, y = a.fields[name], b.fields[name]
        if name == "tool_tokens" and "none" in (x, y) and UNKNOWN not in (x, y):
            continue
        if ANY in (x, y) and UNKNOWN not in (x, y) and not (name == "tokens" and (x in _STEP_NORMED or
                                                                    y in _STEP_NORMED)):
            # a reference that leaves the field to the framework; a normalised token sum that stayed one after
            # _step_normed is no population the framework chose but a scale of its token mean: it differs still
            continue
        if name == "deviation" and x == y == "none":
            continue
        if x != y or x == UNKNOWN or name == "deviation":
            out.append(name)
    return out


def judge(a: Resolved, b: Resolved | None) -> str | None:
    """None when ``a`` and ``b`` are the same quantity (exact); else the reason, one clause per differing field. ``b``
    None (a canonical metric that states no reference: :func:`reference` returned None) is never exact."""
    if b is None:
        return f"{a.who}: the canonical name states no reference reduction to compare with"
    diff = differing(a, b)
    if not diff:
        return None
    return "; ".join(_clause(a, b, f) for f in diff)


def unproven(parts: list[tuple[Entry, Resolved]], proven: Mapping[tuple[str, int], Any], what: str) -> str | None:
    """None when every entry of ``parts`` is proven (a proof ran the framework's code and saw its stated reduction:
    the registry's ``proven``, mappings/proofs.yaml); else why the equality the stated reductions give is not exact:
    "stated, not proven: verl 'actor/ppo_kl' and openrlhf 'ppo_kl' state equal reductions (read from the source), but
    no proof has run the framework's code to confirm openrlhf 'ppo_kl' yet". ``what``: what they agree on."""
    missing = [r.who for e, r in parts if (e.file, e.line) not in proven]
    if not missing:
        return None
    who = " and ".join(r.who for _, r in parts)
    verb = "states" if len(parts) == 1 else "state"
    unseen = "it" if len(parts) == 1 else " and ".join(missing)
    return (f"{UNPROVEN}: {who} {verb} {what} (read from the source), but no proof has run the framework's code "
            f"to confirm {unseen} yet (docs/fidelity-proofs.md)")


def _clause(a: Resolved, b: Resolved, name: str) -> str:
    if name == "deviation":
        texts = [f"{r.who}: {r.fields['deviation']}" for r in (a, b) if r.fields["deviation"] != "none"]
        return "; ".join(texts) + " [deviation]"
    return f"{a.who} {describe(a, name)}; {b.who} {describe(b, name)} [{name}]"


_TOKENS = {"token_mean": "is the token mean", "seq_mean_token_mean": "is the mean of per-sequence token means",
           "seq_mean_token_sum": "is the mean of per-sequence token sums",
           "seq_mean_token_sum_norm": "is the token sum divided by sequences x a constant length",
           "token_sum": "is the token sum",
           "token_sum_step_norm": "is each micro-batch's token sum over the optimizer step's tokens per rank and "
                                  "micro-batch (not a token mean)",
           "token_sum_dp_norm": "is each micro-batch's token sum over that micro-batch's tokens per rank (not a token "
                                "mean)",
           "token_sum_global_norm": "is each micro-batch's token sum over the step's global token count (every "
                                    "rank's and micro-batch's tokens; not a token mean: averaged over the "
                                    "micro-batches of all ranks, the step's token mean divided by the number of "
                                    "micro-batches on all ranks)",
           "per_seq": "is over per-sequence values",
           "none": "is not a per-token or per-sequence quantity"}
_STAT = {"mean": "the mean", "max": "the maximum", "min": "the minimum", "sum": "the sum", "fraction": "a fraction",
         "count": "a count", "value": "a single value", "dist": "the distribution (a histogram)", "std": "a std",
         "explained_var": "an explained variance (1 - Var(returns - values) / Var(returns))"}
_SNAPSHOT = {"rollout": "is taken before the update (the rollout's policy and scores)",
             "update": "is taken during the update (the policy being updated)",
             "after_update": "is taken after the update", "before_scheduler_step": "is read before the scheduler steps",
             "after_scheduler_step": "is read after the scheduler stepped", "none": "states no snapshot",
             EVAL: "is taken by an evaluation (the policy as it is when the evaluation runs)"}
_OTHER = {("padding", "included"): "includes padding tokens", ("padding", "excluded"): "excludes padding tokens",
          ("tool_tokens", "included"): "counts tool-output tokens",
          ("tool_tokens", "excluded"): "leaves tool-output tokens out",
          ("tool_tokens", "none"): "has no tool tokens",
          ("clip_length", "max_length"): "compares with the configured maximum length",
          ("clip_length", "batch_longest"): "compares with the batch's longest sequence",
          ("clip_length", "none"): "is not a truncation ratio"}
_COMBINE = {"mean": "averages its {n}{items} unweighted", "token_weighted": "weights its {n}{items} by tokens",
            "seq_weighted": "weights its {n}{items} by sequences", "sum": "sums its {n}{items}",
            "last": "keeps the last of its {n}{items}", "max": "takes the largest of its {n}{items}",
            "min": "takes the smallest of its {n}{items}", "rank0": "keeps rank 0's value of its {n}{items}",
            "var": "takes the unbiased variance (n-1) of its {n}{items}' values",
            "all_reduce_mean": "averages its {n}{items}' values unweighted",
            "all_reduce_weighted": "weights its {n}{items}' values by their populations",
            "pooled": "pools the items of its {n}{items}",
            "gather": "pools its {n}{items}"}


def describe(r: Resolved, name: str) -> str:
    """What ``r`` does in one field, in plain words (with the count, the config keys and defaults it came from)."""
    value = r.fields[name]
    sw = r.switched.get(name)
    origin = ""
    if sw is not None:
        key, have, defaulted = sw
        origin = f" ({key}={have}{', the default' if defaulted else ''})" if have is not None or defaulted else \
            f" ({key} not set and no default)"
    if value == UNKNOWN:
        return f"cannot be placed: the mapping does not say what {name} is for this config{origin}"
    if value == ANY:
        return f"leaves {name} to each framework"
    if name in LEVELS:
        return _describe_level(r, name) + origin
    if name == "tokens":
        return _TOKENS[value] + origin
    if name == "stat":
        extra = f" ({r.fields['std']})" if value == "std" else ""
        return f"is {_STAT[value]}{extra}" + origin
    if name == "std":
        return ("is the sample std (n-1)" if value == "sample" else "is the population std (n)" if
                value == "population" else "is no std") + origin
    if name == "snapshot":
        return _SNAPSHOT[value] + origin
    if name == "estimator":
        return ("states no estimator" if value == "none" else f"uses the {value} estimator") + origin
    return _OTHER.get((name, value), f"has {name} {value}") + origin


_WHAT = {"token_mean": "token mean", "seq_mean_token_mean": "mean of per-sequence token means",
         "seq_mean_token_sum": "mean of per-sequence token sums", "token_sum": "token sum",
         "seq_mean_token_sum_norm": "normalised token sum", "token_sum_step_norm": "step-normalised token sum",
         "token_sum_dp_norm": "rank-normalised token sum", "token_sum_global_norm": "globally normalised token sum"}


def _what(r: Resolved) -> str:
    """The quantity as a noun: ``token mean``, ``maximum over sequences``, ``value``."""
    tokens, stat = r.fields["tokens"], r.fields["stat"]
    if tokens in _WHAT and stat == "mean":
        return _WHAT[tokens]
    base = {"value": "value", "dist": "distribution"}.get(stat, _STAT.get(stat, stat).replace("the ", "").replace(
        "a ", ""))
    return base + (" over sequences" if tokens == "per_seq" else " over tokens" if tokens != "none" else "")


def _describe_level(r: Resolved, level: str) -> str:
    value, stated = r.fields[level], r.stated[level]
    items = _ITEMS[level]
    count = r.counts.get(level)
    if value == _IDENTITY[level]:
        if level == "window":
            if stated == "last":
                return "logs the value of the step it is logged at" + (
                    f" (one row every {_num(count.n)} steps)" if count is not None and count.n is not None else "")
            if stated == value or count is None:
                return "logs every step"
            return f"logs every step ({count.text(level)})"
        what = _what(r)
        if r.reference:
            return f"is one {what} over the step's whole batch"
        if stated == value:
            return f"is one {what} over all {items}"
        if count is not None and count.one:
            return f"has one of its {items} ({count.text(level)})"
        return f"is one {what} over all {items} ({stated} pools them)"
    n = f"{_num(count.n)} " if count is not None and count.n is not None else ""
    if level == "window" and value == "mean":
        text = f"averages the {n}steps since the last log unweighted"
    elif level == "window":
        text = {"sum": "sums the {n}steps since the last log",
                "pooled": "pools what the {n}steps since the last log computed (weighted by their items)"
                }.get(value, value).format(n=n)
    else:
        text = _COMBINE.get(value, f"combines its {{n}}{{items}} by {value}").format(n=n, items=items)
    if count is not None:
        text += f" ({count.text(level)})"
    return text
