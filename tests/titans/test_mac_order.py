"""``titans:mac`` in the paper's order (Titans Sec 4.1): per segment, retrieve from the committed
memory, attend, update the memory WITH THE ATTENTION OUTPUT starting from the memory committed by
the previous segment, and gate the attention output with a read of the updated memory."""

from __future__ import annotations

import torch

import atlas_core as ac


def test_memory_stores_the_attention_output_segment_by_segment():
    torch.manual_seed(0)
    model = ac.build_model({
        "model": {"arch": "titans:mac", "vocab_size": 32, "d_model": 16, "depth": 1, "heads": 2,
                  "segment_size": 4, "persistent_tokens": 2, "window": 3},
        "memory": {"use": "titans:titans", "parallel": "core:sequential"},
    }).double().eval()
    block = model.blocks[0]
    attn_out, mem_calls, gate_calls = [], [], []
    real_attn, real_mem, real_gate = block.attn.forward, block.memory.forward, block.gate.forward

    def attn(*a, **k):
        y, buf = real_attn(*a, **k)
        attn_out.append(y)
        return y, buf

    def mem(x, state=None):
        m, new = real_mem(x, state)
        mem_calls.append((x, state, m, new))
        return m, new

    def gate(y, m):
        gate_calls.append((y, m))
        return real_gate(y, m)

    block.attn.forward, block.memory.forward, block.gate.forward = attn, mem, gate
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    assert len(attn_out) == len(mem_calls) == len(gate_calls) == 3  # three segments of 4
    for i, (y, (x_in, state_in, m, new)) in enumerate(zip(attn_out, mem_calls)):
        assert torch.equal(x_in, y)  # the memory stores the attention output
        if i == 0:
            assert state_in is None  # the learned initial memory
        else:  # continues from the memory the previous segment committed
            prev = mem_calls[i - 1][3]
            assert set(state_in) == set(prev) and all(torch.equal(state_in[k], prev[k]) for k in prev)
        gy, gm = gate_calls[i]
        assert torch.equal(gy, y) and torch.equal(gm, m)  # gated by the read of the updated memory
    # segment 2 starts from a memory segment 1 really changed (core:linear starts at zero)
    assert mem_calls[1][1]["rule.M"].abs().max() > 0
