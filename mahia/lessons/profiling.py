"""The evidence a notebook shows beside a timing: :func:`profile_calls` runs a call a few times under
``torch.profiler`` and returns a :class:`Profile`, per call: ``wall_ms`` (the profiler's own few µs per operator
included); ``busy_ms``, the device time of the kernels (``busy = busy_ms / wall_ms`` near 1: faster kernels pay;
far below: the device waits for the host); ``launches``; ``top``, the kernels by name, and ``ops``, the operators
by their own time (``by_group`` sums them into groups). A CPU has no kernels: there both list the host's
operators, ``busy_ms`` is their sum and ``launches`` counts the top-level ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from mahia.measure.checks import check_int
from mahia.profile import quiet_profiler_notices

# Kernel (or operator) names of matrix products: cuBLAS/cuBLASLt (``sm80_xmma_gemm_...``, gemv, split-K's reduction,
# Hopper's ``nvjet_...``), CUTLASS, Inductor's templates (``triton_tem_fused_mm_0``); on a CPU, aten ops.
_MATMUL = r"gemm|gemv|matmul|xmma|wgmma|cutlass|nvjet|splitKreduce|triton_tem_\w*mm|aten::(?:mm|bmm|addmm|baddbmm)"
# Fused attention's names say matrix product too (flash's ``cutlass::`` types, cuDNN's ``_sdpa_..._wgmma_``): left out.
_ATTENTION = r"flash|fmha|sdpa|attention"
MATMUL_KERNELS = rf"(?i)^(?!.*(?:{_ATTENTION}))(?=.*(?:{_MATMUL}))"

# Operators (name prefixes) whose own time is a matrix product; a kernel's time is charged to the operator
# that launched it. mahia's grouped GEMM: compiled, its custom op; eager, its autograd Function.
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_grouped_mm", "aten::addbmm")
MATMUL_OPS += ("mahia::moe_grouped_mm", "_GroupedMM")
# The GLA scan is a group of its own (its kernels do decays and cumulative sums besides the chunk products):
# eager its autograd Function, compiled its custom ops.
SCAN_OPS = ("_GLAFunction", "mahia::gla_", "GeneratedBackwardFor_mahia_gla_")
# Every SDPA backend's forward and backward (cuDNN's is the default on an H100 with torch 2.11).
ATTENTION_OPS = ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention")
ATTENTION_OPS += ("aten::_cudnn_attention",)
# Rows that are no operator's work: the profiler's own, and the driver's full-launch-queue marker.
_NOT_WORK = ("Activity Buffer Request", "ProfilerStep", "[memory]", "Command Buffer Full")

# What a templated kernel computes: its functor (``CUDAFunctor_add``, ``MulFunctor``, ``MeanOps``) or the op's
# function whose lambda it runs, which takes a TensorIterator (``direct_copy_kernel_cuda(at::TensorIteratorBase&)``).
_HINT = re.compile(r"\w*[Ff]unctor\w*|\w+Ops?\b|\w+(?=\(at::TensorIterator)")
# Generic launchers whose template argument is the kernel itself (``cutlass::Kernel2<cutlass_80_..._gemm_...>``).
_LAUNCHERS = {"Kernel", "Kernel2", "device_kernel"}


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel's name without namespaces, template arguments or parameter lists, cut to ``width``. Of a
    templated kernel, with a hint at what it computes where its arguments give one
    (``vectorized_elementwise_kernel<CUDAFunctor_add>``); of a generic launcher (``cutlass::Kernel2<...>``),
    the kernel it launches."""
    s = name.replace("(anonymous namespace)::", "")  # the one parenthesis inside a qualified name
    # A C++ signature "void ns::kernel<...>(args)"; not "Memcpy DtoD (Device -> Device)".
    if s.startswith("void ") or re.search(r"\w[<(]", s):
        i = re.search(r"[<(]|$", s).start()
        head = s[:i].split()
        args = s[i + 1 :] if s[i : i + 1] == "<" else ""  # the template arguments (and the parameters: same hints)
        func = head[-1].split("::")[-1] if head else s
        launched = re.match(r"[A-Za-z_][\w:]*", args)
        hints = _HINT.findall(args)
        if func in _LAUNCHERS and launched:
            s = launched.group().split("::")[-1]
        else:  # the last hint: the innermost functor (``BinaryFunctor<..., MulFunctor<float>>``)
            s = f"{func}<{hints[-1]}>" if hints else func
    return s if len(s) <= width else s[: width - 1] + "…"


