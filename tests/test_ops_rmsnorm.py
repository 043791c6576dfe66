"""Triton RMSNorm / add+RMSNorm against the float64 eager reference: outputs, gradients, ops, errors."""

import warnings
from fractions import Fraction

import pytest
import torch
from helpers import assert_close, compare, graph_ops

from mahia import ops
from mahia.layers.norm import RMSNorm
from mahia.ops.rmsnorm import add_rms_norm_eager, rms_norm_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["rms_norm"])
)


def test_opcheck():
    torch.manual_seed(4)
    x = torch.randn(3, 5, 40, device=DEVICE, requires_grad=True)
    r = torch.randn(3, 5, 40, device=DEVICE, requires_grad=True)
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.mahia.rms_norm_fwd.default, (x, None, w, 1e-6))
    torch.library.opcheck(torch.ops.mahia.rms_norm_fwd.default, (x, r, w, 1e-6))
    dy = torch.randn_like(x)
    torch.library.opcheck(torch.ops.mahia.rms_norm_bwd.default, (dy, x.detach(), w.detach(), 1e-6, None))
    torch.library.opcheck(torch.ops.mahia.rms_norm_bwd.default, (dy, x.detach(), w.detach(), 1e-6, dy.clone()))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def block(x, r, w):
        y, h = ops.add_rms_norm(x, r, w)
        return ops.rms_norm(y * 2, w) + h

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 50, device=DEVICE)
    compare(compiled, _eager_block, [x, torch.randn_like(x), torch.randn(50, device=DEVICE)], name="compiled block")
    # the compiled graph calls the custom op, once per call (not the eager-mode autograd.Function)
    names = graph_ops(block, x, x, torch.randn(50, device=DEVICE))
    assert names.count("mahia.rms_norm_fwd.default") == 2, names


def _eager_block(x, r, w):
    y, h = add_rms_norm_eager(x, r, w)
    return rms_norm_eager(y * 2, w) + h


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


def test_public_functions_validate_once(monkeypatch):
    """Forward + backward through rms_norm / add_rms_norm run the input check once, on either path."""
    import mahia.ops.rmsnorm as mod

    calls = []
    real = mod.check_rms_norm_inputs
    monkeypatch.setattr(mod, "check_rms_norm_inputs", lambda fn, *a, **k: (calls.append(fn), real(fn, *a, **k))[1])
    x = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    for disabled in ("0", "1"):
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", disabled)
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's warning
            ops.rms_norm(x, w).sum().backward()
            y, h = ops.add_rms_norm(x, x, w)
        (y.sum() + h.sum()).backward()
        assert calls == ["rms_norm", "add_rms_norm"], (disabled, calls)
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


def test_float64_weight_next_to_float32_x_takes_the_eager_path():
    """Regression: a float64 weight next to float32 x was refused by the Triton path and accepted by the
    fallback. Any float64 input now runs the eager reference, silently (reference precision)."""
    x = torch.randn(3, 40, device=DEVICE, requires_grad=True)
    w = torch.randn(40, device=DEVICE, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.rms_norm(x, w)
        y2, h2 = ops.add_rms_norm(x, x, w)
    assert y.dtype == torch.float32 and y2.dtype == torch.float32
    torch.testing.assert_close(y, rms_norm_eager(x, w), rtol=0, atol=0)
    torch.testing.assert_close(y2, add_rms_norm_eager(x, x, w)[0], rtol=0, atol=0)
    (y.sum() + y2.sum()).backward()
    assert w.grad.dtype == torch.float64


def _rms_ref(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(eps)) * w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("disabled", [False, True], ids=["triton", "fallback"])
def test_eps_zero_and_a_fraction_on_every_path(monkeypatch, disabled, dtype):
    """Regressions (issue 37 #1, #9). eps = 0 with rows that do not fill the last tile (65 x 40): the
    Triton backward summed the padding rows' 0 * inf = NaN into dw. eps = Fraction(1, 10**6) passed the
    check and the Triton path, then failed on the eager path (float64 always takes it) with a TypeError.
    The check now converts eps once with float(); every path gives the float64 answer."""
    if disabled:
        monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        for eps in (0.0, 0, Fraction(1, 10**6)):
            torch.manual_seed(6)
            x = torch.randn(65, 40, device=DEVICE, dtype=dtype)
            r = torch.randn(65, 40, device=DEVICE, dtype=dtype)
            w = torch.randn(40, device=DEVICE, dtype=dtype)
            compare(ops.rms_norm, _rms_ref, [x, w, eps], name=f"rms_norm eps={eps!r}")
            compare(
                ops.add_rms_norm,
                lambda x, r, w, eps: (_rms_ref(x + r, w, eps), x + r),
                [x, r, w, eps],
                name=f"add_rms_norm eps={eps!r}",
                rtol={torch.bfloat16: 2.4e-2}.get(dtype),  # h rounded to bfloat16 before the norm
            )
    ops.reset_fallback_warnings()


def test_meta_and_empty_inputs():
    """Regression: meta tensors crashed in the interpreter ("Cannot copy out of meta tensor"). They get
    shapes (and shapes of gradients) from the eager path; empty inputs give empty outputs."""
    x = torch.empty(2, 3, 64, device="meta", requires_grad=True)
    w = torch.empty(64, device="meta", requires_grad=True)
    y = ops.rms_norm(x, w)
    assert y.device.type == "meta" and y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    y, h = ops.add_rms_norm(x, x, w)
    assert y.shape == h.shape == x.shape and y.device.type == "meta"
    for lead in [(0,), (0, 5), (3, 0)]:
        x0 = torch.randn(*lead, 16, device=DEVICE, requires_grad=True)
        w0 = torch.randn(16, device=DEVICE, requires_grad=True)
        y0 = ops.rms_norm(x0, w0)
        assert y0.shape == x0.shape
        y0.sum().backward()
        assert torch.equal(w0.grad, torch.zeros_like(w0)) and x0.grad.shape == x0.shape


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
