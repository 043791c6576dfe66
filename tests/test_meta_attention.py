"""MetaAttention (gated linear attention): the loop and log-space paths against a float64 loop; the Triton
path's math is test_ops_fuzz's (test_fuzz_gla), its opcheck, compile, frames and fallbacks are here."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import compare

from mahia.measure.checks import compare_fn, rel_error, tolerance
from mahia.measure.instruments import count_syncs
from mahia.model.meta_attention import MetaAttention
from mahia.ops.dispatch import reset_fallback_warnings, triton_import_error
from mahia.ops.gla_scan import gated_linear_attention, gla_bytes, gla_flops, gla_logspace, gla_loop, kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton_import_error() is not None, reason="triton is not installed")


def make_inputs(B, H, T, K, V, dtype=torch.float32, *, temperature=4.0, seed=0):
    """q, k (B, H, T, K), v (B, H, T, V), g = logsigmoid(2 z) / temperature: slow and fast decays mixed."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, K, generator=gen) * K**-0.5
    k = torch.randn(B, H, T, K, generator=gen)
    v = torch.randn(B, H, T, V, generator=gen)
    g = F.logsigmoid(2 * torch.randn(B, H, T, K, generator=gen)) / temperature
    return [t.to(DEVICE, dtype) for t in (q, k, v, g)]


def _path(impl, chunk_size=None):
    if impl == "logspace" and chunk_size is not None:
        return lambda q, k, v, g: gla_logspace(q, k, v, g, chunk_size=chunk_size)
    return lambda q, k, v, g: gated_linear_attention(q, k, v, g, impl=impl)


PATHS = [
    ("loop", None, torch.float32),
    ("logspace", None, torch.float32),
    ("logspace", 64, torch.float32),
    ("logspace", None, torch.bfloat16),
]


@pytest.mark.parametrize("T", [1, 37, 130])
@pytest.mark.parametrize(
    "impl,chunk,dtype", PATHS, ids=[f"{i}{'-c' + str(c) if c else ''}-{str(d)[6:]}" for i, c, d in PATHS]
)
def test_paths_match_float64_loop(impl, chunk, dtype, T):
    inputs = make_inputs(2, 3, T, 16, 32, dtype)
    if T > 1:
        errors = compare(_path(impl, chunk), gla_loop, inputs, tol=tolerance(dtype), name=f"gla {impl}")
        assert set(errors) == {"out0", "grad0", "grad1", "grad2", "grad3"}
        return
    # T = 1: the only pair is s = t, whose decay exp(G_t - G_t) does not depend on g, so dg = 0 exactly;
    # a relative error against 0 is meaningless. dg = q * dq - k * dk must cancel to rounding level.
    compare_fn(_path(impl, chunk), gla_loop, inputs, tol=tolerance(dtype), name=f"gla {impl}", grad_inputs=(0, 1, 2))
    q, k, v, g = (t.detach().requires_grad_() for t in inputs)
    _path(impl, chunk)(q, k, v, g).sum().backward()
    scale = (q.float() * q.grad.float()).abs().max()
    assert g.grad.float().abs().max() <= tolerance(dtype) * scale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA grid limit: the CPU interpreter has none")
def test_triton_launchers_take_more_than_65535_heads():
    """B * H beyond a CUDA grid's second-axis limit (65535): the kernels use one flat axis. Notebook 07's
    largest-batch search on a tiny model reaches such batches."""
    B, H, T, K, V = 70_000, 1, 4, 16, 40
    q, k, v, g = (t.requires_grad_() for t in make_inputs(B, H, T, K, V))
    o = gated_linear_attention(q, k, v, g, impl="triton")  # two value blocks per head
    ends = [0, B - 1]  # the first and the last programs
    ref = gla_loop(*(t[ends].double() for t in (q, k, v, g)))
    assert rel_error(o[ends], ref) <= tolerance(torch.float32)
    o.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, g)) and v.grad[-1].abs().sum() > 0


