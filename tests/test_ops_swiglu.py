"""SwiGLU: errors naming the function, the module. The float64 math and gradients are test_ops_fuzz's;
opcheck, compile, float64 and meta inputs test_ops_launch's."""

import pytest
import torch

from mahia import ops
from mahia.layers.mlp import SwiGLU
from mahia.ops.swiglu import swiglu_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["swiglu"])
)


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


def test_module_impls_agree():
    torch.manual_seed(3)
    eager = SwiGLU(48, 136, device=DEVICE)
    fast = SwiGLU(48, 136, impl="triton", device=DEVICE)
    fast.load_state_dict(eager.state_dict())
    x = torch.randn(2, 5, 48, device=DEVICE)
    torch.testing.assert_close(fast(x), eager(x))
    with pytest.raises(ValueError, match="impl must be one of"):
        SwiGLU(8, 16, impl="fast")
