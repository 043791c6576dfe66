"""Triton RoPE (q and k in one launch) against the float64 eager reference: outputs, gradients, ops, errors."""

import importlib
import warnings

import pytest
import torch
from helpers import assert_close, compare, graph_ops

from mahia import ops
from mahia.layers.rope import RotaryCache, apply_rope
from mahia.ops.rope import apply_rope_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["rope"])
)


def _inputs(B, T, Hq, Hkv, D, dtype, offset=0, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(B, T, Hq, D, device=DEVICE, dtype=dtype)
    k = torch.randn(B, T, Hkv, D, device=DEVICE, dtype=dtype)
    cos, sin = RotaryCache(D, offset + T, device=DEVICE).get(T, offset)
    return q, k, cos, sin


def test_opcheck():
    q, k, cos, sin = _inputs(2, 3, 4, 2, 16, torch.float32)
    q.requires_grad_()
    k.requires_grad_()
    torch.library.opcheck(torch.ops.mahia.rope.default, (q, k, cos, sin, False))
    torch.library.opcheck(torch.ops.mahia.rope.default, (q.detach(), k.detach(), cos, sin, True))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def attn_prologue(q, k, cos, sin):
        qr, kr = ops.rope(q, k, cos, sin)
        return qr * 2, kr + 1

    def eager(q, k, cos, sin):
        qr, kr = apply_rope_eager(q, k, cos, sin)
        return qr * 2, kr + 1

    compiled = torch.compile(attn_prologue, fullgraph=True, backend="aot_eager")
    compare(compiled, eager, list(_inputs(2, 5, 4, 2, 24, torch.float32)), grad_inputs=[0, 1], name="compiled rope")
    assert "mahia.rope.default" in graph_ops(attn_prologue, *_inputs(1, 3, 2, 1, 8, torch.float32))


BAD_CALLS = [  # (call on q (2, 5, 4, 16), k (2, 5, 2, 16), cos and sin (5, 8), error, message)
    (lambda q, k, c, s: ops.rope(q.int(), k, c, s), TypeError, r"^rope: q must be a floating-point"),
    (lambda q, k, c, s: ops.rope(q[0], k, c, s), ValueError, r"^rope: q must be 4-D"),
    (lambda q, k, c, s: ops.rope(q, k[:, :4], c, s), ValueError, r"^rope: k must be"),
    (lambda q, k, c, s: ops.rope(q, k.double(), c, s), TypeError, r"^rope: k must have the dtype of q"),
    (lambda q, k, c, s: ops.rope(q, k, c[:4], s), ValueError, r"^rope: cos must have shape \(T, D/2\)"),
    (lambda q, k, c, s: ops.rope(q, k, c, None), TypeError, r"^rope: sin must be a torch.Tensor"),
    (lambda q, k, c, s: ops.rope(q, k, c.to("meta"), s), ValueError, r"^rope: .*same device"),
    (
        lambda q, k, c, s: ops.rope(q[..., :15], k[..., :15], c, s),
        ValueError,
        r"^rope: head dim D must be even, got 15",
    ),
    # float64: the eager path, the same check
    (lambda q, k, c, s: ops.rope(q[..., :15].double(), k[..., :15].double(), c, s), ValueError, r"^rope: head dim"),
    (lambda q, k, c, s: apply_rope(q, k, c, s, impl="cuda"), ValueError, "impl must be one of"),
    (lambda q, k, c, s: apply_rope_eager(q[..., :15], k[..., :15], c, s), ValueError, r"^apply_rope_eager: head dim"),
]


@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_bad_inputs_raise_errors_naming_the_function(monkeypatch, disabled):
    """Regression: an odd head dim on the fallback named apply_rope_eager. rope validates once, under its
    own name, on both paths."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    inputs = _inputs(2, 5, 4, 2, 16, torch.float32)
    for call, error, match in BAD_CALLS:
        with pytest.raises(error, match=match):
            call(*inputs)
    ops.reset_fallback_warnings()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_tables_that_require_grad_are_refused_on_every_path(monkeypatch, disabled, dtype):
    """Regression (issue 37 #10): cos/sin that require grad raised on the Triton path, while the eager
    path (float64 always takes it) silently differentiated into them; the docstring says no gradient
    flows to them. The one check refuses them on every path; under no_grad they are plain constants."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    q, k, cos, sin = (t.to(dtype) for t in _inputs(2, 5, 4, 2, 16, torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        for tables in ((cos.clone().requires_grad_(), sin), (cos, sin.clone().requires_grad_())):
            with pytest.raises(ValueError, match=r"^rope: cos and sin must not require grad"):
                ops.rope(q.clone().requires_grad_(), k, *tables)
            with torch.no_grad():
                qr, kr = ops.rope(q, k, *tables)
            assert_close("rope under no_grad", qr, apply_rope_eager(q.double(), k.double(), cos, sin)[0], dtype)
    ops.reset_fallback_warnings()


def test_float64_tables_meta_and_empty(monkeypatch):
    """Regression: float64 cos/sin next to float32 q, k were refused by the Triton path and accepted by
    the fallback; now they run the eager path silently. Meta tensors get shapes from the eager path
    (the interpreter crashed on them); empty inputs give empty outputs. One input check per call."""
    mod = importlib.import_module("mahia.ops.rope")  # (mahia.ops.rope is also the function)
    calls = []
    real = mod.check_rope_inputs
    monkeypatch.setattr(mod, "check_rope_inputs", lambda fn, *a: (calls.append(fn), real(fn, *a)))
    q, k, cos, sin = _inputs(2, 5, 4, 2, 16, torch.float32)
    qg = q.clone().requires_grad_()
    sum(t.sum() for t in ops.rope(qg, k, cos, sin)).backward()
    assert calls == ["rope"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qr, kr = ops.rope(q, k, cos.double(), sin.double())
    assert qr.dtype == torch.float32
    qe, ke = apply_rope_eager(q, k, cos.double(), sin.double())
    torch.testing.assert_close(qr, qe, rtol=0, atol=0)
    torch.testing.assert_close(kr, ke, rtol=0, atol=0)
    m = torch.empty(2, 5, 4, 16, device="meta", requires_grad=True)
    cm, sm = torch.empty(5, 8, device="meta"), torch.empty(5, 8, device="meta")
    qm, km = ops.rope(m, m[:, :, :2], cm, sm)
    assert qm.device.type == "meta" and qm.shape == m.shape and km.shape == (2, 5, 2, 16)
    (qm.sum() + km.sum()).backward()
    assert m.grad.shape == m.shape
    for B, T, Hq in [(0, 5, 4), (2, 0, 4), (2, 5, 0)]:
        q0 = torch.randn(B, T, Hq, 16, device=DEVICE, requires_grad=True)
        k0 = torch.randn(B, T, 1, 16, device=DEVICE)
        c0, s0 = torch.randn(T, 8, device=DEVICE), torch.randn(T, 8, device=DEVICE)
        qr, kr = ops.rope(q0, k0, c0, s0)
        assert qr.shape == q0.shape and kr.shape == k0.shape
        qr.sum().backward()
        assert q0.grad.shape == q0.shape
