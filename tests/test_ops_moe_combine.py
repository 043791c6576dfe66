"""Triton MoE combine (un-permute + gated k-sum) against the float64 eager reference: output, both
gradients, odd shapes, custom ops, torch.compile, errors, fallback."""
import warnings

import pytest
import torch

from mahia import ops
from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.ops.moe_combine import moe_combine_eager
from helpers import graph_ops

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not ops.triton_available_for(torch.empty(0, device=DEVICE)),
                                reason=str(ops.status()["moe_combine"]))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_inputs(N, k, D, dtype, gate_dtype=torch.float32, seed=0):
    """out (N*k, D), a random permutation inverse (N*k,), gates (N, k) summing to 1 per token."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(N * k, D, generator=g).to(DEVICE, dtype)
    inverse = torch.randperm(N * k, generator=g).to(DEVICE)
    gates = torch.rand(N, k, generator=g) + 0.1
    return out, inverse, (gates / gates.sum(-1, keepdim=True)).to(DEVICE, gate_dtype)


def compare(N, k, D, dtype, y_dtype=None, gate_dtype=torch.float32):
    out, inverse, gates = make_inputs(N, k, D, dtype, gate_dtype)
    return compare_fn(lambda o, g: ops.moe_combine(o, inverse, g, y_dtype),
                      lambda o, g: moe_combine_eager(o, inverse, g, torch.float64),
                      [out, gates], tol=tolerance(dtype), name=f"moe_combine N={N} k={k} D={D}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N,k,D", [(1, 2, 1000), (37, 3, 70), (37, 1, 1000), (5, 8, 70)], ids=str)
def test_moe_combine_matches_reference(N, k, D, dtype):
    cmp = compare(N, k, D, dtype)
    assert set(cmp.errors) == {"out0", "grad0", "grad1"}  # y, d_out, d_gates


def test_output_dtype_and_16bit_gates():
    """bf16 expert outputs combined into a float32 y (the autocast case), and bf16 gates."""
    out, inverse, gates = make_inputs(9, 2, 70, torch.bfloat16)
    y = ops.moe_combine(out, inverse, gates, torch.float32)
    assert y.dtype == torch.float32 and y.shape == (9, 70)
    assert ops.moe_combine(out, inverse, gates).dtype == torch.bfloat16  # dtype None: out.dtype
    compare(9, 2, 70, torch.bfloat16, y_dtype=torch.float32)
    compare(9, 2, 70, torch.bfloat16, gate_dtype=torch.bfloat16)


def test_gradient_of_out_only():
    """Gates without a gradient (top-1 routing): the backward skips reading out."""
    out, inverse, gates = make_inputs(11, 2, 130, torch.float32)
    out.requires_grad_(True)
    dy = torch.randn(11, 130, device=DEVICE)
    ops.moe_combine(out, inverse, gates).backward(dy)
    o64 = out.detach().double().requires_grad_(True)
    moe_combine_eager(o64, inverse, gates.double(), torch.float64).backward(dy.double())
    assert rel_error(out.grad, o64.grad) <= tolerance(torch.float32)


def test_strided_gates_and_broadcast_dy():
    """Gates as a transposed view; y.sum() sends back a dy with stride 0 (copied to unit stride)."""
    out, inverse, gates = make_inputs(13, 3, 70, torch.bfloat16)
    gates_t = gates.t().contiguous().t().requires_grad_(True)
    assert gates_t.stride() == (1, 13)
    out.requires_grad_(True)
    ops.moe_combine(out, inverse, gates_t, torch.float32).sum().backward()
    o64, g64 = (t.detach().double().requires_grad_(True) for t in (out, gates))
    moe_combine_eager(o64, inverse, g64, torch.float64).sum().backward()
    assert rel_error(out.grad, o64.grad) <= tolerance(torch.bfloat16)
    assert rel_error(gates_t.grad, g64.grad) <= tolerance(torch.bfloat16)


def test_opcheck():
    out, inverse, gates = make_inputs(6, 3, 70, torch.float32)
    out.requires_grad_(True)
    gates.requires_grad_(True)
    torch.library.opcheck(torch.ops.mahia.moe_combine_fwd.default, (out, inverse, gates, torch.float32))
    dy = torch.randn(6, 70, device=DEVICE)
    for gate_grad in (True, False):
        torch.library.opcheck(torch.ops.mahia.moe_combine_bwd.default,
                              (dy, out.detach(), inverse, gates.detach(), gate_grad))


def test_torch_compile_fullgraph():
    out, inverse, gates = make_inputs(7, 2, 45, torch.float32)

    def combine(o, g):
        return ops.moe_combine(o, inverse, g, torch.float32) * 2

    def eager(o, g):
        return moe_combine_eager(o, inverse, g, o.dtype) * 2

    torch._dynamo.reset()
    compiled = torch.compile(combine, fullgraph=True, backend="aot_eager")
    compare_fn(compiled, eager, [out, gates], name="compiled moe_combine")
    assert "mahia.moe_combine_fwd.default" in graph_ops(combine, out, gates)


def test_bad_inputs_raise_clear_errors():
    out, inverse, gates = make_inputs(4, 2, 8, torch.float32)
    with pytest.raises(TypeError, match="inverse must be an int64"):
        ops.moe_combine(out, inverse.int(), gates)
    with pytest.raises(ValueError, match=r"out must be \(N\*k, D\) with N\*k = 4\*2 = 8 rows"):
        ops.moe_combine(out[:7], inverse, gates)
    with pytest.raises(ValueError, match=r"inverse must have shape \(N\*k,\)"):
        ops.moe_combine(out, inverse[:7], gates)
    with pytest.raises(ValueError, match=r"gates must be 2-D \(N, k\)"):
        ops.moe_combine(out, inverse, gates.reshape(-1))
    with pytest.raises(ValueError, match="out must be"):  # gates (4, 3) wants 12 rows
        ops.moe_combine(out, inverse, torch.rand(4, 3, device=DEVICE))
    with pytest.raises(TypeError, match="out must be a floating-point"):
        ops.moe_combine(out.long(), inverse, gates)
    with pytest.raises(TypeError, match="dtype must be"):
        ops.moe_combine(out, inverse, gates, torch.int32)
    with pytest.raises(ValueError, match="same device"):
        ops.moe_combine(out, inverse.to("meta"), gates)


def test_fallback_when_disabled(monkeypatch):
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    ops.reset_fallback_warnings()
    out, inverse, gates = make_inputs(5, 2, 40, torch.float32)
    with pytest.warns(RuntimeWarning, match="moe_combine: Triton kernel not used"):
        y = ops.moe_combine(out, inverse, gates, torch.float32)
    torch.testing.assert_close(y, moe_combine_eager(out, inverse, gates, torch.float32), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.moe_combine(out, inverse, gates)
    ops.reset_fallback_warnings()


def test_float64_takes_the_eager_path():
    out, inverse, gates = make_inputs(3, 2, 16, torch.float64, gate_dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.moe_combine(out, inverse, gates)
    torch.testing.assert_close(y, moe_combine_eager(out, inverse, gates), rtol=0, atol=0)
