"""What notebook 01 measures its loops with: the launch chain's read-backs, the host's time per step, ops per step.
(The two training loops live in notebook 01, whose correctness gate checks that they make the same updates.)"""

import pytest
import torch

from mahia.lessons.sync_loops import host_step_ms, launch_chain, ops_per_step
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


def test_host_step_ms_cancels_what_a_call_pays_once():
    # a clock that moves only when the fake loop runs: 7 ms once per call + 4 ms per step; a one-step call would
    # say 11 ms per step, the difference says 4
    now, calls = [0.0], []

    def run(n):
        calls.append(n)
        now[0] += 0.007 + 0.004 * n

    assert host_step_ms(run, "cpu", steps=4, repeats=3, clock=lambda: now[0]) == pytest.approx(4.0)
    assert sorted(set(calls)) == [1, 4]
    with pytest.raises(RuntimeError, match="did not grow"):
        host_step_ms(lambda n: None, "cpu", clock=lambda: 0.0)


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
