"""mahia.profile: where a step's time goes (host times on the CPU here; kernel times need CUDA)."""

import warnings

import pytest
import torch
from torch import nn

from mahia.profile import StepReport, main, module_ranges, profile_step, quiet_profiler_notices


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))


def test_profile_step_ranks_operators_and_times_modules():
    net = _net()
    x = torch.randn(16, 32)

    def step(x):
        net(x).sum().backward()

    r = profile_step(step, x, steps=2, warmup=1, rows=5, modules={"first": net[0], "last": net[2]})
    assert isinstance(r, StepReport) and (r.device, r.kernel_ms, r.busy) == ("cpu", None, None)  # no device time
    assert r.wall_ms > 0 and 0 < len(r.top) <= 5 and any("mm" in t["name"] for t in r.top), r.top
    assert [t["ms"] for t in r.top] == sorted((t["ms"] for t in r.top), reverse=True)
    assert set(r.modules) == {"first", "last"} and all(v > 0 for v in r.modules.values())
    assert "ms per step" in str(r) and "first" in str(r)


def test_module_ranges_remove_their_hooks_and_bad_input_is_refused():
    net = _net()
    with module_ranges({"a": net[0], "b": [net[1], net[2]]}):
        assert all(len(m._forward_hooks) == 1 and len(m._forward_pre_hooks) == 1 for m in net)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in net)
    with pytest.raises(TypeError, match="must be an nn.Module"), module_ranges({"a": net[0], "b": lambda x: x}):
        pass
    assert not net[0]._forward_hooks and not net[0]._forward_pre_hooks  # nothing left behind
    for kw in ({"steps": 0}, {"warmup": -1}, {"rows": True}):
        with pytest.raises(ValueError, match=f"profile_step: {next(iter(kw))}"):
            profile_step(lambda: None, **kw)
    with pytest.raises(TypeError, match="profile_step: step must be callable"):
        profile_step(3)


def test_command_line(capsys):
    argv = "--preset tiny --batch 1 --seq-len 16 --steps 1 --rows 3 --device cpu --by-module".split()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "preset tiny (optimized)" in out and "ms per step" in out and "attn" in out
    assert main("--preset tiny --impl baseline --batch 1 --steps 1 --rows 1 --device cpu".split()) == 0
    assert "batch 1 x 128" in capsys.readouterr().out  # tiny's max_seq_len, not the 512 it cannot take


def test_quiet_profiler_notices_drops_only_the_profilers_cycle_notice():
    @quiet_profiler_notices
    def noisy():
        notice = "Warning: Profiler clears events at the end of each cycle.Only events from the current"
        warnings.warn(notice, stacklevel=2)  # torch 2.11's text on an H100
        warnings.warn("something the reader should see", UserWarning, stacklevel=2)
        return 7

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert noisy() == 7
    assert [str(w.message) for w in seen] == ["something the reader should see"]
