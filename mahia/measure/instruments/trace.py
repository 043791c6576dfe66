"""Op traces with bytes, FLOPs and the fusion estimate; float32 matrix products (Inductor's TF32 hint)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mahia.measure.instruments.counts import (
    _bare_name,
    _distinct_bytes,
    _kernel_name,
    _launches,
    _named,
    _on_triton_launch,
    _tensors,
    _written_tensors,
)

# Library kernels a compiler calls but does not fuse into (ATen names without the overload).
MATMUL_OPS = frozenset(
    {
        *("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "convolution", "_flash_attention_forward"),
        *("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"),
        *("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"),
        "_efficient_attention_forward",
    }
)
# ATen ops that launch a kernel a compiler keeps as is (data-dependent sizes, sorting, fused optimizer steps).
OPAQUE_ATEN_OPS = frozenset(
    {
        *("sort", "argsort", "topk", "nonzero", "unique", "_unique", "_unique2", "unique_consecutive"),
        *("masked_select", "multinomial", "randperm", "bincount"),
        *("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"),
    }
)

# The products Inductor checks before it warns that TF32 is available but off
# (torch._inductor.compile_fx.is_tf32_warning_applicable), with their two factors by schema argument name.
# linear and matmul are composite: they reach a dispatch mode as addmm/mm/bmm, in case a PyTorch hands them over.
_FACTORS = {
    "mm": ("self", "mat2"),
    "addmm": ("mat1", "mat2"),
    "bmm": ("self", "mat2"),
    "baddbmm": ("batch1", "batch2"),
    "linear": ("input", "weight"),
    "matmul": ("self", "other"),
}
FLOAT32_MATMUL_OPS = frozenset(_FACTORS)


def _matmul_flops(name: str, args: dict[str, Any]) -> int:
    """FLOPs of one matmul-like op: ``2 m k n``; attention ``2 B H T S (D + Dv)``, halved when causal (T = S),
    as the model's own counts (MFU) have it; 0 where unknown (convolution)."""
    s = {k: tuple(v.shape) for k, v in args.items() if isinstance(v, torch.Tensor)}
    if name in _FACTORS:
        a, b = _FACTORS[name]
        return 2 * math.prod(s[a]) * s[b][-1]
    if name == "_grouped_mm":  # (M, K) x (G, K, N) by groups of rows
        a, b = s["self"], s["mat2"]
        return 2 * a[0] * a[1] * b[2] if len(a) == 2 and len(b) == 3 else 0
    if "attention" in name:
        # SDPA takes (B, H, T, D); the _flash/_efficient_attention_forward ops take (B, T, H, D).
        q, k, v = s["query"], s["key"], s["value"]
        (B, H, T, D), S = (q, k[-2]) if name.startswith("_scaled") else ((q[0], q[2], q[1], q[3]), k[1])
        flops = 2 * B * H * T * S * (D + v[-1])
        return flops // 2 if args.get("is_causal") and T == S else flops
    return 0


