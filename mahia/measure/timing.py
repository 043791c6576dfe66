"""Timing that tells the truth about asynchronous devices.

A CUDA kernel launch returns before the kernel runs, so ``time.perf_counter()`` around a launch
measures the launch, not the work. ``bench`` therefore times

* on CUDA with ``torch.cuda.Event`` pairs around each repetition, after a write of an L2-sized
  buffer that flushes the cache (as ``triton.testing.do_bench`` does), so a small input is not
  served from cache; at least 5 repetitions, however long one takes;
* on the CPU with ``torch.utils.benchmark.Timer`` (the CPU runs work when it is called, so
  host time is device time), in samples of several calls each.

The first call is timed apart (``first_call_ms``): compilation, autotuning and allocator growth
happen there and would otherwise pollute the median. Peak device memory over one extra call is
reported on CUDA (``None`` on the CPU, where PyTorch tracks no allocator peak).

Statistics: median with the 20th and 80th percentiles of the per-repetition times.

``host_time`` measures the other side of an asynchronous call: how long the *host* takes to issue it while
the device runs behind (the host's share of a step, which ``bench`` cannot separate from the device's).

``capture_graph`` is the one CUDA-graph capture of the package (``bench(cuda_graph=True)``, the lessons'
``try_capture`` and the model's graphed decoder use it; notebook 05 writes its own on the page).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch

from mahia.measure.checks import check_int

__all__ = [
    "Timing",
    "gain_range",
    "ratio_range",
    "verdict",
    "compare",
    "bench",
    "synchronize",
    "naive_host_time",
    "host_time",
    "issue_ms",
    "LAUNCH_QUEUE_KERNELS",
    "capture_graph",
]

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
    def from_samples(
        cls,
        times_ms: Sequence[float],
        *,
        first_call_ms: float | None = None,
        peak_mem_bytes: int | None = None,
        device: str = "cpu",
    ) -> Timing:
        """Median and 20th/80th percentiles of times measured elsewhere (e.g. a few steps too long to
        :func:`bench`), with the same statistics as :func:`bench`."""
        if not times_ms:
            raise ValueError("Timing.from_samples: needs at least one time")
        med, p20, p80 = _percentiles(list(times_ms))
        return cls(med, p20, p80, len(times_ms), first_call_ms, peak_mem_bytes, device)

    @property
    def spread(self) -> float:
        """Relative width of the 20-80 percentile band."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms > 0 else math.nan

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        s = f"{self.median_ms:.4g} ms [{self.p20_ms:.4g}, {self.p80_ms:.4g}] (n={self.n})"
        if self.peak_mem_bytes is not None:
            s += f", peak {self.peak_mem_bytes / 2**20:.1f} MiB"
        return s


def ratio_range(before_p20: float, before_p80: float, after_p20: float, after_p80: float) -> tuple[float, float]:
    """The range of before / after that the two 20–80% spreads allow (times in ms):
    [before_p20 / after_p80, before_p80 / after_p20], the slowest and the fastest gain."""
    vals = (before_p20, before_p80, after_p20, after_p80)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vals):
        raise ValueError(f"ratio_range: every time must be a number > 0, got {vals!r}")
    if before_p20 > before_p80 or after_p20 > after_p80:
        raise ValueError(f"ratio_range: a p20 is above its p80: {vals!r}")
    return before_p20 / after_p80, before_p80 / after_p20


def gain_range(before: Timing, after: Timing) -> tuple[float, float]:
    """The gain before / after that two timings' 20–80% spreads allow (see :func:`ratio_range`): a gain whose
    range holds 1 is not a measured change."""
    if not (isinstance(before, Timing) and isinstance(after, Timing)):
        raise TypeError(f"gain_range: need two Timing objects, got {type(before).__name__} and {type(after).__name__}")
    return ratio_range(before.p20_ms, before.p80_ms, after.p20_ms, after.p80_ms)


def verdict(before: Timing, after: Timing) -> str:
    """ "faster", "slower" or "within noise": ``after`` against ``before``, from their 20–80% spreads (a change is
    measured only where the spreads are apart)."""
    lo, hi = gain_range(before, after)
    return "faster" if lo > 1 else "slower" if hi < 1 else "within noise"


