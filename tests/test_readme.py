"""The README's code runs as written, its shapes are what it says, and what its comments claim
(the strategies equal core:sequential; a split into calls equals one call) holds."""

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_readme_rule_api_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = text.split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    B, T, H, D = scope["B"], scope["T"], scope["H"], scope["D"]
    assert tuple(scope["y"].shape) == (B, T, H, D)
    assert tuple(scope["state"]["M"].shape) == (B, H, D, D)
    assert tuple(scope["logits"].shape)[:2] == (1, 64)
    assert tuple(scope["out"].shape) == (1, 8 + 16)
    # the rule's anchor is stated, and core:exact_chunk equals core:sequential on it (float32)
    rule, mini = scope["rule"], scope["mini"]
    assert rule.anchor == 1 and mini.anchor == 64
    tol = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scope["y2"], scope["y"], **tol)
    torch.testing.assert_close(scope["state2"]["M"], scope["state"]["M"], **tol)
    # the anchored rule under core:chunkwise equals its sequential run, and the split equals both
    q, k, v, gates = scope["q"], scope["k"], scope["v"], scope["gates"]
    y_seq, s_seq = mini(q, k, v, gates=gates, strategy="core:sequential")
    torch.testing.assert_close(scope["y3"], y_seq, **tol)
    torch.testing.assert_close(torch.cat([scope["ya"], scope["yb"]], 1), y_seq, **tol)
    assert set(scope["sb"]) == set(s_seq) == {"M", "Z.M", "anchor.pos", "anchor.M"}
    for name in s_seq:
        torch.testing.assert_close(scope["state3"][name], s_seq[name], **tol)
        torch.testing.assert_close(scope["sb"][name], s_seq[name], **tol)
    assert float(s_seq["anchor.pos"][0]) == T % 64
    # the anchor is another function: the per-token rule's output differs
    assert (scope["y3"] - scope["y"]).abs().max() > 1e-4


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in ci
