"""What notebook 01 measures its loops with: the launch chain's read-backs, the host's time per step, ops per step.
(The two training loops live in notebook 01, whose correctness gate checks that they make the same updates.)"""

import pytest
import torch

from mahia.lessons.sync_loops import ResidualMLP, host_issue_ms, host_step_ms, launch_chain, make_batches, ops_per_step
from mahia.measure.instruments import count_syncs

IN, CLASSES = 19, 5


def test_launch_chain_counts_reads():
    x = torch.zeros(3)
    with count_syncs() as r:
        launch_chain(x, 10, read_every=4)
    assert r.count == 2 and torch.equal(x, torch.full((3,), 10.0))
    with count_syncs() as r:
        launch_chain(x, 5)
    assert r.count == 0


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="width"):
        ResidualMLP(IN, 0, 1, CLASSES)
    with pytest.raises(ValueError, match="n_steps"):
        make_batches(0, 2, 3, 4)
    with pytest.raises(TypeError, match="dtype"):
        make_batches(1, 2, 3, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="n_kernels"):
        launch_chain(torch.zeros(1), 0)
    with pytest.raises(ValueError, match="read_every"):
        launch_chain(torch.zeros(1), 3, read_every=-2)


def test_host_issue_ms_is_the_median_call_and_checks_its_arguments():
    calls = []
    ms = host_issue_ms(lambda: calls.append(1), "cpu", repeats=3)
    assert len(calls) == 3 and 0 <= ms < 1000
    with pytest.raises(TypeError, match="callable"):
        host_issue_ms(1, "cpu")
    with pytest.raises(ValueError, match="repeats"):
        host_issue_ms(lambda: None, "cpu", repeats=0)


class _FakeClock:
    """A clock (seconds) that only moves when a fake loop "runs": run(n) costs once + per_step * n."""

    def __init__(self, once: float, per_step: float):
        self.t, self.once, self.per_step, self.calls = 0.0, once, per_step, []

    def __call__(self) -> float:
        return self.t

    def run(self, n: int) -> None:
        self.calls.append(n)
        self.t += self.once + self.per_step * n


def test_host_issue_ms_reads_the_clock_around_the_call():
    clock = _FakeClock(once=0.002, per_step=0.001)
    assert host_issue_ms(lambda: clock.run(3), "cpu", repeats=3, clock=clock) == pytest.approx(5.0)
    assert clock.calls == [3, 3, 3]


def test_host_step_ms_cancels_what_a_call_pays_once():
    # 7 ms once per call + 4 ms per step: a one-step call would say 11 ms per step, the difference says 4
    clock = _FakeClock(once=0.007, per_step=0.004)
    assert host_step_ms(clock.run, "cpu", steps=4, repeats=3, clock=clock) == pytest.approx(4.0)
    assert sorted(set(clock.calls)) == [1, 4]
    with pytest.raises(RuntimeError, match="did not grow"):
        host_step_ms(lambda n: None, "cpu", clock=_FakeClock(0.0, 0.0))
    with pytest.raises(ValueError, match="steps"):
        host_step_ms(clock.run, "cpu", steps=1)
    with pytest.raises(TypeError, match="callable"):
        host_step_ms(3, "cpu")


def test_ops_per_step_leaves_out_what_a_call_does_once():
    x = torch.zeros(4)
    first = []

    def run(n):
        if not first:  # the first call does extra work once (like SGD allocating its momentum)
            first.append(1)
            for _ in range(10):
                x.mul_(1)
        x.add_(1)  # once per call
        for _ in range(n):
            x.add_(1)
            x.mul_(2)  # 2 ops per step

    assert ops_per_step(run, steps=3) == 2.0
