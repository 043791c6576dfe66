"""MoE combine (un-permute + gated k-sum) with an ``inverse`` that is not a permutation. The float64 math and
gradients are test_ops_fuzz's; opcheck, compile, bad input, float64 and meta inputs test_ops_launch's."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from helpers import assert_close

from mahia import ops
from mahia.ops.moe_combine import moe_combine_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["moe_combine"])
)


def make_inputs(N, k, D, dtype, gate_dtype=torch.float32, seed=0):
    """out (N*k, D), a random permutation inverse (N*k,), gates (N, k) summing to 1 per token."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(N * k, D, generator=g).to(DEVICE, dtype)
    inverse = torch.randperm(N * k, generator=g).to(DEVICE)
    gates = torch.rand(N, k, generator=g) + 0.1
    return out, inverse, (gates / gates.sum(-1, keepdim=True)).to(DEVICE, gate_dtype)


_REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh process: an out-of-bounds access there can only kill that process. It prints each bad index
# it checked, so a crash shows how far it got.
_BAD_INDEX_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from mahia import ops
    device = "cuda" if torch.cuda.is_available() else "cpu"
    N, k, D = 6, 2, 40
    for bad in map(int, sys.argv[1:]):
        g = torch.Generator().manual_seed(0)
        out = torch.randn(N * k, D, generator=g).to(device).requires_grad_()
        gates = torch.rand(N, k, generator=g).to(device).requires_grad_()
        inverse = torch.randperm(N * k, generator=g).to(device)
        inverse[3] = bad
        y = ops.moe_combine(out, inverse, gates, check=False)  # (on the CPU the default check refuses it)
        dy = torch.randn(N, D, generator=g).to(device)
        y.backward(dy)
        # documented: the bad entry (token 1, slot 1) contributes 0 and gets no gradient; all else is exact
        keep = torch.ones(N * k, dtype=torch.bool, device=device)
        keep[3] = False
        safe = torch.where(keep, inverse, 0)
        ref_y = (out.detach()[safe].view(N, k, D) * (gates.detach() * keep.view(N, k)).unsqueeze(-1)).sum(1)
        ref_dout = gates.detach().reshape(-1, 1) * dy.repeat_interleave(k, 0)  # row inverse[p] gets term p
        assert (y.detach() - ref_y).abs().max() <= 1e-5, ("y", bad)
        assert (out.grad[inverse[keep]] - ref_dout[keep]).abs().max() <= 1e-5, ("d_out", bad)
        assert gates.grad.view(-1)[3] == 0, ("the bad entry's d_gate", bad)
        print(bad, flush=True)
""")


def test_index_out_of_range_never_reads_or_writes_out_of_bounds():
    """Regression: an index past N*k or -1 read and wrote out of bounds (a segfault, a corrupt heap); now the
    entry contributes 0 and gets no gradient, every other value exact."""
    bad = [-1, 12, 13, 10**12, -(2**62)]  # N*k = 12
    env = dict(os.environ, PYTHONPATH=str(_REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    env.pop("MAHIA_DISABLE_TRITON", None)
    script = [sys.executable, "-c", _BAD_INDEX_SCRIPT, *map(str, bad)]
    proc = subprocess.run(script, env=env, cwd=_REPO, capture_output=True, text=True, timeout=600)
    done = proc.stdout.split()
    assert proc.returncode == 0 and done == [str(b) for b in bad], (
        f"rc {proc.returncode} after {done}: {proc.stderr[-2000:]}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_an_index_out_of_range_is_one_clear_error_on_every_path(monkeypatch, disabled, dtype):
    """Regression (issue 37 #11): the CPU's eager path raised an IndexError naming neither moe_combine nor
    inverse. On the CPU the default check refuses it on every path; check=True (any device) names the
    bad entry and refuses a repeated row."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    out, inverse, gates = make_inputs(4, 2, 8, dtype, gate_dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        y = ops.moe_combine(out, inverse, gates)
        torch.testing.assert_close(ops.moe_combine(out, inverse, gates, check=True), y, rtol=0, atol=0)
        for bad in (-1, 8, 10**12):
            inv = inverse.clone()
            inv[5] = bad
            match = rf"^moe_combine: inverse must be a permutation of 0..7.* inverse\[5\] = {bad} is out of range"
            for check in [True] if DEVICE == "cuda" else [None, True]:
                with pytest.raises(ValueError, match=match):
                    ops.moe_combine(out.clone().requires_grad_(), inv, gates, check=check)
        inv = inverse.clone()
        inv[5] = inv[6]
        with pytest.raises(ValueError, match=rf"row {int(inv[6])} appears 2 times and row {int(inverse[5])} never"):
            ops.moe_combine(out, inv, gates, check=True)
    ops.reset_fallback_warnings()


def test_repeated_index_forward_is_the_formula():
    """Without the check, a repeated row is read twice: y is still sum_j g[n, j] out[inverse[n*k + j]]
    (only d_out is undefined where the permutation is broken, documented)."""
    out, inverse, gates = make_inputs(5, 3, 33, torch.float32)
    inverse[4] = inverse[9]
    ref = (out.double()[inverse].view(5, 3, 33) * gates.double().unsqueeze(-1)).sum(1)
    assert_close("y with a repeated row", ops.moe_combine(out, inverse, gates), ref)
    assert_close("eager y with a repeated row", moe_combine_eager(out, inverse, gates), ref)
