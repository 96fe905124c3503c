"""docs/plugins.md documents every hook (with its signature) and every check of the kit, and
every section a failure message points to exists. Fails when a hook or a check is added without
its documentation."""

import inspect
import re
from pathlib import Path

from atlas_core.host import hookspecs
from atlas_core.testing import catalogue

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _anchors(text: str) -> set[str]:
    """GitHub-style anchors of the page's headings."""
    out = set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            title = m.group(1).strip().lower().replace("`", "")
            title = re.sub(r"[^\w\- ]", "", title)
            out.add(title.replace(" ", "-"))
    return out


def test_every_hook_is_documented_with_its_signature():
    text = DOC.read_text(encoding="utf-8")
    for name in hookspecs.HOOK_NAMES:
        signature = f"{name}{inspect.signature(getattr(hookspecs, name))}"
        assert f"### `{signature}`" in text, f"hook {signature} is not documented in docs/plugins.md"


def test_every_check_has_its_section():
    text = DOC.read_text(encoding="utf-8")
    anchors = _anchors(text)
    for check in catalogue().values():
        assert check.name in anchors, f"{check.name} has no section '### {check.name}' in docs/plugins.md"
        section = text.split(f"### {check.name}\n", 1)[1].split("\n### ", 1)[0]
        assert len(section.split()) >= 15, f"the section of {check.name} says too little"


def test_sections_that_messages_point_to_exist():
    anchors = _anchors(DOC.read_text(encoding="utf-8"))
    src = Path(__file__).resolve().parents[2] / "atlas_core" / "testing"
    cited = set()
    for path in src.glob("*.py"):
        cited |= set(re.findall(r"docs/plugins\.md#([\w\-]+)", path.read_text(encoding="utf-8")))
    assert cited, "the kit cites no section"
    missing = sorted(cited - anchors)
    assert not missing, f"sections cited by the kit but missing from docs/plugins.md: {missing}"
