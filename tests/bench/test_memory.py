"""The CPU peak-memory counters (`atlas_core.bench.memory`): live tensor bytes per storage, and the
process's resident-set growth over a block."""

import time

import pytest
import torch

from atlas_core.bench.memory import (LiveTensorBytes, ResidentPeak, peak_tensor_bytes,
                                     resident_growth_bytes, rss_bytes)

MB = 1_000_000


def test_counts_new_storages_and_frees_them():
    with LiveTensorBytes() as probe:
        a = torch.ones(MB // 4)  # 1 MB of float32
        b = a * 2  # another 1 MB
        view = b[10:]  # a view: no new storage
        assert probe.live == 2 * MB
        del a
        assert probe.live == MB
        del b
        assert probe.live == MB  # the view still holds b's storage
        del view
        assert probe.live == 0
    assert probe.peak == 2 * MB


def test_tensors_saved_for_backward_stay_counted_until_backward():
    x = torch.randn(MB // 4, requires_grad=True)  # created outside: not counted
    with LiveTensorBytes() as probe:
        s = x.sigmoid()  # sigmoid saves its output for backward
        y = (s * 3).sum()
        del s  # only the autograd graph holds it now
        assert probe.live >= MB
        y.backward()
        del y
    assert probe.live == MB  # what is left: x.grad, created during backward
    assert probe.peak >= 3 * MB  # output of sigmoid, of the product, and the gradients


def test_peak_of_a_function():
    def f():
        t = [torch.zeros(MB // 4) for _ in range(3)]  # 3 MB live at once
        return sum(x.sum() for x in t)

    assert 3 * MB <= peak_tensor_bytes(f) < 3 * MB + 1000


@pytest.mark.parametrize("use_hwm", [True, False], ids=["VmHWM", "sampled"])
def test_resident_peak_sees_memory_touched_and_freed_inside_the_block(use_hwm):
    if rss_bytes() is None:
        pytest.skip("no /proc/self/status: the resident set cannot be read here")
    size = 64 * 2**20  # above glibc's largest mmap threshold: fresh pages, whatever ran before

    with ResidentPeak(use_hwm=use_hwm) as probe:
        x = torch.ones(size // 4)  # touched
        time.sleep(0.05)  # several samples while it is alive
        del x  # gone before the block ends: only the peak sees it
    assert probe.method == ("VmHWM" if use_hwm else "sampled")
    assert size * 0.95 <= probe.growth < size * 2, probe.growth
    assert resident_growth_bytes(lambda: torch.zeros(size // 4).add_(1)) >= size * 0.95
