"""mahia.measure.instruments: which ops launch a kernel, op counts, live memory, op traces and byte traffic
(sync counting is tested in test_foundation.py and with every sync-free path)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mahia.measure.instruments import (
    NO_KERNEL_OPS,
    ByteTraffic,
    LiveTensorMemory,
    OpTrace,
    count_ops,
    count_syncs,
    launches_kernel,
    trace_ops,
)

N, K, M = 37, 19, 11


@torch.library.custom_op("mahia_test_instruments::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin().cos()  # three ATen ops inside: the instruments see one custom op


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class _Launches(TorchDispatchMode):
    """(op name, launches_kernel) of every op dispatched."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.seen.append((func._schema.name.split("::")[-1], launches_kernel(func, out, args, kwargs)))
        return out


# --- which ops launch a kernel ---------------------------------------------------------------------


def test_launches_kernel_excludes_views_allocations_and_reads():
    x = torch.randn(4, 6)
    params = [torch.randn(3), torch.randn(5)]
    with _Launches() as mode:
        y = x.view(6, 4).t()  # views
        e = torch.empty(3)  # an allocation
        z = (y * 2).sum()  # two kernels
        z.item()  # a read to the host: a copy and a sync, no kernel
        torch._foreach_mul_(params, 2.0)  # in place, returns nothing, writes the list: a kernel
        w = _twice(x)  # a custom op: one kernel as far as the dispatcher sees
        with torch.profiler.record_function("range"):  # a profiler marker: nothing
            pass
    launched = [name for name, k in mode.seen if k]
    assert launched == ["mul", "sum", "_foreach_mul_", "twice"], mode.seen
    free = {name for name, k in mode.seen if not k}
    assert {"view", "t", "empty", "_local_scalar_dense"} <= free
    assert {"empty", "_local_scalar_dense", "detach"} <= NO_KERNEL_OPS
    del e, w


def test_count_ops_counts_work_not_views():
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    with count_ops() as c:
        y = (x @ w).view(-1)[:5].t()  # mm, then three views
        y = y + 1
    assert c.total == 2 and c.by_op["mm"] == 1


def test_count_ops_counts_custom_ops_and_multi_tensor_ops_not_reads():
    x = torch.randn(7)
    params = [torch.randn(3) for _ in range(4)]
    with count_ops() as c, count_syncs() as s:
        _twice(x)
        torch._foreach_add_(params, 1.0)
        torch.empty(5)
        x.sum().item()
    assert c.by_op == {"mahia_test_instruments.twice": 1, "_foreach_add_": 1, "sum": 1}
    assert c.total == 3 and s.count == 1  # the .item() is a sync, not a launch


class _LaunchMetadata:
    """What a compiled Triton launch hands its launch-enter hook (a LazyDict with the kernel's name)."""

    def __init__(self, name):
        self.data = {"name": name}


@torch.library.custom_op("mahia_test_instruments::triton_inside", mutates_args=())
def _triton_inside(x: torch.Tensor) -> torch.Tensor:
    import triton

    for name in ("k1", "k2"):  # as two compiled Triton launches inside a custom op would
        triton.knobs.runtime.launch_enter_hook(_LaunchMetadata(name))
    return x.clone()


def test_count_ops_counts_triton_launches_through_the_launch_hook():
    triton = pytest.importorskip("triton")
    runtime = triton.knobs.runtime
    x = torch.randn(5)
    with count_ops() as c:
        runtime.launch_enter_hook(_LaunchMetadata("my_kernel"))  # what a compiled launch calls
        y = x * 2
        _triton_inside(x)  # its two Triton kernels are counted, the custom op itself not again
    assert dict(c.by_op) == {"triton.my_kernel": 1, "mul": 1, "triton.k1": 1, "triton.k2": 1}
    assert c.total == 4
    runtime.launch_enter_hook(_LaunchMetadata("after"))  # the hook is gone once the block ends
    assert c.total == 4 and y.shape == x.shape


