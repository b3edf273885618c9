"""The Deriver: applies an ordered RuleSet to one run's canonical metric dicts, step after step.

Contract (what the logger, translation, migration and comparison rely on):

* A rule runs at a step only when every metric it reads is present (not missing, not ``None``) and its output is
  missing. **A logged value always wins**: an output that is present is never touched.
* ``apply()`` fills the dict in place and returns the names it derived, so the record's ``derived`` list and the
  sinks can mark them.
* Bad values never raise and never invent a number: division by zero, NaN/infinite or non-numeric inputs, a
  missing config value or a blocked condition give no output and one note per rule and reason (``.notes``, also
  sent to the ``trackbridge.derive`` logger).
* Conditions: ``requires.sources`` (glob patterns matched against ``source`` and its part before ``@``; a rule that
  restricts sources does not run when the source is unknown), ``requires.config_absent`` (e.g. no adaptive-KL
  target), ``forbid_approximate`` (inputs whose translation must have been exact, per ``fidelity``: canonical
  name -> ``"exact"`` or the reason it is approximate; names absent from ``fidelity`` count as exact) and
  ``only`` (allowed placeholder values of templated rules).
* Stateful functions (``delta``, ``cumsum``, ``rate``, ``ema``) keep per-run state, observe their argument at every
  step where it can be evaluated (even when the rule's output was logged, so that a later missing output is derived
  from the right history) and skip steps where it cannot (so ``delta``/``rate`` span back to the last step where the
  input was present). Applying the same step twice does not advance the state. ``to_state()`` /
  ``from_state()`` save and restore it (JSON-able) for resumed runs. ``rate()`` divides by wall time: a record
  without one (a run without a time axis of its own) or two records less than :data:`MIN_RATE_INTERVAL` apart (times
  a copy stamped, not the run's) give no value and one note, never a made-up rate.
* ``progress/step``, when a rule reads it and the dict does not hold it, is taken from ``apply(step=...)``.
* A value derived from an input whose translation was approximate is listed in ``.approximate`` with the reason.
"""
from __future__ import annotations

import fnmatch
import logging
from typing import Any

from ..schema.model import STEP_AXIS
from ..schema.proofs import only_unproven
from . import expr as E
from .rules import Rule, RuleSet, fill, is_template, template_regex

log = logging.getLogger("trackbridge.derive")

STATE_FORMAT = "trackbridge.derive-state/1"
STEP_NAME = STEP_AXIS           # the canonical name of the tracker step (canonical.yaml axes: step)
# seconds: two training records closer than this in wall time were not logged by training steps that far apart but
# written by a copy that stamped its own times (a tracker copy from before runs carried the time-axis mark); rate()
# gives no value across them rather than ~1e8 tokens/s
MIN_RATE_INTERVAL = 1e-3


class _Inst:
    """A rule instantiated for one placeholder binding (cached: bindings recur at every step)."""

    __slots__ = ("out", "ast", "inputs", "stateful", "st_inputs", "forbid", "slot", "slots")

    def __init__(self, rule: Rule, binding: dict[str, str]):
        f = (lambda n: fill(n, binding)) if binding else (lambda n: n)
        self.out = f(rule.name)
        self.ast = E._rename(rule.ast, f) if binding else rule.ast
        self.inputs = [f(n) for n in rule.inputs]
        self.stateful = E.stateful_of(self.ast)
        self.st_inputs = [E.names_of(node.arg) for node in self.stateful]
        self.forbid = [f(n) for n in rule.forbid_approximate]
        # state slot: stable across edits that only move the rule in its file
        self.slot = f"{rule.name}={rule.formula}|{self.out}"
        self.slots = [f"{self.slot}#{node.index}" for node in self.stateful]     # one per stateful function


