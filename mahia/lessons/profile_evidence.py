"""What a notebook shows when it explains a result (notebooks 05-10): the profiler's account of a call.

An explanation of a timing ("the step is host-bound", "the matmuls are what bf16 sped up") rests on
something the run measured and shows. Here that is ``torch.profiler`` through :func:`mahia.profile.profile_step`:

* :func:`profile_call` profiles any zero-argument call on a device: wall time per call, the kernels'
  time and count (GPU), and the busiest operators (device time on a GPU, host time on a CPU);
* :func:`profile_sentence` writes that report as one sentence of measured numbers, and says when the
  evidence is a CPU's (no device queue: host time by operator);
* :func:`op_changes` lists the operators whose time changed most between two reports;
* :func:`time_by_group` sums the operators' time into groups (matmuls, attention, the rest),
  :func:`ops_outside` lists the operators of the rest by name, and :func:`group_sentence` writes two such
  summaries side by side (before and after a change).

By operator (what :mod:`mahia.profile` reports); :mod:`mahia.lessons.profiler_summary`, which notebooks
00-04 use, reports the same profile by kernel name.

Nothing here picks wording by a threshold: the sentences state the numbers, and the notebook says what
they mean next to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from mahia.lessons.profiler_summary import pct, quiet_native_stderr
from mahia.measure.checks import check_int
from mahia.profile import StepReport, profile_step

__all__ = [
    "MATMUL_OPS",
    "SCAN_OPS",
    "ATTENTION_OPS",
    "profile_call",
    "profile_sentence",
    "time_by_group",
    "ops_outside",
    "group_sentence",
    "top_ops",
    "op_changes",
]

# Operators whose own time is a matrix product (the profiler's names; a kernel's time is charged to the
# operator that launched it).
# mahia's own grouped GEMM (a custom op: its forward and its weight-gradient op) is a matmul as well
MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_grouped_mm",
    "aten::addbmm",
    "mahia::moe_grouped_mm",  # compiled
    "_GroupedMM",  # eager: mahia.ops.grouped_mm's autograd Function (its backward is _GroupedMMBackward)
)
# The chunked GLA scan (mahia.ops.gla_scan): its chunk products are matmul FLOPs in the models' FLOP counts, but
# its kernels also do the decays and the cumulative sums, so it is a group of its own. Eager calls run through
# the autograd Function (forward and backward rows), compiled ones through the custom ops.
SCAN_OPS = ("_GLAFunction", "mahia::gla_", "GeneratedBackwardFor_mahia_gla_")
# by the name prefix of their forward and backward operators; every SDPA backend (the cuDNN one is the default
# on an H100 with torch 2.11: aten::_cudnn_attention_forward / _backward)
ATTENTION_OPS = (
    "aten::_scaled_dot_product",
    "aten::_flash_attention",
    "aten::_efficient_attention",
    "aten::_cudnn_attention",
)


def profile_call(
    fn: Callable[[], object], device: torch.device | str, *, steps: int = 3, warmup: int = 1, rows: int = 200
) -> StepReport:
    """``torch.profiler`` over ``steps`` calls of ``fn()`` on ``device`` after ``warmup`` calls
    (:func:`mahia.profile.profile_step`): wall ms per call, kernel ms and launches per call (GPU) and the
    ``rows`` busiest operators. The wall time includes the profiler's own cost (a few µs per operator)."""
    if not callable(fn):
        raise TypeError(f"profile_call: fn must be callable, got {type(fn).__name__}")
    check_int("profile_call", "steps", steps)
    check_int("profile_call", "warmup", warmup, minimum=0)
    anchor = torch.empty(0, device=device)  # profile_step finds the device from its arguments
    with quiet_native_stderr():
        return profile_step(lambda _anchor: fn(), anchor, steps=steps, warmup=warmup, rows=rows)


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


# Rows the profiler lists beside the operators that are not work of the code: its own bookkeeping, and the
# driver's stall marker ("Command Buffer Full": the launch queue was full).
_PROFILER_ROWS = ("Activity Buffer Request", "ProfilerStep", "[memory]", "Command Buffer Full")


def _operators(report: StepReport) -> list[dict]:
    """The operator rows of ``report.top``: called at least once a step and not the profiler's own."""
    return [r for r in report.top if r["calls"] > 0 and not str(r["name"]).startswith(_PROFILER_ROWS)]


def top_ops(report: StepReport, n: int = 3) -> str:
    """ "name ms (calls×), ..." for the ``n`` busiest operators of ``report`` (profiler bookkeeping left out)."""
    return ", ".join(f"`{_short(r['name'])}` {r['ms']:.3g} ms ({r['calls']:,.0f}×)" for r in _operators(report)[:n])


def op_changes(before: StepReport, after: StepReport, n: int = 3) -> str:
    """ "`name` a → b ms, ..." for the ``n`` operators whose time per step changed most (by absolute change) from
    ``before`` to ``after`` (device time on a GPU, host time on a CPU; an operator absent from one report counts
    0 ms there; profiler bookkeeping left out)."""
    for r in (before, after):
        if not isinstance(r, StepReport):
            raise TypeError(f"op_changes: reports must be mahia.profile.StepReport, got {type(r).__name__}")
    check_int("op_changes", "n", n)
    ms_b = {r["name"]: r["ms"] for r in _operators(before)}
    ms_a = {r["name"]: r["ms"] for r in _operators(after)}
    names = sorted(set(ms_b) | set(ms_a), key=lambda k: -abs(ms_a.get(k, 0.0) - ms_b.get(k, 0.0)))
    return ", ".join(f"`{_short(k)}` {ms_b.get(k, 0.0):.3g} → {ms_a.get(k, 0.0):.3g} ms" for k in names[:n])