@pytest.mark.gpu
def test_count_ops_sees_the_triton_kernels_of_an_eager_op_on_cuda():
    from mahia import ops

    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    w = torch.ones(256, device="cuda", requires_grad=True)
    if not ops.triton_available_for(x):
        pytest.skip("Triton cannot run here")
    ops.rms_norm(x, w)  # compiled before counting
    with count_ops() as c:
        ops.rms_norm(x, w)
    assert c.total >= 1 and any(k.startswith("triton.") for k in c.by_op), dict(c.by_op)


def test_live_tensor_memory_tracks_allocations_and_frees():
    x = torch.randn(1000)  # before the mode: not counted
    with LiveTensorMemory() as mem:
        y = x * 2  # +4000
        z = y + 1  # +4000 -> 8000
        del y  # -4000
        w = z.view(10, 100)  # a view: nothing new
        z.add_(1)  # in place: nothing new
        u = torch.empty(250)  # +1000 -> 5000
    assert mem.peak == 8000 and mem.current == 5000
    del z, w, u
    assert mem.current == 0


def test_live_memory_ignores_in_place_and_views_of_tensors_made_before():
    x = torch.zeros(1000)  # 4000 bytes, allocated before the mode
    with LiveTensorMemory() as mem:
        x.mul_(2).add_(1)  # in place: nothing new
        v = x.view(10, 100)  # a view: nothing new
        torch.add(x, 1, out=x)  # out= into an old tensor: nothing new
        y = x * 2  # +4000
    assert mem.peak == 4000 and v.shape == (10, 100)
    del y


# --- op traces -------------------------------------------------------------------------------------


def test_trace_counts_kernels_bytes_and_flops_of_a_chain():
    x, w = torch.randn(N, K), torch.randn(K, M)
    tr = trace_ops(lambda x, w: (x * 2 + 1).relu() @ w, x, w)
    assert [o.name for o in tr.ops] == ["mul", "add", "relu", "mm"]
    assert [o.kind for o in tr.ops] == ["pointwise"] * 3 + ["matmul"]
    nx, nw, ny = 4 * N * K, 4 * K * M, 4 * N * M
    assert tr.kernels == 4
    assert tr.flops == 2 * N * K * M
    assert sum(o.bytes for o in tr.of_kind("pointwise")) == 3 * 2 * nx
    assert tr.bytes == 3 * 2 * nx + nx + nw + ny
    fused = tr.fused()
    assert (fused.regions, fused.kernels) == (1, 2)
    assert fused.pointwise_bytes == 2 * nx  # read x once, write relu(...) once for the mm


def test_fusion_stops_at_a_matmul_between_two_uses():
    # h feeds a matmul and, after it, the residual add: two regions, h written once and read twice.
    x, a, w = torch.randn(N, K), torch.randn(N, K), torch.randn(K, K)

    def block(x, a, w):
        h = x + a
        return h + h @ w

    tr = trace_ops(block, x, a, w)
    assert [o.level for o in tr.ops if o.kind != "free"] == [0, 0, 1]
    fused = tr.fused()
    assert fused.regions == 2 and fused.kernels == 3
    nx = 4 * N * K
    assert fused.pointwise_bytes == (2 * nx + nx) + (2 * nx + nx)  # = eager: nothing to fuse here
    assert fused.pointwise_bytes == sum(o.bytes for o in tr.of_kind("pointwise"))


def test_views_free_ops_and_outputs():
    x = torch.randn(N, 2 * K)

    def f(x):
        a, b = x.chunk(2, dim=-1)  # views: no kernel
        y = torch.sigmoid(a) * b  # fusable with its producer? a, b come from the input: one region
        return y, y * 3  # y is returned, so the region writes it and y * 3

    tr = trace_ops(f, x)
    assert tr.by_kind()["free"]["ops"] >= 1 and tr.kernels == 3
    fused = tr.fused()
    assert fused.regions == 1
    nx, ny = 4 * N * 2 * K, 4 * N * K
    assert fused.pointwise_bytes == nx + 2 * ny  # x read once (both halves), two outputs written


