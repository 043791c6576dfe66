"""What every op of mahia.ops guarantees besides its float64 math (test_ops_fuzz checks that, gradients
included): direct launches, issue 35's one path, bad input, the custom ops, the eager reference's cases."""

import importlib
import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import assert_close, compare, graph_ops

from mahia import ops
from mahia.layers.rope import apply_rope
from mahia.ops import _launch
from mahia.ops._launch import _key

# the modules (mahia.ops re-exports functions of the same names as some of them)
gla_scan, grouped_mm, moe_combine, rmsnorm, rope, swiglu = (
    importlib.import_module(f"mahia.ops.{name}")
    for name in ("gla_scan", "grouped_mm", "moe_combine", "rmsnorm", "rope", "swiglu")
)

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
LAUNCHERS = {  # every launcher of every op, by "module.name"
    f"{m.__name__}.{name}": v
    for m in (rmsnorm, swiglu, rope, moe_combine, grouped_mm, gla_scan.kernels)
    for name, v in vars(m).items()
    if isinstance(v, _launch.Launcher)
}


def _triton_spec(a):
    """Triton's own specialization of one argument (its binder calls the same function)."""
    libtriton = pytest.importorskip("triton._C.libtriton")
    backend = pytest.importorskip("triton.backends.compiler").BaseBackend
    if not hasattr(libtriton, "native_specialize_impl"):
        pytest.skip("this triton has no native_specialize_impl")
    return libtriton.native_specialize_impl(backend, a, False, True, True)


def test_the_key_determines_tritons_specialization():
    """Arguments with one key must get one specialization from Triton, or a direct launch could run a
    kernel compiled for other arguments (e.g. one that assumes a stride divisible by 16)."""
    base = torch.empty(64, dtype=torch.bfloat16)
    args = [0, 1, 2, 15, 16, 17, 32, 48, 1000, 4096, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**40 + 3]
    args += [-1, -16, -17, 2**63, 2**63 + 16, 0.5, 1e-6, True, False]
    args += [base, base[1:], base[8:], base[9:], base.float(), base.float()[2:], base.float()[4:], base.half()]
    seen: dict = {}
    for a in args:
        key, spec = repr(_key([a])[0]), _triton_spec(a)
        assert seen.setdefault(key, spec) == spec, f"{a!r}: key {key} maps to {seen[key]} and {spec}"
    # a Parameter is keyed like the tensor it wraps (by dtype and alignment, never by identity)
    param = torch.nn.Parameter(base.float()[2:])
    assert _key([param]) == [(torch.float32, param.data_ptr() & 15)]


needs_gpu = pytest.mark.skipif(not CUDA, reason="direct launches need compiled kernels (a CUDA GPU)")


def _misaligned(shape, dtype, offset=1):
    """A contiguous tensor whose data pointer is not 16-byte aligned."""
    n = shape[0] * (shape[1] if len(shape) > 1 else 1)
    return torch.randn(n + offset, device="cuda", dtype=dtype)[offset:].view(shape)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rows,cols", [(1, 64), (16, 17), (17, 4096), (300, 1000)])
def test_direct_launch_matches_the_jit_launch(rows, cols, dtype):
    """Later calls of a key launch directly: bit-identical to the first (JIT) call, aligned or not."""
    for make in (lambda s: torch.randn(s, device="cuda", dtype=dtype), lambda s: _misaligned(s, dtype)):
        x = make((rows, cols)).requires_grad_()
        w = make((cols,)).requires_grad_()
        dy = make((rows, cols))
        results = []
        for _ in range(3):  # JIT launch (compiles if new), then direct launches
            x.grad = w.grad = None
            y = ops.rms_norm(x, w)
            y.backward(dy)
            results.append((y.detach().clone(), x.grad.clone(), w.grad.clone()))
        for later in results[1:]:
            for a, b in zip(results[0], later):
                assert torch.equal(a, b)
    assert rmsnorm._launch_fwd.cache_size() > 0 and rmsnorm._launch_bwd.cache_size() > 0


_COMPILE_FOR_SM90 = """import importlib, json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
for module, name, sig, const, options in json.load(sys.stdin):
    fn = getattr(importlib.import_module(module), name)
    const = {(fn.arg_names.index(k),): v for k, v in const.items()}
    try:
        triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options=options)
    except Exception as e:
        print(f"{name}: {e}")"""


