"""The conformance kit on every miras component, written as any plugin author writes it."""

from atlas_core.testing import Case, parametrize_with_checks

CASES = [
    Case("miras:lp", params={"p": 3.0}),
    Case("miras:lp", params={"p": 1.5}),
    Case("miras:huber", params={"delta": 0.5}),
    Case("miras:huber", params={"delta": 0.5, "mode": "norm"}),
    Case("miras:lq", params={"q": 2.5}),
    Case("miras:lq", params={"q": 4.0}),
    Case("miras:kl"),
    Case("miras:kl", params={"scale": 2.0, "axis": "matrix"}),
    # the knobs on deep memory (titans:mlp, a bundled plugin) and read-before retrieval
    Case("miras:huber", params={"delta": 0.5}, rule="titans:titans_deep", id="miras:huber(delta=0.5)@titans_deep"),
    Case("miras:kl", rule={"read": "before", "algorithm": "core:gd"}, id="miras:kl@read_before"),
    # presets, with reductions to the core rules they generalise
    Case("miras:moneta", reductions=[{
        "name": "p2_q2_is_delta_rule_with_decay",
        "params": {"bias": {"use": "miras:lp", "p": 2.0}, "retention": {"use": "miras:lq", "q": 2.0}},
        "equals": {"bias": "core:l2", "retention": "core:decay"},
    }]),
    Case("miras:yaad", reductions=[{
        "name": "large_delta_is_delta_rule_with_decay",
        "params": {"bias": {"use": "miras:huber", "delta": 1.0e6}},
        "equals": {"bias": "core:l2"},
    }]),
    Case("miras:memora"),
]


@parametrize_with_checks(CASES)
def test_conformance(component, check):
    check(component)