def tile_shape(name: str) -> tuple[int, int] | None:
    """The output tile (rows, columns) a matmul kernel's name states, as cuBLAS (``tilesize128x128x64``) and
    CUTLASS (``..._128x256_64x3_...``) and older cuBLAS (``ampere_sgemm_128x64_tn``) name their kernels; None
    when the name states none."""
    m = (
        re.search(r"tilesize(\d+)x(\d+)", name)
        or re.search(r"_(\d+)x(\d+)_\d+x\d+", name)
        or re.search(r"_(\d+)x(\d+)_(?:tn|nt|nn|tt)\b", name)
    )
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass
class Profile:
    """Per call, averaged over the profiled calls (see the module docstring). ``top`` and ``ops``: indexed by
    name, columns ``calls``, ``ms`` (per call) and ``share`` (of the table's total), longest first."""

    device: str  # "cuda" or "cpu"
    wall_ms: float
    busy_ms: float
    launches: float
    top: pd.DataFrame
    ops: pd.DataFrame

    @property
    def busy(self) -> float:
        """``busy_ms / wall_ms``: on a GPU the share of the profiled wall time the device runs kernels."""
        return self.busy_ms / self.wall_ms if self.wall_ms > 0 else float("nan")

    def ms(self, pattern: str) -> float:
        """ms per call of the rows of :attr:`top` whose name matches ``pattern`` (a regex, case-insensitive)."""
        return float(self.top.loc[self.top.index.str.contains(pattern, case=False, regex=True), "ms"].sum())

    def table(self, rows: int = 6) -> pd.DataFrame:
        """The longest ``rows`` kernels (operators on a CPU), with short names."""
        t = self.top.head(rows)
        return t.set_axis([short_kernel_name(n) for n in t.index]).rename_axis(self._what())

    def by_group(self, groups: Mapping[str, Sequence[str]]) -> pd.Series:
        """ms per call of :attr:`ops` summed into ``groups`` (name -> operator-name prefixes; an operator goes
        to the first group one of whose prefixes starts its name) and ``"other"``."""
        of = [next((g for g, p in groups.items() if n.startswith(tuple(p))), "other") for n in self.ops.index]
        return self.ops["ms"].groupby(of).sum().reindex([*groups, "other"], fill_value=0.0)

    def summary(self) -> dict[str, float]:
        """The profile's numbers, named for what they are on its device: a row of a table."""
        cuda = ("kernel ms", "launches", "device busy")
        names = cuda if self.device == "cuda" else ("operator ms (CPU)", "top-level operators", "operators' share")
        return dict(zip(("profiled ms", *names), (self.wall_ms, self.busy_ms, self.launches, self.busy), strict=True))

    def _what(self) -> str:
        return "kernel" if self.device == "cuda" else "operator (CPU)"


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence what native code writes to file descriptor 2 while profiling (the profiler's start/stop log
    lines, which a notebook's kernel would otherwise forward into the cell's output)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _table(rows: list, calls: int) -> pd.DataFrame:
    """(name, count, µs) rows -> calls and ms per call, and share, by name, longest first."""
    t = pd.DataFrame(rows, columns=["name", "calls", "ms"]).set_index("name") / [calls, calls * 1e3]
    t = t[~t.index.str.startswith(_NOT_WORK)].sort_values("ms", ascending=False)
    return t.assign(share=t["ms"] / t["ms"].sum() if t["ms"].sum() > 0 else 0.0)


@quiet_profiler_notices
def profile_calls(fn: Callable[[], object], device: str | torch.device, *, calls: int = 3, warmup: int = 1) -> Profile:
    """Run ``fn()`` ``warmup`` times, then ``calls`` times under ``torch.profiler`` (see the module docstring)."""
    if not callable(fn):
        raise TypeError(f"profile_calls: fn must be callable, got {type(fn).__name__}")
    check_int("profile_calls", "calls", calls)
    check_int("profile_calls", "warmup", warmup, minimum=0)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with quiet_native_stderr(), torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3 / calls
    host = torch.autograd.DeviceType.CPU
    # Ranges (record_function) also appear on the device timeline as "user annotations" spanning their
    # kernels: left out, or their kernels would count twice.
    avg = [e for e in prof.key_averages() if not getattr(e, "is_user_annotation", False)]
    # Operators by their own time: on a GPU the device time of the kernels each launched itself, so no kernel
    # counts twice; on a CPU their own host time, so nested operators do not count twice.
    ops = _table([(e.key, e.count, e.self_device_time_total if cuda else e.self_cpu_time_total)
                  for e in avg if e.device_type == host], calls)  # fmt: skip
    if cuda:  # device events: kernels, copies and fills
        top = _table([(e.key, e.count, e.self_device_time_total) for e in avg if e.device_type != host], calls)
        launches = top["calls"].sum()
    else:
        top = ops
        launches = sum(e.cpu_parent is None for e in prof.events() if e.device_type == host) / calls
    return Profile(dev.type, wall_ms, float(top["ms"].sum()), float(launches), top, ops)


def compare(before: Profile, after: Profile, rows: int = 6) -> pd.DataFrame:
    """Where two profiles of the same work differ: ms per call of each kernel (operator on a CPU) in both and
    the difference, largest first (by size); names are shortened, and rows with the same short name added."""
    if before.device != after.device:
        raise ValueError(f"compare: profiles of different devices ({before.device}, {after.device})")
    per_name = [p.top["ms"].groupby([short_kernel_name(n) for n in p.top.index]).sum() for p in (before, after)]
    t = pd.concat(per_name, axis=1, keys=["ms before", "ms after"]).fillna(0.0)
    t["after - before"] = t["ms after"] - t["ms before"]
    return t.loc[t["after - before"].abs().sort_values(ascending=False).index[:rows]].rename_axis(before._what())
