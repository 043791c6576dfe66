"""The grouped GEMM: every backend under the rule for offs against float64, backend="auto"'s choice, issue 35's
frame count, meta and float64 inputs, torch.compile (custom ops, no graph break, no torch._dynamo at import)."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import assert_close, compare, grouped_mm_runs

from mahia import ops
from mahia.ops.grouped_mm import BACKENDS, grouped_mm, grouped_mm_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["moe_grouped_mm"])
)
_REPO = Path(__file__).resolve().parents[1]
gm = importlib.import_module("mahia.ops.grouped_mm")  # mahia.ops.grouped_mm is also the function's name


def rule_reference(a, b, offs):
    """The rule for offs, written from the module docstring: e_g = min(max(offs[0..g]), M) (max with 0);
    row r belongs to the first group whose end exceeds it, rows past e_{G-1} to none (c = 0 there)."""
    M, K = a.shape
    ends, hi = [], 0
    for o in offs.tolist():
        hi = max(hi, o)
        ends.append(min(hi, M))
    group = (torch.tensor(ends, dtype=torch.long)[None, :] <= torch.arange(M)[:, None]).sum(1)  # G: no group
    b_ext = torch.cat([b, b.new_zeros(1, K, b.shape[2])])
    return torch.einsum("mk,mkn->mn", a, b_ext[group.to(a.device)])


BACKENDS_HERE = [
    pytest.param(b, marks=pytest.mark.skipif(not grouped_mm_runs(b, device=DEVICE), reason=f"{b} cannot run here"))
    for b in BACKENDS
]


# Issue 37 #6 (offs[-1] < M: c and da left uninitialised there), #7 (G = 0: an IndexError), #8 (offs[-1] > M:
# padded-bmm raised IndexError), and bad ends.
OFFS_CASES = {
    "last end < M": [7, 7, 30, 33],
    "no group": [],
    "last end > M": [7, 30, 100],
    "negative and decreasing": [-5, 30, 10, 40],
}


@pytest.mark.parametrize("backend", BACKENDS_HERE)
@pytest.mark.parametrize("case", OFFS_CASES)
def test_every_backend_follows_the_rule_for_offs(backend, case):
    offs = torch.tensor(OFFS_CASES[case], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 16, generator=g).to(DEVICE)
    b = torch.randn(offs.numel(), 16, 24, generator=g).to(DEVICE)
    fast, ref = lambda a, b: grouped_mm(a, b, offs, backend=backend), lambda a, b: rule_reference(a, b, offs)
    compare(fast, ref, [a, b], name=f"grouped_mm {backend} offs {case}")


def _transposed(t):
    return t.t().contiguous().t()


# Issue 37 #5: backend="auto" chose torch._grouped_mm on the CPU for inputs its kernel rejects
# ("strides should be multiple of 16 bytes", "Invalid strides/sizes").
AUTO_CASES = {
    "a transposed": (torch.bfloat16, 45, 16, 24, _transposed, "dense"),  # rows 90 bytes apart
    "N = 0": (torch.float32, 40, 16, 0, None, "dense"),
    "K = 0": (torch.float32, 40, 0, 16, None, "dense"),
    "c.sum().backward()": (torch.float32, 40, 16, 24, None, "sum"),
    "c.sum().backward() bf16": (torch.bfloat16, 40, 16, 24, None, "sum"),
}


@pytest.mark.parametrize("case", AUTO_CASES)
def test_auto_backend_takes_transposed_empty_and_broadcast_gradient_inputs(case):
    dtype, M, K, N, layout, grad = AUTO_CASES[case]
    offs = torch.tensor([7, 30, M], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    a = (layout(a) if layout else a).requires_grad_()
    b = torch.randn(3, K, N, generator=g).to(DEVICE, dtype).requires_grad_()
    a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
    c, c64 = grouped_mm(a, b, offs), rule_reference(a64, b64, offs)
    dc = torch.randn(M, N, generator=g).to(DEVICE)
    if grad == "sum":  # the upstream gradient is a broadcast one: stride 0
        c.sum().backward()
        c64.sum().backward()
    else:
        c.backward(dc.to(dtype))
        c64.backward(dc.double())
    for name, out, ref in (("c", c, c64), ("da", a.grad, a64.grad), ("db", b.grad, b64.grad)):
        assert_close(f"grouped_mm auto ({grouped_mm_backend(a, b)}) {case}: {name}", out, ref, dtype)


@pytest.mark.parametrize("backend", BACKENDS_HERE)
def test_three_python_frames_from_grouped_mm_to_the_kernel(backend, monkeypatch):
    """Issue 35: at most 3 Python frames (torch's included) from grouped_mm to the launch (Triton, torch._grouped_mm
    or bmm); in the backward, at most 2 from where autograd enters Python."""
    paths = []

    def record(real):
        def spy(*args, **kwargs):
            f, names = sys._getframe(1), []
            while f is not None and f.f_code.co_name not in ("grouped_mm", "backward"):
                names.append(f.f_code.co_name)
                f = f.f_back
            paths.append((f.f_code.co_name, len(names) + 1))
            return real(*args, **kwargs)

        return spy

    monkeypatch.setattr(gm.Launcher, "__call__", record(gm.Launcher.__call__))
    monkeypatch.setattr(torch, "_grouped_mm", record(torch._grouped_mm))
    monkeypatch.setattr(torch, "bmm", record(torch.bmm))
    a = torch.randn(40, 16, device=DEVICE, requires_grad=True)
    b = torch.randn(2, 16, 32, device=DEVICE, requires_grad=True)
    c = grouped_mm(a, b, torch.tensor([7, 40], dtype=torch.int32, device=DEVICE), backend=backend)
    forward = list(paths)
    c.backward(torch.ones_like(c))
    assert forward and all(entry == "grouped_mm" and n <= 3 for entry, n in forward), forward
    backward = paths[len(forward) :]
    if backend != "padded-bmm":  # the padded bmm's backward is PyTorch's own
        assert backward and all(entry == "backward" and n <= 2 for entry, n in backward), backward


def test_meta_and_float64_take_the_padded_bmm():
    """Regression: meta tensors crashed the interpreter; they and float64 (no kernel) take the padded bmm."""
    a = torch.empty(10, 8, device="meta", requires_grad=True)
    b = torch.empty(3, 8, 5, device="meta", requires_grad=True)
    offs = torch.empty(3, dtype=torch.int32, device="meta")
    assert grouped_mm_backend(a, b) == "padded-bmm"
    c = grouped_mm(a, b, offs)
    assert c.shape == (10, 5) and c.device.type == "meta"
    c.sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    a64, b64 = torch.randn(10, 8, dtype=torch.float64), torch.randn(3, 8, 5, dtype=torch.float64)
    offs = torch.tensor([2, 2, 10], dtype=torch.int32)
    assert grouped_mm_backend(a64, b64) == "padded-bmm"
    torch.testing.assert_close(grouped_mm(a64, b64, offs), rule_reference(a64, b64, offs))


def test_import_mahia_ops_does_not_import_dynamo():
    """``import mahia.ops`` stays free of torch._dynamo (about 6 s per process on the H100 machine's host)."""
    code = "import sys, mahia.ops; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_compiled_cpu_grouped_mm_has_no_graph_break(monkeypatch):
    """torch.compile of the CPU bfloat16 grouped matmul, whose backend choice probes while tracing: no break."""
    monkeypatch.setattr(gm, "_cpu_grouped_mm_probe", {})  # not probed yet: the first call is traced
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")  # the CPU's own paths, not the interpreter
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch._grouped_mm")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 8, generator=g).bfloat16()
    b = torch.randn(2, 8, 4, generator=g).bfloat16()
    offs = torch.tensor([2, 6], dtype=torch.int32)
    got = torch.compile(grouped_mm, backend="eager", fullgraph=True)(a, b, offs)  # a graph break raises
    assert torch.equal(got, grouped_mm(a, b, offs))


@needs_kernels
def test_compiled_triton_backend_runs_the_two_custom_ops():
    """Issue 35: under torch.compile each kernel is one custom op (opcheck), forward and backward; eager agrees."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    g = torch.Generator().manual_seed(2)
    a = torch.randn(40, 16, generator=g).to(DEVICE).requires_grad_()
    b = torch.randn(3, 16, 24, generator=g).to(DEVICE).requires_grad_()
    offs = torch.tensor([7, 7, 33], dtype=torch.int32, device=DEVICE)
    ends = offs.clamp(0, 40).cummax(0).values
    dc = torch.randn(40, 24, device=DEVICE)
    for native in (False, True):  # native: torch._grouped_mm inside the op, where this build has it for bfloat16
        if native and gm._why_not_native(a.device, torch.bfloat16, 16, 24) is not None:
            continue
        dt = torch.bfloat16 if native else a.dtype
        torch.library.opcheck(gm._mm_op, (a.detach().to(dt), b.detach().to(dt), ends, native))
        torch.library.opcheck(gm._wgrad_op, (a.detach().to(dt), dc.to(dt), ends, native))

    calls = []

    def backend(graph, example_inputs):
        def keep(gm_, _):
            calls.extend(str(n.target) for n in gm_.graph.nodes if "mahia" in str(n.target))
            return make_boxed_func(gm_)

        return aot_module_simplified(graph, example_inputs, fw_compiler=keep, bw_compiler=keep)

    torch._dynamo.reset()
    fn = lambda a, b: grouped_mm(a, b, offs, backend="triton")  # noqa: E731
    c = torch.compile(fn, backend=backend, fullgraph=True)(a, b)
    da, db = torch.autograd.grad(c.square().sum(), [a, b])
    c_e = fn(a, b)
    for got, want in zip((c, da, db), (c_e, *torch.autograd.grad(c_e.square().sum(), [a, b]))):
        torch.testing.assert_close(got, want)
    assert calls == ["mahia.moe_grouped_mm.default"] * 2 + ["mahia.moe_grouped_mm_wgrad.default"]
