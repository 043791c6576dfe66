"""Timing that tells the truth about asynchronous devices.

A CUDA launch returns before the kernel runs: ``time.perf_counter()`` around it measures the launch, not the work.
:func:`bench` times CUDA with event pairs around each repetition, after a write of an L2-sized buffer that
flushes the cache (as ``triton.testing.do_bench`` does), and the CPU with ``torch.utils.benchmark.Timer``. The
first call (compilation, autotuning, allocator growth) is timed apart. Statistics: the median and the 20th and
80th percentiles of the repetitions; a change is measured only where two spreads are apart (:func:`verdict`).
:func:`host_time` measures the other side: how long the host takes to issue a call while the device runs behind.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from mahia.measure.checks import check_int

# How many kernels a CUDA stream queues before the next launch blocks the host until the device has run
# one: about a thousand. An observed figure, not a documented limit (it depends on the driver and on the
# kernels' arguments; e.g. forums.developer.nvidia.com/t/68937: a stream blocks past ~1000 queued kernels).
LAUNCH_QUEUE_KERNELS = 1000


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    n: int
    first_call_ms: float | None = None
    peak_mem_bytes: int | None = None
    device: str = "cpu"

    @classmethod
    def from_samples(cls, times_ms: Sequence[float], **kw) -> Timing:
        """:func:`bench`'s statistics of times measured elsewhere (e.g. a few steps too long to bench); ``kw``:
        ``first_call_ms``, ``peak_mem_bytes``, ``device``."""
        if not times_ms:
            raise ValueError("Timing.from_samples: needs at least one time")
        return cls(*_percentiles(list(times_ms)), len(times_ms), **kw)

    @property
    def spread(self) -> float:
        """Relative width of the 20-80 percentile band."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else math.nan

    def __str__(self) -> str:
        s = f"{self.median_ms:.4g} ms [{self.p20_ms:.4g}, {self.p80_ms:.4g}] (n={self.n})"
        if self.peak_mem_bytes is not None:
            s += f", peak {self.peak_mem_bytes / 2**20:.1f} MiB"
        return s


def gain_range(before: Timing, after: Timing) -> tuple[float, float]:
    """The gain before / after that the two 20–80% spreads allow: [before.p20 / after.p80, before.p80 / after.p20].
    A gain whose range holds 1 is not a measured change."""
    if not (isinstance(before, Timing) and isinstance(after, Timing)):
        raise TypeError(f"gain_range: need two Timing objects, got {type(before).__name__} and {type(after).__name__}")
    return before.p20_ms / after.p80_ms, before.p80_ms / after.p20_ms


def verdict(before: Timing, after: Timing) -> str:
    """``after`` against ``before``: "faster", "slower" or "within noise" (whether the 20–80% spreads overlap)."""
    lo, hi = gain_range(before, after)
    return "faster" if lo > 1 else "slower" if hi < 1 else "within noise"


