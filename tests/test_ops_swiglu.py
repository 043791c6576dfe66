"""Triton SwiGLU against the float64 eager reference: outputs, gradients, strided views, ops, errors."""

import importlib
import warnings

import pytest
import torch
from helpers import compare, graph_ops

from mahia import ops
from mahia.layers.mlp import SwiGLU
from mahia.ops.swiglu import swiglu_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["swiglu"])
)


def test_opcheck():
    torch.manual_seed(2)
    a = torch.randn(3, 5, 70, device=DEVICE, requires_grad=True)
    b = torch.randn(3, 5, 70, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.mahia.swiglu_fwd.default, (a, b))
    dc = torch.randn(3, 5, 70, device=DEVICE)
    torch.library.opcheck(torch.ops.mahia.swiglu_bwd.default, (dc, a.detach(), b.detach()))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def mlp_act(u):
        a, b = u.chunk(2, dim=-1)
        return ops.swiglu(a, b) * 2

    def eager(u):
        a, b = u.chunk(2, dim=-1)
        return swiglu_eager(a, b) * 2

    compiled = torch.compile(mlp_act, fullgraph=True, backend="aot_eager")
    compare(compiled, eager, [torch.randn(6, 2 * 45, device=DEVICE)], name="compiled swiglu")
    assert "mahia.swiglu_fwd.default" in graph_ops(mlp_act, torch.randn(6, 2 * 45, device=DEVICE))


BAD_CALLS = [  # (call on a (4, 8), error, message)
    (lambda a: ops.swiglu(a.long(), a), TypeError, r"^swiglu: a must be a floating-point"),
    (lambda a: ops.swiglu(a, [1.0]), TypeError, r"^swiglu: b must be a torch.Tensor, got list"),
    (lambda a: ops.swiglu(a, a[:, :4]), ValueError, r"^swiglu: a and b must have the same shape"),
    (lambda a: ops.swiglu(a, a.half()), TypeError, r"^swiglu: a and b must have the same dtype"),
    (lambda a: ops.swiglu(a, a.to("meta")), ValueError, r"^swiglu: .*same device"),
    (lambda a: swiglu_eager(None, a), TypeError, r"^swiglu_eager: a must be a torch.Tensor"),
]


@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_bad_inputs_raise_errors_naming_the_function(monkeypatch, disabled):
    """Regression: the fallback's errors named swiglu_eager. swiglu validates once, under its own name."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    a = torch.randn(4, 8, device=DEVICE)
    for call, error, match in BAD_CALLS:
        with pytest.raises(error, match=match):
            call(a)
    ops.reset_fallback_warnings()


def test_validates_once_float64_meta_and_empty(monkeypatch):
    """One input check per call; float64 runs the eager path silently; meta tensors get shapes from the
    eager path (regression: the interpreter crashed on them); empty inputs give empty outputs."""
    mod = importlib.import_module("mahia.ops.swiglu")  # (mahia.ops.swiglu is also the function)

    calls = []
    real = mod.check_swiglu_inputs
    monkeypatch.setattr(mod, "check_swiglu_inputs", lambda fn, *a: (calls.append(fn), real(fn, *a)))
    a = torch.randn(3, 70, device=DEVICE, requires_grad=True)
    ops.swiglu(a, a).sum().backward()
    assert calls == ["swiglu"]
    a64 = torch.randn(3, 70, device=DEVICE, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ops.swiglu(a64, a64), swiglu_eager(a64, a64), rtol=0, atol=0)
    m = torch.empty(2, 5, 300, device="meta", requires_grad=True)
    c = ops.swiglu(m, m)
    assert c.device.type == "meta" and c.shape == m.shape
    c.sum().backward()
    assert m.grad.shape == m.shape
    for shape in [(0, 7), (3, 0), (0,)]:
        e = torch.randn(shape, device=DEVICE, requires_grad=True)
        c = ops.swiglu(e, e * 2)
        assert c.shape == e.shape
        c.sum().backward()
        assert e.grad.shape == e.shape


def test_module_impls_agree():
    torch.manual_seed(3)
    eager = SwiGLU(48, 136, device=DEVICE)
    fast = SwiGLU(48, 136, impl="triton", device=DEVICE)
    fast.load_state_dict(eager.state_dict())
    x = torch.randn(2, 5, 48, device=DEVICE)
    torch.testing.assert_close(fast(x), eager(x))
    with pytest.raises(ValueError, match="impl must be one of"):
        SwiGLU(8, 16, impl="fast")