@pytest.mark.parametrize("impl", ["logspace", "triton"])
def test_module_matches_float64_loop_module(impl):
    if impl == "triton" and triton_import_error() is not None:
        pytest.skip("triton is not installed")
    torch.manual_seed(0)
    fast = MetaAttention(40, 2, key_dim=16, value_dim=24, impl=impl, gate_temperature=4.0).to(DEVICE)
    ref = MetaAttention(40, 2, key_dim=16, value_dim=24, impl="loop", gate_temperature=4.0).to(DEVICE, torch.float64)
    ref.load_state_dict({n: p.double() for n, p in fast.state_dict().items()})
    x = torch.randn(2, 37, 40, device=DEVICE)
    x_ref = x.double().requires_grad_()
    x.requires_grad_()
    y, y_ref, tol = fast(x), ref(x_ref), tolerance(torch.float32)
    assert y.shape == x.shape and rel_error(y, y_ref) <= tol
    dy = torch.randn(y.shape, dtype=torch.float64, device=DEVICE)
    y.backward(dy.float())
    y_ref.backward(dy)
    assert rel_error(x.grad, x_ref.grad) <= tol
    ref_params = dict(ref.named_parameters())
    for name, p in fast.named_parameters():
        assert rel_error(p.grad, ref_params[name].grad) <= tol, name


def test_the_chunked_paths_stay_exact_past_float32s_exp_range():
    """At T = 2048 with GLA's decays (temperature 16) every channel's total log-decay is below -88, where
    exp(-G) of the naive factorization (notebook 09) overflows float32; the chunked paths stay exact."""
    q, k, v, g = make_inputs(1, 2, 2048, 16, 16, temperature=16.0)
    assert g.sum(dim=2).max() < -88
    ref, tol = gla_loop(*(t.double() for t in (q, k, v, g))), tolerance(torch.float32)
    assert rel_error(gla_logspace(q, k, v, g), ref) <= tol
    if triton_import_error() is None:
        assert rel_error(gated_linear_attention(q, k, v, g, impl="triton"), ref) <= tol


@needs_triton
def test_triton_path_has_no_host_syncs():  # the log-space path: test_model's test_train_step_host_syncs
    q, k, v, g = (t.requires_grad_() for t in make_inputs(2, 3, 37, 16, 16))
    with count_syncs() as report:
        o = gated_linear_attention(q, k, v, g, impl="triton")
        o.backward(torch.ones_like(o))
    assert report.count == 0, str(report)
    assert all(t.grad is not None for t in (q, k, v, g))


@needs_triton
def test_opcheck_custom_ops():
    # heads-first memory, as MetaAttention passes views: the fake must give o the layout the kernels give it
    q, k, v, g = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_inputs(1, 2, 20, 16, 16))
    do = torch.randn(1, 2, 20, 16, device=DEVICE)
    for si in ((), (0.25, 1 / 16)):  # g the log-decays; then the logits, q scaled
        torch.library.opcheck(torch.ops.mahia.gla_fwd.default, tuple(t.requires_grad_() for t in (q, k, v, g)) + si)
        torch.library.opcheck(torch.ops.mahia.gla_bwd.default, tuple(t.detach() for t in (q, k, v, g)) + (do, *si))
    grads = torch.ops.mahia.gla_bwd.default(*(t.detach() for t in (q, k, v, g)), do)
    assert all(t.transpose(1, 2).is_contiguous() for t in grads)  # the views' (B, T, H, d) memory: no copy after


@needs_triton
def test_module_compiles_without_graph_break():
    """The custom ops have fake and autograd rules: torch.compile traces the layer as one graph."""
    torch.manual_seed(0)
    m = MetaAttention(32, 2, impl="triton").to(DEVICE)
    x = torch.randn(2, 21, 32, device=DEVICE, requires_grad=True)
    y = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
    y.sum().backward()
    grad, x.grad = x.grad.clone(), None
    y_eager = m(x)
    y_eager.sum().backward()
    assert rel_error(y, y_eager) <= tolerance(torch.float32)
    assert rel_error(grad, x.grad) <= tolerance(torch.float32)


