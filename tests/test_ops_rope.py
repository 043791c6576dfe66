"""RoPE: errors naming the function, tables that require grad. The float64 math and gradients are
test_ops_fuzz's; opcheck, compile, float64 and meta inputs test_ops_launch's."""

import warnings

import pytest
import torch
from helpers import assert_close

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
