"""The math of a rule's forms: `RuleForm` (what a rule is, decided once when it is built:
``rule.form``) and the chunk computations the registered strategies (`atlas_core.strategies`)
run it with (docs/architecture.md, "Build path")."""

from .rule_form import CHUNK_FORMS, RuleForm

__all__ = ["CHUNK_FORMS", "RuleForm"]