def test_every_op_compiles_for_hopper_and_launches_directly_once_warm(monkeypatch):
    """The interpreter runs a kernel's Python, untyped: only the compiler refuses, say, an `if` whose two
    branches give one name two types (the GLA backward, caught on an H100 on 2026-12-05). Each launch's
    signature is recorded and compiled for sm_90 in a process without the interpreter (ptxas ships with triton)."""
    specs, real = {}, _launch.Launcher.__call__

    def record(self, grid, *args, **meta):
        fn = self.kernel.fn  # the Python function, under JITFunction or the interpreter's wrapper
        names = list(inspect.signature(fn).parameters)
        sig = {n: _triton_spec(a)[0] for n, a in zip(names, args)}  # Triton's own: "*bf16", "i32", 1 a constexpr
        const = {n: a for n, a in zip(names, args) if sig[n] == "constexpr"}
        const |= {k: v for k, v in meta.items() if k not in _launch._OPTIONS}
        sig |= dict.fromkeys(const, "constexpr")
        spec = (fn.__module__, fn.__name__, sig, const, {k: v for k, v in meta.items() if k in _launch._OPTIONS})
        specs[repr(spec)] = spec
        return real(self, grid, *args, **meta)

    monkeypatch.setattr(_launch.Launcher, "__call__", record)
    calls = [(getattr(ops, op), _inputs(op)) for op in ("rms_norm", "add_rms_norm", "swiglu", "rope", "moe_combine")]
    bf16 = dict(device=DEV, dtype=torch.bfloat16)
    mm, offs = (torch.randn(96, 64, **bf16), torch.randn(3, 64, 128, **bf16)), torch.tensor([32, 64, 96], device=DEV)
    calls.append((lambda a, b: ops.grouped_mm(a, b, offs.int(), backend="triton"), list(mm)))
    for t in (None, 2.0):  # log-decays, or the gate's logits (GATE)
        gla = lambda *qkvg, t=t: ops.gated_linear_attention(*qkvg, impl="triton", gate_temperature=t)  # noqa: E731
        calls.append((gla, _inputs("gated_linear_attention")))
    half = lambda a: a.bfloat16() if isinstance(a, torch.Tensor) and a.is_floating_point() else a  # noqa: E731
    calls += [(fn, [half(a) for a in args]) for fn, args in calls[:5] + calls[6:]]  # bfloat16: other constexprs
    for fn, args in calls:
        for a in args[:2]:
            a.requires_grad_(a.is_floating_point())
        for _ in range(2 if CUDA else 1):  # on a GPU the second call launches directly
            out = fn(*args)
            sum(o.float().sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    # every launcher ran, so its kernel is compiled below, but the dw sum (a backward of several programs; 5 rows
    # is one) and the zero tail (after the native backend's torch._grouped_mm only); on a GPU each has a direct
    # entry (else a constexpr mismatch)
    ran = {spec[1] for spec in specs.values()}
    missing = {name for name, launcher in LAUNCHERS.items()
               if launcher.kernel.fn.__name__ not in ran or (CUDA and launcher.cache_size() == 0)}  # fmt: skip
    assert missing <= {"mahia.ops.rmsnorm._launch_sum", "mahia.ops.grouped_mm._launch_zero_tail"}, missing
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], input=json.dumps(list(specs.values())),
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert len(specs) >= 30 and done.returncode == 0 and not done.stdout, done.stdout + done.stderr[-2000:]


_OPS_DIR = str(Path(rmsnorm.__file__).parent)


def _inputs(op: str) -> list:
    g = lambda *s: torch.randn(*s, device=DEV)  # noqa: E731
    if op == "rms_norm":
        return [g(5, 40), g(40), 1e-6]
    if op == "add_rms_norm":
        return [g(5, 40), g(5, 40), g(40), 1e-6]
    if op == "swiglu":
        return [g(5, 40), g(5, 40)]
    if op == "rope":
        return [g(2, 3, 4, 8), g(2, 3, 2, 8), g(3, 4), g(3, 4)]
    if op == "gated_linear_attention":
        # T = 130: several groups of rows on a GPU and under the interpreter, so the carry pass runs too
        return [g(1, 2, 130, 16), g(1, 2, 130, 16), g(1, 2, 130, 16), -torch.rand(1, 2, 130, 16, device=DEV)]
    return [g(6, 16), torch.randperm(6, device=DEV), g(3, 2)]  # moe_combine


