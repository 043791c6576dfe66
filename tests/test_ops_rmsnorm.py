"""RMSNorm / add+RMSNorm: errors, the hidden-size limit, the CPU without the interpreter, the module. The float64
math, gradients and issue 37's eps cases (#1, #9) are test_ops_fuzz's; opcheck, compile, float64 and meta
inputs test_ops_launch's."""

import warnings

import pytest
import torch
from helpers import assert_close

from mahia import ops
from mahia.layers.norm import RMSNorm
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["rms_norm"])
)


BAD_CALLS = [  # (call on x (4, 8) and w (8,), error, message)
    (lambda x, w: ops.rms_norm(x.int(), w), TypeError, r"^rms_norm: x must be a floating-point"),
    (lambda x, w: ops.rms_norm([1.0, 2.0], w), TypeError, r"^rms_norm: x must be a torch.Tensor, got list"),
    (lambda x, w: ops.rms_norm(x, w[:7]), ValueError, r"^rms_norm: weight must have shape \(8,\)"),
    (lambda x, w: ops.rms_norm(x, w[None]), ValueError, r"^rms_norm: weight must have shape"),
    (lambda x, w: ops.rms_norm(x, w.long()), TypeError, r"^rms_norm: weight must be a floating-point"),
    (lambda x, w: ops.rms_norm(x, w.to("meta")), ValueError, r"^rms_norm: all inputs must be on the same device"),
    (lambda x, w: ops.rms_norm(x, w, eps=-1.0), ValueError, r"^rms_norm: eps must be >= 0"),
    (lambda x, w: ops.rms_norm(x, w, "a"), TypeError, r"^rms_norm: eps must be a real number >= 0, got str 'a'"),
    (lambda x, w: ops.add_rms_norm(x, x[:, :7], w), ValueError, r"^add_rms_norm: residual must have the shape"),
    (lambda x, w: ops.add_rms_norm(x, x.half(), w), TypeError, r"^add_rms_norm: residual must have the dtype"),
    (lambda x, w: ops.add_rms_norm(x, [1.0], w), TypeError, r"^add_rms_norm: residual must be a torch.Tensor"),
    (lambda x, w: ops.add_rms_norm(x, x, w, eps=None), TypeError, r"^add_rms_norm: eps must be a real number"),
    # the eager references stay public and validate under their own names
    (lambda x, w: rms_norm_eager([1.0], w), TypeError, r"^rms_norm_eager: x must be a torch.Tensor"),
    (lambda x, w: add_rms_norm_eager(x, x, w, "a"), TypeError, r"^add_rms_norm_eager: eps must be a real number"),
]


@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_bad_inputs_raise_errors_naming_the_function_and_argument(monkeypatch, disabled):
    """Regression: a string eps gave "could not convert string to float: 'a'", a list x an error naming
    rms_norm_eager (the fallback's own check). The public function validates once, under its own name."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    x, w = torch.randn(4, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    for call, error, match in BAD_CALLS:
        with pytest.raises(error, match=match):
            call(x, w)
    ops.reset_fallback_warnings()


def test_hidden_size_past_the_kernel_limit_takes_the_eager_path():
    """Regression: hidden size 65537 (MAX_HIDDEN + 1) raised on the Triton path while the fallback computes
    it. The public functions now run the eager reference there, with the one-time warning."""
    from mahia.ops.rmsnorm import MAX_HIDDEN

    ops.reset_fallback_warnings()
    n = MAX_HIDDEN + 1
    x = torch.randn(2, n, device=DEVICE, requires_grad=True)
    w = torch.randn(n, device=DEVICE, requires_grad=True)
    with pytest.warns(RuntimeWarning, match=r"rms_norm: Triton kernel not used \(hidden size 65537 exceeds"):
        y = ops.rms_norm(x, w)
    y.sum().backward()
    torch.testing.assert_close(y, rms_norm_eager(x, w), rtol=0, atol=0)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        ops.rms_norm(x, w)
    with pytest.warns(RuntimeWarning, match="add_rms_norm: Triton kernel not used"):
        y2, h2 = ops.add_rms_norm(x, x, w)
    assert_close("add_rms_norm past MAX_HIDDEN", y2, rms_norm_eager((x + x).double(), w.double()))
    # the largest size the kernel takes still runs on it (no warning)
    ops.reset_fallback_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xm = torch.randn(1, MAX_HIDDEN, device=DEVICE)
        assert_close(
            "rms_norm at MAX_HIDDEN",
            ops.rms_norm(xm, torch.ones(MAX_HIDDEN, device=DEVICE)),
            rms_norm_eager(xm.double(), torch.ones(MAX_HIDDEN, dtype=torch.float64, device=DEVICE)),
        )
    ops.reset_fallback_warnings()


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU path without the interpreter")
def test_fallback_on_cpu_without_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ops.reset_fallback_warnings()
    x = torch.randn(3, 40)
    assert not ops.triton_available_for(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the PyTorch path is the CPU's own: no warning box in a CPU notebook
        y = ops.rms_norm(x, torch.ones(40))
    torch.testing.assert_close(y, rms_norm_eager(x, torch.ones(40)))
    ops.reset_fallback_warnings()


def test_module_impls_agree():
    torch.manual_seed(5)
    eager, fast = RMSNorm(96, device=DEVICE), RMSNorm(96, impl="triton", device=DEVICE)
    with torch.no_grad():
        eager.weight.normal_()
    fast.load_state_dict(eager.state_dict())
    x, r = torch.randn(2, 9, 96, device=DEVICE), torch.randn(2, 9, 96, device=DEVICE)
    torch.testing.assert_close(fast(x), eager(x))
    (y1, h1), (y2, h2) = fast(x, r), eager(x, r)
    torch.testing.assert_close(y1, y2)
    torch.testing.assert_close(h1, h2)
    with pytest.raises(ValueError, match="impl must be one of"):
        RMSNorm(8, impl="cuda")
