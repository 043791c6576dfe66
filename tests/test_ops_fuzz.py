"""Property-based fuzzing of every Triton kernel of mahia.ops (hypothesis): the float64 math of each op.

For each kernel (rms_norm, add_rms_norm, swiglu, rope, moe_combine, grouped_mm, the GLA scan), random
cases (``MAHIA_FUZZ_EXAMPLES``: 25 by default, in ``make test``; 200 in ``make fuzz``) and explicit edge
cases (empty tensors, sizes of 1, issue 37's regressions): leading dims 0 to 64, hidden sizes 1 to 9000,
float32 / float16 / bfloat16, non-contiguous views (padded rows, transposed storage, a strided last dim,
halves of a fused tensor), and every gradient, against a float64 reference written here from the math
(not the eager paths under test), norm-wise and element-wise (``helpers.assert_close``).

Reproducible: ``derandomize=True`` (the cases are a function of the test alone), no example database,
no shrinking (a failure prints its case; under the interpreter shrinking could take long). Runs under
``TRITON_INTERPRET=1`` on a CPU (tests/conftest.py) and on the GPU where CUDA is available:
``python -m pytest tests/test_ops_fuzz.py``. Marked ``fuzz`` (``-m "not fuzz"`` skips it).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

hypothesis = pytest.importorskip("hypothesis")
from helpers import assert_close  # noqa: E402
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mahia import ops  # noqa: E402
from mahia.ops.gla_scan import MAX_K, gated_linear_attention  # noqa: E402
from mahia.ops.grouped_mm import grouped_mm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [
    pytest.mark.fuzz,
    pytest.mark.skipif(
        not ops.triton_available_for(torch.empty(0, device=DEVICE)),
        reason="the Triton kernels cannot run here (no CUDA and TRITON_INTERPRET != 1)",
    ),
]

EXAMPLES = int(os.environ.get("MAHIA_FUZZ_EXAMPLES", "25"))  # make fuzz: 200
FUZZ = settings(
    max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, phases=(Phase.explicit, Phase.generate),
    print_blob=False, suppress_health_check=list(HealthCheck),
)  # fmt: skip

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ON_GPU = DEVICE == "cuda"
# The interpreter runs a few numpy operations per program: keep the tensors and the grids small there.
ELEMENTS = 1 << 20 if ON_GPU else 24_000  # elements of the largest operand
PROGRAMS = 1 << 16 if ON_GPU else 256  # rows of kernels that launch one program per row

# hypothesis favours the first element of a sampled_from and the small end of a range: the lists put
# the common cases first and 0 (an empty tensor) late, and sizes mix a uniform range with boundaries.
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**31 - 1)
leading = st.lists(st.sampled_from([3, 1, 2, 5, 17, 64, 0]), max_size=3)
hidden = st.one_of(
    st.integers(2, 9000), st.integers(1, 64), st.sampled_from([1, 16, 17, 128, 129, 1024, 4096, 4097, 8192, 9000])
)
layouts = st.sampled_from(["contiguous", "row-gap", "transposed", "strided"])


# -- Inputs -----------------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, gen, scale=1.0) -> torch.Tensor:
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * scale).to(DEVICE, dtype)


def _view(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values as a leaf that requires grad, laid out as ``layout``: "contiguous"; "row-gap" (rows
    padded: row stride > last dim, unit last stride); "transposed" (stored with the last two dims
    swapped: last stride != 1); "strided" (every other element of a wider last dim)."""
    t = t.detach()
    if layout == "row-gap" and t.dim() >= 1:
        base = t.new_zeros(*t.shape[:-1], t.shape[-1] + 3)
        base[..., : t.shape[-1]] = t
        t = base[..., : t.shape[-1]]
    elif layout == "strided" and t.dim() >= 1:
        base = t.new_zeros(*t.shape[:-1], 2 * t.shape[-1])
        base[..., ::2] = t
        t = base[..., ::2]
    elif layout == "transposed" and t.dim() >= 2:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    else:
        t = t.contiguous()
    return t.requires_grad_()


