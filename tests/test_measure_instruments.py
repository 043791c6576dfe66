"""mahia.measure.instruments: which ops launch a kernel, op counts, live memory, op traces with FLOPs and the fusion
estimate, byte traffic and float32 products (sync counting: test_foundation.py and every sync-free path)."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mahia.measure.instruments import ByteTraffic, LiveTensorMemory, count_ops, count_syncs, float32_matmuls, trace_ops

N, K, M = 37, 19, 11


@torch.library.custom_op("mahia_test_instruments::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin().cos()  # three ATen ops inside: the instruments see one custom op


@_twice.register_fake
def _(x):
    return torch.empty_like(x)


class _LaunchMetadata:  # what a compiled Triton launch hands its launch-enter hook (a LazyDict with the kernel's name)
    def __init__(self, name):
        self.data = {"name": name}


@torch.library.custom_op("mahia_test_instruments::triton_inside", mutates_args=())
def _triton_inside(x: torch.Tensor) -> torch.Tensor:
    import triton

    for name in ("k1", "k2"):  # as two compiled Triton launches inside a custom op would
        triton.knobs.runtime.launch_enter_hook(_LaunchMetadata(name))
    return x.clone()


def test_count_ops_counts_kernels_not_views_allocations_reads_or_markers():
    x, w = torch.randn(4, 5), torch.randn(5, 3)
    params = [torch.randn(3) for _ in range(4)]
    with count_ops() as c, count_syncs() as s:
        y = (x @ w).view(-1)[:5].t() + 1  # mm, three views, add
        torch.empty(5)  # an allocation
        y.sum().item()  # a read to the host: a copy and a sync, no kernel
        torch._foreach_add_(params, 1.0)  # in place, returns nothing, writes the list: a kernel
        _twice(x)  # a custom op: one kernel as far as the dispatcher sees
        with torch.profiler.record_function("range"):  # a profiler marker: nothing
            pass
    assert c.by_op == {"mm": 1, "add": 1, "sum": 1, "_foreach_add_": 1, "mahia_test_instruments.twice": 1}
    assert c.total == 5 and s.count == 1


def test_triton_launches_are_counted_and_traced_through_the_launch_hook():
    # Review 04-1 / 05-1: mahia's eager GLA scan launches Triton from an autograd Function, outside the dispatcher
    runtime = pytest.importorskip("triton").knobs.runtime
    x = torch.randn(5)

    def step(x):
        runtime.launch_enter_hook(_LaunchMetadata("gla_fwd"))  # what a direct compiled launch calls
        return _triton_inside(x * 2)  # a custom op whose two Triton kernels the hook sees

    with count_ops() as c:
        step(x)
    assert c.by_op == {"triton.gla_fwd": 1, "mul": 1, "triton.k1": 1, "triton.k2": 1}  # the custom op not again
    tr = trace_ops(step, x)  # a trace records the custom op as one opaque op, its inner launches not again
    kinds = [(o.name, o.kind) for o in tr.ops if o.kind != "free"]
    assert kinds == [("triton.gla_fwd", "opaque"), ("mul", "pointwise"), ("triton_inside", "opaque")]
    assert tr.ops[0].bytes == 0
    runtime.launch_enter_hook(_LaunchMetadata("after"))  # the hooks are gone once the blocks end
    assert c.total == 4 and trace_ops(lambda: x + 1).kernels == 1


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


def test_live_tensor_memory_tracks_allocations_and_frees_not_views_or_in_place():
    x = torch.zeros(1000)  # 4000 bytes, made before the mode: not counted
    with LiveTensorMemory() as mem:
        x.mul_(2).add_(1)  # in place: nothing new
        torch.add(x, 1, out=x)  # out= into an old tensor: nothing new
        y = x * 2  # +4000
        z = y + 1  # +4000 -> 8000
        del y  # -4000
        w = z.view(10, 100)  # a view: nothing new
        u = torch.empty(250)  # +1000 -> 5000
    assert mem.peak == 8000 and mem.current == 5000
    del z, w, u
    assert mem.current == 0


def test_trace_counts_kernels_bytes_and_flops_and_fuses_a_chain():
    x, w = torch.randn(N, K), torch.randn(K, M)
    tr = trace_ops(lambda x, w: (x * 2 + 1).relu() @ w, x, w)
    assert [(o.name, o.kind) for o in tr.ops] == [(n, "pointwise") for n in ("mul", "add", "relu")] + [("mm", "matmul")]
    nx, nw, ny = 4 * N * K, 4 * K * M, 4 * N * M
    assert (tr.kernels, tr.flops, tr.bytes) == (4, 2 * N * K * M, 3 * 2 * nx + nx + nw + ny)
    fused = tr.fused()
    assert (fused.regions, fused.kernels) == (1, 2)
    assert fused.pointwise_bytes == 2 * nx  # read x once, write relu(...) once for the mm
    with pytest.raises(TypeError, match="trace_ops: fn must be callable"):
        trace_ops(3)


def test_fusion_stops_at_a_matmul_between_two_uses_and_a_region_writes_what_the_caller_reads():
    x, a, w = torch.randn(N, K), torch.randn(N, K), torch.randn(K, K)
    tr = trace_ops(lambda x, a, w: (h := x + a) + h @ w, x, a, w)  # h feeds the mm and, after it, the add
    assert [o.level for o in tr.ops if o.kind != "free"] == [0, 0, 1]  # the second add reads the mm
    fused = tr.fused()
    assert fused.regions == 2 and fused.kernels == 3
    nx = 4 * N * K
    assert fused.pointwise_bytes == 2 * (2 * nx + nx) == sum(o.bytes for o in tr.of_kind("pointwise"))  # as eager

    def f(x):  # views are free, and a region writes what the caller reads
        a, b = x.chunk(2, dim=-1)  # views: no kernel
        y = torch.sigmoid(a) * b  # a and b come from the input: one region
        return y, y * 3  # y is returned, so the region writes it and y * 3

    tr = trace_ops(f, torch.randn(N, 2 * K))
    assert tr.by_kind()["free"]["ops"] >= 1 and tr.kernels == 3
    fused = tr.fused()
    assert fused.regions == 1
    assert fused.pointwise_bytes == 4 * N * 2 * K + 2 * 4 * N * K  # x read once (both halves), two outputs written


def test_in_place_writes_leave_the_region_and_backward_and_fused_steps_are_traced():
    params, grads = [torch.randn(N, K) for _ in range(3)], [torch.randn(N, K) for _ in range(3)]
    (op,) = trace_ops(lambda: torch._foreach_add_(params, grads, alpha=-0.1)).ops  # returns nothing, writes params
    nb = 4 * N * K
    assert op.kind == "pointwise" and op.mutates and op.read_bytes == 6 * nb and op.write_bytes == 3 * nb
    x = torch.randn(N, K, requires_grad=True)
    tr = trace_ops(lambda: (x * x).sum().backward())
    assert [o.name for o in tr.ops if o.kind != "free"][:2] == ["mul", "sum"] and tr.kernels > 3  # and backward
    p = torch.nn.Parameter(torch.randn(N, K))
    p.grad = torch.randn(N, K)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    opt.step()  # state exists
    (adam,) = [o for o in trace_ops(opt.step).ops if o.name == "_fused_adamw_"]
    # parameter, both moments and (by the schema: a grad scaler unscales there) the gradient are written in place
    assert adam.kind == "opaque" and adam.write_bytes == 4 * nb and adam.read_bytes >= 4 * nb


@pytest.mark.parametrize("fn", [
    lambda a, b, q: a @ b, lambda a, b, q: torch.addmm(b[0], a, b),
    lambda a, b, q: torch.bmm(q[0], q[1].transpose(-1, -2)), lambda a, b, q: F.scaled_dot_product_attention(q, q, q),
])  # fmt: skip
def test_trace_flops_are_torchs_flop_counts_and_causal_attention_counts_half(fn):
    # MFU divides by these: they must not move when a counter changes
    a, b, q = torch.randn(N, K), torch.randn(K, K), torch.randn(2, 3, 17, 8)
    with FlopCounterMode(display=False) as fc:
        fn(a, b, q)
    if fc.get_total_flops():  # the CPU's fused SDPA op has no torch formula: 2 B H T S (D + Dv)
        assert trace_ops(fn, a, b, q).flops == fc.get_total_flops()
    else:
        assert trace_ops(fn, a, b, q).flops == 2 * 2 * 3 * 17 * 17 * (8 + 8)
    causal = trace_ops(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert causal.flops == 2 * 3 * 17 * 17 * (8 + 8)  # half the scores


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
    # PyTorch warns 'Synchronization debug mode is a prototype feature' as the mode turns on (every count on a GPU)
    modes = []

    def set_mode(mode):
        if mode == "warn":
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all", stacklevel=2)
        modes.append(mode)

    for name, value in (("is_available", lambda: True), ("is_initialized", lambda: True), ("get_sync_debug_mode", lambda: 0),
                        ("set_sync_debug_mode", set_mode), ("synchronize", lambda *a: None)):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with count_syncs() as r:
            torch.ones(2).sum()
    assert modes == ["warn", 0] and r.cuda_syncs == 0
    assert not [w for w in caught if "prototype" in str(w.message)]


class _Mixed(torch.nn.Module):
    """A bf16 product under autocast, and one kept in float32 outside it (as the MoE router does)."""

    def __init__(self):
        super().__init__()
        self.proj, self.router = torch.nn.Linear(K, M), torch.nn.Linear(K, 3)

    def forward(self, x):
        y = self.proj(x)  # autocast: bf16
        with torch.autocast("cpu", enabled=False):
            return y, self.router(x.float())  # float32 on purpose


def test_float32_matmuls_sees_autocast_casts_and_names_the_module_and_function():
    mixed = _Mixed()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        r = float32_matmuls(mixed, torch.randn(N, K))
    assert r.by_dtype == {"bfloat16": 1, "float32": 1} and (r.count, r.total) == (1, 2)
    (p,) = r.products  # linear reaches the mode as addmm
    assert (p.op, p.a, p.b, p.count) == ("addmm", (N, K), (K, 3), 1)
    assert (p.function, p.module) == ("_Mixed.forward", "`router` (Linear)")
    assert not mixed.proj._forward_hooks and not mixed.proj._forward_pre_hooks  # its hooks are gone

    a, b = torch.randn(4, N, K), torch.randn(4, K, M)

    def f():
        for _ in range(3):
            a @ b  # bmm, float32, three times
        (a.double() @ b.double()).sum()  # float64: counted by dtype only
        torch.baddbmm(torch.zeros(4, N, M, dtype=torch.bfloat16), a.bfloat16(), b.bfloat16())
        return _twice(a)  # a custom op is one op, as for Inductor: its insides are not seen

    r = float32_matmuls(f)
    assert [(p.op, p.a, p.b, p.count, p.module) for p in r.products] == [("bmm", (4, N, K), (4, K, M), 3, None)]
    assert r.by_dtype == {"float32": 3, "float64": 1, "bfloat16": 1} and r.products[0].function.endswith("f")
    with pytest.raises(TypeError, match="float32_matmuls: fn must be callable"):
        float32_matmuls(3)
