"""The ``atlas_muon`` plugin: the Muon inner optimiser (Newton–Schulz orthogonalised momentum),
the Atlas rule presets and the ``atlas_muon:atlas_parallel`` strategy (Atlas, arXiv 2505.23735,
Eq 32-34). See docs/atlas.md.

Registration lives in `plugin.py` (cheap to import); the math lives in `newton_schulz.py`,
`muon.py` and `parallel.py`.
"""