def compare(timings: dict[str, Timing], baseline: str | None = None) -> pd.DataFrame:
    """The table a notebook shows for variants of the same work: median and 20–80% spread in ms, the gain over
    ``baseline`` (default: the first) and its :func:`verdict`. Notebooks display floats to three significant
    digits (:func:`mahia.lessons.notebook.setup`)."""
    if not timings:
        raise ValueError("compare: no timings")
    base = timings[baseline if baseline is not None else next(iter(timings))]
    rows = {
        name: {
            "median ms": t.median_ms,
            "p20 ms": t.p20_ms,
            "p80 ms": t.p80_ms,
            "gain": base.median_ms / t.median_ms,
            "verdict": "baseline" if t is base else verdict(base, t),
        }
        for name, t in timings.items()
    }
    return pd.DataFrame.from_dict(rows, orient="index")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued work on ``device`` (no-op on the CPU)."""
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(dev)


def naive_host_time(fn: Callable[[], object], n: int = 10) -> float:
    """What a naive ``perf_counter`` around a loop reports, in ms per call (no synchronization).

    Kept to *show* why it lies on a GPU (notebook 00); never used for a reported figure.
    """
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
    fn: Callable[[], object], warmup_ms: float, rep_ms: float, flush_l2: bool, max_reps: int
) -> list[float]:
    """Per-call times from CUDA events.

    With ``flush_l2`` each repetition is one call after an L2-sized buffer write (the write also
    gives the CPU time to queue the call, so the events time the kernel, not the launch, as long as the
    host's work for the call is shorter than the write; beyond that the device waits and the events
    time the wait too). Without
    it, calls run back to back in blocks of ``k`` between one pair of events, and each block's
    time / k is one sample: timing a single short kernel between events would measure the host's
    launch gap instead.
    """
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-4)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    if flush_l2:
        k, n_rep = 1, max(5, min(max_reps, int(rep_ms / est)))
    else:
        k = max(1, int(0.5 / est))  # blocks of >= ~0.5 ms
        n_rep = max(5, min(max_reps, int(rep_ms / (est * k))))
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


def _cpu_times(fn: Callable[[], object], warmup_ms: float, rep_ms: float, max_reps: int) -> list[float]:
    """Per-call times from ``torch.utils.benchmark.Timer``: samples of ``k`` calls each (>= ~1 ms),
    at least 5 samples, within about ``rep_ms``."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    est = max(timer.timeit(1).mean, 1e-7) * 1e3  # ms; the first call was already made by bench()
    if warmup_ms > est:
        timer.timeit(max(1, int(warmup_ms / est)))
    k = max(1, int(1.0 / est))
    n = max(5, min(max_reps, int(rep_ms / (est * k))))
    return [timer.timeit(k).mean * 1e3 for _ in range(n)]


def bench(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 25,
    rep_ms: float = 100,
    flush_l2: bool = True,
    memory: bool = True,
    max_reps: int = 1000,
    cuda_graph: bool = False,
) -> Timing:
    """Time the zero-argument callable ``fn`` and return median and spread in milliseconds.

    ``device`` defaults to CUDA when available. ``fn`` must do the full unit of work (e.g. forward
    and backward) and should not allocate its inputs. The first call is timed apart, synchronized
    with a host clock; it includes compilation and autotuning.

    ``cuda_graph=True`` (CUDA only) captures ``fn`` once in a CUDA graph and times its replays: the
    *device* time of the work, without the Python, dispatcher and launch overhead that a short
    kernel sequence otherwise pays on every call (and that a real model hides by running ahead or
    by graphs of its own). Use it to judge a kernel against the hardware; time without it to see
    what a plain eager call costs.
    """
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("bench(device='cuda') but CUDA is not available on this machine")

    synchronize(dev)
    t0 = time.perf_counter()
    fn()
    synchronize(dev)
    first = (time.perf_counter() - t0) * 1e3

    peak = None
    if dev.type == "cuda":
        if memory:
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
            fn()
            torch.cuda.synchronize(dev)
            peak = torch.cuda.max_memory_allocated(dev) - base
        if cuda_graph:
            try:
                graph, _ = capture_graph(fn)
            except Exception as e:
                raise RuntimeError(
                    f"bench(cuda_graph=True): the function cannot be captured in a CUDA graph "
                    f"({type(e).__name__}: {e}); time it with cuda_graph=False"
                ) from e
            fn = graph.replay
        times = _cuda_times(fn, warmup_ms, rep_ms, flush_l2, max_reps)
    else:
        times = _cpu_times(fn, warmup_ms, rep_ms, max_reps)
    return Timing.from_samples(times, first_call_ms=first, peak_mem_bytes=peak, device=dev.type)


