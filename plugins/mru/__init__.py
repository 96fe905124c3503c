"""Matrix Recurrent Unit (MRU): ``H_t = H_{t-1} X_t`` computed by parallel prefix scans.

Modules:
    scans       the scan algorithms (Hillis–Steele, Brent–Kung, Sklansky) over any associative
                combine, plus the readable left-to-right loop
    cumprod     exact cumulative matrix products with a closed-form backward, one
                ``torch.autograd.Function`` per scan algorithm

Nothing is imported here, so that importing the package stays cheap.
"""