@pytest.mark.parametrize("path", ["autograd", "no_grad", "custom_op"])
@pytest.mark.parametrize(
    "op,module,launchers",
    [
        ("rms_norm", rmsnorm, ["_launch_fwd", "_launch_bwd"]),
        ("add_rms_norm", rmsnorm, ["_launch_fwd", "_launch_bwd"]),
        ("swiglu", swiglu, ["_launch_fwd", "_launch_bwd"]),
        ("rope", rope, ["_launch_rope"]),
        ("moe_combine", moe_combine, ["_launch_fwd", "_launch_bwd"]),
        ("gated_linear_attention", gla_scan.kernels, ["_launch_fwd", "_launch_bwd"]),
    ],
)
def test_at_most_three_frames_from_the_public_function_to_the_launch(monkeypatch, op, module, launchers, path):
    """Issue 35: frames of mahia/ops files on the stack at each launch (torch's not counted), eager with and
    without autograd, and compiled (aot_eager: the graph calls the custom ops)."""
    depths = []

    def spy(real):
        def launch(*args, **kwargs):
            frame = sys._getframe(1)
            n = 0
            while frame is not None:
                n += frame.f_code.co_filename.startswith(_OPS_DIR)
                frame = frame.f_back
            depths.append(n)
            return real(*args, **kwargs)

        return launch

    for name in launchers:
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    monkeypatch.setattr(rmsnorm, "_fwd_plans", {})  # a planned launch (GPU) bypasses _launch_fwd
    args = _inputs(op)
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if path != "no_grad":
        floats[0].requires_grad_()
    with torch.set_grad_enabled(path != "no_grad"):
        fn, kw = getattr(ops, op), {"impl": "triton"} if op == "gated_linear_attention" else {}
        out = (torch.compile(fn, backend="aot_eager", fullgraph=True) if path == "custom_op" else fn)(*args, **kw)
    if path != "no_grad":
        sum(o.sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    assert len(depths) == (1 if path == "no_grad" else 2), depths  # the forward's launch, the backward's
    assert max(depths) <= 3, depths


@pytest.mark.parametrize("module", [rmsnorm, rope, swiglu, moe_combine], ids=lambda m: m.__name__)
def test_at_most_six_exported_names_per_op(module):
    assert len(module.__all__) <= 6 and all(hasattr(module, name) for name in module.__all__), module.__all__


CHECKS = {  # each op's input check, by module and name
    "rms_norm": (rmsnorm, "check_rms_norm_inputs"),
    "add_rms_norm": (rmsnorm, "check_rms_norm_inputs"),
    "swiglu": (swiglu, "check_swiglu_inputs"),
    "rope": (rope, "check_rope_inputs"),
    "moe_combine": (moe_combine, "check_moe_combine_inputs"),
}
EAGER = {
    "rms_norm": rmsnorm.rms_norm_eager,
    "add_rms_norm": rmsnorm.add_rms_norm_eager,
    "swiglu": swiglu.swiglu_eager,
    "rope": rope.apply_rope_eager,
    "moe_combine": moe_combine.moe_combine_eager,
}


@pytest.mark.parametrize("disabled", ["0", "1"], ids=["triton", "fallback"])
@pytest.mark.parametrize("op", list(EAGER))
def test_one_input_check_per_call_and_a_disabled_triton_warns_once(monkeypatch, op, disabled):
    """Forward and backward run the input check once. MAHIA_DISABLE_TRITON=1 runs the eager reference, one warning."""
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", disabled)
    ops.reset_fallback_warnings()
    module, check = CHECKS[op]
    calls, real = [], getattr(module, check)
    monkeypatch.setattr(module, check, lambda fn, *a, **k: (calls.append(fn), real(fn, *a, **k))[1])
    args = _inputs(op)
    args[0].requires_grad_()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = getattr(ops, op)(*args), getattr(ops, op)(*args)
    sum(o.sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    assert calls == [op, op]
    messages = [str(w.message) for w in caught]
    assert len(messages) == (disabled == "1") and all(f"ops.{op}: Triton kernel not used" in m for m in messages)
    if disabled == "1":
        assert all("disabled by MAHIA_DISABLE_TRITON=1" in s for s in ops.status().values())
        torch.testing.assert_close(out, EAGER[op](*args), rtol=0, atol=0)
    ops.reset_fallback_warnings()


def _custom_op_calls(op):
    """(custom op, arguments) of each registration an op uses (forward and backward variants)."""
    args = _inputs(op)
    args[0].requires_grad_()
    if op == "rms_norm":
        (x, w, eps), dy = args, torch.randn_like(args[0], requires_grad=True)
        fwd = [("rms_norm_fwd", (x, None, w, eps, torch.half)), ("rms_norm_fwd", (x, dy, w, eps, None))]
        return fwd + [("rms_norm_bwd", (dy.detach(), x.detach(), w, eps, dh)) for dh in (None, dy.detach())]
    if op == "swiglu":
        dc, calls = torch.randn_like(args[0]), (args, (torch.cat(args, -1).detach().requires_grad_(), None))  # h=[a|b]
        return [c for a, b in calls for c in (("swiglu_fwd", (a, b)), ("swiglu_bwd", (dc, a.detach(), b)))]
    if op == "rope":
        return [("rope", (*args, False)), ("rope", (*(a.detach() for a in args), True))]
    out, inverse, gates = args
    dy = torch.randn(gates.shape[0], out.shape[1], device=out.device)
    return [("moe_combine_fwd", (out, inverse, gates, torch.float32))] + [
        ("moe_combine_bwd", (dy, out.detach(), inverse, gates, gate_grad)) for gate_grad in (True, False)
    ]


COMPILED_OP = {"rms_norm": "rms_norm_fwd", "swiglu": "swiglu_fwd", "rope": "rope", "moe_combine": "moe_combine_fwd"}


@pytest.mark.skipif(not ops.triton_available_for(torch.empty(0, device=DEV)), reason="no Triton kernels here")
@pytest.mark.parametrize("op", list(COMPILED_OP))
def test_custom_ops_pass_opcheck_and_compile_without_a_graph_break(op):
    """opcheck of every custom op; torch.compile(fullgraph) calls it and matches float64, gradients included."""
    for name, args in _custom_op_calls(op):  # fixed-arity returns: Inductor's C++ wrapper read a Tensor[] as one tensor
        assert "[]" not in str((custom := getattr(torch.ops.mahia, name).default)._schema).split("->")[1], name
        torch.library.opcheck(custom, args)
    torch._dynamo.reset()
    compiled = torch.compile(getattr(ops, op), fullgraph=True, backend="aot_eager")
    grad_inputs = [0, 1] if op == "rope" else None  # cos and sin are constants
    compare(compiled, EAGER[op], list(_inputs(op)), grad_inputs=grad_inputs, name=f"compiled {op}")
    assert f"mahia.{COMPILED_OP[op]}.default" in graph_ops(getattr(ops, op), *_inputs(op))


FLOAT64 = {  # each op's call with a float64 input (or dtype) next to float32 ones
    "rms_norm": lambda x, w, eps: (x, w.double(), eps),
    "add_rms_norm": lambda x, r, w, eps: (x, r, w.double(), eps),
    "swiglu": lambda a, b: (a.double(), b.double()),
    "rope": lambda q, k, cos, sin: (q, k, cos.double(), sin.double()),
    "moe_combine": lambda out, inverse, gates: (out, inverse, gates.double()),
}


@pytest.mark.parametrize("op", list(EAGER))
def test_float64_takes_the_eager_reference_silently_and_meta_gets_shapes(op):
    """Regressions: a float64 input next to float32 ones was refused by the Triton path (now: the eager
    reference, silently); meta tensors crashed the interpreter (now: shapes from the eager reference)."""
    args = FLOAT64[op](*_inputs(op))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = getattr(ops, op)(*args)
    torch.testing.assert_close(out, EAGER[op](*args), rtol=0, atol=0)  # dtypes too
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in _inputs(op)]
    meta[0].requires_grad_()
    outs = getattr(ops, op)(*meta)
    outs = outs if isinstance(outs, tuple) else (outs,)
    real = EAGER[op](*_inputs(op))
    assert [(o.device.type, o.shape) for o in outs] == [
        ("meta", r.shape) for r in (real if isinstance(real, tuple) else (real,))
    ]
    sum(o.sum() for o in outs).backward()
    assert meta[0].grad.shape == meta[0].shape


BAD_CALLS = {  # by the inputs the calls take (_inputs): (call, error, message)
    "rms_norm": [
        (lambda x, w, e: ops.rms_norm(x.int(), w), TypeError, r"^rms_norm: x must be a floating-point"),
        (lambda x, w, e: ops.rms_norm([1.0, 2.0], w), TypeError, r"^rms_norm: x must be a torch.Tensor, got list"),
        (lambda x, w, e: ops.rms_norm(x, w[:7]), ValueError, r"^rms_norm: weight must have shape \(40,\)"),
        (lambda x, w, e: ops.rms_norm(x, w.long()), TypeError, r"^rms_norm: weight must be a floating-point"),
        (lambda x, w, e: ops.rms_norm(x, w.to("meta")), ValueError, r"^rms_norm: all inputs must be on the same"),
        (lambda x, w, e: ops.rms_norm(x, w, -1.0), ValueError, r"^rms_norm: eps must be >= 0"),
        (lambda x, w, e: ops.rms_norm(x, w, "a"), TypeError, r"^rms_norm: eps must be a real number >= 0, got str"),
        (lambda x, w, e: ops.rms_norm(x, w, out_dtype=torch.int8), TypeError, r"^rms_norm: out_dtype must be None or"),
        (lambda x, w, e: ops.add_rms_norm(x, x[:, :7], w), ValueError, r"^add_rms_norm: residual must have the shape"),
        (lambda x, w, e: ops.add_rms_norm(x, x.half(), w), TypeError, r"^add_rms_norm: residual must have the dtype"),
        (lambda x, w, e: ops.add_rms_norm(x, [1.0], w), TypeError, r"^add_rms_norm: residual must be a torch.Tensor"),
        (lambda x, w, e: ops.add_rms_norm(x, x, w, None), TypeError, r"^add_rms_norm: eps must be a real number"),
        # the eager references stay public and validate under their own names
        (lambda x, w, e: rmsnorm.rms_norm_eager([1.0], w), TypeError, r"^rms_norm_eager: x must be a torch.Tensor"),
        (lambda x, w, e: rmsnorm.add_rms_norm_eager(x, x, w, "a"), TypeError, r"^add_rms_norm_eager: eps must be a"),
    ],
    "swiglu": [
        (lambda a, b: ops.swiglu(a.long(), b), TypeError, r"^swiglu: a must be a floating-point"),
        (lambda a, b: ops.swiglu(a, [1.0]), TypeError, r"^swiglu: b must be a torch.Tensor, got list"),
        (lambda a, b: ops.swiglu(a, b[:, :4]), ValueError, r"^swiglu: a and b must have the same shape"),
        (lambda a, b: ops.swiglu(a, b.half()), TypeError, r"^swiglu: a and b must have the same dtype"),
        (lambda a, b: ops.swiglu(a, b.to("meta")), ValueError, r"^swiglu: .*same device"),
        (lambda a, b: ops.swiglu(a[:, :7]), ValueError, r"^swiglu: a packed \[a \| b\] needs an even last dim"),
        (lambda a, b: swiglu.swiglu_eager(None, b), TypeError, r"^swiglu_eager: a must be a torch.Tensor"),
    ],
    "rope": [
        (lambda q, k, c, s: ops.rope(q.int(), k, c, s), TypeError, r"^rope: q must be a floating-point"),
        (lambda q, k, c, s: ops.rope(q[0], k, c, s), ValueError, r"^rope: q must be 4-D"),
        (lambda q, k, c, s: ops.rope(q, k[:, :2], c, s), ValueError, r"^rope: k must be"),
        (lambda q, k, c, s: ops.rope(q, k.double(), c, s), TypeError, r"^rope: k must have the dtype of q"),
        (lambda q, k, c, s: ops.rope(q, k, c[:2], s), ValueError, r"^rope: cos must have shape \(T, D/2\)"),
        (lambda q, k, c, s: ops.rope(q, k, c, None), TypeError, r"^rope: sin must be a torch.Tensor"),
        (lambda q, k, c, s: ops.rope(q, k, c.to("meta"), s), ValueError, r"^rope: .*same device"),
        (lambda q, k, c, s: ops.rope(q[..., :7], k[..., :7], c, s), ValueError, r"^rope: head dim D must be even"),
        # float64: the eager path, the same check
        (lambda q, k, c, s: ops.rope(q[..., :7].double(), k[..., :7].double(), c, s), ValueError, r"^rope: head dim"),
        (lambda q, k, c, s: apply_rope(q, k, c, s, impl="cuda"), ValueError, "impl must be one of"),
        (lambda q, k, c, s: rope.apply_rope_eager(q[..., :7], k[..., :7], c, s), ValueError, r"^apply_rope_eager: "),
    ],
    "moe_combine": [
        (lambda o, i, g: ops.moe_combine(o, i.int(), g), TypeError, "^moe_combine: inverse must be an int64"),
        (lambda o, i, g: ops.moe_combine(o[:5], i, g), ValueError, r"^moe_combine: out must be \(N\*k, D\)"),
        (lambda o, i, g: ops.moe_combine(o, i[:5], g), ValueError, r"inverse must have shape \(N\*k,\)"),
        (lambda o, i, g: ops.moe_combine(o, i, g.reshape(-1)), ValueError, r"gates must be 2-D \(N, k\)"),
        (lambda o, i, g: ops.moe_combine(o, i, g[:2]), ValueError, "out must be"),  # gates (2, 2) wants 4 rows
        (lambda o, i, g: ops.moe_combine(o.long(), i, g), TypeError, "out must be a floating-point"),
        (lambda o, i, g: ops.moe_combine(o, i, g, torch.int32), TypeError, "dtype must be"),
        (lambda o, i, g: ops.moe_combine(o, i.to("meta"), g), ValueError, "same device"),
        (lambda o, i, g: ops.moe_combine(o, [0, 1], g), TypeError, r"^moe_combine: inverse must be a torch.Tensor"),
        (lambda o, i, g: moe_combine.moe_combine_eager(o, i.int(), g), TypeError, "^moe_combine_eager: inverse must"),
    ],
}


@pytest.mark.parametrize("disabled", ["0", "1"], ids=["triton", "fallback"])
@pytest.mark.parametrize("op", list(BAD_CALLS))
def test_bad_inputs_raise_errors_naming_the_function_and_argument(monkeypatch, op, disabled):
    """Regressions: a string eps gave "could not convert string to float"; a list x, or an odd head dim on
    the fallback, an error naming the eager reference. Each function names itself, on both paths."""
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", disabled)
    args = _inputs(op)
    for call, error, match in BAD_CALLS[op]:
        with pytest.raises(error, match=match):
            call(*args)
    ops.reset_fallback_warnings()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("disabled", ["0", "1"], ids=["triton", "fallback"])
def test_rope_tables_that_require_grad_are_refused_on_every_path(monkeypatch, disabled, dtype):
    """Regression (issue 37 #10): cos/sin that require grad raised on the Triton path and were silently
    differentiated on the eager one. Now refused on every path; under no_grad they are constants."""
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", disabled)
    q, k, cos, sin = (t.to(dtype) for t in _inputs("rope"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning
        for tables in ((cos.clone().requires_grad_(), sin), (cos, sin.clone().requires_grad_())):
            with pytest.raises(ValueError, match=r"^rope: cos and sin must not require grad"):
                ops.rope(q.clone().requires_grad_(), k, *tables)
            with torch.no_grad():
                qr, kr = ops.rope(q, k, *tables)
            assert_close("rope under no_grad", qr, rope.apply_rope_eager(q.double(), k.double(), cos, sin)[0], dtype)
    ops.reset_fallback_warnings()


def test_hidden_size_past_the_kernel_limit_takes_the_eager_path():
    """Regression: hidden size MAX_HIDDEN + 1 raised on the Triton path; now the eager reference runs it, with
    the one-time warning. MAX_HIDDEN still runs on the kernel."""
    ops.reset_fallback_warnings()
    for n in (rmsnorm.MAX_HIDDEN + 1, rmsnorm.MAX_HIDDEN):
        x = torch.randn(2, n, device=DEV, requires_grad=True)
        w = torch.randn(n, device=DEV, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y, (y2, _) = ops.rms_norm(x, w), ops.add_rms_norm(x, x, w)
            ops.rms_norm(x, w)  # warned once already: silent
        messages = [str(c.message) for c in caught]
        too_wide = f"Triton kernel not used (hidden size {n} exceeds"
        assert len(messages) == 2 * (n > rmsnorm.MAX_HIDDEN) and all(too_wide in m for m in messages), messages
        y.sum().backward()
        assert x.grad.shape == x.shape and w.grad.shape == w.shape
        assert_close(f"rms_norm at {n}", y, rmsnorm.rms_norm_eager(x.double(), w.double()))
        assert_close(f"add_rms_norm at {n}", y2, rmsnorm.rms_norm_eager((x + x).double(), w.double()))
    ops.reset_fallback_warnings()


@pytest.mark.skipif(CUDA, reason="checks the CPU path without the interpreter")
def test_a_cpu_input_without_the_interpreter_runs_the_eager_reference_silently(monkeypatch):
    """The PyTorch path is the CPU's own: no warning box in a CPU notebook."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ops.reset_fallback_warnings()
    x, w = torch.randn(3, 40), torch.ones(40)
    assert not ops.triton_available_for(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(ops.rms_norm(x, w), rmsnorm.rms_norm_eager(x, w))