def _fit(dims: list[int], per_row: int, max_rows: int = PROGRAMS * 64, elements: int = ELEMENTS) -> list[int]:
    """Halve the largest of ``dims`` until prod(dims) * per_row <= elements and prod(dims) <= max_rows."""
    dims = list(dims)
    while max(dims, default=0) > 1 and (math.prod(dims) * per_row > elements or math.prod(dims) > max_rows):
        i = max(range(len(dims)), key=dims.__getitem__)
        dims[i] = max(1, dims[i] // 2)
    return dims


def _low(*dts: torch.dtype) -> torch.dtype:
    """The least precise of the dtypes (the one whose tolerances apply)."""
    return max(dts, key=lambda d: {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}[d])


def _grads(out, inputs, grad_out):
    """Gradients of sum(out * grad_out) for every input (zeros where an empty output does not reach it)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    gos = grad_out if isinstance(grad_out, (tuple, list)) else (grad_out,)
    return torch.autograd.grad(outs, inputs, gos, allow_unused=True, materialize_grads=True)


def _ref_inputs(*ts):
    return [t.detach().to(torch.float64).requires_grad_() for t in ts]


def examples(names: str, *rows):
    """One explicit ``@example`` per row of values, in the order of ``names``."""

    def apply(test):
        for row in rows:
            test = example(**dict(zip(names.split(), row)))(test)
        return test

    return apply


@contextlib.contextmanager
def _quiet():
    """Every case here must take the Triton path: a fallback warning is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- rms_norm, add_rms_norm -------------------------------------------------------------------------
# RMSNorm: float64 inputs take the eager path (the other dtypes the kernels); eps any real >= 0, 0 included
rms_dtypes = st.sampled_from(DTYPES + (torch.float64,))
rms_eps = st.sampled_from([1e-6, 1e-5, 0.1, 0.0, Fraction(1, 10**6)])


def _rms_ref(h, w, eps):
    return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + float(eps)) * w


def _unit(t: torch.Tensor) -> float:
    return t.detach().abs().amax().item() if t.numel() else 0.0


def _check_rms_grads(name, x64, w64, dy64, eps, got, ref, dtypes, n):
    # dx = rstd * (w dy - x_hat * mean(x_hat * w dy)): for N <= 2 a cancellation of terms of size
    # rstd * |w dy| down to far less; the element-wise bound takes that term size as its unit.
    # dw = sum over rows of dy * x_hat can cancel too (a random-seed fuzz: 12,288 rows, N = 1, |dw| 0.82 from
    # terms of 2-norm 110; float32 error 1.2e-5 here, 7.6e-6 in F.rms_norm): its unit is the terms' 2-norm.
    rstd = torch.rsqrt(x64.detach().pow(2).mean(dim=-1, keepdim=True) + float(eps))
    terms = _unit(rstd * w64.detach() * dy64) if x64.numel() else 0.0
    assert_close(f"{name} dx", got[0], ref[0], dtypes[0], scale=max(terms, _unit(ref[0])), norm=n > 2)
    assert got[1].dtype == dtypes[1]
    dw_terms = (dy64 * x64.detach() * rstd).reshape(-1, n).norm(dim=0).max().item() if x64.numel() else 0.0
    assert_close(f"{name} dw", got[1], ref[1], _low(*dtypes), scale=max(dw_terms, _unit(ref[1])), norm=n > 2)


@FUZZ
@given(lead=leading, n=hidden, dtype=rms_dtypes, w_fp32=st.booleans(), layout=layouts, eps=rms_eps, seed=seeds,
       out=st.sampled_from([None, torch.bfloat16]))  # fmt: skip
@example(lead=[65], n=40, dtype=torch.float32, w_fp32=False, layout="contiguous", eps=0.0, seed=3, out=None)  # #37
@example(lead=[3], n=8, dtype=torch.float64, w_fp32=False, layout="contiguous", eps=Fraction(1, 4096), seed=4, out=None)
@example(lead=[0, 3], n=9000, dtype=torch.bfloat16, w_fp32=False, layout="row-gap", eps=1e-6, seed=0, out=None)
@example(lead=[1], n=1, dtype=torch.float16, w_fp32=True, layout="contiguous", eps=1e-6, seed=1, out=None)
@example(lead=[], n=9000, dtype=torch.float32, w_fp32=False, layout="strided", eps=1e-5, seed=2, out=torch.bfloat16)
def test_fuzz_rms_norm(lead, n, dtype, w_fp32, layout, eps, seed, out):
    lead, g = _fit(lead, n), _gen(seed)
    x = _view(_randn(lead + [n], dtype, g), layout)
    w = _view(_randn([n], torch.float32 if w_fp32 else dtype, g), layout)
    with _quiet():
        y = ops.rms_norm(x, w, eps, out_dtype=out)  # out: y in another dtype, as under autocast
    assert y.dtype == (out or dtype) and y.shape == x.shape
    dy = _randn(y.shape, y.dtype, g)
    dx, dw = _grads(y, [x, w], dy)

    x64, w64 = _ref_inputs(x, w)
    y64 = _rms_ref(x64, w64, eps)
    dx64, dw64 = _grads(y64, [x64, w64], dy.double())
    assert_close("rms_norm y", y, y64, _low(dtype, y.dtype))
    _check_rms_grads("rms_norm", x64, w64, dy.double(), eps, (dx, dw), (dx64, dw64), (dtype, w.dtype), n)


