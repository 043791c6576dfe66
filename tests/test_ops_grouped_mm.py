"""The Triton grouped GEMM against float64 per-group matmuls (element-wise and norm-wise), its index
guards, and the dispatch rules every op of mahia.ops shares (float64, meta, inputs the kernels cannot take)."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from helpers import compare

from mahia import ops
from mahia.ops import dispatch
from mahia.ops.grouped_mm import grouped_mm, grouped_mm_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    not ops.triton_available_for(torch.empty(0, device=DEVICE)), reason=str(ops.status()["moe_grouped_mm"])
)
_REPO = Path(__file__).resolve().parents[1]


def per_group(a, b, offs):
    """c[rows of g] = a[rows of g] @ b[g], one matmul per group (offs read on the host)."""
    c = a.new_zeros(a.shape[0], b.shape[2])
    start = 0
    for g, end in enumerate(offs.tolist()):
        c[start:end] = a[start:end] @ b[g]
        start = end
    return c


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_triton_backend_matches_per_group_matmuls(dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(45, 24, generator=g).to(DEVICE, dtype)
    b = (torch.randn(4, 24, 40, generator=g) / 5).to(DEVICE, dtype)
    offs = torch.tensor([7, 7, 30, 45], dtype=torch.int32, device=DEVICE)  # an empty group
    errors = compare(
        lambda a, b: grouped_mm(a, b, offs, backend="triton"),
        lambda a, b: per_group(a, b, offs),
        [a, b],
        name=f"grouped_mm triton {dtype}",
    )
    assert set(errors) == {"out0", "grad0", "grad1"}


_BAD_OFFS_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from mahia.ops.grouped_mm import grouped_mm
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for spec in sys.argv[1:]:
        offs = torch.tensor(json.loads(spec), dtype=torch.int32, device=device)
        a = torch.randn(40, 16, device=device, requires_grad=True)
        b = torch.randn(offs.numel(), 16, 24, device=device, requires_grad=True)
        c = grouped_mm(a, b, offs, backend="triton")
        c.backward(torch.ones_like(c))
        print(json.dumps({"offs": spec, "shape": list(c.shape)}), flush=True)
""")


@needs_kernels
def test_bad_group_ends_never_read_or_write_out_of_bounds():
    """offs is not checked against M (that would read it on the host); the Triton kernels guard every
    row index instead (0 <= row < M), so group ends past M, negative or decreasing ones never take them
    outside a, c, dc or da (in a fresh process: a stray access could only kill that one)."""
    bad = ["[10, 30, 100000]", "[-50, 20, 40]", "[30, 10, 40]", "[40, 40, 2000000000]"]
    env = dict(os.environ, PYTHONPATH=str(_REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    env.pop("MAHIA_DISABLE_TRITON", None)
    proc = subprocess.run(
        [sys.executable, "-c", _BAD_OFFS_SCRIPT, *bad], env=env, cwd=_REPO, capture_output=True, text=True, timeout=600
    )
    done = [json.loads(line)["offs"] for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"crashed (rc {proc.returncode}) after {done}: {proc.stderr[-2000:]}"
    assert done == bad


def test_meta_and_float64_take_the_padded_bmm():
    """Regression (meta): the interpreter cannot run on meta tensors; they get shapes from the padded bmm.
    float64 has no kernel either (reference precision)."""
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
    torch.testing.assert_close(grouped_mm(a64, b64, offs), per_group(a64, b64, offs))


# ---------------------------------------------------------------------------------------------------
# The dispatch rules (mahia.ops.dispatch.use_triton), shared by every op
# ---------------------------------------------------------------------------------------------------


@needs_kernels
def test_use_triton_sends_float64_meta_and_non_tensors_to_eager_silently():
    x = torch.randn(3, 4, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.use_triton("rms_norm", x, x)
        assert not dispatch.use_triton("rms_norm", x, x.double())  # float64 secondary input
        assert not dispatch.use_triton("rms_norm", x.double(), x)
        assert not dispatch.use_triton("rms_norm", x, torch.empty(4, device="meta"))
        assert not dispatch.use_triton("rms_norm", torch.empty(3, 4, device="meta"))
        assert not dispatch.use_triton("rms_norm", [1.0], x)
        assert dispatch.use_triton("moe_combine", x, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    assert "meta device" in ops.why_not(torch.empty(1, device="meta"))


@needs_kernels
def test_use_triton_unsupported_input_warns_once():
    dispatch.reset_fallback_warnings()
    x = torch.randn(3, 4, device=DEVICE)
    with pytest.warns(RuntimeWarning, match=r"mahia.ops.swiglu: Triton kernel not used \(too big\)"):
        assert not dispatch.use_triton("swiglu", x, unsupported="too big")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not dispatch.use_triton("swiglu", x, unsupported="too big")
        assert dispatch.use_triton("swiglu", x)
    dispatch.reset_fallback_warnings()


def test_the_cpu_probe_is_marked_constant_as_the_public_decorator_marks():
    """grouped_mm.py marks its CPU capability probe by hand (the public decorator imports torch._dynamo, seconds
    per process): the mark must be the one torch.compiler.assume_constant_result sets in this torch."""
    gm = importlib.import_module("mahia.ops.grouped_mm")  # mahia.ops.grouped_mm is also the function's name

    def probe():
        return True

    marked = torch.compiler.assume_constant_result(probe)
    marks = {k: v for k, v in vars(marked).items() if k.startswith("_dynamo")}
    assert marks == {"_dynamo_marked_constant": True}
    assert gm._native_cpu_supported._dynamo_marked_constant is True


def test_import_mahia_ops_does_not_import_dynamo():
    """``import mahia.ops`` (every notebook's) stays free of torch._dynamo: about 6 s of the H100 machine's host
    per process, paid again by each notebook that never compiles."""
    code = "import sys, mahia.ops; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=_REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_compiled_cpu_grouped_mm_has_no_graph_break(monkeypatch):
    """torch.compile of the CPU bfloat16 grouped matmul, whose backend choice calls the capability probe
    while tracing: one graph, no break, and the eager result."""
    gm = importlib.import_module("mahia.ops.grouped_mm")  # mahia.ops.grouped_mm is also the function's name

    monkeypatch.setattr(gm, "_cpu_grouped_mm_probe", {})  # not probed yet: the first call is traced
    monkeypatch.setenv("MAHIA_DISABLE_TRITON", "1")  # the CPU's own paths, not the interpreter
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch._grouped_mm")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 8, generator=g).bfloat16()
    b = torch.randn(2, 8, 4, generator=g).bfloat16()
    offs = torch.tensor([2, 6], dtype=torch.int32)
    explained = torch._dynamo.explain(grouped_mm)(a, b, offs)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    got = torch.compile(grouped_mm, backend="eager")(a, b, offs)
    assert torch.equal(got, grouped_mm(a, b, offs))