def profile_sentence(report: StepReport, what: str, *, n_top: int = 3, measured_ms: float | None = None) -> str:
    """One sentence of what the profiler measured for ``what`` (a noun phrase): on a GPU the wall time per
    call, the kernels' time and number, the share of the wall time the device ran kernels and the busiest
    operators by device time; on a CPU the wall time and the busiest operators by host time, marked as
    CPU evidence.

    The profiler adds its own cost to every operator, so its wall time is longer than the benchmark's. Pass
    the benchmark's median (``measured_ms``, timed without the profiler) and the busy share is also given
    against it: the kernels' time over the time the call really takes."""
    if not isinstance(report, StepReport):
        raise TypeError(f"profile_sentence: report must be a mahia.profile.StepReport, got {type(report).__name__}")
    if measured_ms is not None and not (isinstance(measured_ms, (int, float)) and measured_ms > 0):
        raise ValueError(f"profile_sentence: measured_ms must be a time > 0 (ms) or None, got {measured_ms!r}")
    if report.kernel_ms is None:
        return (
            f"*CPU evidence* ({what}, `torch.profiler`): {report.wall_ms:.3g} ms per call under the profiler (its "
            f"own cost per operator included); by host time the busiest operators are {top_ops(report, n_top)}."
        )
    text = (
        f"{what.capitalize()} under `torch.profiler`: {report.wall_ms:.3g} ms of wall time per call, of which "
        f"{report.kernel_ms:.3g} ms are kernels ({report.kernels:,} launches): the device ran kernels "
        f"{pct(report.busy)} of the profiled time"
    )
    if measured_ms is None:
        text += f" and waited {pct(1 - report.busy)}."
    elif report.kernel_ms <= measured_ms:
        text += f", and {pct(report.kernel_ms / measured_ms)} of the {measured_ms:.3g} ms the benchmark measured"
        text += (
            " without the profiler's cost per operator."
            if report.wall_ms >= measured_ms
            else " without the profiler (more than the profiled call took: the two runs varied by more than the "
            "profiler's own cost)."
        )
    else:
        text += (
            f"; the benchmark measured {measured_ms:.3g} ms without the profiler, less than the kernels' summed "
            f"time (kernels that overlap, or that ran slower under the profiler)."
        )
    owned = sum(r["ms"] for r in _operators(report))
    if report.kernel_ms > 0 and owned < 0.5 * report.kernel_ms:
        # A CUDA-graph replay launches its kernels from the graph: no operator of this call issued them.
        return text + (
            f" Operators own {owned:.3g} ms of those kernels' time: the rest ran outside any operator, as the "
            f"kernels of a CUDA-graph replay do."
        )
    return text + f" Busiest operators by device time: {top_ops(report, n_top)}."


def time_by_group(report: StepReport, groups: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """ms per call of the profiled operators, summed into ``groups`` (name -> operator-name prefixes; an
    operator goes to the first group one of whose prefixes it starts with) and ``"other"``. The operators
    are the report's ``top`` rows: profile with enough ``rows`` to see them all."""
    if not isinstance(report, StepReport):
        raise TypeError(f"time_by_group: report must be a mahia.profile.StepReport, got {type(report).__name__}")
    out = {g: 0.0 for g in groups}
    out["other"] = 0.0
    for r in _operators(report):
        out[_group_of(r["name"], groups)] += r["ms"]
    return out


def _group_of(name: str, groups: Mapping[str, Sequence[str]]) -> str:
    """The first group one of whose prefixes ``name`` starts with, else ``"other"``."""
    return next((g for g, prefixes in groups.items() if name.startswith(tuple(prefixes))), "other")


def ops_outside(report: StepReport, groups: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """The operators :func:`time_by_group` puts in ``"other"`` (no group's prefix), name -> ms per call; like it,
    without the profiler's own rows and the driver's "Command Buffer Full" marker, which are no operator's work."""
    if not isinstance(report, StepReport):
        raise TypeError(f"ops_outside: report must be a mahia.profile.StepReport, got {type(report).__name__}")
    out: dict[str, float] = {}
    for r in _operators(report):
        if _group_of(r["name"], groups) == "other":
            out[r["name"]] = out.get(r["name"], 0.0) + r["ms"]
    return out


def group_sentence(before: Mapping[str, float], after: Mapping[str, float], labels: Sequence[str]) -> str:
    """ "matmuls 3.1 → 0.9 ms (×3.44), other 2.0 → 1.8 ms (×1.11)" for the groups of two
    :func:`time_by_group` results (the factor is before / after; "—" where after is 0)."""
    parts = []
    for g in (*labels, "other"):
        b, a = before.get(g, 0.0), after.get(g, 0.0)
        factor = f"×{b / a:.3g}" if a > 0 else "—"
        parts.append(f"{g} {b:.3g} → {a:.3g} ms ({factor})")
    return ", ".join(parts)
