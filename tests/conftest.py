"""Suite-wide settings: the tests use tiny tensors, for which one intra-op thread is fastest."""

import torch

torch.set_num_threads(1)