def test_in_place_writes_count_and_backward_is_traced():
    x = torch.randn(N, K, requires_grad=True)
    buf = torch.zeros(N, K)

    def f(x):
        buf.add_(x.detach())  # an in-place write must reach memory
        y = (x * x).sum()
        y.backward()
        return y

    tr = trace_ops(f, x)
    add = [o for o in tr.ops if o.name == "add_"][0]
    assert add.mutates and add.kind == "pointwise"
    assert len(tr.ops) > 4  # forward + backward ops
    assert any(o.name == "add_" for o in tr.ops)
    assert tr.fused().pointwise_bytes > 0


def test_trace_counts_attention_flops():
    q = torch.randn(2, 3, 17, 8)
    tr = trace_ops(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), q)
    mm = [o for o in tr.ops if o.kind == "matmul"]
    if mm:  # the CPU build dispatches to a fused SDPA op: one matmul-kind kernel
        assert mm[0].flops == 2 * 2 * 3 * 17 * 17 * 16 // 2
    else:  # the math path: bmm ops
        assert tr.flops > 0


def test_trace_rejects_non_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        trace_ops(3)


def test_trace_records_in_place_ops_that_return_nothing():
    params = [torch.randn(N, K) for _ in range(3)]
    grads = [torch.randn(N, K) for _ in range(3)]

    def step():
        torch._foreach_add_(params, grads, alpha=-0.1)  # returns nothing, writes params

    tr = trace_ops(step)
    (op,) = tr.ops
    nb = 4 * N * K
    assert op.kind == "pointwise" and op.mutates
    assert op.read_bytes == 6 * nb and op.write_bytes == 3 * nb
    assert tr.kernels == 1 and tr.fused().bytes == 6 * nb + 3 * nb  # written in place: it leaves the region
    assert isinstance(tr, OpTrace)


def test_trace_sees_a_fused_optimizer_step_as_one_opaque_kernel():
    p = torch.nn.Parameter(torch.randn(N, K))
    p.grad = torch.randn(N, K)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    opt.step()  # state exists
    tr = trace_ops(opt.step)
    fused = [o for o in tr.ops if o.name == "_fused_adamw_"]
    assert len(fused) == 1 and fused[0].kind == "opaque"
    nb = 4 * N * K
    # the parameter and both moments are written in place, and the gradient too by the schema (a grad
    # scaler's unscaling happens there)
    assert fused[0].write_bytes == 4 * nb
    assert fused[0].read_bytes >= 4 * nb  # and read with the gradient


# --- byte traffic ----------------------------------------------------------------------------------


def test_byte_traffic_counts_reads_and_writes_of_kernel_launching_ops():
    x, w = torch.randn(M, N), torch.randn(N)
    params = [torch.randn(K), torch.randn(K)]
    with ByteTraffic() as traffic:
        y = x * w  # reads x and w (broadcast: N once), writes y
        y.view(-1).t()  # a view: no row
        torch.empty(100)  # an allocation: no row
        torch._foreach_mul_(params, 3.0)  # writes its list in place
        y.expand(2, M, N).sum()  # a broadcast input counts its distinct elements once
    rows = traffic.rows
    assert [r["op"] for r in rows] == ["mul", "_foreach_mul_", "sum"]
    assert rows[0] == {"op": "mul", "read_bytes": 4 * (M * N + N), "written_bytes": 4 * M * N, "out_shape": f"{M}x{N}"}
    assert rows[1]["read_bytes"] == rows[1]["written_bytes"] == 2 * 4 * K
    assert rows[2]["read_bytes"] == 4 * M * N and rows[2]["written_bytes"] == 4


def test_count_syncs_keeps_the_sync_debug_modes_prototype_notice_out(monkeypatch):
    """09's and 10's H100 outputs showed 'Synchronization debug mode is a prototype feature ...' under every
    sync count: PyTorch prints it when the mode is turned on. count_syncs turns it on without the notice."""
    import warnings

    from mahia.measure.instruments import count_syncs

    modes = []

    def set_mode(mode):
        if mode == "warn":
            warnings.warn(
                "Synchronization debug mode is a prototype feature and does not yet detect all "
                "synchronizing operations",
                UserWarning,
                stacklevel=2,
            )
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with count_syncs() as r:
            torch.ones(2).sum()
    assert modes == ["warn", 0]
    assert not [w for w in caught if "prototype" in str(w.message)]
    assert r.cuda_syncs == 0