@FUZZ
@given(lead=leading, n=hidden, dtype=rms_dtypes, w_fp32=st.booleans(), layout=layouts, eps=rms_eps, seed=seeds)
@example(lead=[65], n=40, dtype=torch.bfloat16, w_fp32=True, layout="row-gap", eps=0, seed=3)  # issue 37 #1
@example(lead=[0], n=4097, dtype=torch.float16, w_fp32=False, layout="transposed", eps=1e-6, seed=0)
@example(lead=[1, 1], n=9000, dtype=torch.bfloat16, w_fp32=True, layout="strided", eps=1e-6, seed=1)
@example(lead=[3, 64, 64], n=1, dtype=torch.float32, w_fp32=True, layout="transposed", eps=1e-6, seed=1935195)  # dw
def test_fuzz_add_rms_norm(lead, n, dtype, w_fp32, layout, eps, seed):
    lead, g = _fit(lead, n), _gen(seed)
    x = _view(_randn(lead + [n], dtype, g), layout)
    r = _view(_randn(lead + [n], dtype, g), "contiguous" if layout == "strided" else layout)
    w = _view(_randn([n], torch.float32 if w_fp32 else dtype, g), layout)
    with _quiet():
        y, h = ops.add_rms_norm(x, r, w, eps)
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == x.shape
    dy, dh = _randn(y.shape, dtype, g), _randn(y.shape, dtype, g)
    dx, dr, dw = _grads((y, h), [x, r, w], (dy, dh))

    x64, r64, w64 = _ref_inputs(x, r, w)
    h64 = x64 + r64
    # The contract: h is rounded to x's dtype and that rounded h is normalized (gradients pass through
    # the rounding). The reference normalizes the kernel's h; h itself is compared with the exact sum.
    h_rounded = h64 + (h.detach().double() - h64).detach()
    y64 = _rms_ref(h_rounded, w64, eps)
    dx64, dr64, dw64 = _grads((y64, h64), [x64, r64, w64], (dy.double(), dh.double()))
    assert_close("add_rms_norm h", h, h64, dtype)
    assert_close("add_rms_norm y", y, y64, dtype)
    # dx = dh + the RMSNorm gradient (a cancellation for N <= 2, see _check_rms_grads)
    _check_rms_grads(
        "add_rms_norm", h.detach().double(), w64, dy.double(), eps, (dx, dw), (dx64, dw64), (dtype, w.dtype), n
    )
    assert torch.equal(dx, dr)  # h = x + residual: one gradient for both
    assert_close("add_rms_norm dresidual", dr, dr64, dtype, norm=n > 2, scale=_unit(dx64))


# -- swiglu -----------------------------------------------------------------------------------------
@FUZZ
@given(
    lead=leading,
    n=hidden,
    dtype=dtypes,
    layout=st.sampled_from(["contiguous", "row-gap", "transposed", "strided", "packed"]),
    seed=seeds,
)
@example(lead=[0, 2], n=9000, dtype=torch.float32, layout="packed", seed=0)
@example(lead=[1], n=1, dtype=torch.bfloat16, layout="transposed", seed=1)
def test_fuzz_swiglu(lead, n, dtype, layout, seed):
    lead = _fit(lead, n, max_rows=PROGRAMS)  # a strided operand: one program per row and block
    g = _gen(seed)
    if layout == "packed":  # swiglu(h): the halves of a fused projection read in place, one gradient dh
        a, b = (h := _randn(lead + [2 * n], dtype, g, scale=3.0).requires_grad_()).detach().split(n, -1)
    else:
        a = _view(_randn(lead + [n], dtype, g, scale=3.0), layout)  # reach the flat tails of sigmoid
        b = _view(_randn(lead + [n], dtype, g), layout)
    with _quiet():
        c = ops.swiglu(h) if layout == "packed" else ops.swiglu(a, b)
    assert c.dtype == dtype and c.shape == a.shape
    dc = _randn(c.shape, dtype, g)
    da, db = _grads(c, [h], dc)[0].split(n, -1) if layout == "packed" else _grads(c, [a, b], dc)

    a64, b64 = _ref_inputs(a, b)
    c64 = a64 * torch.sigmoid(a64) * b64
    da64, db64 = _grads(c64, [a64, b64], dc.double())
    assert_close("swiglu c", c, c64, dtype)
    assert_close("swiglu da", da, da64, dtype)
    assert_close("swiglu db", db, db64, dtype)


