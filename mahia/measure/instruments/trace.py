"""Op traces with FLOPs and the fusion estimate; float32 matrix products (Inductor's TF32 hint)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mahia.measure.instruments.counts import (
    _bare_name,
    _distinct_bytes,
    _launches,
    _tensors,
    _TritonLaunchHook,
    _written_tensors,
)

# ---------------------------------------------------------------------------------------------------
# Op traces and the fusion estimate
# ---------------------------------------------------------------------------------------------------

# Library kernels a compiler calls but does not fuse into (ATen names without the overload).
MATMUL_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "_grouped_mm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    }
)
# ATen ops that launch a kernel a compiler keeps as is (data-dependent sizes, sorting, fused optimizer steps).
OPAQUE_ATEN_OPS = frozenset(
    {
        "sort",
        "argsort",
        "topk",
        "nonzero",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "masked_select",
        "multinomial",
        "randperm",
        "bincount",
        "_fused_adam_",
        "_fused_adamw_",
        "_fused_sgd_",
        "_fused_adagrad_",
    }
)


def _matmul_flops(name: str, args: dict[str, Any]) -> int:
    """FLOPs of one matmul-like op from its arguments (by schema name); 0 where unknown."""

    def shape(key):
        t = args.get(key)
        return tuple(t.shape) if isinstance(t, torch.Tensor) else None

    if name in ("mm", "addmm"):
        a, b = shape("mat1" if name == "addmm" else "self"), shape("mat2")
        return 2 * a[0] * a[1] * b[1] if a and b else 0
    if name in ("bmm", "baddbmm"):
        a, b = shape("batch1" if name == "baddbmm" else "self"), shape("batch2" if name == "baddbmm" else "mat2")
        return 2 * a[0] * a[1] * a[2] * b[2] if a and b else 0
    if name == "_grouped_mm":
        a, b = shape("self"), shape("mat2")
        if a and b and len(a) == 2 and len(b) == 3:  # (M, K) x (G, K, N) by groups of rows
            return 2 * a[0] * a[1] * b[2]
        return 0
    if "attention" in name:
        q, k, v = shape("query"), shape("key"), shape("value")
        if not (q and k and v):
            return 0
        # SDPA takes (B, H, T, D); the _flash/_efficient_attention_forward ops take (B, T, H, D).
        if name.startswith("_scaled_dot_product"):
            (B, H, T, D), S, Dv = q, k[-2], v[-1]
        else:
            (B, T, H, D), S, Dv = q, k[1], v[-1]
        flops = 2 * B * H * T * S * (D + Dv)
        return flops // 2 if args.get("is_causal") and T == S else flops
    return 0


@dataclass(frozen=True)
class OpRecord:
    """One dispatched op. ``reads``: (tensor id, bytes, view) per distinct input, where ``view`` =
    (storage offset, shape, strides) tells two views of one tensor apart; ``writes``: (tensor id, bytes).
    Views share the id of the tensor they alias."""

    name: str
    kind: str  # "matmul" | "opaque" | "pointwise" | "free"
    reads: tuple[tuple[int, int, tuple], ...]
    writes: tuple[tuple[int, int], ...]
    flops: int
    level: int
    mutates: bool

    @property
    def read_bytes(self) -> int:
        return sum(r[1] for r in self.reads)

    @property
    def write_bytes(self) -> int:
        return sum(b for _, b in self.writes)

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class FusedEstimate:
    """What an ideal fusing compiler would launch and move (see the module docstring)."""

    regions: int  # fused pointwise kernels
    kernels: int  # regions + matmul + opaque kernels
    pointwise_bytes: int  # bytes the fused regions move
    bytes: int  # all bytes: regions + matmul + opaque ops
    region_bytes: tuple[int, ...] = field(repr=False, default=())


@dataclass
class OpTrace:
    """The ops of one call of a function (:func:`trace_ops`)."""

    ops: list[OpRecord]
    outputs: frozenset[int]  # ids of the tensors the function returned
    sizes: dict[int, int] = field(default_factory=dict, repr=False)  # tensor id -> bytes of the whole tensor

    def of_kind(self, kind: str) -> list[OpRecord]:
        return [o for o in self.ops if o.kind == kind]

    @property
    def kernels(self) -> int:
        """Kernels eager PyTorch launches: one per op that is not free."""
        return sum(o.kind != "free" for o in self.ops)

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops)

    @property
    def bytes(self) -> int:
        """Bytes all kernels read and write in eager mode."""
        return sum(o.bytes for o in self.ops if o.kind != "free")

    @property
    def pointwise_bytes(self) -> int:
        return sum(o.bytes for o in self.of_kind("pointwise"))

    def by_kind(self) -> dict[str, dict[str, int]]:
        """{kind: {"ops", "bytes", "flops"}} for a table."""
        out: dict[str, dict[str, int]] = {}
        for o in self.ops:
            d = out.setdefault(o.kind, {"ops": 0, "bytes": 0, "flops": 0})
            d["ops"] += 1
            d["bytes"] += o.bytes if o.kind != "free" else 0
            d["flops"] += o.flops
        return out

    def fused(self) -> FusedEstimate:
        """Merge connected pointwise ops of equal level into regions; count their kernels and bytes."""
        pw = [i for i, o in enumerate(self.ops) if o.kind == "pointwise"]
        parent = {i: i for i in pw}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        producer: dict[int, int] = {}  # tensor id -> index of the pointwise op that wrote it last
        for i in pw:
            o = self.ops[i]
            for tid, *_ in o.reads:
                j = producer.get(tid)
                if j is not None and self.ops[j].level == o.level:
                    parent[find(i)] = find(j)
            for tid, _ in o.writes:  # every write is a fresh id, so a producer is never overwritten
                producer[tid] = i

        region_of = {i: find(i) for i in pw}
        # Which regions (or -1: a non-pointwise op, or the caller) read each tensor id.
        readers: dict[int, set[int]] = {}
        for i, o in enumerate(self.ops):
            if o.kind == "free":
                continue
            r = region_of.get(i, -1)
            for tid, *_ in o.reads:
                readers.setdefault(tid, set()).add(r)
        for tid in self.outputs:
            readers.setdefault(tid, set()).add(-1)

        reads: dict[int, dict[int, dict]] = {}  # region -> tensor id -> view -> bytes
        writes: dict[int, dict[int, int]] = {}  # region -> tensor id -> bytes written
        written_in: dict[int, dict[int, int]] = {}
        for i in pw:
            o, r = self.ops[i], region_of[i]
            inside = written_in.setdefault(r, {})
            for tid, b, view in o.reads:
                if tid not in inside:  # produced outside the region: each distinct view read once
                    reads.setdefault(r, {}).setdefault(tid, {})[view] = b
            for tid, b in o.writes:
                inside[tid] = b
                if o.mutates or any(x != r for x in readers.get(tid, ())):
                    writes.setdefault(r, {})[tid] = b
        roots = sorted(set(region_of.values()))

        def read_bytes(r: int) -> int:  # distinct views of a tensor, at most the whole tensor
            return sum(
                min(sum(views.values()), self.sizes.get(tid, math.inf)) for tid, views in reads.get(r, {}).items()
            )

        region_bytes = tuple(int(read_bytes(r)) + sum(writes.get(r, {}).values()) for r in roots)
        other = [o for o in self.ops if o.kind in ("matmul", "opaque")]
        pointwise_bytes = sum(region_bytes)
        return FusedEstimate(
            regions=len(roots),
            kernels=len(roots) + len(other),
            pointwise_bytes=pointwise_bytes,
            bytes=pointwise_bytes + sum(o.bytes for o in other),
            region_bytes=region_bytes,
        )


class _Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[OpRecord] = []
        self._tid: dict[int, int] = {}  # id(tensor object) -> tensor id (aliases share one)
        self._level: dict[int, int] = {}  # tensor id -> level
        self.sizes: dict[int, int] = {}  # tensor id -> bytes of the whole tensor
        self._keep: list[torch.Tensor] = []  # keeps traced tensors alive, so Python ids are not reused
        self._next = 0
        self._depth = 0  # dispatched ops running now: a Triton launch inside one belongs to that op

    def launched_triton(self, metadata=None) -> None:
        """Triton's launch-enter hook: a compiled Triton kernel launched from Python outside any dispatched op
        (an autograd Function calling its launcher, as mahia's eager fast paths do) is one opaque kernel that
        the dispatcher never sees; its tensors are unknown, so it records no bytes."""
        if self._depth:
            return
        data = getattr(metadata, "data", None)
        name = data.get("name", "kernel") if isinstance(data, dict) else "kernel"
        self.ops.append(OpRecord(f"triton.{name}", "opaque", (), (), 0, 0, False))

    def tid(self, t: torch.Tensor) -> int:
        key = id(t)
        if key not in self._tid:
            self._tid[key] = self._new_id(t)
        return self._tid[key]

    def _new_id(self, t: torch.Tensor) -> int:
        self._keep.append(t)
        self._next += 1
        self.sizes[self._next] = _distinct_bytes(t)
        return self._next

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self._depth -= 1
        name = _bare_name(func)
        schema_args = func._schema.arguments
        named = {a.name: v for a, v in zip(schema_args, args)} | dict(kwargs)
        mutated = {a.name for a in schema_args if a.alias_info is not None and a.alias_info.is_write}
        ins = _tensors((args, kwargs))
        outs = _tensors(out)
        written = outs or _written_tensors(func, args, kwargs, out)

        if not _launches(func, written):
            kind = "free"  # a view, an allocation, a size query, .item(), or no tensor out (promote_types)
        elif func.namespace != "aten":
            kind = "opaque"  # a custom kernel (torch.library op): one launch, not fusable
        elif name in MATMUL_OPS:
            kind = "matmul"
        elif name in OPAQUE_ATEN_OPS:
            kind = "opaque"
        else:
            kind = "pointwise"

        seen: set[int] = set()
        reads = []
        for t in ins:
            tid = self.tid(t)
            view = (t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            if (tid, view) not in seen:
                seen.add((tid, view))
                reads.append((tid, _distinct_bytes(t), view))
        level = max((self._level.get(r[0], 0) for r in reads), default=0)
        out_level = level + (kind in ("matmul", "opaque"))

        writes = []
        if kind == "free":
            for t in outs:
                # an alias (view) of the first input keeps its id; an allocation gets a fresh one
                self._tid[id(t)] = (
                    self.tid(ins[0])
                    if ins and (func.is_view or name in ("detach", "alias", "_unsafe_view"))
                    else self._new_id(t)
                )
                self._keep.append(t)
            reads = []
        for t in written if kind != "free" else ():
            new = self._new_id(t)  # a new version, also for an in-place op's output or mutated argument
            self._tid[id(t)] = new
            self._level[new] = out_level
            writes.append((new, _distinct_bytes(t)))
        flops = _matmul_flops(name, named) if kind == "matmul" else 0
        self.ops.append(OpRecord(name, kind, tuple(reads), tuple(writes), int(flops), level, bool(mutated)))
        return out


def trace_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> OpTrace:
    """Run ``fn(*args, **kwargs)`` once and record its ops (backward too, if ``fn`` calls it): the module
    docstring says what is recorded. A compiled Triton kernel launched from Python outside any dispatched op
    (seen by Triton's launch hook) is recorded as an opaque op ``triton.<kernel>`` with no bytes: the
    dispatcher never sees it, but eager mode launches it.

    The tensors it creates are kept alive until the trace is built, so trace small shapes or
    expect one extra step's worth of memory.
    """
    if not callable(fn):
        raise TypeError(f"trace_ops: fn must be callable, got {type(fn).__name__}")
    tracer = _Tracer()
    hook = _TritonLaunchHook(tracer.launched_triton)  # Triton kernels launched outside the dispatcher
    hook.install()
    try:
        with tracer:
            result = fn(*args, **kwargs)
    finally:
        hook.remove()
    out_ids = frozenset(
        tracer._tid[id(t)] for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor) and id(t) in tracer._tid
    )
    trace = OpTrace(tracer.ops, out_ids, dict(tracer.sizes))
    tracer._keep.clear()
    return trace


# ---------------------------------------------------------------------------------------------------
# Float32 matrix products (Inductor's TF32 hint)
# ---------------------------------------------------------------------------------------------------

# The products Inductor checks before it warns that TF32 is available but off
# (torch._inductor.compile_fx.is_tf32_warning_applicable). linear and matmul are composite: they reach a
# dispatch mode as addmm/mm/bmm already, and are listed in case a PyTorch hands them over whole.
FLOAT32_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul"})

# The two factors of each op, by schema argument name (addmm's and baddbmm's ``self`` is the added term).
_FACTORS = {
    "mm": ("self", "mat2"),
    "addmm": ("mat1", "mat2"),
    "bmm": ("self", "mat2"),
    "baddbmm": ("batch1", "batch2"),
    "linear": ("input", "weight"),
    "matmul": ("self", "other"),
}


@dataclass(frozen=True)
class Float32Product:
    """``count`` matrix products of one op and one pair of factor shapes with a float32 output; where they
    ran: the innermost Python function outside PyTorch that called them (``function``, its qualified name)
    and the innermost submodule running (``module``: qualified name and class; None when untold)."""

    op: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    count: int
    function: str | None = None
    module: str | None = None


@dataclass
class Float32Matmuls:
    """What :func:`float32_matmuls` saw: the float32 products (first seen first) and every product's
    output dtype (``by_dtype``: dtype name -> products, float32 included)."""

    products: list[Float32Product]
    by_dtype: Counter

    @property
    def count(self) -> int:
        return sum(p.count for p in self.products)

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())


_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


def _caller() -> str | None:
    """The qualified name of the innermost function on the stack outside PyTorch and this module."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(_TORCH_DIR) or f.f_code.co_filename == __file__):
        f = f.f_back
    return None if f is None else getattr(f.f_code, "co_qualname", f.f_code.co_name)


class _MatmulDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.where: list[str] = []  # the submodules running now, outermost first
        self.float32: Counter = Counter()  # (op, a, b, function, module) -> calls, in first-seen order
        self.by_dtype: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _bare_name(func)
        if func.namespace == "aten" and name in FLOAT32_MATMUL_OPS and isinstance(out, torch.Tensor):
            self.by_dtype[str(out.dtype).removeprefix("torch.")] += 1
            if out.dtype == torch.float32:
                named = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
                a, b = (tuple(named[k].shape) for k in _FACTORS[name])
                self.float32[(name, a, b, _caller(), self.where[-1] if self.where else None)] += 1
        return out


def float32_matmuls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Float32Matmuls:
    """Run ``fn(*args, **kwargs)`` once and return the matrix products (:data:`FLOAT32_MATMUL_OPS`) whose
    output is float32, with their factor shapes and counts; where ``fn`` is an ``nn.Module``, each product
    also names the innermost submodule that ran it ("`blocks.1.mlp` (MoE)"; the class alone for the root).

    Why: on a GPU with TF32 (sm 8.0 or newer) and TF32 off, Inductor warns "TensorFloat32 tensor cores ...
    available but not enabled" once per process, as soon as a graph it compiles holds such a product. In a
    bf16 model these are the products computed in float32 on purpose (or by accident); this names them.
    The mode sees the ops after autocast's casts, so an autocast-covered product shows its autocast dtype.
    It runs on any device, but sees what this device runs: a custom op counts as one op, as it does for
    Inductor, while a PyTorch fallback that runs instead of a GPU's Triton kernel shows its products.
    """
    if not callable(fn):
        raise TypeError(f"float32_matmuls: fn must be callable, got {type(fn).__name__}")
    mode = _MatmulDtypes()
    hooks = []

    def enter(label: str) -> Callable[..., None]:
        return lambda *_: mode.where.append(label)  # None: a hook that returns a value would replace one

    def leave(*_) -> None:
        mode.where.pop()

    if isinstance(fn, torch.nn.Module):
        for qual, sub in fn.named_modules():
            label = f"`{qual}` ({type(sub).__name__})" if qual else type(sub).__name__
            hooks.append(sub.register_forward_pre_hook(enter(label)))
            hooks.append(sub.register_forward_hook(leave, always_call=True))
    try:
        with mode:
            fn(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    products = [Float32Product(op, a, b, n, *where) for (op, a, b, *where), n in mode.float32.items()]
    return Float32Matmuls(products, mode.by_dtype)