def test_trace_ops_records_triton_launches_outside_the_dispatcher():
    # Review 04-1 / 05-1: mahia's eager GLA scan launches Triton from an autograd Function, outside the
    # dispatcher, so the traced kernel count left it out while the profiler (and the compiled code) counted it.
    triton = pytest.importorskip("triton")
    runtime = triton.knobs.runtime
    x = torch.randn(5)

    def step(x):
        runtime.launch_enter_hook(_LaunchMetadata("gla_fwd_kernel"))  # what a direct compiled launch calls
        return _triton_inside(x * 2)  # a custom op: one opaque op, its inner launches not counted again

    tr = trace_ops(step, x)
    assert [(o.name, o.kind) for o in tr.ops if o.kind != "free"] == [
        ("triton.gla_fwd_kernel", "opaque"),
        ("mul", "pointwise"),
        ("triton_inside", "opaque"),
    ]
    assert tr.kernels == 3 and tr.ops[0].bytes == 0
    runtime.launch_enter_hook(_LaunchMetadata("after"))  # the hook is gone once the trace ends
    assert trace_ops(lambda: x + 1).kernels == 1


# --- float32 matrix products (Inductor's TF32 warning) ----------------------------------------------


class _Mixed(torch.nn.Module):
    """A bf16 product under autocast, and one kept in float32 outside it (as the MoE router does)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(K, M)
        self.router = torch.nn.Linear(K, 3)

    def forward(self, x):
        y = self.proj(x)  # autocast: bf16
        with torch.autocast("cpu", enabled=False):
            logits = self.router(x.float())  # float32 on purpose
        return y, logits


def test_float32_matmuls_sees_autocast_casts_and_names_the_module_and_function():
    from mahia.measure.instruments import float32_matmuls

    x = torch.randn(N, K)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        r = float32_matmuls(_Mixed(), x)
    assert r.by_dtype == {"bfloat16": 1, "float32": 1} and (r.count, r.total) == (1, 2)
    (p,) = r.products
    assert (p.op, p.a, p.b, p.count) == ("addmm", (N, K), (K, 3), 1)  # linear reaches the mode as addmm
    assert p.function == "_Mixed.forward" and p.module == "`router` (Linear)"


def test_float32_matmuls_counts_mm_bmm_and_ignores_other_dtypes_and_ops():
    from mahia.measure.instruments import float32_matmuls

    a, b = torch.randn(4, N, K), torch.randn(4, K, M)

    def f():
        for _ in range(3):
            a @ b  # bmm, float32, three times
        a[0] @ b[0]  # mm
        (a.double() @ b.double()).sum()  # float64: counted by dtype only
        torch.baddbmm(torch.zeros(4, N, M, dtype=torch.bfloat16), a.bfloat16(), b.bfloat16())
        return torch.sin(a)  # not a product

    r = float32_matmuls(f)
    assert [(p.op, p.a, p.b, p.count, p.module) for p in r.products] == [
        ("bmm", (4, N, K), (4, K, M), 3, None),
        ("mm", (N, K), (K, M), 1, None),
    ]
    assert r.by_dtype == {"float32": 4, "float64": 1, "bfloat16": 1}
    assert all(p.function.endswith("f") for p in r.products)
    with pytest.raises(TypeError, match="callable"):
        float32_matmuls(3)


def test_float32_matmuls_removes_its_hooks_and_a_custom_op_is_one_op():
    from mahia.measure.instruments import float32_matmuls

    lin = torch.nn.Linear(K, M)
    float32_matmuls(lin, torch.randn(2, K))
    assert not lin._forward_hooks and not lin._forward_pre_hooks
    # _twice's insides never reach the mode; no product at all
    assert float32_matmuls(_twice, torch.randn(3)).total == 0
