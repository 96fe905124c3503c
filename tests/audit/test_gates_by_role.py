"""Strategies, chunk forms and kernel backends read a rule's gates by role through its form
(``p.gates[rule.form.gate("step_size")]``), never by a literal gate name, and no pseudo-gate
travels among the real ones (the chunk recurrence's ``A_t`` is the explicit ``decay_from_start``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the consumers of a rule's form: registered strategies, math forms, kernel backends
READERS = ["atlas_core/strategies", "atlas_core/forms", "plugins/cuda_backend",
           "plugins/atlas_muon/parallel.py", "plugins/mru/strategies.py"]
LITERAL_GATE = re.compile(r"""gates\[\s*["'][A-Za-z_]\w*["']\s*\]|["']_A["']""")


def _files():
    for entry in READERS:
        path = REPO / entry
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def test_no_consumer_reads_a_gate_by_its_name():
    hits = [f"{f.relative_to(REPO)}:{n}: {line.strip()}"
            for f in _files() for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            if LITERAL_GATE.search(line)]
    assert not hits, "\n".join(hits)


def test_the_pattern_finds_a_literal_read():
    assert LITERAL_GATE.search('theta = p.gates["theta"]')
    assert LITERAL_GATE.search("gates={**gates, '_A': A}")
    assert not LITERAL_GATE.search('theta = p.gates[f.gate("step_size")]')
