"""Derived metrics: compute what a framework did not log from what it did, by rules declared in YAML.

``expr`` is the safe expression language, ``rules`` loads and checks ``derived.yaml`` files, ``engine`` applies them
per step. Typical use::

    rules = load_rules()                       # shipped mappings/derived.yaml (+ user files: load_rules([path]))
    d = Deriver(rules, config={"kl_coef": 0.05}, source="trl/ppo@v0.12.0", fidelity=translation.approximate)
    names = d.apply(metrics, step=17, wall_time=time.time())   # fills metrics in place, returns derived names
"""
from .engine import Deriver
from .expr import ExprError, NoValue, parse
from .rules import Rule, RuleError, RuleSet, load_rules

__all__ = ["Deriver", "ExprError", "NoValue", "Rule", "RuleError", "RuleSet", "load_rules", "parse", "make_deriver",
           "rules_for", "lint_rules"]

_CACHE: dict = {}


def rules_for(registry, extra_paths=None) -> RuleSet:
    """The shipped rules plus the derived-rule files among ``extra_paths``, checked against ``registry``'s names.
    Loaded once per registry and set of files."""
    from pathlib import Path
    derived = {str(Path(p).resolve()) for p in registry.derived_files}
    shipped = str((Path(registry.canonical.file).parent / "derived.yaml").resolve())
    extra = sorted(p for p in derived if p != shipped)
    key = (id(registry), tuple(extra))
    rules = _CACHE.get(key)
    if rules is None:
        canon = registry.canonical
        rules = load_rules(extra, canonical=lambda n: canon.find(n) is not None, config_names=set(canon.config))
        _CACHE[key] = rules
    return rules


def make_deriver(registry, extra_paths=None, *, config=None, source=None, fidelity=None) -> Deriver:
    """A Deriver for one run: rules from ``registry`` (and user files), canonical ``config``, the run's ``source``."""
    return Deriver(rules_for(registry, extra_paths), config=config, source=source, fidelity=fidelity)


def lint_rules(registry, paths=None) -> int:
    """Check every derived-rule file (shipped and user); raises RuleError naming file, line and rule."""
    return len(rules_for(registry, paths))