class _Plan:
    __slots__ = ("rule", "active", "why", "anchor", "prefix", "regex", "insts", "fixed")

    def __init__(self, rule: Rule):
        self.rule = rule
        self.active, self.why = True, ""
        templated = [n for n in rule.inputs if is_template(n)]
        self.anchor = templated[0] if templated else None
        self.prefix = self.anchor.split("{", 1)[0] if self.anchor else ""
        self.regex = template_regex(self.anchor) if self.anchor else None
        self.insts: dict[tuple, _Inst] = {}
        # inputs without placeholders: when one is missing a stateless templated rule need not scan the keys
        self.fixed = [] if rule.stateful else [n for n in rule.inputs if not is_template(n)]
        if not self.anchor:
            self.insts[()] = _Inst(rule, {})


def _source_matches(patterns: list[str], source: str | None) -> bool:
    if not patterns:
        return True
    if not source:
        return False
    head = source.split("@", 1)[0]
    return any(fnmatch.fnmatchcase(source, p) or fnmatch.fnmatchcase(head, p) for p in patterns)


class Deriver:
    """Applies derived-metric rules to one run. Create one per run (it holds the run's stateful history)."""

    def __init__(self, rules: RuleSet, config: dict[str, Any] | None = None, source: str | None = None,
                 fidelity: dict[str, str] | None = None, *, split: str = "", axes: frozenset[str] = frozenset()):
        self.rules = rules
        self.split = split               # "" for train records; "eval", "test" for the others
        self.axes = axes                 # canonical progress axes (axis: true)
        self.config: dict[str, Any] = dict(config or {})
        self.source = source
        self.fidelity: dict[str, str] = dict(fidelity or {})
        self.notes: list[str] = []
        self.approximate: dict[str, str] = {}
        self.skipped: dict[str, str] = {}          # rule key -> why it never runs for this run (conditions)
        self._noted: set[tuple[str, str]] = set()
        self._state: dict[str, dict[str, Any]] = {}
        self._plans: list[_Plan] = []
        self._by_keys: dict[tuple[str, ...], list[_Plan]] = {}      # the plans that can run, by a record's names
        self._by_prefix: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # a template prefix's names, by names
        for rule in rules:
            plan = _Plan(rule)
            if not _source_matches(rule.sources, source):
                plan.active, plan.why = False, f"source {source!r} is not one of {rule.sources}"
            present = [c for c in rule.config_absent if self.config.get(c) is not None]
            if present:
                plan.active, plan.why = False, f"config {present[0]} is set ({self.config[present[0]]!r})"
            if plan.active and split and self._counts_axis(rule):
                # an eval/test row repeats the run's position (TRL's eval_num_tokens is the train token counter,
                # eval rows carry the train epoch): it is no counter of that split's own work
                plan.active, plan.why = False, (f"the {split} split has no counter of its own: its progress axes "
                                                f"repeat the training run's position")
            if not plan.active:
                self.skipped[rule.key] = plan.why
            self._plans.append(plan)
        self._interrupted_note = False

    def _counts_axis(self, rule: Rule) -> bool:
        """Whether a stateful function of the rule (delta, rate, cumsum, ema) reads a progress axis."""
        return any(set(E.names_of(node.arg)) & self.axes for node in E.stateful_of(rule.ast))

    def interrupt(self) -> None:
        """Another split's record (an evaluation) came between two of this split's: the wall time until the next
        one includes it, so every ``rate()`` starts again from the next observation (``delta`` keeps its history:
        an evaluation adds to no training counter)."""
        hit = False
        for plan in self._plans:
            for inst in plan.insts.values():
                for node in inst.stateful:
                    if node.fn != "rate":
                        continue
                    st = self._state.get(f"{inst.slot}#{node.index}")
                    if st and st.get("cur") is not None:
                        st["prev"] = st["cur"] = None
                        hit = True
        if hit and not self._interrupted_note:
            self._interrupted_note = True
            msg = ("rate() not derived across an evaluation: the wall time between two training rows with an "
                   "evaluation in between includes it; the next interval starts after it")
            self.notes.append(msg)
            log.info("%s", msg)

    # ------------------------------------------------------------------------------------------ notes
    def _note(self, rule: Rule, out: str, reason: str) -> None:
        key = (rule.key + "|" + out, reason)
        if key in self._noted:
            return
        self._noted.add(key)
        msg = f"{out} not derived ({rule.file.rsplit('/', 1)[-1]}:{rule.line}, {rule.formula!r}): {reason}"
        self.notes.append(msg)
        log.info("%s", msg)

    # ------------------------------------------------------------------------------------------ apply
    def apply(self, metrics: dict[str, Any], *, step: int | None = None, wall_time: float | None = None) -> list[str]:
        """Fill ``metrics`` (canonical names) in place with what the rules can derive; return the derived names."""
        derived: list[str] = []
        injected = False
        if step is not None and STEP_NAME not in metrics:
            metrics[STEP_NAME] = step
            injected = True
        try:
            keys: tuple[str, ...] | None = None
            for plan in self._plans_for(metrics):
                if plan.anchor is None:
                    self._run(plan, plan.insts[()], metrics, step, wall_time, derived)
                    continue
                if any(metrics.get(n) is None for n in plan.fixed):
                    continue
                if keys is None or len(keys) != len(metrics):
                    keys = tuple(metrics)
                for key in self._matching(plan.prefix, keys):
                    m = plan.regex.match(key)  # type: ignore[union-attr]
                    if not m:
                        continue
                    binding = m.groupdict()
                    if plan.rule.only and any(binding.get(ph) not in vals for ph, vals in plan.rule.only.items()):
                        continue
                    bkey = tuple(sorted(binding.items()))
                    inst = plan.insts.get(bkey)
                    if inst is None:
                        inst = plan.insts[bkey] = _Inst(plan.rule, binding)
                    self._run(plan, inst, metrics, step, wall_time, derived)
        finally:
            if injected and metrics.get(STEP_NAME) is step:
                del metrics[STEP_NAME]
        return derived

    def _matching(self, prefix: str, keys: tuple[str, ...]) -> list[str]:
        """The names among ``keys`` a templated plan's prefix starts (worked out once per prefix and set of names:
        a run logs the same names at every step)."""
        found = self._by_prefix.get((prefix, keys))
        if found is None:
            if len(self._by_prefix) >= 256:     # bounded, as _by_keys is
                self._by_prefix.clear()
            found = self._by_prefix[(prefix, keys)] = [k for k in keys if k.startswith(prefix)]
        return found

    def _plans_for(self, metrics: dict[str, Any]) -> list[_Plan]:
        """The active plans that can do something at a record with these names, in order: one whose inputs are all
        among them or derived by a plan before it, or one with a stateful function whose inputs are (it observes
        them); a templated plan and every plan after it (what it derives is known only from the keys). The others
        would return at once (an input missing, nothing to observe): worked out once per set of names."""
        key = tuple(metrics)
        plans = self._by_keys.get(key)
        if plans is None:
            if len(self._by_keys) >= 256:       # records that each log other names: bounded all the same
                self._by_keys.clear()
            names, every, plans = set(key), False, []
            for plan in self._plans:
                if not plan.active:
                    continue
                every = every or plan.anchor is not None
                insts = plan.insts.values()
                if every or any(all(n in names for n in i.inputs) or any(all(n in names for n in st)
                                                                         for st in i.st_inputs) for i in insts):
                    plans.append(plan)
                    names.update(i.out for i in insts)
            self._by_keys[key] = plans
        return plans

    def _run(self, plan: _Plan, inst: _Inst, metrics: dict[str, Any], step: int | None, wall_time: float | None,
             derived: list[str]) -> None:
        rule = plan.rule
        has_output = metrics.get(inst.out) is not None
        if not inst.stateful:
            if has_output:
                return
            for n in inst.inputs:
                if metrics.get(n) is None:
                    return
            env = E.Env(metrics, self.config)
        else:
            env = E.Env(metrics, self.config)
            why = self._observe(inst, env, step, wall_time)
            if why and not has_output:
                self._note(rule, inst.out, why)
            if has_output:
                return
            for n in inst.inputs:
                if metrics.get(n) is None:
                    return
        for n in inst.forbid:
            fid = self.fidelity.get(n, "exact")
            # an input stated to be the quantity but not proven yet is used (the value says so, below); one known to
            # differ is not
            if fid != "exact" and not only_unproven(fid):
                self._note(rule, inst.out, f"input {n} is approximate ({fid}); the formula needs it exact")
                return
        try:
            value = E.evaluate(inst.ast, env)
        except E.NoValue as exc:
            reason = str(exc.args[0]) if exc.args else "no value"
            if not reason.startswith(("delta() has no value", "rate() has no value", "cumsum() has no value",
                                      "ema() has no value")):
                self._note(rule, inst.out, reason)
            return
        metrics[inst.out] = value
        derived.append(inst.out)
        for n in inst.inputs:
            fid = self.fidelity.get(n, "exact")
            if fid != "exact" or n in self.approximate:
                self.approximate[inst.out] = f"derived from {n}, which is approximate: {self.approximate.get(n, fid)}"
                break

    # ------------------------------------------------------------------------------------------ stateful functions
    def _observe(self, inst: _Inst, env: E.Env, step: int | None, wall_time: float | None) -> str | None:
        """Observe the stateful functions' arguments at this record; says why when a ``rate()`` had two
        observations but no time to divide by (no wall times, or two less than :data:`MIN_RATE_INTERVAL` apart)."""
        timeless = None
        got = env.metrics.get
        for node, names, slot in zip(inst.stateful, inst.st_inputs, inst.slots):
            if any(got(n) is None for n in names):
                continue                      # input absent at this step: history unchanged
            try:
                v = E.evaluate(node.arg, env)
            except E.NoValue:
                continue                      # not observed at this step: history unchanged
            st = self._state.get(slot)
            same = st is not None and step is not None and st.get("step") == step
            if node.fn in ("delta", "rate"):
                ref = (st.get("prev") if same else st.get("cur")) if st else None
                self._state[slot] = {"step": step, "prev": ref, "cur": [wall_time, v]}
                if ref is None:
                    continue
                if node.fn == "delta":
                    env.stateful[node.index] = v - ref[1]
                else:
                    t0, t1 = ref[0], wall_time
                    if t0 is None or t1 is None:
                        timeless = ("rate() needs wall times and the run holds none of its own (a tracker's write "
                                    "times are not used), so no per-second rate is derived")
                        continue
                    if t1 - t0 <= 0:
                        continue
                    if t1 - t0 < MIN_RATE_INTERVAL:
                        timeless = (f"two records {t1 - t0:.2g} s apart: times that close are when the records "
                                    f"were written, not logged, so no per-second rate is derived from them")
                        continue
                    env.stateful[node.index] = (v - ref[1]) / (t1 - t0)
            elif node.fn == "cumsum":
                base = (st["base"] if same else st["sum"]) if st else 0.0
                self._state[slot] = {"step": step, "base": base, "sum": base + v}
                env.stateful[node.index] = base + v
            elif node.fn == "ema":
                base = (st["base"] if same else st["ema"]) if st else None
                a = node.alpha if node.alpha is not None else 1.0
                val = v if base is None else a * v + (1.0 - a) * base
                self._state[slot] = {"step": step, "base": base, "ema": val}
                env.stateful[node.index] = val
        return timeless

    # ------------------------------------------------------------------------------------------ state
    def to_state(self) -> dict[str, Any]:
        """The run's stateful history as a JSON-able dict (store it with a checkpoint)."""
        import copy
        return {"format": STATE_FORMAT, "slots": copy.deepcopy(self._state)}

    def from_state(self, state: dict[str, Any]) -> "Deriver":
        """Restore history saved by :meth:`to_state` (a resumed run continues its deltas, sums and averages)."""
        import copy
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a derive state (expected format {STATE_FORMAT!r})")
        self._state = copy.deepcopy(state.get("slots") or {})
        return self