def compare(timings: dict[str, Timing], baseline: str | None = None) -> pd.DataFrame:
    """The table a notebook shows for variants of the same work: median and 20–80% spread in ms, the gain over
    ``baseline`` (default: the first) and its :func:`verdict`. Notebooks display floats to three significant
    digits (:func:`mahia.lessons.notebook.setup`)."""
    if not timings:
        raise ValueError("compare: no timings")
    base = timings[baseline if baseline is not None else next(iter(timings))]
    rows = [
        (t.median_ms, t.p20_ms, t.p80_ms, base.median_ms / t.median_ms, "baseline" if t is base else verdict(base, t))
        for t in timings.values()
    ]
    return pd.DataFrame(rows, index=list(timings), columns=["median ms", "p20 ms", "p80 ms", "gain", "verdict"])


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` (no-op on the CPU)."""
    if (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def naive_host_time(fn: Callable[[], object], n: int = 10) -> float:
    """What a naive ``perf_counter`` around a loop reports, in ms per call (no synchronization): kept to *show* why
    it lies on a GPU (notebook 00), never used for a reported figure."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


def _percentiles(times: list[float]) -> tuple[float, float, float]:
    xs = sorted(times)
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=10, method="inclusive")  # deciles: q[1]=20%, q[7]=80%
    return statistics.median(xs), q[1], q[7]


def _cuda_times(
    fn: Callable[[], object], warmup_ms: float, rep_ms: float, flush_l2: bool, min_reps: int, max_reps: int
) -> list[float]:
    """Per-call times from CUDA events. With ``flush_l2`` each repetition is one call after an L2-sized write (which
    also gives the host time to queue the call, so the events time the kernel, not the launch). Without it, calls
    run back to back in blocks of ``k`` (>= ~0.5 ms) between one pair of events, each block's time / k one sample:
    a single short kernel between events would measure the host's launch gap instead."""
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # The estimate: from one call when it is long (bench() made one or two already: a long call's warm-up; a 2 s
    # decode took 14 calls for its 5 samples, now 9), from five when it is short (one is mostly launch latency).
    for n_est in (1, 5):
        torch.cuda.synchronize()
        start.record()
        for _ in range(n_est):
            fn()
        end.record()
        torch.cuda.synchronize()
        est = max(start.elapsed_time(end) / n_est, 1e-4)
        if est >= 1.0:
            break
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    k = 1 if flush_l2 else max(1, int(0.5 / est))
    n_rep = max(min_reps, min(max_reps, int(rep_ms / (est * k))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for s, e in zip(starts, ends):
        if cache is not None:
            cache.zero_()  # evict the inputs from L2 so each repetition reads device memory
        s.record()
        for _ in range(k):
            fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / k for s, e in zip(starts, ends)]


def _cpu_times(fn: Callable[[], object], warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> list[float]:
    """Per-call times from ``torch.utils.benchmark.Timer``: at least ``min_reps`` samples of ``k`` calls (>= ~1 ms)."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    est = max(timer.timeit(1).mean, 1e-7) * 1e3  # ms; the first call was already made by bench()
    if warmup_ms > est:
        timer.timeit(max(1, int(warmup_ms / est)))
    k = max(1, int(1.0 / est))
    n = max(min_reps, min(max_reps, int(rep_ms / (est * k))))
    return [timer.timeit(k).mean * 1e3 for _ in range(n)]


def _device(fn_name: str, device: torch.device | str | None) -> torch.device:
    """``device`` as a torch.device (CUDA when available if None); a clear error for a bad name or absent CUDA."""
    try:
        dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"{fn_name}: device must be a torch.device or a name like 'cpu' or 'cuda', got {device!r}"
        ) from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{fn_name}(device={str(dev)!r}) but CUDA is not available on this machine")
    return dev


def bench(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    flush_l2: bool = True,
    memory: bool = True,
    min_reps: int = 5,
    max_reps: int = 1000,
    cuda_graph: bool = False,
) -> Timing:
    """Time the zero-argument ``fn`` (the full unit of work, inputs made outside): median and 20–80% spread in ms.

    ``device`` defaults to CUDA when available. The first call is timed apart with a synchronized host clock
    (``first_call_ms``); on CUDA ``memory`` adds the peak memory of one more call. ``cuda_graph=True`` (CUDA) times
    replays of one captured call: the *device* time of the work, without the Python, dispatch and launch overhead
    a short kernel sequence pays on every eager call. Judge a kernel against the hardware with it; time without it
    to see what a plain eager call costs. At least ``min_reps`` calls are timed, however long they take.
    """
    dev = _device("bench", device)
    synchronize(dev)
    t0 = time.perf_counter()
    fn()
    synchronize(dev)
    first = (time.perf_counter() - t0) * 1e3
    if dev.type != "cuda":
        times = _cpu_times(fn, warmup_ms, rep_ms, min_reps, max_reps)
        return Timing.from_samples(times, first_call_ms=first, device=dev.type)
    peak = None
    if memory:
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
    if cuda_graph:
        try:
            fn = capture_graph(fn)[0].replay
        except Exception as e:
            raise RuntimeError(
                f"bench(cuda_graph=True): the function cannot be captured in a CUDA graph "
                f"({type(e).__name__}: {e}); time it with cuda_graph=False"
            ) from e
    times = _cuda_times(fn, warmup_ms, rep_ms, flush_l2, min_reps, max_reps)
    return Timing.from_samples(times, first_call_ms=first, peak_mem_bytes=peak, device="cuda")


def issue_ms(
    fn: Callable[[], object], device: torch.device | str, *, clock: Callable[[], float] = time.perf_counter
) -> float:
    """One sample of :func:`host_time` in ms: the host's time in one call started on an idle device, the device's
    catch-up kept out (synchronize; t0; fn(); t1; synchronize). ``clock`` (seconds) is there for tests."""
    synchronize(device)
    t0 = clock()
    fn()
    t1 = clock()
    synchronize(device)
    return (t1 - t0) * 1e3


def host_time(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 10,
    rep_ms: float = 50,
    min_reps: int = 5,
    max_reps: int = 1000,
) -> Timing:
    """How long the host takes to *issue* the zero-argument ``fn`` (Python, dispatch, checks, allocation, autograd
    recording, launches) while the device, idle at the start, runs the queued kernels behind it: median and 20–80%
    spread in ms of :func:`issue_ms`. On a CPU the work runs inside the call, so a sample is the call's time.

    Valid on a GPU while the call never waits for the device: it must queue fewer kernels than the launch queue
    holds (:data:`LAUNCH_QUEUE_KERNELS`), and a sync inside it (``.item()``, ``nonzero``) waits for the work queued
    before. The first call is timed apart (``first_call_ms``); then calls for about ``warmup_ms`` are discarded and
    about ``rep_ms`` of repetitions (catch-up included), at least ``min_reps`` and at most ``max_reps``, are timed.
    """
    if not callable(fn):
        raise TypeError(f"host_time: fn must be callable, got {type(fn).__name__}")
    for name, v in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise ValueError(f"host_time: {name} must be a finite number >= 0 (milliseconds), got {v!r}")
    check_int("host_time", "min_reps", min_reps)
    check_int("host_time", "max_reps", max_reps, minimum=min_reps)
    dev = _device("host_time", device)

    def one() -> tuple[float, float]:
        """(issue time, issue time + the device's catch-up) of one call, in ms."""
        t0 = time.perf_counter()
        issue = issue_ms(fn, dev)
        return issue, (time.perf_counter() - t0) * 1e3

    first, _ = one()
    est = max(one()[1], 1e-4)
    for _ in range(min(max_reps, int(warmup_ms / est))):
        one()
    n = max(min_reps, min(max_reps, int(rep_ms / est)))
    return Timing.from_samples([one()[0] for _ in range(n)], first_call_ms=first, device=dev.type)


def capture_graph(fn: Callable[[], Any], *, warmup: int = 3, pool=None) -> tuple[Any, Any]:
    """Capture the zero-argument ``fn`` in a CUDA graph; return ``(graph, outputs)``.

    ``fn`` first runs ``warmup`` times on a side stream (lazy initialization, cuBLAS workspaces, autotuning and
    allocator growth happen there, off the stream the capture records), then once inside
    ``torch.cuda.graph(graph, pool=pool)``, under the caller's grad mode. ``outputs`` lives in the graph's memory:
    every ``graph.replay()`` overwrites it in place. ``pool=None`` gives the graph a private pool;
    ``pool=other.pool()`` shares one, which saves memory for graphs replayed in capture order, but a replay may
    then overwrite another graph's outputs.

    Not capturable: anything that needs the host mid-call (``.item()``, ``nonzero``, a data-dependent branch) and
    CPU tensors; Python values are frozen at capture. A failed capture may leave CUDA's random generator unusable
    for the rest of the process ("Offset increment outside graph capture"): check before, not by failing.
    """
    if not callable(fn):
        raise TypeError(f"capture_graph: fn must be callable, got {type(fn).__name__}")
    check_int("capture_graph", "warmup", warmup, minimum=0)
    if not torch.cuda.is_available():
        raise RuntimeError("capture_graph: CUDA graphs need a CUDA device, and CUDA is not available here")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs
