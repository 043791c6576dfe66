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
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import torch

from mahia.measure.checks import check_int

__all__ = [
    "ProfileSummary",
    "profile_calls",
    "compare",
    "short_kernel_name",
    "tile_shape",
    "MATMUL_KERNELS",
    "quiet_native_stderr",
]

# Kernel (or operator) names of matrix products: cuBLAS/cuBLASLt/CUTLASS kernels on a GPU, aten ops on a CPU.
MATMUL_KERNELS = r"gemm|matmul|xmma|cutlass|wgmma|aten::mm|aten::bmm|aten::addmm|aten::baddbmm"


def short_kernel_name(name: str, width: int = 60) -> str:
    """A kernel's name without template arguments, parameter lists or namespaces, cut to ``width``."""
    s = name
    while True:  # innermost <...> first, so nested templates go too
        t = re.sub(r"<[^<>]*>", "", s)
        if t == s:
            break
        s = t
    if s.startswith("void ") or re.search(r"\w\(", s):  # a C++ signature: "void ns::kernel<...>(args)" -> "kernel"
        s = re.sub(r"\([^()]*\)", "", s).strip()
        s = s.split(" ")[-1]
        if "::" in s:
            s = s.split("::")[-1]
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
        return ", ".join(f"`{short_kernel_name(r.name, 48)}` ({r.share:.0%})" for r in self.top.head(n).itertuples())

    def sentence(self, what: str) -> str:
        """One sentence of evidence: busy time against wall time and the longest rows; on a CPU it says that
        these are host operators."""
        if self.cuda:
            return (
                f"Profiler, {what}: {self.launches:.0f} kernel launch(es) per call ran {self.busy_ms:.3g} ms of device "
                f"time in {self.wall_ms:.3g} ms of wall time (device busy {self.busy:.0%}); the longest: "
                f"{self.longest()}."
            )
        return (
            f"Profiler, {what} (CPU run: host operators, not GPU kernels): the operators spent {self.busy_ms:.3g} ms "
            f"of their own time in {self.wall_ms:.3g} ms of wall time per call ({self.busy:.0%}); the longest: "
            f"{self.longest()}."
        )


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