# -- rope -------------------------------------------------------------------------------------------
def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@FUZZ
@given(
    b=st.sampled_from([2, 1, 3, 0]),
    t=st.sampled_from([7, 16, 1, 33, 2, 0]),
    hq=st.integers(1, 6),
    hkv=st.integers(1, 4),
    half=st.one_of(st.integers(1, 64), st.integers(1, 4500)),
    dtype=dtypes,
    table_fp32=st.booleans(),
    layout=st.sampled_from(["contiguous", "fused-qkv", "heads-first", "strided"]),
    table_layout=st.sampled_from(["contiguous", "row-gap", "strided"]),
    seed=seeds,
)
@examples(
    "b t hq hkv half dtype table_fp32 layout table_layout seed",
    (0, 5, 2, 1, 64, torch.float32, True, "contiguous", "contiguous", 0),
    (1, 1, 1, 1, 4500, torch.bfloat16, True, "fused-qkv", "row-gap", 1),
    (2, 3, 0, 1, 8, torch.float32, True, "contiguous", "contiguous", 2),  # no query head
)
def test_fuzz_rope(b, t, hq, hkv, half, dtype, table_fp32, layout, table_layout, seed):
    D = 2 * half
    while b * t * (hq + hkv) * D > ELEMENTS and half > 1:
        half //= 2
        D = 2 * half
    b, t = _fit([b, t], 1, max_rows=PROGRAMS)  # one program per token
    g = _gen(seed)
    if layout == "fused-qkv":  # views into one (B, T, Hq + 2 Hkv, D) projection
        qkv = _randn([b, t, hq + 2 * hkv, D], dtype, g)
        q, k = qkv[:, :, :hq].requires_grad_(), qkv[:, :, hq : hq + hkv].requires_grad_()
    elif layout == "heads-first":  # stored (B, H, T, D), seen as (B, T, H, D)
        q = _randn([b, hq, t, D], dtype, g).transpose(1, 2).requires_grad_()
        k = _randn([b, hkv, t, D], dtype, g).transpose(1, 2).requires_grad_()
    else:
        q = _view(_randn([b, t, hq, D], dtype, g), layout)
        k = _view(_randn([b, t, hkv, D], dtype, g), layout)
    angles = torch.rand(t, half, generator=g, dtype=torch.float64) * 100
    tdt = torch.float32 if table_fp32 else dtype
    cos = _view(angles.cos().to(DEVICE, tdt), table_layout).detach()
    sin = _view(angles.sin().to(DEVICE, tdt), table_layout).detach()
    with _quiet():
        qr, kr = ops.rope(q, k, cos, sin)
    assert qr.dtype == kr.dtype == dtype and qr.shape == q.shape and kr.shape == k.shape
    dq_out, dk_out = _randn(qr.shape, dtype, g), _randn(kr.shape, dtype, g)
    dq, dk = _grads((qr, kr), [q, k], (dq_out, dk_out))

    q64, k64 = _ref_inputs(q, k)
    c64, s64 = cos.double(), sin.double()
    qr64, kr64 = _rotate(q64, c64, s64), _rotate(k64, c64, s64)
    dq64, dk64 = _grads((qr64, kr64), [q64, k64], (dq_out.double(), dk_out.double()))
    low = _low(dtype, tdt)
    for name, got, ref in (("q_rot", qr, qr64), ("k_rot", kr, kr64), ("dq", dq, dq64), ("dk", dk, dk64)):
        assert_close(f"rope {name}", got, ref, low)


