"""The README's code runs as written and its shapes are what it says."""

from pathlib import Path

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


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in ci