def _check_budget(fn_name: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == math.inf:
        raise ValueError(f"{fn_name}: {name} must be a finite number >= 0 (milliseconds), got {v!r}")
    return float(v)


def _device(fn_name: str, device: torch.device | str | None) -> torch.device:
    """``device`` as a torch.device (CUDA when available if None); a clear error for a bad name or absent CUDA."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"{fn_name}: device must be a torch.device or a name like 'cpu' or 'cuda', got {device!r}"
        ) from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"{fn_name}(device={str(dev)!r}) but CUDA is not available on this machine")
    return dev


def issue_ms(
    fn: Callable[[], object], device: torch.device | str, *, clock: Callable[[], float] = time.perf_counter
) -> float:
    """One sample of :func:`host_time`, in ms: synchronize(device); t0 = clock(); fn(); t1 = clock();
    synchronize(device); return t1 - t0. The host's time in one call started on an idle device, the device's
    catch-up kept out. ``clock`` (seconds) is there for tests."""
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
    """How long the host takes to *issue* the zero-argument ``fn``: median and 20th/80th percentiles in ms.

    Each repetition:  synchronize(device); t0 = perf_counter(); fn(); t1 = perf_counter(); synchronize(device).
    The sample is ``t1 - t0``: the host's time in the call (Python, dispatch, argument checks, allocation,
    autograd recording, launches) while the device, idle at t0, runs the queued kernels behind it; the
    trailing synchronize keeps that device work out of the next sample. On a CPU the work runs inside the
    call, so the sample is simply the call's time.

    Valid on a GPU while the call never waits for the device: it must queue fewer kernels than the launch
    queue holds (:data:`LAUNCH_QUEUE_KERNELS`, about a thousand; past it each launch waits for a kernel to
    finish), and a sync inside the call (``.item()``, ``nonzero``) waits for the work queued before it, so
    a call that syncs measures host time plus those waits (close to its wall time when it syncs often).

    The first call is timed apart (``first_call_ms``, its issue time: compilation and allocator growth
    happen there); then calls for about ``warmup_ms`` are discarded, and about ``rep_ms`` of repetitions
    (each counted with its trailing synchronize), at least ``min_reps`` and at most ``max_reps``, are timed.
    """
    if not callable(fn):
        raise TypeError(f"host_time: fn must be callable, got {type(fn).__name__}")
    warmup_ms = _check_budget("host_time", "warmup_ms", warmup_ms)
    rep_ms = _check_budget("host_time", "rep_ms", rep_ms)
    check_int("host_time", "min_reps", min_reps)
    check_int("host_time", "max_reps", max_reps, minimum=min_reps)
    dev = _device("host_time", device)

    def one() -> tuple[float, float]:
        """(issue time, issue time + the device's catch-up) of one call, in ms."""
        t0 = time.perf_counter()
        issue = issue_ms(fn, dev)
        return issue, (time.perf_counter() - t0) * 1e3

    first, _ = one()
    est = max(one()[1], 1e-4)  # ms per repetition, device catch-up included: what the budgets count
    for _ in range(min(max_reps, int(warmup_ms / est))):
        one()
    n = max(min_reps, min(max_reps, int(rep_ms / est)))
    return Timing.from_samples([one()[0] for _ in range(n)], first_call_ms=first, device=dev.type)


def capture_graph(fn: Callable[[], Any], *, warmup: int = 3, pool=None) -> tuple[Any, Any]:
    """Capture the zero-argument ``fn`` in a CUDA graph; return ``(graph, outputs)``.

    ``fn`` first runs ``warmup`` times on a side stream (lazy initialization, cuBLAS workspaces,
    autotuning and allocator growth happen there, outside the capture; the side stream keeps those calls
    off the stream the capture then records), then once inside ``torch.cuda.graph(graph, pool=pool)``.
    ``outputs`` is what that captured call returned: tensors in the graph's memory, which every
    ``graph.replay()`` overwrites in place (copy what must outlive the next replay). The captured call's
    kernels ran only as recorded: ``outputs`` holds their result once ``graph.replay()`` has run.
    ``fn`` runs under the caller's grad mode (wrap the call in ``torch.no_grad()`` for inference).

    Memory pool: ``pool=None`` gives the graph a private pool, kept as long as the graph lives; its
    intermediates and outputs are never handed to other tensors. ``pool=other.pool()`` (or
    ``torch.cuda.graph_pool_handle()``) shares one pool between graphs, which saves memory when they are
    replayed one after the other in the order they were captured, but a replay may then overwrite the
    outputs of another graph of the pool.

    What cannot be captured: anything that needs the host mid-call (``.item()``, ``print(tensor)``,
    ``nonzero``, a data-dependent Python branch) and CPU tensors. Python values are frozen at capture.
    A capture that fails raises, and may leave CUDA's random generator unusable for the rest of the
    process ("Offset increment outside graph capture"): check what you capture before, not by failing.
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