# -- moe_combine ------------------------------------------------------------------------------------
@FUZZ
@given(
    n=st.sampled_from([17, 3, 1, 64, 2, 300, 0]),
    k=st.sampled_from([2, 1, 3, 4, 8, 5, 0, 6, 7]),
    d=hidden,
    dtype=dtypes,
    gate_dtype=st.sampled_from(["fp32", "same"]),
    y_dtype=st.sampled_from([None, "fp32", "same"]),
    out_layout=st.sampled_from(["contiguous", "row-gap", "strided"]),
    gate_layout=st.sampled_from(["contiguous", "transposed"]),
    strided_inverse=st.booleans(),
    gate_grad=st.booleans(),
    seed=seeds,
)
@examples(
    "n k d dtype gate_dtype y_dtype out_layout gate_layout strided_inverse gate_grad seed",
    (0, 2, 9000, torch.float32, "same", None, "contiguous", "contiguous", False, True, 0),
    (1, 1, 1, torch.bfloat16, "fp32", "fp32", "row-gap", "transposed", True, False, 1),
    (3, 0, 16, torch.float32, "same", None, "contiguous", "contiguous", False, True, 2),  # k = 0: y = 0
    (13, 3, 70, torch.bfloat16, "fp32", "fp32", "contiguous", "transposed", False, True, 5),  # y.sum()'s dy
)
def test_fuzz_moe_combine(
    n, k, d, dtype, gate_dtype, y_dtype, out_layout, gate_layout, strided_inverse, gate_grad, seed
):
    d = min(d, max(1, ELEMENTS // max(k, 1)))
    (n,) = _fit([n], max(k, 1) * d, max_rows=PROGRAMS * 4)
    g = _gen(seed)
    gdt = torch.float32 if gate_dtype == "fp32" else dtype
    ydt = {None: None, "fp32": torch.float32, "same": dtype}[y_dtype]
    out = _view(_randn([n * k, d], dtype, g), out_layout)
    gates = torch.rand(n, k, generator=g, dtype=torch.float64) + 0.1
    gates = _view((gates / gates.sum(-1, keepdim=True)).to(DEVICE, gdt), gate_layout)
    gates.requires_grad_(gate_grad)
    perm = torch.randperm(n * k, generator=g)
    if strided_inverse:  # every other element of a longer int64 tensor
        inverse = torch.full((2 * n * k,), -7, dtype=torch.int64)
        inverse[::2] = perm
        inverse = inverse.to(DEVICE)[::2]
    else:
        inverse = perm.to(DEVICE)
    with _quiet():
        y = ops.moe_combine(out, inverse, gates, ydt)
    assert y.shape == (n, d) and y.dtype == (dtype if ydt is None else ydt)
    dy = _randn(y.shape, y.dtype, g)
    dy = dy[:1, :1].expand(n, d) if seed % 2 and y.numel() else dy  # half of the time y.sum()'s stride-0 dy
    wrt = [out, gates] if gate_grad else [out]
    grads = _grads(y, wrt, dy)

    out64, g64 = _ref_inputs(out, gates)
    inv = inverse.cpu().tolist()
    rows = out64[torch.tensor(inv, dtype=torch.int64, device=DEVICE)] if inv else out64[:0]
    y64 = (rows.view(n, k, d) * g64.unsqueeze(-1)).sum(dim=1)
    grads64 = _grads(y64, [out64, g64] if gate_grad else [out64], dy.double())
    low = _low(dtype, gdt, y.dtype)
    assert_close("moe_combine y", y, y64, low)
    for name, got, ref, like in zip(("d_out", "d_gates"), grads, grads64, wrt):
        assert got.dtype == like.dtype
        assert_close(f"moe_combine {name}", got, ref, low)


# -- grouped_mm (every backend) ---------------------------------------------------------------------
def _gmm_cost(m: int, k: int, n: int, groups: int) -> int:
    """Tile iterations of the forward, the dgrad and the wgrad kernels (the CPU interpreter's cost)."""
    tiles_m = -(-m // 32) + groups
    c = lambda a, b: -(-a // b)  # noqa: E731
    return tiles_m * (c(n, 64) * c(k, 32) + c(k, 64) * c(n, 32)) + groups * c(k, 64) * c(n, 64) * c(m, 32)


@FUZZ
@given(
    m=st.sampled_from([33, 5, 64, 1, 150, 2, 31, 0]),
    k=hidden,
    n=hidden,
    empty=st.sampled_from(["", "", "", "", "K", "N"]),  # issue 37 #5: K = 0 or N = 0
    groups=st.sampled_from([1, 2, 3, 4, 5, 6, 0]),  # issue 37 #7: G = 0 (no row in a group)
    tail=st.sampled_from([0, 0, 1, 7, 40]),  # issue 37 #6: offs[-1] = M - tail, rows of no group
    backend=st.sampled_from(["triton", "auto", "padded-bmm"]),
    dtype=dtypes,
    a_layout=st.sampled_from(["contiguous", "transposed", "row-gap"]),
    b_transposed=st.booleans(),
    seed=seeds,
)
@examples(
    "m k n empty groups tail backend dtype a_layout b_transposed seed",
    (0, 16, 16, "", 3, 0, "triton", torch.float32, "contiguous", False, 0),
    (5, 9000, 1, "", 1, 0, "triton", torch.bfloat16, "transposed", True, 1),
    (2, 1, 9000, "", 2, 0, "triton", torch.float16, "row-gap", False, 2),
)
def test_fuzz_grouped_mm(m, k, n, empty, groups, tail, backend, dtype, a_layout, b_transposed, seed):
    budget = 1 << 30 if ON_GPU else 160
    while _gmm_cost(m, k, n, groups) > budget:  # shrink the largest of m, k, n
        if m >= max(k, n) and m > 1:
            m //= 2
        elif k >= n and k > 1:
            k //= 2
        else:
            n //= 2
    k, n = (0 if empty == "K" else k), (0 if empty == "N" else n)
    tail = min(tail, m)
    g = _gen(seed)
    a = _view(_randn([m, k], dtype, g), a_layout)
    bk = _randn([groups, n, k] if b_transposed else [groups, k, n], dtype, g, scale=max(k, 1) ** -0.5)
    b = (bk.transpose(1, 2) if b_transposed else bk).detach().requires_grad_()
    cuts = sorted(torch.randint(0, m - tail + 1, (groups - 1,), generator=g).tolist()) + [m - tail] if groups else []
    offs = torch.tensor(cuts, dtype=torch.int32, device=DEVICE)
    with _quiet():
        c = grouped_mm(a, b, offs, backend=backend)
    assert c.shape == (m, n) and c.dtype == dtype
    dc = _randn(c.shape, dtype, g)
    # the broadcast (stride-0) gradient of c.sum(), issue 37 #5, half of the time
    dc = dc[:1, :1].expand(m, n) if seed % 2 and c.numel() else dc
    da, db = _grads(c, [a, b], dc)

    a64, b64 = _ref_inputs(a, b)
    parts, start = [], 0
    for grp, end in enumerate(cuts):
        parts.append(a64[start:end] @ b64[grp])
        start = end
    c64 = torch.cat(parts + [a64[start:] @ a64.new_zeros(k, n)])  # the rows past the last end: 0
    da64, db64 = _grads(c64, [a64, b64], dc.double())
    assert_close("grouped_mm c", c, c64, dtype)
    assert_close("grouped_mm da", da, da64, dtype)
    assert_close("grouped_mm db", db, db64, dtype)


# -- The GLA scan (impl="triton") -------------------------------------------------------------------
def _gla_recurrence(q, k, v, g):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, one step at a time (float64)."""
    B, H, T, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        S = g[:, :, t].exp().unsqueeze(-1) * S + k[:, :, t].unsqueeze(-1) * v[:, :, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    if outs:
        return torch.stack(outs, dim=2)
    return v * 0 + (q.sum() + k.sum() + g.sum()) * 0


# GLA's chunked form rounds every tl.dot operand (A, the decayed q and k, the carried state) to the
# input dtype: a few roundings per element, so its 16-bit element-wise bounds are twice the default.
_GLA_EW = {torch.float32: {}, torch.float16: dict(rtol=4e-3, atol=4e-3), torch.bfloat16: dict(rtol=3.2e-2, atol=3.2e-2)}


@FUZZ
@given(
    b=st.sampled_from([1, 2, 0]),
    h=st.sampled_from([2, 1, 3]),
    t=st.sampled_from([17, 40, 1, 16, 64, 15, 2, 0]),
    k=st.one_of(st.integers(1, 32), st.integers(1, MAX_K)),
    v=st.one_of(st.integers(1, 40), st.integers(1, 300)),
    dtype=dtypes,
    g_fp32=st.booleans(),
    temperature=st.sampled_from([1.0, 4.0, 16.0]),
    reset=st.sampled_from([None, float("-inf"), -1e30, -1e4, -100.0]),  # a full reset, in 1 of 8 gates
    layout=st.sampled_from(["contiguous", "heads-first", "strided"]),
    seed=seeds,
    logits=st.booleans(),  # g the gate's logits and q scaled, both in the kernels (MetaAttention's call)
)
@example(b=0, h=2, t=16, k=16, v=16, dtype=torch.float32, g_fp32=False, temperature=4.0, reset=None,
         layout="contiguous", seed=0, logits=False)  # fmt: skip
@example(b=1, h=1, t=0, k=8, v=8, dtype=torch.bfloat16, g_fp32=True, temperature=4.0, reset=None,
         layout="contiguous", seed=1, logits=False)  # fmt: skip
@example(b=1, h=1, t=1, k=MAX_K, v=1, dtype=torch.float16, g_fp32=False, temperature=1.0, reset=None,
         layout="strided", seed=2, logits=True)  # fmt: skip
@example(b=1, h=2, t=40, k=16, v=8, dtype=torch.float32, g_fp32=False, temperature=4.0, reset=-1e30,
         layout="contiguous", seed=3, logits=True)  # fmt: skip
def test_fuzz_gla(b, h, t, k, v, dtype, g_fp32, temperature, reset, layout, seed, logits):
    if not ON_GPU:  # (value blocks x chunks) programs of (16, 16, K) blocks: keep the interpreter's work small
        while b * h * -(-t // 16) * -(-v // 32) * (2 if k > 64 else 1) > 12 and (v > 16 or t > 16):
            if v > 16:
                v //= 2
            else:
                t //= 2
    gen = _gen(seed)
    gdt = torch.float32 if g_fp32 else dtype

    def make(last, dt, scale=1.0, transform=None):
        if layout == "heads-first":  # stored (B, T, H, d), seen as (B, H, T, d): as MetaAttention does
            x = _randn([b, t, h, last], torch.float64, gen, scale)
            x = x if transform is None else transform(x)
            return x.to(dt).transpose(1, 2).requires_grad_()
        x = _randn([b, h, t, last], torch.float64, gen, scale)
        return _view((x if transform is None else transform(x)).to(dt), layout)

    q = make(k, dtype, 1.0 if logits else k**-0.5)
    kk = make(k, dtype)
    vv = make(v, dtype)

    def log_decays(z):  # <= 0; with reset, 1 in 8 of them -inf or very large (issue 37: NaN, 24% error)
        g = 2 * z if logits else F.logsigmoid(2 * z) / temperature
        return g if reset is None else torch.where(torch.rand(z.shape, generator=gen).to(z.device) < 1 / 8, reset, g)

    gg = make(k, gdt, transform=log_decays)
    kw = dict(scale=k**-0.5, gate_temperature=temperature) if logits else {}
    with _quiet():
        o = gated_linear_attention(q, kk, vv, gg, impl="triton", **kw)
    assert o.shape == (b, h, t, v) and o.dtype == dtype
    do = _randn(o.shape, dtype, gen)
    dq, dk, dv, dg = _grads(o, [q, kk, vv, gg], do)

    q64, k64, v64, g64 = _ref_inputs(q, kk, vv, gg)
    qs, gs = (q64 * kw["scale"], F.logsigmoid(g64) / temperature) if logits else (q64, g64)
    o64 = _gla_recurrence(qs, k64, v64, gs)
    dq64, dk64, dv64, dg64 = _grads(o64, [q64, k64, v64, g64], do.double())
    low = _low(dtype, gdt)
    ew = _GLA_EW[low]
    assert_close("gla o", o, o64, low, **ew)
    assert_close("gla dq", dq, dq64, low, **ew)
    assert_close("gla dk", dk, dk64, low, **ew)
    assert_close("gla dv", dv, dv64, low, **ew)
    # dg = sum_{s >= t} (q_s dq_s - k_s dk_s): a cancellation (exactly 0 at T = 1); its terms set the scale
    terms = max((q64 * dq64).abs().amax().item(), (k64 * dk64).abs().amax().item()) if dg.numel() else 0.0
    terms /= temperature if logits else 1.0  # dL/dz = dL/dg * sigmoid(-z) / temperature
    assert_close(
        "gla dg", dg, dg64, low, scale=max(terms, dg64.abs().amax().item() if dg.numel() else 0.0), norm=t > 1, **ew
    )