@dataclass(frozen=True)
class OpRecord:
    """One dispatched op. ``reads``: (tensor id, bytes, view) per distinct input, where ``view`` = (storage offset,
    shape, strides) tells two views of one tensor apart; ``writes``: (tensor id, bytes). Views share their
    tensor's id; every write is a new id (a new version)."""

    name: str
    kind: str  # "matmul" | "opaque" | "pointwise" | "free"
    reads: tuple[tuple[int, int, tuple], ...]
    writes: tuple[tuple[int, int], ...]
    flops: int
    level: int  # matmul or opaque ops on the longest path from the inputs
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
    """What an ideal fusing compiler would launch and move (:meth:`OpTrace.fused`)."""

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
        """Pointwise ops joined by a data edge merge into one region (kernel) unless a matmul or opaque op lies
        between them (their level differs). A region reads each outside tensor once (each distinct view, at most
        the whole tensor) and writes only what leaves it: what another region, another op or the caller reads,
        and what an in-place op writes."""
        pw = [i for i, o in enumerate(self.ops) if o.kind == "pointwise"]
        parent = {i: i for i in pw}

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        producer: dict[int, int] = {}  # tensor id -> the pointwise op that wrote it
        for i in pw:
            o = self.ops[i]
            for tid, *_ in o.reads:
                j = producer.get(tid)
                if j is not None and self.ops[j].level == o.level:
                    parent[find(i)] = find(j)
            producer.update((tid, i) for tid, _ in o.writes)

        region_of = {i: find(i) for i in pw}
        readers: dict[int, set[int]] = {tid: {-1} for tid in self.outputs}  # tensor id -> regions (-1: any other)
        for i, o in enumerate(self.ops):
            for tid, *_ in o.reads if o.kind != "free" else ():
                readers.setdefault(tid, set()).add(region_of.get(i, -1))

        reads: dict[int, dict[int, dict]] = {}  # region -> tensor id -> view -> bytes
        writes: dict[int, dict[int, int]] = {}  # region -> tensor id -> bytes written
        inside: dict[int, set[int]] = {}  # region -> tensor ids written in it
        for i in pw:
            o, r = self.ops[i], region_of[i]
            done = inside.setdefault(r, set())
            for tid, b, view in o.reads:
                if tid not in done:
                    reads.setdefault(r, {}).setdefault(tid, {})[view] = b
            for tid, b in o.writes:
                done.add(tid)
                if o.mutates or any(x != r for x in readers.get(tid, ())):
                    writes.setdefault(r, {})[tid] = b
        roots = sorted(set(region_of.values()))
        region_bytes = tuple(
            int(sum(min(sum(v.values()), self.sizes.get(t, math.inf)) for t, v in reads.get(r, {}).items()))
            + sum(writes.get(r, {}).values())
            for r in roots
        )
        other = [o for o in self.ops if o.kind in ("matmul", "opaque")]
        pointwise = sum(region_bytes)
        return FusedEstimate(
            len(roots), len(roots) + len(other), pointwise, pointwise + sum(o.bytes for o in other), region_bytes
        )