def _bad(**override):
    q, k, v, g = make_inputs(1, 2, 8, 16, 16)
    args = {"q": q, "k": k, "v": v, "g": g, **override}
    return lambda impl="logspace", **kw: gated_linear_attention(*(args[n] for n in "qkvg"), impl=impl, **kw)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (_bad(q=torch.randn(2, 8, 16)), ValueError, "^gated_linear_attention: q must be 4-D"),
        (_bad(k=torch.randn(1, 2, 9, 16)), ValueError, "k must have the shape of q"),
        (_bad(g=torch.randn(1, 2, 8, 8)), ValueError, "g must have the shape of q"),
        (_bad(v=torch.randn(1, 2, 7, 16)), ValueError, "v must be"),
        (_bad(q=torch.ones(1, 2, 8, 16, dtype=torch.int64)), TypeError, "q must be a floating-point"),
        (_bad(v=torch.randn(1, 2, 8, 16, dtype=torch.float64)), TypeError, "^gated_linear_attention: v must have the"),
        (_bad(g=[0.0]), TypeError, "g must be a torch.Tensor"),
        (_bad(g=torch.zeros(1, 2, 8, 16, device="meta")), ValueError, "same device"),
        (lambda: _bad()(impl="fast"), ValueError, "impl must be one of"),
        (lambda: _bad()(scale=math.inf), ValueError, "^gated_linear_attention: scale must be a finite number"),
        (lambda: _bad()(impl="triton", gate_temperature=0), ValueError, "gate_temperature must be None or a positive"),
        (lambda: gla_logspace(*make_inputs(1, 1, 4, 16, 16), chunk_size=0), ValueError, "chunk_size"),
        (lambda: MetaAttention(30, 4), ValueError, "divisible by n_heads"),
        (lambda: MetaAttention(32, 2, impl="cuda"), ValueError, "impl must be one of"),
        (lambda: MetaAttention(32, 2, gate_temperature=0.0), ValueError, "gate_temperature"),
        (lambda: MetaAttention(32, 2, key_dim=0, value_dim=8), ValueError, "key_dim"),
        (lambda: MetaAttention(32, 2)(torch.randn(2, 5, 31)), ValueError, "x must be"),
        # regression: a bfloat16 module given float32 input failed inside a matmul
        (lambda: MetaAttention(32, 2, dtype=torch.bfloat16)(torch.randn(1, 5, 32)), TypeError, "^MetaAttention: x has"),
        (lambda: gla_loop(*make_inputs(1, 1, 4, 16, 16)[:3], None), TypeError, "^gla_loop: g must be a torch.Tensor"),
        (lambda: gla_flops(1, 1, -1, 16, 16), ValueError, "T must be"),
        (lambda: gla_bytes(1, 1, 8, 16, 16, element_size=-2), ValueError, "element_size"),
    ],
)
def test_bad_inputs_raise(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_flop_and_byte_counts():
    C = 16
    assert gla_flops(1, 1, 16, 16, 16, C, backward=False) == 3 * C**3 + 2 * C**3 + 4 * C**3
    assert gla_flops(1, 1, 17, 16, 16, C, backward=False) == 2 * 9 * C**3  # a padded second chunk
    assert gla_flops(2, 3, 16, 16, 16, C) == 6 * (9 + 25) * C**3
    assert gla_bytes(1, 1, 10, 4, 8, element_size=2, backward=False) == 10 * (3 * 4 + 2 * 8) * 2
    assert gla_bytes(2, 1, 10, 4, 8) == 2 * 10 * (9 * 4 + 5 * 8) * 4


def _nan_steps(t: torch.Tensor) -> set[int]:
    return set(torch.isnan(t).nonzero()[:, 2].tolist())


@pytest.mark.parametrize("which", "qkvg")
@pytest.mark.parametrize("impl", ["loop", "logspace", "triton"])
def test_nan_at_step_t_reaches_no_earlier_output(impl, which):
    """Regression: a NaN at step 20 made outputs 16-19 NaN on the chunked paths (0 * NaN). Now the output has
    the recurrence's NaN pattern, dq, dk, dv are finite before t, dg before t's chunk (documented)."""
    if impl == "triton" and triton_import_error() is not None:
        pytest.skip("triton is not installed")
    t, T = 20, 40
    base = make_inputs(1, 2, T, 16, 8)
    base["qkvg".index(which)][0, 1, t, 3] = float("nan")  # one element of head 1 at step t
    do = torch.randn(1, 2, T, 8, generator=torch.Generator().manual_seed(3)).to(DEVICE)

    def run(path):
        ins = [x.clone().requires_grad_() for x in base]
        o = gated_linear_attention(*ins, impl=path)
        o.backward(do)
        return o, [x.grad for x in ins]

    o, grads = run(impl)
    o_ref, grads_ref = run("loop")
    assert min(_nan_steps(o), default=T) >= t, sorted(_nan_steps(o))
    assert torch.equal(torch.isnan(o), torch.isnan(o_ref))
    assert torch.isfinite(o[:, 0]).all()  # the other head is untouched
    chunk_start = t // 16 * 16
    for name, got, ref in zip("qkvg", grads, grads_ref):
        first = chunk_start if name == "g" else t
        before = [s for s in _nan_steps(got) if s < first and s not in _nan_steps(ref)]
        assert not before, f"d{name}: NaN at steps {before} where the recurrence is finite"


@needs_triton
def test_the_intra_chunk_dots_agree_with_the_column_loop(monkeypatch):
    """The pairs inside a chunk as dots (decays spanning <= SPAN) against one column at a time (SPAN < 0)."""
    ins = [t.requires_grad_() for t in make_inputs(1, 2, 40, 16, 24)]
    run = lambda: [o := gated_linear_attention(*ins, impl="triton"), *torch.autograd.grad(o.square().sum(), ins)]  # noqa: E731
    dots = run()
    monkeypatch.setattr("mahia.ops.gla_scan.kernels.SPAN", -1.0)
    for name, got, ref in zip(["o", "dq", "dk", "dv", "dg"], dots, run()):
        assert not torch.equal(got, ref) and rel_error(got, ref) < 1e-6, name  # both ran: other roundings


@needs_triton
def test_the_groups_a_sequence_is_split_into_change_no_bit(monkeypatch):
    """The carries entering the groups (their number follows the GPU's SM count) are updated as the walks do."""
    ins = [t.requires_grad_() for t in make_inputs(1, 1, 100, 64, 16)]  # 4 groups of 32 rows; 2 programs a carry
    run = lambda: [o := gated_linear_attention(*ins, impl="triton"), *torch.autograd.grad(o.square().sum(), ins)]  # noqa: E731
    split, plan = run(), kernels._plan
    monkeypatch.setattr(kernels, "_plan", lambda q, v, **kw: ((p := plan(q, v, **kw))[0], 1, {**p[2], "GROUP": 128}))
    assert all(torch.equal(a, b) for a, b in zip(split, run()))


@pytest.mark.parametrize("reset", [float("-inf"), -1e4, -1e30])
def test_a_full_reset_gives_the_recurrences_answer(reset):
    """Regression (issue 37 #2, #3): a log-decay of -inf made every later output NaN on the chunked paths,
    -1e4 or -1e30 cost up to 24% error. The Triton path: test_fuzz_gla's reset (an explicit example at -1e30)."""
    q, k, v, g = make_inputs(1, 2, 33, 16, 8)
    g[:, :, 10] = reset
    g[0, 1, 20, 3] = reset  # a second reset in one channel of a later chunk
    compare(_path("logspace"), gla_loop, [q, k, v, g], name=f"gla logspace, g = {reset}")


@pytest.mark.parametrize("impl", ["loop", "logspace"])
def test_empty_sequence_keeps_every_input_in_the_graph(impl):
    """Regression: with T = 0 the PyTorch paths returned v * 0, leaving q, k and g out of the graph; now
    (B, H, 0, V) and zero gradients (the Triton path: test_fuzz_gla's t = 0 example)."""
    q, k, v, g = (t.requires_grad_() for t in make_inputs(2, 3, 0, 16, 8))
    o = gated_linear_attention(q, k, v, g, impl=impl)
    assert o.shape == (2, 3, 0, 8) and o.dtype == v.dtype
    grads = torch.autograd.grad(o.sum(), [q, k, v, g])
    assert all(gr.shape == t.shape and not gr.any() for gr, t in zip(grads, (q, k, v, g)))


@needs_triton
def test_key_dim_past_the_kernel_limit_falls_back_with_one_warning():
    """Regression: K > 128 raised on the Triton path; now it runs the log-space path, with one warning."""
    reset_fallback_warnings()
    q, k, v, g = (t.requires_grad_() for t in make_inputs(1, 2, 19, 130, 8))
    with pytest.warns(RuntimeWarning, match=r"gla: Triton kernel not used \(key dim K=130 exceeds"):
        out = gated_linear_attention(q, k, v, g, impl="triton")
    out.sum().backward()
    assert torch.equal(out, gla_logspace(q, k, v, g))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gated_linear_attention(q, k, v, g, impl="triton")  # once per process
    reset_fallback_warnings()


def test_float64_gate_meta_tensors_and_one_check(monkeypatch):
    """Regressions: a float64 gate next to float32 q, k, v was refused by the kernel (now: log-space,
    silently); meta tensors crashed the interpreter (now: shapes). The input check runs once per call."""
    import mahia.ops.gla_scan as mod

    q, k, v, g = make_inputs(1, 2, 21, 16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = gated_linear_attention(q, k, v, g.double(), impl="triton")
    assert out.dtype == torch.float32
    assert torch.equal(out, gla_logspace(q, k, v, g.double()))
    meta = [torch.empty(2, 3, 37, 16, device="meta", requires_grad=True) for _ in range(4)]
    meta[2] = torch.empty(2, 3, 37, 24, device="meta", requires_grad=True)
    for impl in ("triton", "logspace", "loop"):
        o = gated_linear_attention(*meta, impl=impl)
        assert o.device.type == "meta" and o.shape == (2, 3, 37, 24)
    o.sum().backward()
    assert all(t.grad.shape == t.shape for t in meta)
    m = MetaAttention(32, 2, impl="triton", device="meta")
    assert m(torch.empty(2, 5, 32, device="meta")).shape == (2, 5, 32)

    calls = []
    real = mod.check_gla_inputs
    monkeypatch.setattr(mod, "check_gla_inputs", lambda fn, *a: (calls.append(fn), real(fn, *a)))
    qq, kk, vv, gg = (t.requires_grad_() for t in make_inputs(1, 2, 21, 16, 8))
    gated_linear_attention(qq, kk, vv, gg, impl="triton").sum().backward()
    assert calls == ["gated_linear_attention"]


def test_the_pytorch_scans_compute_in_float32_under_autocast():
    # the docstring's promise: every path computes in float32; autocast would run their matmuls in bf16
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 8) for _ in range(3))
    g = -torch.rand(1, 2, 37, 8) * 0.5
    for fn in (gla_loop, lambda *a: gla_logspace(*a, chunk_size=16)):
        want = fn(q, k, v, g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = fn(q, k, v, g)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    m = MetaAttention(32, 2, impl="logspace", dtype=torch.bfloat16)  # float32 x is no error under autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(torch.randn(1, 5, 32)).shape == (1, 5, 32)
