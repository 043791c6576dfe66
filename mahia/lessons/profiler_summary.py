"""The evidence notebooks 00-04 show for their explanations: a ``torch.profiler`` summary of a call, by kernel.

A notebook that says *why* a result came out as it did shows the measurement the reason rests on. The
most common one: where the time of a call goes. :func:`profile_calls` runs a function a few times under
``torch.profiler`` and returns a :class:`ProfileSummary`:

* on a GPU, the device time of the kernels (and copies) against the wall time of a call, the number of
  kernels, and every kernel by name, longest first. Kernel time close to the wall time: the device is busy
  and faster kernels pay. Far below: the device waits for the host (Python, dispatch, launches, syncs);
* on a CPU there are no kernels: the same summary lists the host's operators (``aten::...``) by their own
  time, against the wall time, and its sentence says that it is CPU evidence.

    s = profile_calls(lambda: manual_attention(q, k, v), device)
    s.table()                       # the longest kernels (operators on a CPU), ms per call, share
    s.sentence("the manual path")   # one sentence of measured numbers
    s.ms_matching(MATMUL_KERNELS)   # ms per call of the kernels whose name matches
    compare(before, after)          # where two profiles of the same work differ

The wall time is measured around the profiled calls, so it includes the profiler's own overhead (a few µs
per operator): compare it with the kernel time of the same summary, not with ``bench``. (Notebooks 05-10
use :mod:`mahia.lessons.profile_evidence`, which reports by operator through :mod:`mahia.profile`.)
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from mahia.measure.checks import check_int
from mahia.profile import quiet_profiler_notices

__all__ = [
    "ProfileSummary",
    "duration",
    "profile_calls",
    "compare",
    "short_kernel_name",
    "tile_shape",
    "MATMUL_KERNELS",
    "quiet_native_stderr",
]

# Kernel (or operator) names of matrix products. On a GPU: cuBLAS/cuBLASLt (``sm80_xmma_gemm_...``,
# ``ampere_sgemm_...``, gemv, split-K's reduction, and on Hopper the ``nvjet_...`` family), CUTLASS and
# Inductor's matmul templates (``triton_tem_fused_mm_0``); on a CPU, aten ops.
_MATMUL = r"gemm|gemv|matmul|xmma|wgmma|cutlass|nvjet|splitKreduce|triton_tem_\w*mm|aten::(?:mm|bmm|addmm|baddbmm)"
# Fused attention runs matrix products too, and its names say so (``cutlass::`` types in flash's template
# arguments, cuDNN's ``..._sdpa_..._wgmma_...``); it is attention, not a matrix product, so it is left out.
_ATTENTION = r"flash|fmha|sdpa|attention"
MATMUL_KERNELS = rf"(?i)^(?!.*(?:{_ATTENTION}))(?=.*(?:{_MATMUL}))"

# What a templated kernel computes, from its template arguments: PyTorch passes a functor
# (``CUDAFunctor_add``, ``MulFunctor``, ``sum_functor``, ``MeanOps``) or a lambda written inside the op's
# function, which takes a TensorIterator (``direct_copy_kernel_cuda(at::TensorIteratorBase&)``).
_HINT = re.compile(r"\w*[Ff]unctor\w*|\w+Ops?\b|\w+(?=\(at::TensorIterator)")
# Generic launchers whose template argument is the kernel itself (``cutlass::Kernel2<cutlass_80_..._gemm_...>``).
_LAUNCHERS = {"Kernel", "Kernel2", "device_kernel"}


def _closing(s: str, i: int) -> int:
    """The index of the bracket that closes the one at ``s[i]``, ``len(s)`` if none does."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "<([{":
            depth += 1
        elif s[j] in ">)]}":
            depth -= 1
            if depth == 0:
                return j
    return len(s)


def pct(x: float) -> str:
    """A share as a percentage that never rounds a small nonzero share to "0%" (0.004 is "0.4%")."""
    return f"{x:.0%}" if x == 0 or abs(x) >= 0.01 else f"{x:.1%}"


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel's name without namespaces, template arguments or parameter lists, cut to ``width``. Of a
    templated kernel, with a hint at what it computes where its arguments give one
    (``vectorized_elementwise_kernel<CUDAFunctor_add>``, ``elementwise_kernel<direct_copy_kernel_cuda>``);
    of a generic launcher (``cutlass::Kernel2<...>``), the kernel it launches."""
    s = name.replace("(anonymous namespace)::", "")  # the one parenthesis inside a qualified name
    # A C++ signature "void ns::kernel<...>(args)"; not "Memcpy DtoD (Device -> Device)".
    if s.startswith("void ") or re.search(r"\w[<(]", s):
        i = re.search(r"[<(]|$", s).start()
        head = s[:i].split()
        args = s[i + 1 : _closing(s, i)] if s[i : i + 1] == "<" else ""
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


def duration(ms: float) -> str:
    """A time given in ms, written in µs below a millisecond ("1.05 µs", "673 µs", "2.64 ms"), to three figures:
    the µs the lessons' prose gives short kernels in, rather than "0.00105 ms" beside them."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or math.isnan(ms):
        raise ValueError(f"duration: need a time in ms, got {ms!r}")
    v, unit = (ms * 1e3, "µs") if abs(ms) < 1 else (ms, "ms")
    return f"{float(f'{v:.3g}'):,g} {unit}"  # 3 significant digits, written out: "1,000 µs", not "1e+03 µs"


@dataclass
class ProfileSummary:
    """Per call, averaged over the profiled calls. ``busy_ms``: the device time of the kernels on a GPU,
    the operators' own host time on a CPU. ``top``: every kernel (operator) by name, longest first, with
    its calls and ms per call and its share of ``busy_ms``."""

    device: str  # "cuda" or "cpu"
    calls: int
    wall_ms: float
    busy_ms: float
    launches: float  # kernels per call (GPU) or top-level operators per call (CPU)
    top: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def busy(self) -> float:
        """``busy_ms / wall_ms``: on a GPU the fraction of the wall time the device runs kernels."""
        return self.busy_ms / self.wall_ms if self.wall_ms > 0 else float("nan")

    def ms_matching(self, pattern: str) -> float:
        """ms per call of the rows of :attr:`top` whose name matches ``pattern`` (a regex, case-insensitive)."""
        if self.top.empty:
            return 0.0
        hit = self.top["name"].str.contains(pattern, case=False, regex=True)
        return float(self.top.loc[hit, "ms"].sum())

    def table(self, rows: int = 6) -> pd.DataFrame:
        """The longest ``rows`` kernels (GPU) or operators (CPU), with shortened names."""
        t = self.top.head(rows).copy()
        t.insert(0, "kernel" if self.cuda else "operator (CPU)", [short_kernel_name(n) for n in t["name"]])
        return t.drop(columns="name").rename(columns={"ms": "ms per call", "share": "share of busy time"})

    def longest(self, n: int = 3) -> str:
        """ "`name` (share), ..." of the ``n`` longest rows."""
        return ", ".join(f"`{short_kernel_name(r.name, 48)}` ({pct(r.share)})" for r in self.top.head(n).itertuples())

    def _noun(self) -> str:
        """What the device ran (GPU): kernels, copies (the profiler's Memcpy and Memset rows), or both."""
        names = [] if self.top.empty else list(self.top["name"])
        copies = sum(n.startswith(("Memcpy", "Memset")) for n in names)
        one = round(self.launches) == 1
        if names and copies == len(names):
            return "copy" if one else "copies"
        if copies:
            return "kernel or copy" if one else "kernels and copies"
        return "kernel" if one else "kernels"

    def sentence(self, what: str, *, measured_ms: float | None = None) -> str:
        """One sentence of evidence: kernel time against wall time and the longest rows; on a CPU it says that
        these are host operators.

        The profiled wall time holds the profiler's own cost (a few µs per operator, and its start on the first
        call), so a short call looks idle under it. Pass the benchmark's time of the same call (``measured_ms``):
        the device's busy share is then given against that, the time the call really takes."""
        if measured_ms is not None and not (isinstance(measured_ms, (int, float)) and measured_ms > 0):
            raise ValueError(
                f"ProfileSummary.sentence: measured_ms must be a time > 0 (ms) or None, got {measured_ms!r}"
            )
        if not self.cuda:
            return (
                f"Profiler, {what} (CPU run: host operators, not GPU kernels): the operators spent "
                f"{duration(self.busy_ms)} of their own time in {duration(self.wall_ms)} of wall time per call ({pct(self.busy)}); the longest: "
                f"{self.longest()}."
            )
        text = (
            f"Profiler, {what}: {self.launches:.0f} {self._noun()} per call ran {duration(self.busy_ms)} of device time"
        )
        if measured_ms is None:
            text += (
                f", in {duration(self.wall_ms)} of profiled wall time ({pct(self.busy)}; that wall time includes the "
                f"profiler's own cost)"
            )
        elif self.busy_ms <= measured_ms:
            text += (
                f": device busy {pct(self.busy_ms / measured_ms)} of the {duration(measured_ms)} the call takes without "
                f"the profiler"
            )
        else:
            text += (
                f", more than the {duration(measured_ms)} the call takes without the profiler (kernels that overlap, or "
                f"ran slower under it): the device is busy throughout"
            )
        return text + f"; the longest: {self.longest()}."


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


@quiet_profiler_notices
def profile_calls(
    fn: Callable[[], object], device: str | torch.device, *, calls: int = 3, warmup: int = 1
) -> ProfileSummary:
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
    # kernels: left out, or their kernels would count twice (as mahia.profile does).
    events = [e for e in prof.events() if not getattr(e, "is_user_annotation", False)]
    if cuda:  # device events: kernels, copies and fills, each once
        rows = [(e.name, e.time_range.elapsed_us()) for e in events if e.device_type != host]
        launches = len(rows) / calls
    else:  # host operators, each by its own (self) time, so nested ones are not counted twice
        ops = [e for e in events if e.device_type == host]
        rows = [(e.name, e.self_cpu_time_total) for e in ops]
        launches = sum(1 for e in ops if e.cpu_parent is None) / calls
    by_name: dict[str, list[float]] = {}
    for name, us in rows:
        acc = by_name.setdefault(name, [0, 0.0])
        acc[0] += 1
        acc[1] += us
    ranked = sorted(by_name.items(), key=lambda kv: kv[1][1], reverse=True)
    top = pd.DataFrame(
        [{"name": n, "calls": c / calls, "ms": us / 1e3 / calls} for n, (c, us) in ranked],
        columns=["name", "calls", "ms"],
    )
    busy_ms = sum(us for _, us in rows) / 1e3 / calls
    top["share"] = top["ms"] / busy_ms if busy_ms > 0 else 0.0
    return ProfileSummary("cuda" if cuda else "cpu", calls, wall_ms, busy_ms, launches, top)


def compare(before: ProfileSummary, after: ProfileSummary, rows: int = 6) -> pd.DataFrame:
    """Where two profiles of the same work differ: ms per call of each kernel (operator) in both, and the
    difference, largest first (by size); names are shortened, and rows with the same short name added."""
    if before.device != after.device:
        raise ValueError(f"compare: profiles of different devices ({before.device}, {after.device})")

    def per_name(s: ProfileSummary) -> pd.Series:
        return s.top.assign(short=[short_kernel_name(n) for n in s.top["name"]]).groupby("short")["ms"].sum()

    t = pd.concat([per_name(before).rename("before"), per_name(after).rename("after")], axis=1).fillna(0.0)
    t["after - before"] = t["after"] - t["before"]
    t = t.reindex(t["after - before"].abs().sort_values(ascending=False).index).head(rows)
    return t.rename_axis("kernel" if before.cuda else "operator (CPU)").rename(
        columns={"before": "ms before", "after": "ms after"}
    )
