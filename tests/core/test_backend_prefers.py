"""Automatic backend dispatch skips a backend that can serve a call but says it is slower there
(`Backend.prefers`); a forced backend runs regardless; the kernel's speed policy
(`speed_refusal`) leaves exactly the measured-faster case to the kernel."""

from __future__ import annotations

from atlas_core.backends import Backend, BoundBackends


class _Fake(Backend):
    def __init__(self, name, prefers):
        self.name, self._prefers, self.asked = name, prefers, 0

    def prefers(self, strategy, rule, inputs):
        self.asked += 1
        return self._prefers, "" if self._prefers else "measured slower"


def test_automatic_dispatch_skips_a_backend_that_prefers_not():
    slow, fast = _Fake("slow", False), _Fake("fast", True)
    bound = BoundBackends("s", None, [("slow", slow, ""), ("fast", fast, "")])
    assert bound.select(None, None, None) is fast
    assert slow.asked == 1


def test_only_slower_backends_leave_the_call_to_pytorch():
    slow = _Fake("slow", False)
    assert BoundBackends("s", None, [("slow", slow, "")]).select(None, None, None) is None


def test_a_forced_backend_runs_even_where_it_prefers_not():
    slow = _Fake("slow", False)
    assert BoundBackends("s", "slow", [("slow", slow, "")]).select(None, None, None) is slow
    assert slow.asked == 0


def test_kernel_speed_policy_serves_only_the_measured_faster_case():
    from atlas_plugins.cuda_backend.backend_chunk import speed_refusal

    assert speed_refusal(momentum=False, window=1, backward=False) is None
    for momentum, window, backward in [(True, 1, False), (False, 16, False), (False, 1, True),
                                       (True, 16, True)]:
        why = speed_refusal(momentum=momentum, window=window, backward=backward)
        assert why and "ATLAS_BACKEND=cuda:chunk_linear" in why
        assert ("gradients" in why) == backward and ("momentum" in why) == momentum
        assert ("window" in why) == (window > 1)
