"""Matrix Recurrent Unit (MRU): ``H_t = H_{t-1} X_t`` computed by parallel prefix scans (seed 002).

Modules:
    scans       the scan algorithms (Hillis–Steele, Brent–Kung, Sklansky) over any associative
                combine, the readable loop, and `count_steps` (measured depth and work)
    cumprod     exact cumulative matrix products with a closed-form backward, one
                ``torch.autograd.Function`` per scan algorithm
    rule        ``mru:mru``, the standalone rule (call contract, input checks, reference loop)
    strategies  ``mru:hillis_steele``, ``mru:brent_kung``, ``mru:sklansky``
    layer       the MRU layer: per-head W_in / W_out and the orthogonal parametrisation of X_t
    lm          ``mru:mru_lm``, GPT-2-style blocks with the MRU in place of attention
    plugin      registration through the ``atlas_register`` hook (no torch import)

Nothing is imported here, so that importing the package stays cheap. See docs/mru.md.
"""
