"""The chunk kernel's limits (``cuda:chunk_linear``'s verifier, the launcher and the compile check
read them): sizes after padding to a power of two, and the dtypes it takes."""

from __future__ import annotations

import torch

MAX_HEAD_DIM = 128  # Dk (Dphi) and Dv
MAX_CHUNK = 64  # C
MAX_EXTENDED = 128  # C + c - 1, the rows of one chunk with its Omega look-back
# the backward kernel's shared memory on sm_90 (docs/kernels.md "Resources on sm_90"; an H100 block
# allows 232,448 B): 262,144 B at Dk = 128 even with C + c - 1 = 64 rows, 229,376 B at Dk = 64 with
# 128 rows, 147,456 B at (C + c - 1) x Dk = 64 x 64. Calls that need gradients are served up to
# Dk = 64 and (C + c - 1) x Dk = 4096 after padding
MAX_BACKWARD_HEAD_DIM = 64
MAX_BACKWARD_TILE = 4096
# with momentum, 128 rows do not fit even at Dk = 32 (253,952 B): C + c - 1 <= 64 after padding
MAX_BACKWARD_MOMENTUM_ROWS = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