class _Tracer(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[OpRecord] = []
        self.tids: dict[int, int] = {}  # id(tensor object) -> tensor id (aliases share one)
        self.levels: dict[int, int] = {}  # tensor id -> level
        self.sizes: dict[int, int] = {}  # tensor id -> bytes of the whole tensor
        self.keep: list[torch.Tensor] = []  # keeps traced tensors alive, so Python ids are not reused
        self.depth = 0  # dispatched ops running now: a Triton launch inside one belongs to that op

    def launched_triton(self, metadata=None) -> None:
        """A compiled Triton kernel launched from Python outside any op (an autograd Function calling its launcher):
        one opaque kernel the dispatcher never sees, its bytes unknown."""
        if not self.depth:
            self.ops.append(OpRecord(_kernel_name(metadata), "opaque", (), (), 0, 0, False))

    def new_id(self, t: torch.Tensor) -> int:
        self.keep.append(t)
        self.sizes[len(self.sizes) + 1] = _distinct_bytes(t)
        self.tids[id(t)] = len(self.sizes)
        return len(self.sizes)

    def tid(self, t: torch.Tensor) -> int:
        return self.tids[id(t)] if id(t) in self.tids else self.new_id(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.depth -= 1
        name, named = _bare_name(func), _named(func, args, kwargs)
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        written = _written_tensors(func, args, kwargs, out)
        if not _launches(func, written):
            kind = "free"  # a view, an allocation, a size query, .item(), or no tensor out
        elif func.namespace != "aten" or name in OPAQUE_ATEN_OPS:
            kind = "opaque"  # a custom op: one launch, not fusable
        else:
            kind = "matmul" if name in MATMUL_OPS else "pointwise"

        if kind == "free":
            alias = ins and (func.is_view or name in ("detach", "alias", "_unsafe_view"))
            for t in outs:  # a view keeps the id of the tensor it aliases; an allocation gets a fresh one
                if alias:
                    self.tids[id(t)] = self.tid(ins[0])
                    self.keep.append(t)
                else:
                    self.new_id(t)
            self.ops.append(OpRecord(name, kind, (), (), 0, 0, False))
            return out
        reads = {}
        for t in ins:
            reads.setdefault((self.tid(t), (t.storage_offset(), tuple(t.shape), tuple(t.stride()))), _distinct_bytes(t))
        level = max((self.levels.get(tid, 0) for tid, _ in reads), default=0)
        writes = []
        for t in written:  # a new version, also for an in-place op's output or mutated argument
            writes.append((self.new_id(t), _distinct_bytes(t)))
            self.levels[writes[-1][0]] = level + (kind != "pointwise")
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        flops = _matmul_flops(name, named) if kind == "matmul" else 0
        reads_t = tuple((tid, b, view) for (tid, view), b in reads.items())
        self.ops.append(OpRecord(name, kind, reads_t, tuple(writes), flops, level, mutates))
        return out


def trace_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> OpTrace:
    """Run ``fn(*args, **kwargs)`` once (backward too, if ``fn`` calls it) and record its ops. Kinds: ``matmul``
    (with FLOPs), ``opaque`` (custom ops, sorts, ``topk``, fused optimizer steps, and Triton kernels launched from
    Python outside any op, as ``triton.<kernel>`` without bytes), ``pointwise`` (every other launching op: what a
    compiler fuses) and ``free``. A tensor's bytes are those of its distinct elements. Eager code only; the
    tensors made are kept alive until the trace is built: trace small shapes."""
    if not callable(fn):
        raise TypeError(f"trace_ops: fn must be callable, got {type(fn).__name__}")
    tracer = _Tracer()
    with _on_triton_launch(tracer.launched_triton), tracer:
        result = fn(*args, **kwargs)
    outputs = frozenset(tracer.tids[id(t)] for t in _tensors(result) if id(t) in tracer.tids)
    return OpTrace(tracer.ops, outputs, tracer.sizes)


# --- Float32 matrix products (Inductor's TF32 hint) ---


@dataclass(frozen=True)
class Float32Product:
    """``count`` products of one op and pair of factor shapes with a float32 output; where they ran: the innermost
    Python function outside PyTorch (``function``) and the innermost submodule (``module``; None when untold)."""

    op: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    count: int
    function: str | None = None
    module: str | None = None


@dataclass
class Float32Matmuls:
    """The float32 products (first seen first) and every product's output dtype (``by_dtype``)."""

    products: list[Float32Product]
    by_dtype: Counter

    @property
    def count(self) -> int:
        return sum(p.count for p in self.products)

    @property
    def total(self) -> int:
        return sum(self.by_dtype.values())


_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


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
        if func.namespace == "aten" and name in _FACTORS and isinstance(out, torch.Tensor):
            self.by_dtype[str(out.dtype).removeprefix("torch.")] += 1
            if out.dtype == torch.float32:
                named = _named(func, args, kwargs)
                f = sys._getframe(1)  # the caller: the innermost frame outside PyTorch and this file
                while f is not None and (
                    f.f_code.co_filename.startswith(_TORCH_DIR) or f.f_code.co_filename == __file__
                ):
                    f = f.f_back
                caller = None if f is None else getattr(f.f_code, "co_qualname", f.f_code.co_name)
                a, b = (tuple(named[k].shape) for k in _FACTORS[name])
                self.float32[(name, a, b, caller, self.where[-1] if self.where else None)] += 1
        return out


def float32_matmuls(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Float32Matmuls:
    """Run ``fn(*args, **kwargs)`` once and return its matrix products with a float32 output; for an
    ``nn.Module`` each names the innermost submodule that ran it ("`blocks.1.mlp` (MoE)"; the class for the root).

    Why: on a GPU with TF32 off, Inductor warns "TensorFloat32 tensor cores ... available but not enabled" as soon
    as a graph holds such a product; in a bf16 model these are the products computed in float32 on purpose or by
    accident. The mode sees the ops after autocast's casts, and a custom op as one op, as Inductor does.
    """
    if not callable(fn):
        raise TypeError(f"float32_matmuls: fn must be callable, got {type(fn).__name__}")
    mode = _MatmulDtypes()
    hooks = []

    def enter(label: str) -> Callable[..., None]:
        return lambda *_: mode.where.append(label)  # None: a hook that returns a value would replace one

    def leave(*_) -> None:
        mode.where.pop()

    for qual, sub in fn.named_modules() if isinstance(fn, torch.nn.Module) else ():
        hooks.append(
            sub.register_forward_pre_hook(enter(f"`{qual}` ({type(sub).__name__})" if qual else type(sub).__name__))
        )
        hooks.append(sub.register_forward_hook(leave, always_call=True))
    try:
        with mode:
            fn(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return Float32Matmuls(
        [Float32Product(op, a, b, n, *w) for (op, a, b, *w), n in mode.float32.items()], mode.by_dtype
    )
