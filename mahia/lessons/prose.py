"""Sentences the notebooks' computed Markdown chooses between, by the numbers the run measured.

A notebook writes its findings with ``show_md(f"...")`` from measured values. Where the *wording* depends
on a measurement (the gain was larger than predicted, or smaller, or within the margin), the choice is
made here, in one small function per decision, each branch unit-tested
(tests/test_lessons_prose.py); the notebook keeps the numbers it reports in sight. Every number in a
sentence below comes from an argument: nothing is typed in.

Sections follow the notebooks that use them (00, 01, 02, ...).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

__all__ = [
    "above_copy_note",
    "aux_tradeoff_sentence",
    "balance_order_sentence",
    "bf16_saving_note",
    "bound_name",
    "cached_buffers_note",
    "compile_evidence",
    "context_gain_note",
    "copy_sweep_cpu",
    "copy_timing_modes",
    "decode_gain_note",
    "disturbed_ceiling_note",
    "exp_bound_verdict",
    "extra_ops_clause",
    "faster_or_slower",
    "first_failure_phrase",
    "fixed_rate_model_note",
    "flash_backend_note",
    "flat_time_verdict",
    "fp16_sum_overflow_note",
    "gain_cutoff_sentence",
    "gqa_note",
    "host_cost_overstated",
    "host_cost_sentences",
    "host_device_sentence",
    "kernel_time_split",
    "ladder_miss_cause",
    "launch_model_check",
    "manual_oom_note",
    "matmul_ceiling_check",
    "matmul_tiles_clause",
    "memory_loop_error_note",
    "model_miss_summary",
    "overlap_bound_clause",
    "padding_cost_note",
    "predicted_gain_phrase",
    "per_tensor_reads",
    "pct",
    "spread_range",
    "plain_numbers",
    "reorder_print_summary",
    "same_tokens_phrase",
    "shortfall_source",
    "skip_step_summary",
    "slower_rungs_note",
    "slowdown_sentence",
    "spreads_overlap",
    "specialization_evidence",
    "specialization_verdict",
    "launch_count_note",
    "spread_note",
    "sync_free_loop_note",
    "sync_gain_evidence",
    "train_vs_inference",
    "group_change_sentence",
    "bytes_bound_note",
    "not_faster_note",
    "trace_check_note",
    "tf32_warning_note",
    "absolute_miss_note",
    "autotune_verdict",
    "time_drop_note",
    "mib_amount",
    "matmul_time_check",
    "tail_loss_list",
    "unscaled_fp16_note",
    "loss_log_softmax_note",
    "recompute_cost_note",
    "growth_crossover_note",
    "extra_work_time_note",
    "pick_margin_note",
    "out_of_proportion_note",
    "within_phrase",
    "gain_hits_note",
    "retimed_gain_note",
    "uncounted_sync_clause",
    "window_mask_note",
    "yes_no",
]


# Two medians of the same work within this share of each other agree (retimed_note's default, 09-6 and 10-5).
_SAME_MEDIAN = 0.03


def _check_timings(fn: str, *timings: Sequence[float]) -> None:
    """Each of ``timings`` is (median, p20, p80) with 0 < p20 <= median <= p80, else a ValueError naming ``fn``."""
    for t in timings:
        if len(t) != 3 or not 0 < t[1] <= t[0] <= t[2]:
            raise ValueError(f"{fn}: need (median, p20, p80) with 0 < p20 <= median <= p80, got {t!r}")


def pct(x: float) -> str:
    """A share as a percentage that never rounds a small nonzero share to "0%": 0.004 is "0.4%", below 0.001
    "<0.1%"; from 1% on, whole percents."""
    if not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x):
        raise ValueError(f"pct: need a number, got {x!r}")
    if x == 0 or abs(x) >= 0.01:
        return f"{x:.0%}"
    if abs(x) < 0.001:
        return "<0.1%" if x > 0 else ">-0.1%"
    return f"{x:.1%}"


# A number that ``:.3g`` wrote with a positive exponent ("2.59e+03", "1.596e+05", "0.0e+00").
_E_NUMBER = re.compile(r"(?<![\w.])(-?\d(?:\.(\d+))?)e\+(\d{1,2})(?!\w|\.\d)")


def _plain(m: re.Match) -> str:
    mantissa, decimals, exp = m.group(1), m.group(2) or "", int(m.group(3))
    if exp > 9:  # 39 digits would be unreadable, and all but the first few made up by the float
        return f"{mantissa} × 10^{exp}"
    value = float(mantissa) * 10**exp
    if value == 0:
        return "0"
    places = len(decimals) - exp  # keep the significant digits the exponent form had, no more
    return f"{round(value):,}" if places <= 0 else f"{value:,.{places}f}"


def plain_numbers(text: str) -> str:
    """``text`` with every number written with a positive exponent by ``:g``/``:e`` formatting written out:
    "2.59e+03 ms" becomes "2,590 ms", "0.0e+00" becomes "0"; past 10^9 as a power of ten ("3.39e+38" becomes
    "3.39 × 10^38"). Negative exponents (tolerances such as 1e-05) stay as they are: there the exponent is the
    clearer form."""
    return _E_NUMBER.sub(_plain, text)


def spread_range(lo: float, hi: float, *, sig: int = 3) -> str:
    """``lo–hi`` (a 20–80% spread) to ``sig`` significant figures, or as many more (up to 6) as it takes for the
    two ends to print differently: "2.64–2.64" says nothing, "2.637–2.641" gives the spread; ends equal even at
    6 figures print once, as one number."""
    if not (isinstance(sig, int) and 1 <= sig <= 6):
        raise ValueError(f"spread_range: sig must be 1 to 6, got {sig!r}")
    for d in range(sig, 7):
        a, b = f"{lo:.{d}g}", f"{hi:.{d}g}"
        if a != b:
            return plain_numbers(f"{a}–{b}")
    return plain_numbers(a)


def spread_note(lo: float, hi: float) -> str:
    """Appended to "20–80% spread of the ratio lo–hi": says when the spread contains 1."""
    return "; it contains 1, so the difference is not significant" if lo <= 1 <= hi else ""


def yes_no(flags: Mapping[str, bool]) -> str:
    """ "name yes, other **no**" for a dict of outcomes (e.g. bitwise reproducible or not)."""
    return ", ".join(f"{k} {'yes' if v else '**no**'}" for k, v in flags.items())


def bound_name(launch_bound: bool, *, explain: bool = False) -> str:
    """ "launch-bound" or "device-bound", from a prediction's ``launch_bound`` (04, 05); ``explain`` adds why,
    after a colon, so that the phrase can stand inside parentheses."""
    if launch_bound:
        return "launch-bound: host time > device time" if explain else "launch-bound"
    return "device-bound"


# ---------------------------------------------------------------------------------------------------
# 00 · environment and roofline
# ---------------------------------------------------------------------------------------------------


def copy_timing_modes(
    mib: Sequence[float],
    flushed_us: Sequence[float],
    warm_us: Sequence[float],
    host_us: Sequence[float],
    predicted_us: Sequence[float],
    *,
    copy_us: float,
    l2_mib: float | None = None,
) -> str:
    """What the two timing modes of the copy sweep measured (GPU), size by size (ascending ``mib``).

    With the L2 flush each repetition is one copy between two CUDA events. ``copy_us``, the profiler's
    device time of the smallest copy, splits its flushed time ``flushed_us[0]`` into the copy and the rest,
    ``gap = flushed_us[0] - copy_us``: the stream's time from the start event to the copy and from the copy
    to the end event, which the events count and the profiler's time of the copy does not. Without the flush
    the copies run back to back, several between one pair of events, so the gap is shared between them: a
    warm copy faster by at most ``gap`` needs nothing else; one faster than ``predicted_us`` (bytes over the
    measured copy ceiling) read part of its bytes from somewhere faster than device memory. A warm copy
    slower than the flushed one took longer than the device needs (the flushed time bounds that); its time is
    given as a fraction of ``host_us`` (the host's launch of one copy measured alone, no sync), the pace of the
    launches, without claiming the two are equal.
    ``l2_mib``: the L2 cache's size (the device report's ``l2_cache_mib``)."""
    n = len(mib)
    if not (n and len(flushed_us) == len(warm_us) == len(host_us) == len(predicted_us) == n):
        raise ValueError(
            "copy_timing_modes: mib, flushed_us, warm_us, host_us and predicted_us need the same, non-zero length"
        )
    if not copy_us > 0:
        raise ValueError(f"copy_timing_modes: copy_us must be > 0 (the profiler's time of the copy), got {copy_us}")
    f0, gap = flushed_us[0], flushed_us[0] - copy_us
    text = f"With the flush, each repetition is one copy between two CUDA events: the smallest measures {f0:.1f} µs. "
    if gap > 0:
        text += (
            f"The profiler puts the copy itself at {copy_us:.1f} µs of device time, so {gap:.1f} µs "
            f"({gap / f0:.0%}) of the flushed floor is not the copy: it is the stream's time from the start event "
            f"to the copy and from the copy to the end event, which the events count and the profiler does not. "
        )
    else:
        text += f"The profiler puts the copy itself at {copy_us:.1f} µs: the events count nothing else. "
    if host_us[0] > f0:
        text += (
            f"The host's launch of one copy ({host_us[0]:.1f} µs, host clock, no sync) is longer than that whole "
            f"time, so the events did not wait for it: the flush before each repetition gives the host time to "
            f"queue the copy. "
        )
    else:
        text += (
            f"The host's launch of one copy ({host_us[0]:.1f} µs, host clock, no sync) is not longer than that "
            f"time, so part of it may be inside it. "
        )
    slower = [i for i in range(n) if warm_us[i] > flushed_us[i]]
    if slower:
        w, h = [warm_us[i] for i in slower], [host_us[i] for i in slower]
        r = [warm_us[i] / host_us[i] for i in slower]
        text += (
            f"Without the flush the copies run back to back, and at {_sizes(mib, slower)} each took longer "
            f"than with it ({_span(min(w), max(w))} µs per copy, the warm curve *below* the flushed one): longer "
            f"than the device needs for it (at most the flushed time), and about the pace of their launches, "
            f"{_span(min(r), max(r), '.2f')} of the host's time per launch measured alone "
            f"({_span(min(h), max(h))} µs), so the launches, not the device, set their pace. "
        )
    faster = [i for i in range(n) if warm_us[i] < flushed_us[i]]
    if faster:
        saved = [flushed_us[i] - warm_us[i] for i in faster]
        text += f"At {_sizes(mib, faster)} the warm copy was faster, by {_span(min(saved), max(saved))} µs per copy"
        within = [i for i in faster if flushed_us[i] - warm_us[i] <= gap]
        if within:
            text += (
                f"; {'all ' if len(within) == len(faster) else 'at ' + _sizes(mib, within) + ' '}by no more than the {max(gap, 0):.1f} µs the flushed timing "
                f"counts around each copy, which back-to-back copies share"
            )
        beat = [i for i in faster if warm_us[i] < predicted_us[i]]
        for i in beat:
            fits = ""
            if l2_mib:
                fit = "fit" if 2 * mib[i] <= l2_mib else "do not fit"
                fits = f"; its source and destination ({2 * mib[i]:g} MiB) {fit} in the {l2_mib:g} MiB L2 cache"
            text += (
                f"; at {_size(mib[i])} the warm copy ({warm_us[i]:.1f} µs) beat the time the copy ceiling predicts "
                f"({predicted_us[i]:.1f} µs), so part of its bytes did not come from device memory{fits}"
            )
        other = [i for i in faster if i not in within and i not in beat]
        if other:
            text += (
                f"; at {_sizes(mib, other)} by more than that, without beating the ceiling's prediction: "
                f"this run does not show where the rest was saved"
            )
        text += ". "
    return text


def _sizes(mib: Sequence[float], idx: Sequence[int]) -> str:
    return ", ".join(_size(mib[i]) for i in idx)


def _span(lo: float, hi: float, fmt: str = ".1f") -> str:
    """``lo–hi``, or one number where the two print the same."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}–{b}"


def _size(mib: float) -> str:
    return f"{mib * 1024:g} KiB" if mib < 1 else f"{mib:g} MiB"


def copy_sweep_cpu(mib: Sequence[float], gbps: Sequence[float], ceiling_gbps: float) -> str:
    """CPU run: the copy sweep's rate at its smallest and largest size against the ceiling (ascending ``mib``),
    and the sizes where it ran above the ceiling (one large copy timed once, at setup, with no spread kept),
    with the size where the rate was highest; the run does not measure why (which cache serves which size)."""
    n = len(mib)
    if not (n and len(gbps) == n) or not ceiling_gbps > 0:
        raise ValueError("copy_sweep_cpu: mib and gbps need the same, non-zero length, and the ceiling must be > 0")
    text = (
        f"*CPU run:* the smallest copy ({_size(mib[0])}) moved {gbps[0]:,.1f} GB/s, {gbps[0] / ceiling_gbps:.2f} "
        f"of the ceiling; the largest ({_size(mib[-1])}) {gbps[-1]:,.1f} GB/s, {gbps[-1] / ceiling_gbps:.2f} of it. "
    )
    above = [i for i in range(n) if gbps[i] > ceiling_gbps]
    if above:
        top = max(range(n), key=lambda i: gbps[i])
        text += (
            f"Faster than the ceiling at {', '.join(_size(mib[i]) for i in above)}: the ceiling is one large copy "
            f"timed once at setup, with no spread kept, while the rate here depends on the size (highest, "
            f"{gbps[top]:,.1f} GB/s, at {_size(mib[top])}); this run does not measure which of the CPU's caches "
            f"serves which size. "
        )
    return text


def exp_bound_verdict(times: Mapping[str, tuple]) -> str:
    """What bounds each ``torch.exp`` of notebook 00's exercise, from a measurement beside it: ``times`` maps a
    name to ``(exp, copy)``, two timings (anything with ``median_ms``, ``p20_ms`` and ``p80_ms``: a
    :class:`mahia.measure.timing.Timing`) of exp and of a copy of the same bytes (``clone``: one read and
    one write per element, as exp). Where the two 20-80% bands overlap, exp costs what moving its bytes
    costs: memory-bound, whatever its intensity says. Where exp is slower, the difference is exp's own work
    per element (its instructions), which then sets the time; unless it is within a tenth of the copy's time
    (the H200's float64 exp: 1.03×), where the bytes still set it and exp adds a little per element."""
    if not times:
        raise ValueError("exp_bound_verdict: no measurements")
    same, near, slower = [], [], []
    for name, (exp, copy) in times.items():
        if exp.p20_ms <= copy.p80_ms:
            same.append(f"{name} ({exp.median_ms:.3g} ms against the copy's {copy.median_ms:.3g})")
        elif exp.median_ms <= 1.1 * copy.median_ms:
            near.append(f"{name} ({exp.median_ms / copy.median_ms:.2f}× the copy's {copy.median_ms:.3g} ms)")
        else:
            extra = exp.median_ms - copy.median_ms
            slower.append(
                f"{name} ({exp.median_ms / copy.median_ms:.2f}× the copy's {copy.median_ms:.3g} ms: "
                f"{extra:.3g} ms of exp's own work)"
            )
    parts = []
    if same:
        parts.append(
            f"as fast as a copy of the same bytes, within the 20–80% spreads: {', '.join(same)}; moving the bytes "
            f"sets their time (memory-bound)"
        )
    if near:
        parts.append(
            f"slower than a copy by less than a tenth, the spreads apart: {', '.join(near)}; still memory-bound, "
            f"exp adding a little time per element to the bytes' time"
        )
    if slower:
        parts.append(
            f"slower than a copy of the same bytes, the spreads apart: {', '.join(slower)}; there exp's "
            f"instructions, not its bytes, set the time, although its intensity is below the ridge point: one exp "
            f"costs several instructions, where the ridge counts one FLOP per exp"
        )
    return "Against a copy of the same bytes timed the same way: " + "; ".join(parts) + "."


def matmul_ceiling_check(
    variant: str,
    flops: float,
    ceiling_tflops: float,
    sweep_tflops: float,
    ceiling_way_ms: tuple[float, float, float],
    flushed_ms: tuple[float, float, float] | None = None,
) -> str:
    """The matmul ceiling against a sweep point, like with like: ``variant`` (``flops`` per call, measured at
    ``sweep_tflops`` by the sweep) timed again the ceiling's way (the best median of a few large sizes, once at
    setup, no spread kept; on a GPU back to back without the L2 flush) and, on a GPU, right after that the
    sweep's way (``flushed_ms``: the L2 flushed before each repetition; None on a CPU, which has no flush).
    Each ``(median, p20, p80)`` in ms gives a rate ``flops / t / 1e12`` TFLOP/s and a 20–80% band from the
    p80 (slow) to the p20 (fast) time. Says where the ceiling lies against the ceiling-way band and whether
    the two bands are apart; when the sweep point is above the ceiling, which of those measured differences
    accounts for it (flushed faster, bands apart; the ceiling below its own way's band now), else the spread
    (the ceiling inside its way's band and the sweep point inside the band of its own way; where the two ways'
    medians are more than 3% apart although their bands overlap, the spread or the timing mode, which the run
    does not tell apart), or that none does."""
    bands = {"ceiling_way_ms": ceiling_way_ms} | ({"flushed_ms": flushed_ms} if flushed_ms is not None else {})
    for name, t in bands.items():
        if len(t) != 3 or not all(x > 0 for x in t):
            raise ValueError(f"matmul_ceiling_check: {name} must be (median, p20, p80) in ms, all > 0; got {t}")
    if not (flops > 0 and ceiling_tflops > 0):
        raise ValueError("matmul_ceiling_check: flops and ceiling_tflops must be > 0")

    def rates(t: tuple[float, float, float]) -> tuple[float, float, float]:  # median, low (p80), high (p20)
        return flops / (t[0] * 1e-3) / 1e12, flops / (t[2] * 1e-3) / 1e12, flops / (t[1] * 1e-3) / 1e12

    b, b_lo, b_hi = rates(ceiling_way_ms)
    where = "inside" if b_lo <= ceiling_tflops <= b_hi else ("above" if ceiling_tflops > b_hi else "below")
    gpu = flushed_ms is not None
    text = (
        f" The ceiling ({ceiling_tflops:.3g} TFLOP/s) is the best median of a few large matmuls"
        + (" timed back to back without the L2 flush" if gpu else "")
        + ", once at setup, with no spread kept"
        + ("; the sweep flushes L2 before each repetition" if gpu else "")
        + f". Timed again at {variant}'s shape, "
        + ("one way after the other: back to back" if gpu else "the ceiling's way:")
        + f" {b:.3g} TFLOP/s (20–80%: {b_lo:.3g}–{b_hi:.3g})"
    )
    mode, own = False, b_lo <= sweep_tflops <= b_hi  # own: the sweep point inside the band of its own way
    if gpu:
        f, f_lo, f_hi = rates(flushed_ms)
        own = f_lo <= sweep_tflops <= f_hi
        apart = f_lo > b_hi or f_hi < b_lo
        mode = apart and f > b
        text += f", flushed {f:.3g} ({f_lo:.3g}–{f_hi:.3g}): {f / b:.2f}× the back-to-back rate, " + (
            "the two bands apart" if apart else "the two bands overlapping"
        )
    text += f". The ceiling lies {where} the {'back-to-back' if gpu else 'new'} band."
    if sweep_tflops > ceiling_tflops:
        causes = (["the timing mode (flushed runs faster than back to back at this shape)"] if mode else []) + (
            ["the ceiling's measurement (this shape, timed its way now, runs faster)"] if where == "below" else []
        )
        if not causes and where == "inside" and own:
            causes = ["the timings' spread: the ceiling lies inside its way's band and the sweep point inside its own"]
            # bands that overlap while the medians do not agree: the spread alone is no answer
            if gpu and max(f / b, b / f) > 1 + _SAME_MEDIAN:
                causes = [
                    f"the timings' spread or the timing mode, which this run does not tell apart: the ceiling lies "
                    f"inside its way's band and the sweep point inside its own, but the flushed median is {f / b:.2f}× "
                    f"the back-to-back one, more than the {_SAME_MEDIAN:.0%} within which two medians agree here"
                ]
        text += f" The sweep point's {sweep_tflops / ceiling_tflops:.2f} of the ceiling comes from " + (
            " and from ".join(causes) + "." if causes else "none of these, within the spreads measured here."
        )
    return text


def kernel_time_split(
    bench_ms: float, kernel_ms: float, kernel_frac: float, *, other_gap_us: float | None = None
) -> str:
    """GPU: a short op's ``bench`` time against its kernels' device time (profiler): the difference is time the
    CUDA events count around the kernels, outside them; ``kernel_frac``: the ceiling fraction the kernels alone
    reach (FLOPs / kernel time / ceiling); ``other_gap_us``: the same difference measured for another op (the
    smallest copy), compared when given. Two such gaps count as the same when they are within 0.5 µs or 15% of
    each other: each comes from two medians, and the events' own resolution is about half a microsecond."""
    if not (bench_ms > 0 and kernel_ms > 0):
        raise ValueError(f"kernel_time_split: times must be > 0, got {bench_ms}, {kernel_ms}")
    b, k = bench_ms * 1e3, kernel_ms * 1e3
    if b <= k:
        return f"its bench time ({b:.1f} µs) is no longer than its kernels' device time ({k:.1f} µs, profiler); "
    gap = b - k
    other = ""
    if other_gap_us is not None:
        same = abs(gap - other_gap_us) <= max(0.5, 0.15 * max(gap, other_gap_us))
        other = (
            f" (the smallest copy's, above, is {other_gap_us:.1f} µs: about the same, as one fixed cost per timed "
            f"call would be)"
            if same
            else f" (the smallest copy's, above, is {other_gap_us:.1f} µs: not one fixed cost)"
        )
    return (
        f"its bench time ({b:.1f} µs) is {b / k:.1f}× its kernels' device time ({k:.1f} µs, profiler): {gap:.1f} µs "
        f"are time the events count around the kernels, outside them{other}. On their device time "
        f"alone the kernels reach {kernel_frac:.3f} of the ceiling; "
    )


def matmul_tiles_clause(
    n: int, kernel: str, tile: tuple[int, int] | None, sms: int | None, *, kernel_frac: float | None = None
) -> str:
    """What the profiler's kernel name says about an (n, n) x (n, n) product: its output tiles against the
    GPU's SMs, when the name states a tile size (:func:`mahia.lessons.profiler_summary.tile_shape`). With
    ``kernel_frac`` (the ceiling fraction the kernel alone reaches) and SMs left idle: idle SMs cap the
    fraction at ``busy SMs / sms``, so when the kernel stays below that cap they explain at most a factor
    ``sms / busy SMs`` of its shortfall, and the rest happens inside the kernel."""
    if tile is None or not sms:
        return f"its kernel is `{kernel}` (the name states no tile size). "
    tm, tn = tile
    tiles = -(-n // tm) * -(-n // tn)
    busy = min(tiles, sms)
    text = (
        f"its kernel, `{kernel}`, computes {tm}×{tn} output tiles, so a {n}×{n} product is {tiles} {'tile' if tiles == 1 else 'tiles'} for "
        f"{sms} SMs: {busy} of them get work"
    )
    if kernel_frac is not None and busy < sms and kernel_frac < busy / sms:
        text += (
            f" ({busy / sms:.2f} of the SMs): idle SMs explain at most a factor {sms / busy:.1f} of the shortfall, "
            f"the rest happens inside the kernel, which this profile does not break down"
        )
    return text + ". "


# ---------------------------------------------------------------------------------------------------
# 01 · sync elimination
# ---------------------------------------------------------------------------------------------------


def predicted_gain_phrase(ratio: float, after: str) -> str:
    """A predicted speed ratio (time before / time after) as words chosen by its value: a "speedup" only above
    1.00 as printed; below it, ``after`` (a noun phrase: the optimized path) is predicted slower."""
    if not ratio > 0:
        raise ValueError(f"predicted_gain_phrase: the ratio must be > 0, got {ratio!r}")
    shown = f"{ratio:.2f}"
    if float(shown) > 1:
        return f"a **{shown}× speedup**"
    if float(shown) == 1:
        return f"**{shown}×**: no predicted difference"
    return f"a predicted **{shown}×** ({after} {'slightly ' if ratio >= 0.9 else ''}slower)"


def extra_ops_clause(ops_before: int, ops_after: int) -> str:
    """Appended to "the sync-free step dispatches <after> ops against <before>": ops, not kernels (one op may
    launch several kernels or copies; section 5's profiler counts those)."""
    if ops_after > ops_before:
        return " (the masked arithmetic and `torch.where` are extra ops; section 5's profiler counts the kernels)"
    return ""


def sync_gain_evidence(
    speedup: float, predicted: float, *, busy_before: float | None = None, busy_after: float | None = None, cuda: bool
) -> str:
    """Why the measured gain of the sync-free loop differs from the read-back model's (``predicted``: each sync
    charged its ``t_sync``, a read-back measured with nothing queued, so no wait for queued work), stated
    with the device-busy fractions of the two loops (GPU): ``busy_before`` and ``busy_after``, each loop's kernel
    time per step (profiler) over its step timed *without* the profiler. The profiler's own cost slows the host,
    so the busy share of the profiled wall time shows idle time the profiler makes itself (73% busy under it
    where the device ran 97% of the unprofiled step, H100 of b34185d). On a CPU, where the evidence is by
    operator, said to be no waiting at all."""
    if not cuda:
        return (
            "*CPU run:* nothing runs asynchronously here, so a sync waits for nothing and there is no overlap to "
            "lose: the two loops differ by the operators they run, which the table below compares (ms per call of "
            "each loop, by operator)."
        )
    if busy_before is None or busy_after is None:
        raise ValueError("sync_gain_evidence: a GPU run needs busy_before and busy_after")
    text = (
        f"The device runs kernels {pct(min(busy_before, 1.0))} of the syncing loop's step and "
        f"{pct(min(busy_after, 1.0))} of the sync-free loop's (the profiler's kernel time per step over the step "
        f"timed without it: under the profiler, whose own cost slows the host, both would look idler). "
    )
    if speedup > predicted:
        return text + (
            f"The gain, {speedup:.2f}×, is larger than the read-back model's {predicted:.2f}×: after each sync the "
            f"device also waits while the host launches the next kernels, time the model does not charge; the "
            f"busy fractions show that idle time."
        )
    return text + (
        f"The gain, {speedup:.2f}×, is no larger than the read-back model's {predicted:.2f}×: "
        + (
            "the sync-free loop keeps the device no busier, so the syncs cost less here than the read-back measured "
            "on the chain of tiny kernels, and the sync-free step runs more ops."
            if busy_after <= busy_before
            else "the device is busier without syncs, but the sync-free step also runs more ops, which takes back "
            "part of the gain."
        )
    )


def gain_cutoff_sentence(
    step_ms: Sequence[float],
    measured: Sequence[float],
    predicted: Sequence[float],
    *,
    cut: float,
    model_cut_ms: float,
    cuda: bool = True,
    lo: Sequence[float] | None = None,
    hi: Sequence[float] | None = None,
) -> str:
    """Where the measured gain of the sync sweep (ascending ``step_ms``) is under ``cut``, against where the
    read-back model crosses it (``model_cut_ms``: the step time at which 1 + syncs·t_sync / t_step = cut),
    and whether the measured gain falls with the step time as the model's does (it does not if it rises
    anywhere). ``lo``/``hi``: each gain's range from the 20–80% spreads; with them a size counts as under (over)
    the cut only when its whole range is, and the rest are named as within the spread. ``cuda=False``: a CPU
    run, where nothing overlaps, so no reason is given for the shape."""
    if not (len(step_ms) == len(measured) == len(predicted)) or not len(step_ms):
        raise ValueError("gain_cutoff_sentence: step_ms, measured and predicted need the same, non-zero length")
    if (lo is None) != (hi is None) or (lo is not None and not (len(lo) == len(hi) == len(measured))):
        raise ValueError("gain_cutoff_sentence: give both lo and hi, one per size, or neither")
    lo_, hi_ = (lo, hi) if lo is not None else (measured, measured)
    under = [i for i in range(len(measured)) if hi_[i] < cut]
    over = [i for i in range(len(measured)) if lo_[i] >= cut]
    within = [i for i in range(len(measured)) if i not in under and i not in over]
    at = lambda idx: ", ".join(  # noqa: E731
        f"{step_ms[i]:.3g} ms ({measured[i]:.2f}×" + (f", {lo_[i]:.2f}–{hi_[i]:.2f})" if lo is not None else ")")
        for i in idx
    )
    text = (
        f"The read-back model gives less than {cut:g}× for every step longer than {model_cut_ms:.3g} ms "
        f"(at the measured sizes it predicts {min(predicted):.3f}–{max(predicted):.3f}×). "
    )
    if not under and not within:
        return (
            text + f"Measured, the gain stayed at {cut:g}× or more at every size ({min(measured):.2f}× at the least)."
        )
    parts = []
    if under:
        parts.append(f"under {cut:g}× at step times of {at(under)}")
    if over:
        parts.append(f"above it at {at(over)}")
    if within:
        parts.append(f"within the spread of {cut:g}× at {at(within)}")
    text += "Measured, it is " + ", ".join(parts[:-1]) + (", and " if len(parts) > 1 else "") + parts[-1]
    if not cuda:
        return (
            text
            + ". *CPU run:* nothing is asynchronous here, so these ratios are the loops' different ops and the machine's noise; the question is about a GPU."
        )
    rises = any(b > a for a, b in zip(measured, measured[1:]))  # anywhere, with the step time ascending
    return text + (
        ": the measured gain does not fall steadily with the step time as the model's does; the step time alone "
        "does not order it (the sweep's summary sets it against host time / device time instead)."
        if rises
        else ": it falls with the step time, as the model's does."
    )


def _count(x: float) -> str:
    """An op or kernel count per step: whole when it is, one decimal when it is an average."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _per_step(x: float) -> str:
    """A count divided by a few steps, exact up to two decimals: "114", "110.25"."""
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def launch_model_check(
    *,
    pred_after_us: float,
    launch_us: float,
    host_us: float,
    device_us: float,
    step_us: float,
    ops_before: float,
    ops_after: float,
    kernels_before: float,
    kernels_after: float,
    n_sync: int,
    sync_us: float,
    cuda: bool,
    profiled_steps: int = 1,
) -> str:
    """Section 3's premise (a sync-free step is ``ops_after × launch_us`` of launches, launch-bound) against
    what section 5 measured per sync-free step: the host's time to issue it (``host_us``), the device's busy
    time (``device_us``, profiler) and the step (``step_us``); on a GPU also the device launches per step the
    profiler counted (``kernels_*``) against the ops counted, and what section 3's model predicts with those
    counts in place of the op counts (``n_sync`` syncs of ``sync_us`` each per syncing step):

        speedup = (kernels_before × launch_us + n_sync × sync_us) / (kernels_after × launch_us)

    ``profiled_steps``: how many steps the profiled call ran (``kernels_*`` are its launches divided by it): the
    sentence then gives each count over those steps and per step, so an average is never shown as a count.

    On a CPU the host runs the ops: no device."""
    if not (launch_us > 0 and ops_after > 0):
        raise ValueError(f"launch_model_check: launch_us and ops_after must be > 0, got {launch_us}, {ops_after}")
    per_op = host_us / ops_after
    if not cuda:
        return (
            f"Section 3's premise, checked on this CPU: the host runs each op itself, {per_op:.1f} µs per op on "
            f"average ({host_us:.0f} µs per sync-free step over {_count(ops_after)} ops) against the "
            f"{launch_us:.2f} µs of the chain's one-element add."
        )
    if not (kernels_after > 0 and n_sync >= 0 and sync_us >= 0):
        raise ValueError(
            f"launch_model_check: kernels_after must be > 0 and n_sync, sync_us >= 0 on a GPU, got "
            f"{kernels_after}, {n_sync}, {sync_us}"
        )
    ratio = host_us / device_us
    k_before, k_after = kernels_before * launch_us + n_sync * sync_us, kernels_after * launch_us
    op_gain = (ops_before * launch_us + n_sync * sync_us) / (ops_after * launch_us)
    if host_us >= 2 * device_us:  # the host's time at least twice the device's: device time negligible-ish
        bound = (
            f"host-bound (host/device {ratio:.3g}), as the model assumed, at {per_op / launch_us:.1f}× its cost per op"
        )
    elif host_us >= device_us:
        bound = (
            f"near balance (host/device {ratio:.3g}: the device's time is within a factor of two of the host's), so "
            f"the model's premise, a step whose device time does not count, does not hold here; the host's cost "
            f"per op is {per_op / launch_us:.1f}× the model's"
        )
    else:
        bound = (
            f"device-bound (host/device {ratio:.3g}), so the model's premise of a launch-bound step does not hold here"
        )
    if profiled_steps > 1:
        k = profiled_steps
        counted = (
            f"the profiler counts {_count(round(kernels_before * k, 6))} device launches (kernels and copies) in {k} "
            f"steps of the syncing loop ({_per_step(kernels_before)} a step) and {_count(round(kernels_after * k, 6))} "
            f"in {k} steps of the sync-free one ({_per_step(kernels_after)} a step), against {_count(ops_before)} and "
            f"{_count(ops_after)} ops counted per step"
        )
    else:
        counted = (
            f"per step the profiler counts {_count(kernels_before)} device launches (kernels and copies) of the "
            f"syncing loop and {_count(kernels_after)} of the sync-free one, against {_count(ops_before)} and "
            f"{_count(ops_after)} ops counted"
        )
    return (
        f"Section 3's premise, checked: {counted} (the table below lists where the two differ). With "
        f"these launch counts in place of the op counts, the model predicts {k_before:.0f} µs against {k_after:.0f} µs "
        f"per step, {k_before / k_after:.2f}× (the op counts give {op_gain:.2f}×). The op-count "
        f"model charges the sync-free step {pred_after_us:.0f} µs of launches; measured, the host needs "
        f"{host_us:.0f} µs to issue one ({per_op:.1f} µs per op against t_launch = {launch_us:.2f} µs) and the device "
        f"is busy {device_us:.0f} µs of the {step_us:.0f} µs step: {bound}."
    )


def host_device_sentence(
    labels: Sequence[str], host_ms: Sequence[float], device_ms: Sequence[float], step_over_max: Sequence[float]
) -> str:
    """The host's time to issue a sync-free step against the device's busy time of it, at the first and the
    last size of a sweep (host/device > 1: host-bound), and how close each measured step came to
    max(host, device), the length of a step whose host and device work overlap fully."""
    host_ms, device_ms, step_over_max = ([float(x) for x in v] for v in (host_ms, device_ms, step_over_max))
    n = len(labels)
    if not (n == len(host_ms) == len(device_ms) == len(step_over_max)) or n == 0:
        raise ValueError(
            "host_device_sentence: labels, host_ms, device_ms and step_over_max need the same, non-zero length"
        )

    def at(i: int) -> str:
        r = host_ms[i] / device_ms[i]
        return (
            f"{host_ms[i]:.3g} ms to issue a step at {labels[i]}, where the device is busy {device_ms[i]:.3g} ms "
            f"(host/device {r:.3g}: {'host' if r >= 1 else 'device'}-bound)"
        )

    text = f"Per sync-free step, the host needs {at(0)}" + (f", and {at(n - 1)}" if n > 1 else "")
    text += f"; a measured sync-free step took {_span(min(step_over_max), max(step_over_max), '.2f')}× the larger of the two"
    short = [labels[i] for i in range(n) if step_over_max[i] < 1]
    if not short:
        return text + "."
    # A step cannot be shorter than the time the host needs to issue it: where it was, the host time
    # (measured on calls of a few steps, after a sync) overstates the host's share in the timed loop.
    return text + (
        f". A step shorter than the larger of the two cannot be: at {', '.join(short)} the host time, measured on "
        f"short calls after a sync, overstates what issuing costs in the timed loop, so the host- or device-bound "
        f"label there rests on an upper bound of the host's time."
    )


def balance_order_sentence(order, labels: Sequence[str]) -> str:
    """Where the largest gain of the sync sweep sits in host time / device time, and how many pairs of sizes
    order their gains as the overlap account predicts (the size nearer balance, host = device, gains more),
    with how many of each are outside the 20–80% spreads. ``order``: a
    :class:`mahia.lessons.sync_loops.BalanceOrder` of the sizes named by ``labels``."""
    if len(labels) != len(order.gain):
        raise ValueError(f"balance_order_sentence: {len(labels)} labels for {len(order.gain)} sizes")
    t, n = order.top, order.nearest
    text = (
        f"Against host/device: the largest gain, {order.gain[t]:.2f}× at {labels[t]}, is at host/device "
        f"{order.ratio[t]:.3g}, "
        + (
            "the size nearest balance (host = device)."
            if t == n
            else f"not at the size nearest balance: that is {labels[n]} (host/device {order.ratio[n]:.3g}, "
            f"{order.gain[n]:.2f}×)."
        )
    )
    if not order.pairs:
        return text
    text += (
        f" Of the {order.pairs} pairs of sizes, {order.agree} order their gains as the overlap account predicts, "
        f"the size nearer balance gaining more ({order.agree_apart} of them with 20–80% spreads apart), and "
        f"{order.against} against it ({order.against_apart} with spreads apart)"
    )
    if order.against_apart:
        return text + (
            f": in {order.against_apart} pair(s) the timing separates a larger gain farther from balance, which "
            "the overlap account does not explain."
        )
    return text + (": every pair against it lies within the timing noise." if order.against else ".")


def overlap_bound_clause(
    labels: Sequence[str], gain: Sequence[float], lo: Sequence[float], hi: Sequence[float], bound: Sequence[float]
) -> str:
    """How the measured gains of the sync sweep (20–80% spreads ``lo``-``hi``) compare with their overlap bound
    (host + device) / max(host, device), the gain if the syncs serialized all of a step: the sizes above it,
    and whether their whole spread is."""
    gain, lo, hi, bound = ([float(x) for x in v] for v in (gain, lo, hi, bound))
    n = len(labels)
    if not (n == len(gain) == len(lo) == len(hi) == len(bound)) or n == 0:
        raise ValueError("overlap_bound_clause: labels, gain, lo, hi and bound need the same, non-zero length")
    above = [i for i in range(n) if gain[i] > bound[i]]
    under = [gain[i] / bound[i] for i in range(n) if i not in above]
    text = f"{len(under)} of the {n} measured gains lie at or under their overlap bound" + (
        f", {_span(100 * min(under), 100 * max(under), '.0f')}% of it" if under else ""
    )
    if not above:
        return text + "."
    return (
        text
        + "; above it: "
        + ", ".join(
            f"{labels[i]} ({gain[i]:.2f}× against {bound[i]:.2f}×, spread {lo[i]:.2f}–{hi[i]:.2f}"
            + (", all of it above" if lo[i] > bound[i] else "")
            + ")"
            for i in above
        )
        + "."
    )


def slowdown_sentence(
    label: str,
    *,
    gain: float,
    lo: float,
    hi: float,
    step_before_ms: float,
    step_after_ms: float,
    host_ms: float,
    device_ms: float,
    ops_before: float,
    ops_after: float,
    n_sync: int,
    sync_us: float,
) -> str:
    """Why removing the syncs slowed a sweep size down (``gain`` < 1), from measured quantities: at a
    host-bound size (host ≥ device) the host's work sets the step, and the sync-free step's extra ops cost
    (ops_after - ops_before) × host time per op, against the n_sync × t_sync of read-back the syncs cost."""
    if not gain < 1:
        raise ValueError(f"slowdown_sentence: for a slowdown (gain < 1), got {gain}")
    if hi >= 1:  # the spread allows no change or a gain: no measured slowdown to explain (gain_range)
        return (
            f"At {label} the sync-free loop ran at {gain:.2f}× the syncing one, but the ratio's 20–80% spread, "
            f"{lo:.2f}–{hi:.2f}, holds 1: that is no measured change, so there is no slowdown to explain."
        )
    diff_us = (step_after_ms - step_before_ms) * 1e3
    text = (
        f"At {label} removing the syncs slowed the loop: {gain:.2f}× (20–80% spread {lo:.2f}–{hi:.2f}), "
        f"{diff_us:.0f} µs more per step."
    )
    ratio = host_ms / device_ms
    if not ratio >= 1:
        return text + (
            f" The step is device-bound there (host/device {ratio:.3g}), so the host's time per op does not set it: "
            "these measurements do not explain the slowdown."
        )
    extra = ops_after - ops_before
    if extra <= 0:
        return text + (
            f" The step is host-bound there (host/device {ratio:.3g}), but the sync-free step runs no more ops "
            f"({_count(ops_after)} against {_count(ops_before)} per step): the op count does not explain it."
        )
    per_op_us = host_ms * 1e3 / ops_after
    extra_us, readback_us = extra * per_op_us, n_sync * sync_us
    return (
        text
        + (
            f" The step is host-bound there (host/device {ratio:.3g}: the host needs {host_ms:.3g} ms to issue it, the "
            f"device {device_ms:.3g} ms to run it), so the host's work sets its length. The sync-free step runs "
            f"{_count(extra)} more ops ({_count(ops_after)} against {_count(ops_before)} per step); at the average "
            f"{per_op_us:.1f} µs of host time per op measured there ({host_ms:.3g} ms over {_count(ops_after)} ops) they "
            f"cost {extra_us:.0f} µs, while the syncs it removes cost {n_sync} × {sync_us:.1f} µs = {readback_us:.0f} µs of "
            f"read-back by section 3's chain: {extra_us - readback_us:+.0f} µs net, {(extra_us - readback_us) / diff_us:.0%} of "
            f"the {diff_us:+.0f} µs measured"
        )
        + (
            "."
            if extra_us - readback_us
            <= step_before_ms * 1e3 * (1 / lo - 1)  # the largest loss the 20-80% spread allows
            # above it the extra ops would cost more than even the spread's slowest runs lost: they do not explain it
            else ": more than even the spread's slowest runs lost, so the extra ops alone do not account for it."
        )
    )


def skip_step_summary(rows: Sequence[Mapping]) -> str:
    """Notebook 01's first exercise: each way of skipping a non-finite step (``step``), its ``syncs`` and what a
    NaN batch did to the weights (``weights after the NaN batch``: "unchanged", "changed" or "NaN")."""
    if not rows:
        raise ValueError("skip_step_summary: no rows")
    key = "weights after the NaN batch"
    text = (
        "With a batch whose loss is NaN: "
        + "; ".join(f"`{r['step']}` {r['syncs']} sync(s), weights {r[key]}" for r in rows)
        + ". "
    )
    good = [r["step"] for r in rows if r["syncs"] == 0 and r[key] == "unchanged"]
    text += f"Skipped without a sync and without a trace: {', '.join(f'`{g}`' for g in good) or 'none of them'}. "
    if any(r[key] == "changed" for r in rows):
        text += (
            "Where the weights changed, the gradient was zero but SGD's momentum still moved them (the update is "
            "lr × (μ · buffer + g)): the buffers have to be put back too. "
        )
    if any(r[key] == "NaN" for r in rows):
        text += "Where they became NaN, the 0/1 multiply let the NaN through: `nan * 0` is `nan`, a select is not. "
    return text


# ---------------------------------------------------------------------------------------------------
# 02 · SDPA attention
# ---------------------------------------------------------------------------------------------------


def window_mask_note(runs_masked: Sequence[str]) -> str:
    """Notebook 02's first exercise: why SDPA's flash backend cannot take a sliding-window mask, and what it means
    when a backend named ``flash`` ran one anyway (on a CPU, PyTorch's own CPU kernel of that name takes any
    mask)."""
    text = ""
    if "flash" in runs_masked:
        text = (
            "Here `flash` ran the mask: on a CPU that backend is PyTorch's own CPU kernel, which takes any mask. "
            "The CUDA flash backend does not: "
        )
    else:
        text = "SDPA's flash backend takes no `attn_mask` at all: "
    return text + (
        "through SDPA it gets only `is_causal`, a pattern its loop builds into which tiles it visits. "
        "FlashAttention itself also has a local (sliding-window) mode, the same idea for a band of tiles, "
        "but SDPA does not expose it, and an arbitrary mask has no input in either. A window is a block-sparse "
        "pattern a kernel can skip tile by tile (FlexAttention generates such kernels for any such pattern)."
    )


def manual_oom_note(oom_t: int | None, predicted_t: int | None) -> str:
    """Where the manual path ran out of memory (``oom_t``, None: never) against the prediction."""
    if oom_t is not None:
        return (
            f"The manual path ran out of memory at **T={oom_t}** (predicted: "
            f"{predicted_t if predicted_t else 'no OOM in this sweep'}). "
        )
    return f"The manual path never ran out of memory in this sweep (predicted first OOM: {predicted_t}). "


def flash_backend_note(
    flash_tflops: float | None,
    cudnn_tflops: float | None,
    *,
    capability: str | None,
    flash_impl: str | None,
    shape: str,
) -> str:
    """The measured rate of the cuDNN backend against the flash backend, and what differs between the two
    kernels in this PyTorch build. ``flash_impl``: ``torch.nn.attention.current_flash_attention_impl()``
    (None: PyTorch's bundled FlashAttention-2); ``capability``: the GPU's compute capability, "9.0" on
    Hopper. Empty unless both backends were timed."""
    if flash_tflops is None or cudnn_tflops is None:
        return ""
    text = (
        f"At {shape}, causal, cuDNN's fused attention runs at {cudnn_tflops / flash_tflops:.2f}× the rate of the "
        f"`flash` backend ({cudnn_tflops:.3g} against {flash_tflops:.3g} TFLOP/s). They are different kernels: "
    )
    if flash_impl is not None:
        return text + f"the `flash` backend runs the {flash_impl} implementation activated in this process. "
    text += (
        "the `flash` backend is PyTorch's bundled FlashAttention-2 (no other implementation is activated: "
        "`torch.nn.attention.current_flash_attention_impl()` is None)"
    )
    if capability and capability.split(".")[0] == "9":
        text += (
            f", written for the tensor-core instructions of the generation before Hopper. It uses none of "
            f"Hopper's own (warpgroup `wgmma` matrix instructions, TMA copies), which FlashAttention-3 and "
            f"cuDNN's attention kernels use on this compute capability {capability} GPU. "
        )
        return text
    return text + ". "


def decode_gain_note(
    manual_us: float,
    sdpa_us: float,
    manual_busy_us: float,
    sdpa_busy_us: float,
    manual_kernels: float,
    sdpa_kernels: float,
    *,
    cuda: bool,
) -> str:
    """Notebook 02's decoding step: where SDPA's gain over the manual path (timed, µs per call) comes from, by
    the profiler's kernels per call and their device time (``*_busy_us``). The timed call less its kernel time
    is the time the device sits idle inside a call, waiting for the host to issue the next kernel, so

        gain = (manual_busy - sdpa_busy)  [kernel time]  +  (manual idle - sdpa idle)  [host time]

    On a CPU (``cuda=False``) the busy times are the operators' own host time and no split is made."""
    if not (manual_us > 0 and sdpa_us > 0 and manual_busy_us >= 0 and sdpa_busy_us >= 0):
        raise ValueError("decode_gain_note: the timed calls must be > 0 and the busy times >= 0")
    if not cuda:
        return (
            f"*CPU run:* the profiler sees host operators, not kernels: the manual path's {manual_kernels:.0f} "
            f"top-level operators spent {manual_busy_us:.1f} µs of their own time per call, SDPA's {sdpa_kernels:.0f} "
            f"{sdpa_busy_us:.1f} µs; with no device queue there is no split into kernel and host time."
        )
    idle_m, idle_s = manual_us - manual_busy_us, sdpa_us - sdpa_busy_us
    text = (
        f"The profiler: the manual path runs {manual_kernels:.0f} kernels per call for {manual_busy_us:.1f} µs of "
        f"device time, SDPA {sdpa_kernels:.0f} for {sdpa_busy_us:.1f} µs. The timed call less its kernels, the time "
        f"the device waits for the host inside a call: manual {idle_m:.1f} µs, SDPA {idle_s:.1f} µs. "
    )
    gain, kernel = manual_us - sdpa_us, manual_busy_us - sdpa_busy_us
    host = gain - kernel
    if gain <= 0:
        return text + f"SDPA saves nothing here: it takes {-gain:.1f} µs longer per call."
    text += f"Of the {gain:.1f} µs SDPA saves per call, {kernel:.1f} µs is kernel time and {host:.1f} µs host time"
    launches = f"{manual_kernels:.0f} kernel launches, each with its Python and dispatch, against {sdpa_kernels:.0f}"
    if kernel <= 0:
        return text + f": all of the gain is the host's ({launches}); SDPA's kernels are not faster."
    if host <= 0:
        return text + ": all of the gain is in the kernels; the host's time per call did not shrink."
    if host > kernel:
        return text + f": the larger part, {host / gain:.0%}, is the host's ({launches})."
    return text + f": the larger part, {kernel / gain:.0%}, is in the kernels."


def gqa_note(
    rows: Sequence[Mapping], *, repeat_mib: float, kv_saved_ms: float, modeled: Sequence[str] = ("math",)
) -> str:
    """Notebook 02's grouped-query attention against the same call with a kv head per query head, per backend
    (``backend``; ``gqa_ms``, ``mha_ms`` with their 20–80% spreads ``*_p20``, ``*_p80``; peak memory
    ``gqa_peak_mib``, ``mha_peak_mib``, None or NaN where not measured). Faster or slower means beyond both
    spreads. A call through ``repeat_kv`` (k and v copied for every query head, ``repeat_mib``) grows the peak
    by at least that copy; a smaller growth means no such copy was made. ``kv_saved_ms``: the k, v bytes GQA
    saves, at the copy bandwidth. ``modeled``: backends whose memory the notebook explains by a model of their own
    (math expands k and v itself, in float32), left out of the no-copy inference."""
    if not rows:
        raise ValueError("gqa_note: no rows")
    # three decimals where two would print 1.00 for a ratio the spreads call faster or slower
    ratio = lambda r: f"{x:.3f}×" if f"{(x := r['gqa_ms'] / r['mha_ms']):.2f}" == "1.00" else f"{x:.2f}×"  # noqa: E731
    text = "GQA time over the same call without GQA: " + ", ".join(f"{r['backend']} {ratio(r)}" for r in rows)
    groups = {"faster beyond both 20–80% spreads": [], "slower beyond both spreads": [], "within them": []}
    for r in rows:
        faster, slower = r["gqa_p80"] < r["mha_p20"], r["gqa_p20"] > r["mha_p80"]
        groups[list(groups)[0 if faster else 1 if slower else 2]].append(r["backend"])
    text += (
        "; "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in groups.items() if v)
        + f". By the byte model the k, v bytes GQA saves are worth {kv_saved_ms:.3g} ms at the copy bandwidth, "
        f"{kv_saved_ms / min(r['gqa_ms'] for r in rows):.1%} of the fastest GQA call; the FLOPs are unchanged. "
    )
    if any(_unmeasured(r["gqa_peak_mib"]) or _unmeasured(r["mha_peak_mib"]) for r in rows):
        return text + "*CPU run:* no device memory is measured, so which backends copy k and v is not shown."
    grew = {r["backend"]: r["gqa_peak_mib"] - r["mha_peak_mib"] for r in rows}
    text += (
        "Peak memory over the call without GQA: "
        + ", ".join(f"{b} {d:+,.0f} MiB" for b, d in grew.items())
        + f"; k and v repeated to every query head take {repeat_mib:,.0f} MiB. "
    )
    copy = [b for b, d in grew.items() if d >= repeat_mib]
    less = [b for b in grew if b not in copy and b not in modeled]
    if copy:
        text += f"Grew by at least that copy, as a call through `repeat_kv` does: {', '.join(copy)}. "
    if less:
        text += f"Grew by less, so no full copy of k and v was made: {', '.join(less)}."
    return text.rstrip()


def _unmeasured(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


# ---------------------------------------------------------------------------------------------------
# 03 · Triton fusion
# ---------------------------------------------------------------------------------------------------


def above_copy_note(
    fracs: Mapping[str, float], reads_per_write: Mapping[str, float], reference: float, *, cuda: bool
) -> str:
    """Why fused kernels ran above 1 of the copy bandwidth (``fracs`` by experiment), if any did: their reads per
    write against a copy's one, and a plain ``a + b`` stream at the SwiGLU shape (``reference``: its fraction of
    the copy bandwidth; two reads per write, no arithmetic) measured in the same run. Empty when none did."""
    above = {e: f for e, f in fracs.items() if f > 1}
    if not above:
        return ""
    listed = ", ".join(
        f"{e} at {f:.2f} (reads {reads_per_write[e]:.2g}× the bytes it writes)" for e, f in above.items()
    )
    if not cuda:
        text = (
            f"*CPU run:* above 1: {listed}. A plain `a + b` at the SwiGLU shape ran at {reference:.2f} of the ceiling. "
        )
        if reference > 1:
            return text + (
                "A stream with no arithmetic passes the ceiling too, so it is the size, not the kernel: these "
                "tensors are served from the CPU's caches, while the ceiling is one copy larger than them."
            )
        return text + "The plain stream did not pass it, so the caches alone do not explain these fractions."
    text = (
        f"Above 1: {listed}. The ceiling is a copy, one read per write; a plain `a + b` at the SwiGLU shape, two "
        f"reads per write and no arithmetic, ran at {reference:.2f} of it. "
    )
    if reference > 1:
        return text + (
            "So the copy is not a ceiling for a read-heavy mix: device memory serves a stream of mostly reads "
            "faster than one with as many writes as reads, and these kernels are at that mix's rate, not above it."
        )
    return text + (
        "The plain stream stayed below the ceiling, so the mix does not explain these fractions: compare them "
        "with the spread of their timings (the table above)."
    )


# ---------------------------------------------------------------------------------------------------
# 04 · torch.compile
# ---------------------------------------------------------------------------------------------------


def absolute_miss_note(
    eager_ms: float, eager_pred_ms: float, comp_ms: float, comp_pred_ms: float, ops: int, launch_us: float
) -> str:
    """Notebook 04: the model's absolute times against the measured ones (ms), eager and `default`, beside the
    ratio it predicts. When both miss by about as much (their misses within 25% of each other) and neither lands
    (0.8–1.25× the measurement), an agreeing ratio is two misses cancelling, said so. ``ops``: the eager call's
    traced ops; eager's measured time per op against ``launch_us`` (t_launch, µs) shows the host work per op that
    a bare launch chain does not have."""
    if not (eager_ms > 0 and eager_pred_ms > 0 and comp_ms > 0 and comp_pred_ms > 0 and ops > 0 and launch_us > 0):
        raise ValueError("absolute_miss_note: the times, ops and t_launch must be > 0")
    me, mc = eager_ms / eager_pred_ms, comp_ms / comp_pred_ms
    text = (
        f"Eager measured {eager_ms:.3g} ms against {eager_pred_ms:.3g} ms predicted ({me:.2f}× the prediction), "
        f"`default` {comp_ms:.3g} ms against {comp_pred_ms:.3g} ms ({mc:.2f}×). "
    )
    if all(0.8 <= m <= 1.25 for m in (me, mc)):
        return text + "The model prices both calls, so its ratio is a prediction that held. "
    per_op = eager_ms * 1e3 / ops
    if per_op > 1.25 * launch_us:
        text += (
            f"Eager took {per_op:.3g} µs per traced op against t_launch = {launch_us:.3g} µs: host work per op "
            "(Python, module calls, dispatch) that a bare chain of launches does not have and the model leaves out. "
        )
    if 0.8 <= me / mc <= 1.25:
        text += (
            "Both miss by about as much, so however close the predicted gain comes, that is two misses cancelling, "
            "not the model pricing either call. "
        )
    return text


def trace_check_note(traced: int, profiled: int, *, within: float = 0.05) -> str:
    """The traced kernel count of a step (``traced``, :func:`mahia.measure.instruments.trace_ops`) against the
    device events the profiler saw (``profiled``: kernels, copies and memsets): a cross-check that holds when they
    are within ``within`` of each other, else the gap, which the launch model (priced on the traced count) misses."""
    if not (traced > 0 and profiled >= 0):
        raise ValueError(f"trace_check_note: need traced > 0 and profiled >= 0, got {traced!r}, {profiled!r}")
    gap = profiled - traced
    if abs(gap) <= within * traced:
        return f"the profiler sees {profiled:,} device events on the GPU: the trace's count holds"
    return (
        f"the profiler sees {profiled:,} device events on the GPU, {abs(gap):,} {'more' if gap > 0 else 'fewer'} "
        f"({abs(gap) / traced:.0%} of the trace's count): events the trace does not see (an op that launches "
        f"several kernels, copies and memsets), which the launch model below, priced on the traced count, "
        f"{'leaves out' if gap > 0 else 'counts too'}"
    )


def compile_evidence(ratio: float, eager, compiled, saved_ms: float) -> str:
    """`default`'s measured gain over the predicted one (``ratio``), with the profiler's account of one eager and
    one compiled call (two :class:`mahia.lessons.profiler_summary.ProfileSummary`): launches, busy and wall time.
    ``saved_ms`` = eager median - compiled median of the benchmark (the profiler's wall times carry its own
    overhead); of it, the profiler's busy-time drop is the device's (operators' on a CPU) share, the rest the host's."""
    if not (isinstance(saved_ms, (int, float)) and math.isfinite(saved_ms)):
        raise ValueError(f"compile_evidence: saved_ms must be a finite number, got {saved_ms!r}")
    what = "kernel" if eager.cuda else "operator"
    counted = "device events (kernels, copies and memsets)" if eager.cuda else "operators"
    text = (
        f"`default` measured {ratio:.2f}× the predicted gain. Per call, the profiler counts {eager.launches:.0f} "
        f"{counted} eager and {compiled.launches:.0f} compiled; {what} time {eager.busy_ms:.3g} → "
        f"{compiled.busy_ms:.3g} ms, wall time under the profiler {eager.wall_ms:.3g} → {compiled.wall_ms:.3g} ms. "
    )
    saved_busy = eager.busy_ms - compiled.busy_ms
    if saved_ms <= 0:
        return text + "In the benchmark the compiled call was not faster."
    if saved_busy >= saved_ms:
        text += (
            f"The benchmark's medians save {saved_ms:.3g} ms per call; the profiler's {what} time drops by "
            f"{saved_busy:.3g} ms, all of that saving or more"
        )
    else:
        text += (
            f"Of the {saved_ms:.3g} ms per call that the benchmark's medians save, the profiler puts {saved_busy:.3g} ms "
            f"in {what} time; the other {saved_ms - saved_busy:.3g} ms is the host's (Python, dispatch, launches)"
        )
    if not eager.cuda:
        return (
            text
            + ": *CPU run: Inductor's C++ code runs inside a few calls the profiler does not split into operators.*"
        )
    return text + "."


_COPY_EVENTS = r"^Mem(?:cpy|set)\b"  # the profiler's names of device copies and fills ("Memset (Device)")
_INDUCTOR_KERNELS = r"^triton_"  # Inductor names its Triton kernels triton_poi_/_red_/_per_/_tem_...


def _events(profile, pattern: str) -> float:
    """Device events per call of a :class:`~mahia.lessons.profiler_summary.ProfileSummary` whose name matches."""
    top = profile.top
    return float(top.loc[top["name"].str.contains(pattern, regex=True), "calls"].sum()) if len(top) else 0.0


def launch_count_note(ops_eager: int, generated: int, library: int, eager, compiled) -> str:
    """Why the profiler's launch counts per call (``eager``, ``compiled``: two GPU
    :class:`~mahia.lessons.profiler_summary.ProfileSummary`) differ from the counts of the code: ``ops_eager`` ops
    that launch a kernel in the eager trace, ``generated`` kernels Inductor wrote and ``library`` library calls
    in its output. The profiler counts every device event (kernels, copies, memsets); the compiled count is split
    by the profile's names (Inductor's ``triton_`` kernels, the rest). Empty on a CPU (its profile counts host
    operators)."""
    if not (eager.cuda and compiled.cuda):
        return ""
    mem_e, mem_c = _events(eager, _COPY_EVENTS), _events(compiled, _COPY_EVENTS)
    ind = _events(compiled, _INDUCTOR_KERNELS)
    return (
        f"The profiler's counts are not the code's: it counts every event on the device per call (kernels, copies "
        f"and memsets), and one op or library call can launch several. Eager: {_count(eager.launches)} events "
        f"({_count(mem_e)} of them copies and memsets) for {ops_eager} traced ops. Compiled: "
        f"{_count(compiled.launches)} events for the code's {generated + library} launches: {_count(ind)} Inductor "
        f"kernels (`triton_...`) for its {generated} generated ones, and {_count(compiled.launches - ind)} other events "
        f"({_count(mem_c)} of them copies and memsets) for its {library} library calls."
    )


def _calls(x: float) -> str:
    """A break-even count as whole calls; "never" where it is infinite (the compiled call was not faster)."""
    return "never" if math.isinf(x) else f"{round(x):,}"


def train_vs_inference(
    train_gain: float,
    train_break_even: float,
    infer_gain: float,
    infer_break_even: float,
    *,
    train_range: tuple[float, float] | None = None,
    infer_range: tuple[float, float] | None = None,
) -> str:
    """Notebook 04's first exercise: which of a compiled training step and a compiled inference forward of the same
    block gained more per call, and whether one paid its compile time back sooner, as measured. "Sooner" only when
    its break-even is strictly fewer whole calls and the (fewest, most) calls that the timings' 20–80% spreads allow
    (``*_range``, from :func:`mahia.lessons.graphs_and_compile.break_even_range`) do not overlap; otherwise, or
    without the ranges, both counts are stated."""
    n_tr, n_inf = (math.inf if math.isinf(x) else round(x) for x in (train_break_even, infer_break_even))
    sooner = None
    if train_range is not None and infer_range is not None:
        if n_tr < n_inf and train_range[1] < infer_range[0]:
            sooner = "the training step"
        elif n_inf < n_tr and infer_range[1] < train_range[0]:
            sooner = "the inference forward"
    more = "the training step" if train_gain > infer_gain else "the inference forward"
    counts = " against ".join(
        "never" if math.isinf(x) else f"{_calls(x)} {unit}"
        for x, unit in ((train_break_even, "steps"), (infer_break_even, "calls"))
    )
    if sooner is None:
        text = f"Measured here, {more} gained more per call; the two paid their compile time back after {counts}"
        if train_range is not None and infer_range is not None:
            text += (
                f"; the timings' 20–80% spreads allow {_calls(train_range[0])}–{_calls(train_range[1])} and "
                f"{_calls(infer_range[0])}–{_calls(infer_range[1])}, which overlap: neither paid back measurably sooner"
            )
        return text + (
            ". Training repeats one step of one shape for a whole run, so its compile time is paid once against far "
            "more calls than a short inference job makes."
        )
    join = " and" if more == sooner else f", but {sooner}"
    text = f"Measured here, {more} gained more per call{join} paid its compile time back sooner ({counts}). "
    if sooner == "the training step":
        return text + (
            "Training is the better case: it repeats one step of one shape for a whole run, so the compile time is "
            "paid once, and its backward adds elementwise work that fusion removes too."
        )
    return text + (
        "Per call, inference is the better case at this size; training still repeats one step of one shape for a "
        "whole run, so its compile time is paid once against far more calls than a short inference job makes."
    )


def group_change_sentence(
    before: Mapping[str, float], after: Mapping[str, float], labels: Sequence[str], names: tuple[str, str]
) -> str:
    """ "matmuls 250 → 22.7 ms (×11), attention only in bf16: 6.2 ms, …" for the groups of two
    ``time_by_group`` results (``labels`` and then "other"; the factor is before / after). A group with no time
    on one side is named with the side it ran in (``names``: the before and after runs); one with none on either
    is left out."""
    parts = []
    for g in (*labels, "other"):
        b, a = before.get(g, 0.0), after.get(g, 0.0)
        if b > 0 and a > 0:
            parts.append(f"{g} {b:.3g} → {a:.3g} ms (×{b / a:.3g})")
        elif b > 0 or a > 0:
            parts.append(f"{g} only in {names[0] if b > 0 else names[1]}: {max(a, b):.3g} ms")
    return ", ".join(parts)


def bytes_bound_note(
    factor: float, bound: float, ops_before: Mapping[str, float], ops_after: Mapping[str, float], n_top: int = 3
) -> str:
    """Checks the gain ``factor`` of the operators outside the named groups against ``bound``, the most that
    memory-bound work gains from its bytes shrinking by that factor. Above it, at least one of them gained more
    than ``bound`` (were all at or below it, so would be their sum); the ``n_top`` largest drops in time,
    ``ops_before`` -> ``ops_after`` (operator name -> ms), say which."""
    if not (math.isfinite(factor) and factor > 0 and bound > 0):
        raise ValueError(f"bytes_bound_note: factor and bound must be positive numbers, got {factor!r}, {bound!r}")
    if factor <= bound:
        return f"The operators in other changed by ×{factor:.2f}, within the ≤ {bound:g}× that fewer bytes give memory-bound work."
    drops = sorted(((b - ops_after.get(k, 0.0), k, b) for k, b in ops_before.items()), reverse=True)[:n_top]
    listed = ", ".join(f"`{k}` {b:.3g} → {ops_after.get(k, 0.0):.3g} ms" for d, k, b in drops if d > 0)
    return (
        f"The operators in other gained ×{factor:.2f}, more than the ≤ {bound:g}× that fewer bytes give memory-bound work: at least "
        f"one operator in it gained more than that, so not all of it is memory-bound work whose bytes only shrank."
        + (f" Its largest drops: {listed}." if listed else "")
    )


def not_faster_note(
    sizes: Sequence[float],
    ratios: Sequence[float],
    what: str,
    unit: str,
    ranges: Sequence[tuple[float, float]] | None = None,
) -> str:
    """Names the ``sizes`` at which ``what`` was not faster (its speedup ``ratios`` at or below 1), with their
    ratios; says so when it was faster at every size. Given ``ranges`` (the ratio's low and high end at each size,
    from the two timings' 20–80% spreads: :func:`gain_range`), a size whose range holds 1 is no measured gain
    either, whatever its median ratio, and "faster at every size" needs every range above 1."""
    if len(sizes) != len(ratios) or not len(sizes) or (ranges is not None and len(ranges) != len(sizes)):
        raise ValueError(
            f"not_faster_note: need as many sizes as ratios (and ranges), at least one, got {len(sizes)}, "
            f"{len(ratios)}" + ("" if ranges is None else f", {len(ranges)}")
        )

    def listed(items: Sequence[tuple[float, str]]) -> str:
        names = [f"{s:,.0f}" for s, _ in items]
        at = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        return f"{at} {unit} ({', '.join(r for _, r in items)})"

    slow = [(s, f"{r:.2f}×") for s, r in zip(sizes, ratios) if r <= 1]
    unsure = (
        [
            (s, f"{r:.2f}×, spread {lo:.2f}–{hi:.2f}×")
            for s, r, (lo, hi) in zip(sizes, ratios, ranges)
            if r > 1 and lo <= 1
        ]
        if ranges is not None
        else []
    )
    if not slow and not unsure:
        return f"{what} was faster at every size" + (
            ", beyond the spread of every ratio." if ranges is not None else "."
        )
    parts = [f"{what} was not faster at {listed(slow)}"] if slow else []
    if unsure:
        lead = "" if slow else f"{what} was faster at every size by the median, but "
        parts.append(f"{lead}at {listed(unsure)} the ratio's spread holds 1: no measured gain there")
    return "; ".join(parts) + "."


def _later_no_slower(times: Sequence[float], order: Sequence[int]):
    """(i, j) for each point i of ``order`` (positions in ``times``, smallest size first) whose fastest later point j
    took no longer than it: where a sweep's times are not in proportion to its sizes."""
    for a, i in enumerate(order[:-1]):
        j = min(order[a + 1 :], key=lambda k: times[k])
        if times[j] <= times[i]:
            yield i, j


def time_drop_note(
    sizes: Sequence[float],
    medians: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    what: str,
    unit: str,
    *,
    wide: float = 0.1,
) -> str:
    """Where ``what`` took longer (median, ms) at a size than at a larger one, though its work grows with the size:
    each such point with the larger size's time and the point's 20–80% spread (``lows``–``highs``, ms). A spread
    wider than ``wide`` of the median says the point's calls varied (the host's jitter, the device's clocks), so the
    drop is not a cost of the size; a narrow one says the drop repeated call after call, unless it overlaps the
    larger size's spread (then no drop is measured). "" when no time drops."""
    sizes, medians, lows, highs = (list(x) for x in (sizes, medians, lows, highs))  # by position, not label
    n = len(sizes)
    if not n or not (len(medians) == len(lows) == len(highs) == n):
        raise ValueError(f"time_drop_note: need as many medians and spreads as sizes, at least one, got {n}")
    parts = []
    for i, j in _later_no_slower(medians, sorted(range(n), key=lambda i: sizes[i])):
        if medians[j] < medians[i]:
            width = (highs[i] - lows[i]) / medians[i]
            if width > wide:
                verdict = "wide: its calls varied, so the drop is not a cost of the size"
            elif lows[i] <= highs[j]:  # the H200's 19.6 ms (19.46–19.73) against 19.5 ms (19.31–19.70)
                verdict = f"narrow, but overlapping the larger size's {lows[j]:.3g}–{highs[j]:.3g} ms: no measured drop"
            else:
                verdict = "narrow: the drop repeated call after call"
            parts.append(
                f"{medians[i]:.3g} ms at {sizes[i]:,.0f} {unit}, more than the {medians[j]:.3g} ms at "
                f"{sizes[j]:,.0f} (20–80% spread {lows[i]:.3g}–{highs[i]:.3g} ms, {width:.0%} of the median, {verdict})"
            )
    if not parts:
        return ""
    return f"{what} took " + "; ".join(parts) + "."


def reorder_print_summary(rows: Sequence[Mapping]) -> str:
    """Notebook 04's second exercise: for each print (``print``), the graphs and breaks Dynamo made without and
    with ``print`` as a reorderable logging function (``reorderable``, ``graphs``, ``graph breaks``)."""
    kinds = list(dict.fromkeys(r["print"] for r in rows))
    if not kinds:
        raise ValueError("reorder_print_summary: no rows")
    parts = []
    for k in kinds:
        plain = next(r for r in rows if r["print"] == k and not r["reorderable"])
        moved = next(r for r in rows if r["print"] == k and r["reorderable"])
        failed = [r for r in (plain, moved) if r["graphs"] is None]
        if failed:  # Dynamo raised instead of tracing: say so, with what it said
            which = " and ".join("registered as reorderable" if r["reorderable"] else "as is" for r in failed)
            parts.append(
                f"`{k}`: Dynamo could not trace the function {which} ({failed[0]['why']}), so this PyTorch "
                "gives no answer here"
            )
            continue
        said = (
            f"`{k}`: {plain['graphs']} graph(s) and {plain['graph breaks']} break(s); registered as reorderable, "
            f"{moved['graphs']} graph(s) and {moved['graph breaks']} break(s)"
        )
        if moved["graph breaks"] < plain["graph breaks"]:
            said += ": Dynamo records the call and replays it after the graph, so it no longer splits the function"
        else:
            said += (
                ": the break stays, because Dynamo reorders a logging call only when it can replay its arguments after "
                "the graph, and in this PyTorch it could not replay these"
            )
        parts.append(said)
    return "; ".join(parts) + "."


# A call whose benchmarked time is at least this many times its kernels' time is dominated by the host: a
# difference between two such calls measures the host (its noise included), not the compiled kernels.
HOST_DOMINATED_FACTOR = 2.0

_SPECIALIZATION_KEYS = ("static ms", "dynamic ms", "static kernel ms", "dynamic kernel ms")


def specialization_verdict(lo: float, hi: float, rows: Sequence[Mapping] | None = None) -> str:
    """What static-shape specialization bought, from the range ``lo``-``hi`` of dynamic / static time per call
    (where the difference comes from: :func:`specialization_evidence`).

    ``rows`` (on a GPU): one mapping per length with the benchmarked ``"static ms"`` and ``"dynamic ms"`` and the
    profiler's ``"static kernel ms"`` and ``"dynamic kernel ms"`` per call. Where every benchmarked time is at
    least :data:`HOST_DOMINATED_FACTOR` × its kernel time, the host decides the benchmark, so its ratios are
    called host noise and the verdict is made on the kernel times instead."""
    if rows:
        missing = [k for k in _SPECIALIZATION_KEYS if any(k not in r for r in rows)]
        if missing:
            raise ValueError(f"specialization_verdict: rows need {list(_SPECIALIZATION_KEYS)}, missing {missing}")
        if not all(r[k] > 0 for r in rows for k in _SPECIALIZATION_KEYS):
            raise ValueError(f"specialization_verdict: every time must be > 0, got {list(rows)!r}")
        over = [r[f"{m} ms"] / r[f"{m} kernel ms"] for r in rows for m in ("static", "dynamic")]
        if min(over) >= HOST_DOMINATED_FACTOR:
            return _kernel_verdict(lo, hi, over, [r["dynamic kernel ms"] / r["static kernel ms"] for r in rows])
    if lo > 1:
        return f"Specialization bought {lo:.2f}–{hi:.2f}× per call. "
    if hi < 1:
        return (
            "The dynamic compile was faster at every length here: specialization bought nothing measurable at these "
            "sizes, and the static compiles cost one compilation per length. "
        )
    return (
        "Mixed: the dynamic compile was faster at some lengths and slower at others, so specialization bought "
        "nothing consistent here; what it certainly costs is one compilation per length. "
    )


def _kernel_verdict(lo: float, hi: float, over: Sequence[float], k_ratios: Sequence[float]) -> str:
    """:func:`specialization_verdict` for calls the host dominates: the verdict from the kernel times."""
    klo, khi = min(k_ratios), max(k_ratios)
    text = (
        f"But each call's benchmarked time is {_span(min(over), max(over))}× its kernels' time (profiler), so the "
        f"host decides these timings and their {lo:.2f}–{hi:.2f}× range is host noise, not the compiled code. By "
        f"kernel time the dynamic compile's kernels took {_span(klo, khi, '.3f')}× the static ones': "
    )
    if klo > 1:
        verdict = f"the static kernels were faster at every length, by {_span(100 * (klo - 1), 100 * (khi - 1))}%"
    elif khi <= 1:
        verdict = "the dynamic kernels were as fast or faster at every length, so specialization bought no device time"
    else:
        verdict = "faster at some lengths and slower at others, so specialization bought nothing consistent"
    return text + verdict + "; what it certainly costs is one compilation per length. "


def specialization_evidence(
    length: int, static_ms: float, dynamic_ms: float, static_kernel_ms: float, dynamic_kernel_ms: float
) -> str:
    """Where the dynamic compile's extra time per call goes at ``length``, from the two benchmarked times and the
    profiler's kernel time of each call: the kernels (slower symbolic-size kernels) or the host (the guards and
    size arithmetic a symbolic graph runs per call)."""
    gap, k_gap = dynamic_ms - static_ms, dynamic_kernel_ms - static_kernel_ms
    text = (
        f"At T = {length} the profiler puts the static call's kernels at {static_kernel_ms:.3g} ms and the dynamic "
        f"one's at {dynamic_kernel_ms:.3g} ms, against {static_ms:.3g} and {dynamic_ms:.3g} ms per call benchmarked"
    )
    if gap <= 0:
        kernels = (
            f"its kernels took {k_gap:.2g} ms more ({dynamic_kernel_ms / static_kernel_ms:.3f}×)"
            if k_gap > 0
            else f"nor were its kernels ({dynamic_kernel_ms / static_kernel_ms:.3f}× the static ones' time)"
        )
        return text + ": the dynamic call was not slower in the benchmark there; " + kernels + ". "
    if k_gap >= 0.5 * gap:
        return text + f": the kernels hold {k_gap:.3g} of the {gap:.3g} ms difference, so it is mostly device work. "
    return text + (
        f": the kernels hold {max(k_gap, 0):.3g} of the {gap:.3g} ms difference, so most of it is host work per call "
        f"(the symbolic graph's guards and size arithmetic), not slower kernels. "
    )


# ---------------------------------------------------------------------------------------------------
# 05 · CUDA graphs
# ---------------------------------------------------------------------------------------------------


def per_tensor_reads(which: str, reads: int, with_grad: int, tensors: int) -> str:
    """The optimizer's host reads per step (``reads``, listed in ``which``) per parameter tensor it updates: the
    ``with_grad`` of the model's ``tensors`` that have a gradient (an optimizer skips the others)."""
    if not (reads >= 0 and 0 <= with_grad <= tensors):
        raise ValueError(
            f"per_tensor_reads: need reads >= 0 and 0 <= with_grad <= tensors, got {reads}, {with_grad}, {tensors}"
        )
    of = f"{with_grad:,} of the model's {tensors:,} parameter tensors have a gradient"
    if with_grad and reads and reads % with_grad == 0:
        return f"{which}, {reads // with_grad:,} per updated tensor ({of})"
    return f"{which} ({of})"


def padding_cost_note(within_spread: bool) -> str:
    """The CPU run's note on bucketing: without graphs it measures the padding alone."""
    return (
        " *CPU run: no graphs, so this measures only what the padding costs"
        + (" (here within the 20–80% spread of the two timings: no measurable difference)" if within_spread else "")
        + ".*"
    )


# ---------------------------------------------------------------------------------------------------
# 06 · mixed precision
# ---------------------------------------------------------------------------------------------------


def fp16_sum_overflow_note(total: float, fp16_max: float, fp16_error: float) -> str:
    """When the fp16 sum overflowed (its error is not finite): says so; else nothing."""
    if math.isfinite(fp16_error):
        return ""
    return f"In fp16 the same sum ({total:,.0f}) does not fit under {fp16_max:,.0f}: error {fp16_error}. "


def mib_amount(n_bytes: float) -> str:
    """``n_bytes`` in MiB without spurious digits: "13,241 MiB" from 100 MiB on, three significant digits below
    ("9.4 MiB", "0.53 MiB"), "<0.1 MiB" for an amount above 0 that small, and "0 MiB" for none at all."""
    if not (math.isfinite(n_bytes) and n_bytes >= 0):
        raise ValueError(f"mib_amount: n_bytes must be a finite number >= 0, got {n_bytes!r}")
    mib = n_bytes / 2**20
    if mib == 0:
        return "0 MiB"
    if mib < 0.1:
        return "<0.1 MiB"
    return f"{mib:,.0f} MiB" if mib >= 100 else f"{mib:.3g} MiB"


def matmul_time_check(
    model_ms: float, profiled_ms: float, rest_ms: float, amdahl_rest_ms: float, time: str, *, what: str = "matmuls"
) -> str:
    """Sets the profiler's time of the matmul operators (``profiled_ms``) beside ``model_ms``, the time their FLOPs
    take at the square-matmul ceiling, and the profiler's time of everything else (``rest_ms``) beside
    ``amdahl_rest_ms``, what the Amdahl estimate took for it (the step's time minus ``model_ms``). ``time`` names
    the profiler's clock ("device" or "host"); ``what`` the operators profiled, which must be the work the FLOPs
    count (e.g. "matmuls and the scan" where the model counts the scan's chunk products as matmul FLOPs)."""
    for name, v in (("model_ms", model_ms), ("profiled_ms", profiled_ms)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"matmul_time_check: {name} must be a time > 0 (ms), got {v!r}")
    for name, v in (("rest_ms", rest_ms), ("amdahl_rest_ms", amdahl_rest_ms)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"matmul_time_check: {name} must be a time >= 0 (ms), got {v!r}")
    side = (
        f"above the {model_ms:.3g} ms their FLOPs take at the square-matmul ceiling (they ran at "
        f"{model_ms / profiled_ms:.2f} of it)"
        if profiled_ms > model_ms
        else f"below the {model_ms:.3g} ms their FLOPs take at the square-matmul ceiling"
    )
    return (
        f"The profiler puts the fp32 {what} at {profiled_ms:.3g} ms of {time} time, {side}, and everything else at "
        f"{rest_ms:.3g} ms, where the Amdahl estimate took {amdahl_rest_ms:.3g} ms (the step minus the matmuls at "
        f"the ceiling)."
    )


def _first_bad(values: Sequence[float]) -> int | None:
    return next((i for i, v in enumerate(values) if not math.isfinite(v)), None)


def tail_loss_list(curves: Mapping[str, Sequence[float]], n_tail: int) -> str:
    """ "fp32 4.2305, fp16, no scaler diverged (NaN from step 37 on), …": the mean loss of the last ``n_tail``
    steps of each curve (name -> loss per step), or, for a curve that is not finite, where it stopped being so."""
    if not (isinstance(n_tail, int) and n_tail >= 1):
        raise ValueError(f"tail_loss_list: n_tail must be an int >= 1, got {n_tail!r}")
    parts = []
    for name, curve in curves.items():
        values = [float(v) for v in curve]
        if not values:
            raise ValueError(f"tail_loss_list: the curve {name!r} is empty")
        bad = _first_bad(values)
        if bad is None:
            parts.append(f"{name} {sum(values[-n_tail:]) / len(values[-n_tail:]):.4f}")
            continue
        what = "NaN" if math.isnan(values[bad]) else "inf"
        stays = all(not math.isfinite(v) for v in values[bad:])
        parts.append(
            f"{name} diverged ({what} from step {bad + 1} on)"
            if stays
            else f"{name} not finite at {sum(not math.isfinite(v) for v in values)} steps, from step {bad + 1}"
        )
    return ", ".join(parts)


def unscaled_fp16_note(curve: Sequence[float], scaled_finite: bool | None, fp16_max: float) -> str:
    """Why the fp16 run without a loss scaler (``curve``: its loss per step) went NaN or inf, when it did (ending in a
    space, to be followed by another sentence); nothing when it stayed finite. ``scaled_finite``: whether the fp16 run with a GradScaler stayed finite (None: no such
    run here)."""
    values = [float(v) for v in curve]
    bad = _first_bad(values)
    if bad is None:
        return ""
    what = "NaN" if math.isnan(values[bad]) else "inf"
    if scaled_finite is False:
        scaler = (
            "The fp16 run with a GradScaler did not stay finite either: the overflow is not only in the gradients "
            "that a scaler checks. "
        )
    else:
        scaler = ("The fp16 run with a GradScaler stayed finite: a" if scaled_finite else "A") + (
            " GradScaler finds an inf or NaN in the gradients, skips that step and lowers its scale; without one, "
            "the optimizer writes such a step into the weights, and the losses after it follow. "
        )
    return (
        f"Without a loss scaler the fp16 loss became {what} at step {bad + 1}. Gradients that vanish (section 2) slow or "
        f"stall training; they do not make a loss {what}. An inf comes from an fp16 value past {fp16_max:,.0f}, and "
        f"a NaN from an operation without a value, such as inf − inf or 0 × inf; which value went first was not "
        f"measured here. " + scaler
    )


def loss_log_softmax_note(log_softmax: Mapping[str, int], nll_loss: Mapping[str, int], softmax_default: str) -> str:
    """Notebook 06's third exercise: why the loss's log-softmax ran in the dtype it did under autocast.
    ``log_softmax``, ``nll_loss``: the calls of ``_log_softmax`` and ``nll_loss_forward`` per dtype name (from
    :func:`mahia.lessons.training.op_dtypes`); ``softmax_default``: the dtype autocast gives a softmax called
    without a dtype on this device ("float32" on CUDA)."""
    ran = ", ".join(f"{n} in {d}" for d, n in log_softmax.items()) or "none"
    nll = ", ".join(f"{n} in {d}" for d, n in nll_loss.items()) or "none"
    if not log_softmax:
        return "The loss ran no log-softmax here."
    if set(log_softmax) == {"float32"}:
        return (
            f"The loss's log-softmax ran {ran}: on this device autocast casts the loss's input to float32 before "
            f"it (the loss is on this device's float32 list), and its `nll_loss` ran {nll}."
        )
    if softmax_default == "float32":
        return (
            f"The loss's log-softmax ran {ran}, although autocast gives float32 to a softmax called without a dtype: "
            f"`F.cross_entropy` calls `log_softmax` with its input's dtype given explicitly, and autocast keeps a "
            f"dtype it is given (it picks float32 only where none is). The `nll_loss` after it, on autocast's "
            f"float32 list, ran {nll}: it reads a float32 copy of those log-probabilities."
        )
    return (
        f"The loss's log-softmax ran {ran}, as autocast runs a softmax here ({softmax_default}); its `nll_loss` "
        f"ran {nll}."
    )


# ---------------------------------------------------------------------------------------------------
# 07 · gradient checkpointing
# ---------------------------------------------------------------------------------------------------


def recompute_cost_note(
    d_wall_ms: float,
    d_kern_ms: float,
    busy_before: float,
    busy_after: float,
    what: str,
    host_work: str,
    *,
    peer: tuple[str, float, float] | None = None,
) -> str:
    """Where a checkpointing policy's added wall time (``d_wall_ms`` over the step without checkpointing) went,
    from the profiler: ``d_kern_ms`` of added kernel time, and the share of each benchmarked step the device ran
    kernels (``busy_before`` without checkpointing, ``busy_after`` with ``what``). Where both steps keep the
    device busy (at least 90%), the host's work (``host_work``, a noun phrase: the recompute's launches, a Python
    policy) hides behind device work and the added time is kernel time; otherwise the host adds what the kernels
    do not account for. ``peer`` (its name, added wall ms, added kernel ms) is another policy doing the same host
    work: where its added wall time is not in excess of its kernels' (less than half of ``what``'s excess), the host
    work named cannot be the cause, and the sentence says only that the time is not kernel time."""
    for name, v in (("busy_before", busy_before), ("busy_after", busy_after)):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"recompute_cost_note: {name} must be a share >= 0, got {v!r}")
    text = (
        f"The device ran kernels {pct(busy_before)} of the benchmarked step without checkpointing and "
        f"{pct(busy_after)} with {what}: "
    )
    if min(busy_before, busy_after) >= 0.9:
        return text + (
            f"the step is device-bound, so the host's work ({host_work}) overlaps device work, and the added time "
            f"is kernel time ({d_kern_ms:.3g} ms more of kernels for {d_wall_ms:.3g} ms more per step)."
        )
    if d_wall_ms <= d_kern_ms:
        return text + (
            f"the added kernel time ({d_kern_ms:.3g} ms) covers the added wall time ({d_wall_ms:.3g} ms), so the "
            f"host's work ({host_work}) costs no time measurable here."
        )
    excess = d_wall_ms - d_kern_ms
    if peer is not None and peer[1] - peer[2] < excess / 2:
        return text + (
            f"{excess:.3g} of the {d_wall_ms:.3g} ms added per step are not kernel time. {peer[0]} does the same kind of "
            f"host work ({host_work}) and shows no such excess ({peer[1]:.3g} ms more per step for {peer[2]:.3g} ms more of "
            f"kernels), so that work alone does not explain it; this run does not isolate the cause."
        )
    return text + (
        f"where it waits on the host, the host's work ({host_work}) adds wall time that the added kernels do not "
        f"account for "
        f"({excess:.3g} of the {d_wall_ms:.3g} ms)."
    )


def growth_crossover_note(
    tokens: Sequence[float], peaks: Sequence[float], fixed_bytes: float, model_bytes_per_token: float
) -> str:
    """The tokens per step above which what grows with them outweighs ``fixed_bytes`` (weights, gradients and
    optimizer state): from the slope of the measured step ``peaks`` (bytes) over ``tokens`` (a least-squares line)
    and, beside it, from the memory model's activations (``model_bytes_per_token``)."""
    if len(tokens) != len(peaks) or len(tokens) < 2:
        raise ValueError(
            f"growth_crossover_note: need as many peaks as tokens, at least 2, got {len(tokens)}, {len(peaks)}"
        )
    if not (fixed_bytes > 0 and model_bytes_per_token > 0):
        raise ValueError("growth_crossover_note: fixed_bytes and model_bytes_per_token must be > 0")
    n = len(tokens)
    mt, mp = sum(tokens) / n, sum(peaks) / n
    var = sum((t - mt) ** 2 for t in tokens)
    if var == 0:
        raise ValueError("growth_crossover_note: the tokens must not all be the same")
    slope = sum((t - mt) * (p - mp) for t, p in zip(tokens, peaks)) / var
    model = (
        f"the memory model's activations {mib_amount(model_bytes_per_token * 1024)}, which would put it at "
        f"{fixed_bytes / model_bytes_per_token:,.0f} tokens"
    )
    if slope <= 0:
        return f"The step's peak did not grow with the tokens across this sweep, so no crossover can be read from it ({model})."
    even = fixed_bytes / slope
    return (
        f"Across this sweep the step's peak grew by {mib_amount(slope * 1024)} per 1,024 tokens ({model}): what grows "
        f"with the tokens outweighs weights, gradients and AdamW state together ({mib_amount(fixed_bytes)}) above "
        f"about **{even:,.0f} tokens per step**. Below that, what checkpointing cannot touch is the larger part, so it "
        f"saves less than half of all training memory there, and sharding or shrinking the optimizer state works on "
        f"the larger part."
    )


def out_of_proportion_note(
    tokens: Sequence[float],
    ms: Mapping[str, Sequence[float]],
    *,
    unit: str = "tokens",
    price: str = "the time overhead measured there is not the price of the recompute",
) -> str:
    """Where a sweep's steps are not in proportion to their work: ``tokens`` per step (increasing) and, per policy
    (``ms``: name -> median ms at each size), a step with fewer tokens that took at least as long as one with more,
    or a step with at least 1.5× the tokens of the size before that took less than ``flat`` (10%) longer (the H200's
    full checkpointing: 163.7 ms at 16,384 tokens, 165.0 at 32,768). Up to the largest such size, the step time is
    the host's and the noise's rather than the work's, so a ratio of two policies there is not the price of the work
    one adds (``price``: what the sentence concludes; ``unit``: what ``tokens`` counts, per step)."""
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        raise ValueError(f"out_of_proportion_note: tokens must increase, got {list(tokens)!r}")
    flat = 1.1
    worst = None  # (tokens up to which, name, smaller size, its ms, larger size, its ms)
    for name, times in ms.items():
        if len(times) != len(tokens):
            raise ValueError(f"out_of_proportion_note: {name} has {len(times)} times for {len(tokens)} sizes")
        found = [(tokens[i], i, j) for i, j in _later_no_slower(times, list(range(len(tokens))))]
        found += [
            (tokens[i + 1], i, i + 1)
            for i in range(len(tokens) - 1)
            if tokens[i + 1] >= 1.5 * tokens[i] and times[i] < times[i + 1] < flat * times[i]
        ]
        for upto, i, j in found:
            if worst is None or (upto, times[i] / times[j]) > (worst[0], worst[3] / worst[5]):
                worst = (upto, name, tokens[i], times[i], tokens[j], times[j])
    if worst is None:
        return "Every policy's step took longer with more tokens across this sweep."
    upto, name, t, a, t2, b = worst
    how = (
        f"{a:.4g} ms at {t:,.0f} {unit}, no less than {b:.4g} ms at {t2:,.0f}"
        if b <= a
        else f"{b:.4g} ms at {t2:,.0f} {unit}, {b / a - 1:.1%} more than {a:.4g} ms at {t:,.0f} ({t2 / t:.3g}× the {unit})"
    )
    return (
        f"Up to {upto:,.0f} {unit} per step the steps are not in proportion to their work: the {name} step took "
        f"{how}. There the step time is the host's and the noise's, so {price}."
    )


def within_phrase(err: float) -> str:
    """How close two outputs are, from their largest error: "bit-identical" where it is 0 (not "within 0"),
    else "within 1.2e-07"."""
    if not (math.isfinite(err) and err >= 0):
        raise ValueError(f"within_phrase: err must be a finite error >= 0, got {err!r}")
    return "bit-identical" if err == 0 else f"within {err:.1e}"


def spreads_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two timings, each (median, p20, p80), have 20–80% spreads that overlap: neither is faster than the
    other beyond their noise."""
    return a[1] <= b[2] and b[1] <= a[2]


def extra_work_time_note(more: Sequence[float], refs: Mapping[str, Sequence[float]]) -> str:
    """A step that does all the work of a reference step and more (``more``: its (median, p20, p80) in ms)
    against one or more timings of the reference (``refs``: a noun phrase, e.g. "section 4's selective step", ->
    (median, p20, p80)). A difference is measured only where the 20–80% spreads are apart and the step doing more is the
    slower; where they overlap, or where it measured faster although it does more, there is no measurable
    difference. Two timings of the reference whose spreads are apart disagree with each other, and the note says so."""
    _check_timings("extra_work_time_note", more, *refs.values())
    if not refs:
        raise ValueError("extra_work_time_note: no reference timing")
    text = (
        f"{more[0]:.4g} ms (p20–p80 {more[1]:.4g}–{more[2]:.4g}) against "
        + ", and ".join(f"{label}, {r[0]:.4g} ms ({r[1]:.4g}–{r[2]:.4g})" for label, r in refs.items())
        + ": "
    )
    bands = list(refs.values())
    if any(not spreads_overlap(a, b) for i, a in enumerate(bands) for b in bands[i + 1 :]):
        text += (
            "the reference's timings disagree with each other (their spreads are apart), so one of them was disturbed; "
        )
    measured, unmeasured = [], []
    for label, r in refs.items():
        change = more[0] / r[0] - 1
        if spreads_overlap(more, r):
            unmeasured.append(f"its spread overlaps that of {label}")
        elif change < 0:
            unmeasured.append(f"{-change:.0%} faster than {label} while doing more work: timing noise, not a gain")
        else:
            measured.append(f"{change:+.0%} time against {label}, the spreads apart")
    if not measured:
        return text + "**no measurable difference** (" + "; ".join(unmeasured) + ")."
    return (
        text
        + "; ".join(measured)
        + ("; no measurable difference otherwise (" + "; ".join(unmeasured) + ")" if unmeasured else "")
        + "."
    )


def pick_margin_note(pick: str, times: Mapping[str, Sequence[float]]) -> str:
    """Whether the policy picked as the fastest of several candidates (``times``: name -> (median, p20, p80) in
    ms, ``pick`` among them) is faster beyond the noise: the candidates whose 20–80% spread overlaps the pick's
    are not separated from it by this run, so the pick between them follows the medians alone."""
    _check_timings("pick_margin_note", *times.values())
    if pick not in times:
        raise ValueError(f"pick_margin_note: {pick!r} is not among the candidates {sorted(times)}")
    p = times[pick]
    tied = [k for k, t in times.items() if k != pick and spreads_overlap(p, t)]
    if len(times) == 1:
        return f"{pick} is the only candidate."
    if not tied:
        return f"{pick}'s 20–80% spread ({p[1]:.4g}–{p[2]:.4g} ms) is apart from the other candidates': it is the faster beyond the noise."
    others = ", ".join(f"{k} {times[k][0]:.4g} ms ({times[k][1]:.4g}–{times[k][2]:.4g})" for k in tied)
    return (
        f"Its time, {p[0]:.4g} ms (20–80% spread {p[1]:.4g}–{p[2]:.4g}), is not apart from {others}: the spreads "
        f"overlap, so this run does not show {pick} to be the faster, and the pick between them follows the medians "
        f"alone."
    )


# ---------------------------------------------------------------------------------------------------
# 08 · MoE routing
# ---------------------------------------------------------------------------------------------------


def disturbed_ceiling_note(small_tflops: float, ceiling_tflops: float) -> str:
    """When small matmuls ran above the matmul ceiling measured at setup, that measurement was disturbed."""
    if small_tflops <= ceiling_tflops:
        return ""
    return (
        f" *The small matmuls ran above the ceiling measured at setup ({small_tflops / ceiling_tflops:.1f}×): "
        f"that measurement was disturbed (e.g. by other work on a shared machine), so predictions and "
        f"fractions that use it are off by about that factor.*"
    )


def aux_tradeoff_sentence(
    coefs: Sequence[float], cv: Sequence[float], task_loss: Sequence[float], *, steps: int, seeds: int = 1
) -> str:
    """Notebook 08's aux-loss experiment: the routing cv and the task loss each ``aux_loss_coef`` (ascending
    ``coefs``, the first the baseline) ended at after ``steps`` steps, from ``seeds`` run(s) each. A trade-off is
    claimed only when the task loss rises with the coefficient; otherwise the sentence says it did not show."""
    n = len(coefs)
    if not (n >= 2 and len(cv) == len(task_loss) == n):
        raise ValueError("aux_tradeoff_sentence: coefs, cv and task_loss need the same length, at least 2")
    text = (
        f"After {steps} steps: "
        + "; ".join(f"coef {c:g}, cv {v:.2f} and task loss {t:.2g}" for c, v, t in zip(coefs, cv, task_loss))
        + ". "
    )
    if all(b < a for a, b in zip(cv, cv[1:])):
        text += "The cv falls as the coefficient grows: the balancing term spreads the load. "
    else:
        lowest = min(range(n), key=lambda i: cv[i])
        text += f"The cv does not fall steadily with the coefficient (lowest, {cv[lowest]:.2f}, at coef {coefs[lowest]:g}). "
    ratio = task_loss[-1] / task_loss[0]
    if all(b > a for a, b in zip(task_loss, task_loss[1:])):
        return text + (
            f"The task loss rises with it, to {ratio:.2f}× the run with coef {coefs[0]:g} at coef {coefs[-1]:g}: "
            f"here the coefficient trades the balance against the task."
        )
    worst = max(range(n), key=lambda i: task_loss[i])
    text += (
        f"The task loss does not rise with the coefficient (at coef {coefs[-1]:g} it ends at {ratio:.2f}× the run "
        f"with coef {coefs[0]:g}; the highest, {task_loss[worst]:.2g}, is at coef {coefs[worst]:g}): at this size "
        f"and number of steps the trade-off does not show in the task loss"
    )
    if seeds == 1:
        return text + f", and one run per coefficient, from one seed over {steps} steps, is a noisy measure of it."
    return text + "."


def sync_free_loop_note(
    t_free_ms: float,
    t_loop_ms: float,
    *,
    syncs: int,
    ops_free: int,
    ops_loop: int,
    cap_rows: int,
    rows: int,
    cuda: bool,
) -> str:
    """Notebook 08's first exercise: what removing the loop's ``syncs`` syncs bought, from the sync-free capacity
    loop's time (``t_free_ms``; ``ops_free`` ops, ``cap_rows`` rows per expert) against the ``nonzero`` loop's
    (``t_loop_ms``; ``ops_loop`` ops, about ``rows`` rows per expert)."""
    if not (t_free_ms > 0 and t_loop_ms > 0):
        raise ValueError("sync_free_loop_note: both times must be > 0")
    what = f"({ops_free} ops against {ops_loop}, and {cap_rows} rows per expert instead of about {rows})"
    if not cuda:
        return (
            f"*CPU run:* without its syncs the loop takes {t_free_ms:.3g} ms against {t_loop_ms:.3g} ms {what}; a "
            f"sync waits for nothing on a CPU, so this compares the two loops' work, not the syncs. "
        )
    more_work = ops_free >= ops_loop and cap_rows >= rows  # the sync-free loop does at least the loop's work
    if t_free_ms < t_loop_ms:
        saved = t_loop_ms - t_free_ms
        text = (
            f"Without its {syncs} syncs the loop takes {t_free_ms:.3g} ms against {t_loop_ms:.3g} ms {what}: "
            f"{saved:.3g} ms per forward, {saved * 1e3 / max(syncs, 1):.3g} µs per sync removed. "
        )
        if more_work:
            return text + "The sync-free loop does more work, so the syncs cost at least that much here. "
        return text + "The two loops differ in more than the syncs, so this is not the syncs' cost alone. "
    text = f"Without its {syncs} syncs the loop is not faster: {t_free_ms:.3g} ms against {t_loop_ms:.3g} ms {what}. "
    if not more_work:
        return text + "The two loops differ in more than the syncs, so the pair does not price the syncs. "
    return text + (
        "It is not the same loop: it runs more ops and pads every expert to its capacity, so the pair cannot "
        "price the syncs alone (they cost at most the extra work's time). What it does show: dropping the syncs "
        "while keeping one short op sequence per expert does not make the loop fast, since the host still issues "
        "every op one by one (§5's profile of the `nonzero` loop had its device waiting most of the time). "
    )


def fixed_rate_model_note(
    rows: Sequence[float],
    measured: Sequence[float],
    model: Sequence[float],
    rates: Sequence[float],
    *,
    rate_at: float,
    rows_at: int,
    peak: float,
    target: float,
    spreads: Sequence[Sequence[float]] | None = None,
) -> str:
    """Notebook 08's second exercise: where the measured gains of the expert sweep (``rows`` tokens per expert)
    part from the model that holds one expert's rate fixed at its ``rows_at``-row measurement (``rate_at``
    TFLOP/s; ``model``: its gains), and why, from the rate one expert's matmuls reached at each swept size
    (``rates``, TFLOP/s, from the sweep's t_expert); and where the measured gain is under ``target``.

    ``spreads``: per point, the measured gain's range (lo, hi) from the 20–80% spreads of the two times
    (:func:`gain_range`). A model gain inside it counts as equal to the measurement; without spreads any
    difference counts."""
    n = len(rows)
    if not (n and len(measured) == len(model) == len(rates) == n) or not peak > 0:
        raise ValueError("fixed_rate_model_note: rows, measured, model and rates need the same, non-zero length")
    if spreads is not None and (len(spreads) != n or any(not lo <= m <= hi for (lo, hi), m in zip(spreads, measured))):
        raise ValueError("fixed_rate_model_note: spreads need one (lo, hi) per point, around its measured gain")
    lo_hi = spreads if spreads is not None else [(m, m) for m in measured]
    below = [i for i in range(n) if model[i] > lo_hi[i][1]]
    above = [i for i in range(n) if model[i] < lo_hi[i][0]]
    equal = [i for i in range(n) if i not in below and i not in above]
    beyond = " beyond the measured gain's 20–80% range" if spreads is not None else ""
    text = ""
    if below:
        text += f"The measurement is below the fixed-rate model{beyond} at {_rows(rows, below)} rows per expert. "
        faster = [i for i in below if rates[i] > rate_at]
        if faster:
            i = max(faster, key=lambda j: rates[j])
            text += (
                f"There one expert's matmuls ran at up to {rates[i]:.3g} TFLOP/s ({rates[i] / peak:.2f} of the "
                f"ceiling, at {rows[i]:g} rows), against the {rate_at:.3g} TFLOP/s the model keeps from {rows_at} "
                f"rows: large experts approach the matmul ceiling, so a rate held fixed overstates the loop's time, "
                f"and with it the gain. "
            )
        slower = [i for i in below if rates[i] <= rate_at]
        if slower:
            text += (
                f"At {_rows(rows, slower)} rows one expert's rate was not above the model's, so the rate does not "
                f"explain the gap there. "
            )
    if above:
        text += f"It is above the model{beyond} at {_rows(rows, above)} rows. "
    if not below and not above:
        text += (
            "The model's gain lies inside the measured gain's 20–80% range at every swept size. "
            if spreads is not None
            else "The measurement equals the model at every swept size. "
        )
    elif equal and spreads is not None:
        text += (
            f"At {_rows(rows, equal)} rows the model's gain lies inside the measured gain's 20–80% range: equal "
            f"within the timings' spread"
            + (
                f" ({rows_at} rows is where the model takes its rate from)"
                if rows_at in [rows[i] for i in equal]
                else ""
            )
            + ". "
        )
    under = [i for i in range(n) if measured[i] < target]
    if under:
        return text + (
            f"Measured, the gain is under {target:g}× at "
            + ", ".join(f"{rows[i]:g} rows ({measured[i]:.2f}×)" for i in under)
            + "."
        )
    return text + f"Measured, the gain stayed at {target:g}× or more at every swept size."


def _rows(rows: Sequence[float], idx: Sequence[int]) -> str:
    return ", ".join(f"{rows[i]:g}" for i in idx)


# ---------------------------------------------------------------------------------------------------
# 05, 08, 09 · the launch model with the host's measured cost per op
# ---------------------------------------------------------------------------------------------------


def host_cost_sentences(rows: Sequence[Mapping], *, cuda: bool, queue: int | None = None) -> str:
    """Each path's time against the launch model twice: with t_launch (a one-element add in a bare chain) and with
    the path's own host cost per op, measured (``rows`` as :func:`mahia.lessons.hybrid_parts.host_row` makes them).

    miss = measured - predicted; the measured per-op host cost moves the prediction by refined - predicted; the
    refined model agrees when it lies inside the measurement's 20–80% spread, else it still misses (below it:
    what is left is not host time per op; above: it overshoots). ``queue``: the launch queue, named when a host
    cost was measured on a smaller instance. On a CPU (``cuda=False``) host time is the call's time, so the
    refined model restates the measurement: said once, at the end."""
    if not rows:
        raise ValueError("host_cost_sentences: no rows")
    text = " ".join(_host_cost_sentence(r, cuda=cuda, queue=queue) for r in rows)
    if not cuda:
        text += (
            " *CPU run:* the host runs each op as it is called, so its host time is the call's whole time (compute "
            "included; a sync waits for nothing): the refined model restates that time unless the model's compute "
            "at the measured ceilings is larger."
        )
    return text


def _host_full_ms(row: Mapping) -> float:
    """ms: the host's measured time for the full call: the instance's whole host time (its syncs' waits included)
    scaled to the full call's ops, where the row has it; else the cost per op over the full call's ops."""
    if row.get("host ms") is not None and row.get("host ops"):
        return row["host ms"] * row["ops"] / row["host ops"]
    return row["host µs/op"] * row["ops"] / 1e3


def host_cost_overstated(row: Mapping, *, cuda: bool) -> bool:
    """Whether :func:`host_cost_sentences` calls a row's measured host cost "no prediction": on a GPU, the refined
    model lies above the measurement's spread by more than its width, and the host alone, as measured, would need
    longer for the call than the whole call took back to back (so a gain computed from that cost is no prediction
    either). The host's time counts its waits at the call's syncs: they are part of issuing it."""
    lo, hi, ref = row["p20 ms"], row["p80 ms"], row["refined ms"]
    return cuda and ref > hi + (hi - lo) and _host_full_ms(row) > hi


def host_model_lands(row: Mapping) -> bool:
    """Whether the model with the measured host cost (``refined ms``) lands on the measurement: inside its 20–80%
    spread and within 0.8–1.25× its median. A wide spread alone does not make a prediction far from the median
    a hit."""
    m, lo, hi, ref = row["measured ms"], row["p20 ms"], row["p80 ms"], row["refined ms"]
    return lo <= ref <= hi and 0.8 <= ref / m <= 1.25


def _host_cost_sentence(row: Mapping, *, cuda: bool, queue: int | None) -> str:
    m, lo, hi = row["measured ms"], row["p20 ms"], row["p80 ms"]
    pred, ref, h, tl = row["predicted ms"], row["refined ms"], row["host µs/op"], row["t_launch µs"]
    if not (m > 0 and pred > 0 and ref > 0 and tl > 0 and lo <= m <= hi):
        raise ValueError("host_cost_sentences: needs times > 0 and p20 <= measured <= p80")
    path = str(row["path"])
    text = f"{path[:1].upper()}{path[1:]}: the host took {h:.3g} µs per op to issue it ({h / tl:.2f}× t_launch = {tl:.3g} µs)"
    if row["host ops"] != row["ops"]:
        text += f", measured on {row['host instance']} ({row['host ops']:,} ops"
        text += (
            f"; the full call's {row['ops']:,} would overfill the launch queue of about {queue:,} kernels)"
            if queue
            else f" against the full call's {row['ops']:,})"
        )
    if row["syncs"] and cuda:
        text += (
            f"; it syncs {row['syncs']}× per call, so its host time holds the waits for the device at those syncs "
            f"(t_sync taken out per sync; any wait beyond it stays in the per-op figure)"
        )
    text += (
        f". With that cost the model predicts {ref:.3g} ms, against {m:.3g} ms measured and {pred:.3g} ms with "
        f"t_launch (the measurement is {m / pred:.2f}× that): "
    )
    miss, moved = m - pred, ref - pred
    if host_model_lands(row):
        return text + f"inside the measurement's 20–80% spread ({lo:.3g}–{hi:.3g} ms): per-op host cost is the miss."
    if lo <= ref <= hi:
        return text + (
            f"inside the measurement's 20–80% spread ({lo:.3g}–{hi:.3g} ms) only because that spread is wide "
            f"({pct((hi - lo) / m)} of the median): the median is {m / ref:.2f}× the refined model, so per-op host "
            f"cost is part of the miss, not all of it."
        )
    if ref < lo:
        share = f", {moved / miss:.0%} of the {miss:.3g} ms miss," if miss > 0 and moved > 0 else ""
        return text + (
            f"it still misses. The measured host cost moves the prediction by {moved:+.3g} ms{share} and leaves "
            f"{m - ref:.3g} ms ({m / ref:.2f}× the refined model) that is not host time per op: device work or "
            f"syncs that the model prices too low, or host and device not overlapping as its max assumes."
        )
    if hi < ref <= hi + (hi - lo):  # above the spread by less than its own width: as close as the timing resolves
        return text + (
            f"just above the measurement's 20–80% spread ({lo:.3g}–{hi:.3g} ms), by less than its width: "
            f"{ref / m:.2f}× the measurement, so per-op host cost is about all of the miss."
        )
    host_full = _host_full_ms(row)
    if host_cost_overstated(row, cuda=cuda):
        # Issuing cannot take longer than the whole call: the isolated measurement (a sync, then one call into
        # an idle device) cost the host more per op than back-to-back calls do, so it is no prediction here.
        return text + (
            f"no prediction: at that cost the host alone would need {host_full:.3g} ms for the call's ops, more "
            f"than the whole call took back to back ({m:.3g} ms, 20–80% {lo:.3g}–{hi:.3g} ms). Issued alone after "
            f"a sync, each op cost the host more than in back-to-back calls, so this measurement overstates the "
            f"host's cost per op in the timed loop."
        )
    text += f"it overshoots, {ref / m:.2f}× the measurement and above its 20–80% spread ({lo:.3g}–{hi:.3g} ms)"
    if row["host ops"] != row["ops"]:
        return text + "; a cost per op measured on a smaller instance need not carry over to the full call."
    return text + "."


# ---------------------------------------------------------------------------------------------------
# 09 · hybrid components
# ---------------------------------------------------------------------------------------------------


def memory_loop_error_note(errors: Mapping[str, float], tol: float, *, dtype: str, nodes: int, steps: int) -> str:
    """Notebook 09: why the graph memory's loop, the readable definition, is further from the float64 loop than the
    batched path. ``errors``: the loop's relative errors against float64 (``out*`` outputs, ``grad*`` gradients,
    as :class:`mahia.measure.checks.Comparison` names them); ``tol``: the dtype's tolerance (the loop is shown, not
    checked). In the backward of each of the ``steps`` diffusion steps every one of the ``nodes`` node rows reads
    the whole state, and autograd adds those ``nodes`` gradient contributions one at a time in the tensors' dtype;
    the batched path's single matmul accumulates in float32."""
    outs = [v for k, v in errors.items() if k.startswith("out")]
    grads = [v for k, v in errors.items() if k.startswith("grad")]
    if not outs:
        raise ValueError(f"memory_loop_error_note: no output error among {sorted(errors)}")
    out, grad = max(outs), max(grads, default=0.0)
    worst = max(out, grad)
    if worst <= tol:
        return f"The loop itself is within {dtype}'s tolerance as well ({worst:.1e}, tolerance {tol:.0e})."
    text = (
        f"The loop's own error, {worst:.1e}, is above {dtype}'s tolerance ({tol:.0e}); it is shown, not checked "
        f"(tol inf): the loop is the definition, not the path under test. "
    )
    if grad > out:
        return text + (
            f"The error is in its gradients (up to {grad:.1e}; the output's is {out:.1e}): in the backward of each "
            f"of the {steps} diffusion steps, each of the {nodes} node rows reads the whole state, and autograd adds "
            f"their {nodes} gradient contributions to it one at a time in {dtype}, rounding every partial sum; the "
            f"batched path gets that gradient from one matmul, which accumulates in float32."
        )
    return text + (
        f"The error is in its output ({out:.1e}; gradients up to {grad:.1e}): the loop rounds to {dtype} after every "
        f"op of every node's row and diffusion step, while the batched path builds P^k in float32 and applies it "
        f"with one matmul."
    )


def first_failure_phrase(first_t: int | None, largest_t: int) -> str:
    """Completes "it returns NaN/inf ...": the first sequence length that failed, if any."""
    return f"from T = {first_t} on" if first_t else f"nowhere up to T = {largest_t}"


def uncounted_sync_clause(counted: int) -> str:
    """Said of the plan's read-back when the sync counter did not see it (a CPU tensor's ``.tolist()``)."""
    return "" if counted else ", invisible to the counter on a CPU"


def faster_or_slower(ratio: float) -> str:
    """ "2.50× faster" for a speed ratio (old time / new time) above 1, "4.87× slower" below it, "as fast" at 1."""
    if not ratio > 0:
        raise ValueError(f"faster_or_slower: the ratio must be > 0, got {ratio!r}")
    if ratio > 1:
        return f"{ratio:.3g}× faster"
    if ratio < 1:
        return f"{1 / ratio:.3g}× slower"
    return "as fast"


def autotune_verdict(
    tuned: str,
    plain: str,
    tuned_ms: float,
    plain_ms: float,
    tuned_compile_s: float,
    plain_compile_s: float,
    gain: tuple[float, float],
    plain_kernel_ms: float | None = None,
) -> str:
    """Notebook 04: a mode that autotunes (``tuned``) against the same mode without autotuning (``plain``): their
    medians (ms), compile times (s) and the range of plain / tuned that the two 20–80% spreads allow (``gain``,
    :func:`gain_range`). Says whether the autotuned kernels paid for the longer compile: faster or slower only
    where the whole range says so, else no measured difference. ``plain_kernel_ms``, the profiler's kernel time
    of one ``plain`` call: a saving larger than all of it cannot come from faster kernels (the H200 reference of
    b0bf60d credited them with 0.8 ms of a call whose kernels took 0.32 ms)."""
    if not (tuned_ms > 0 and plain_ms > 0 and tuned_compile_s >= 0 and plain_compile_s >= 0):
        raise ValueError("autotune_verdict: the times must be > 0 and the compile times >= 0")
    if plain_kernel_ms is not None and not (isinstance(plain_kernel_ms, (int, float)) and plain_kernel_ms >= 0):
        raise ValueError(f"autotune_verdict: plain_kernel_ms must be None or >= 0 ms, got {plain_kernel_ms!r}")
    lo, hi = gain
    cost = f"after {tuned_compile_s:.1f} s of compiling against {plain_compile_s:.1f} s"
    head = f"`{tuned}` {tuned_ms:.3g} ms against `{plain}` {plain_ms:.3g} ms, {cost}"
    if lo > 1 and plain_kernel_ms is not None and plain_ms - tuned_ms > plain_kernel_ms:
        return (
            f"{head}: {faster_or_slower(plain_ms / tuned_ms)}, but the {plain_ms - tuned_ms:.3g} ms saved is more than "
            f"all of `{plain}`'s kernel time ({plain_kernel_ms:.3g} ms per call, profiler): not faster kernels but "
            "host time per call differed between the two timings (the call is host-bound)."
        )
    if lo > 1:
        return f"{head}: the autotuned kernels made the call {faster_or_slower(plain_ms / tuned_ms)}."
    if hi < 1:
        return (
            f"{head}: {faster_or_slower(plain_ms / tuned_ms)}, so here autotuning did not pay; the profiler's "
            "comparison below shows which kernels it replaced."
        )
    return f"{head}: within the spread of each other ({lo:.2f}–{hi:.2f}×), so autotuning bought no measured gain."


def shortfall_source(
    what: str, measured_ms: float, predicted_ms: float, kernel_ms: float | None, busy: float | None
) -> str:
    """Where the time a path (``what``, a noun phrase) took beyond its prediction went, from the profiler: its
    kernels' time per call (``kernel_ms``; ``busy``: their share of the profiled wall time). Device time can
    explain at most what the kernels took beyond the whole prediction; the rest the device waited on the host.
    On a CPU (no kernel time), no split is made."""
    if not (measured_ms > 0 and predicted_ms > 0):
        raise ValueError("shortfall_source: the measured and predicted times must be > 0")
    text = f"{what[:1].upper()}{what[1:]} took {measured_ms / predicted_ms:.2f}× its prediction. "
    if kernel_ms is None or busy is None:
        return text + "*CPU run:* no device queue, so the profiler cannot split that into host and device time."
    missed = measured_ms - predicted_ms
    if missed <= 0:
        return text + f"Its kernels took {kernel_ms:.3g} ms per call (the device busy {pct(busy)} of the time)."
    text += f"Its kernels took {kernel_ms:.3g} ms per call, the device busy {pct(busy)} of the profiled wall time"
    if kernel_ms <= predicted_ms:
        return text + (
            f": less than the {predicted_ms:.3g} ms predicted for the whole call, so device work below the ceiling "
            f"does not explain the {missed:.3g} ms the model misses; the device waits on the host, whose ops and "
            f"syncs cost more than t_launch and t_sync."
        )
    device = min(kernel_ms - predicted_ms, missed)
    return text + (
        f": of the {missed:.3g} ms the model misses, up to {device:.3g} ms is device time (kernels below the "
        f"ceiling) and the rest, {missed - device:.3g} ms, the host's."
    )


def flat_time_verdict(what: str, ms: Sequence[float], p20: Sequence[float], p80: Sequence[float]) -> str:
    """Whether a time the model expects to stay flat over a sweep did: the medians ``ms`` and 20–80% spreads
    (``p20``, ``p80``) of each point. Flat when every point's spread overlaps every other's."""
    n = len(ms)
    if not (n and len(p20) == len(p80) == n):
        raise ValueError("flat_time_verdict: ms, p20 and p80 need the same, non-zero length")
    span = (
        f"{min(ms):.3g}–{max(ms):.3g} ms over the sweep ({ms[0]:.3g} ms at the first point, {ms[-1]:.3g} at the last)"
    )
    if max(p20) <= min(p80):
        return f"{what} stayed flat, as expected: {span}, and the 20–80% spreads of all points overlap."
    return (
        f"{what} did not stay flat, although it does the same work at every point: {span}, "
        f"{max(ms) / min(ms):.2f}× from its fastest to its slowest point, beyond the 20–80% spread of its timings."
    )


def cached_buffers_note(fracs: Sequence[float]) -> str:
    """Said of fractions of the copy bandwidth when one is above 1 (the buffers stayed in a cache); else empty."""
    if not any(f > 1 for f in fracs):
        return ""
    return (
        f" (Above 1, at {max(fracs):.2f}: the buffers stayed in a cache between calls; the copy ceiling is "
        f"measured on buffers no cache holds.)"
    )


def gain_range(before_p20: float, before_p80: float, after_p20: float, after_p80: float) -> tuple[float, float]:
    """The measured gain's range from the 20–80% spreads of the before and after times (ms):
    :func:`mahia.measure.timing.ratio_range`, for rows that carry the four numbers rather than Timings."""
    from mahia.measure.timing import ratio_range  # torch-importing module: only when called

    return ratio_range(before_p20, before_p80, after_p20, after_p80)


def retimed_note(
    what: str,
    first: Sequence[float],
    again: Sequence[Sequence[float]],
    first_label: str,
    again_label: str,
    *,
    agree_within: float = _SAME_MEDIAN,
) -> str:
    """The same work timed twice: ``first`` is one timing's (median, p20, p80) in ms, ``again`` one or more later
    timings of the same work. Medians within ``agree_within`` of each other (the later medians' median / first's)
    agree to within that, whatever the spreads: two tight spreads 1% apart are not a disagreement. Otherwise they
    agree where the 20–80% spreads [p20, p80] overlap and each median lies inside the other's spread; the
    sentence gives both numbers, and, where no spread overlaps, how far apart the medians are. Spreads that
    overlap while a median lies outside the other's spread are wide rather than in agreement: the sentence says
    so and gives their widths (p80 - p20, as a share of the median)."""
    _check_timings("retimed_note", first, *again)
    if not again:
        raise ValueError("retimed_note: no later timing")
    meds = sorted(t[0] for t in again)
    lo, hi = min(t[1] for t in again), max(t[2] for t in again)
    n_ok = sum(spreads_overlap(t, first) for t in again)
    at = f"{meds[0]:.3g} ms" if len(meds) == 1 else f"{meds[0]:.3g}–{meds[-1]:.3g} ms (medians)"
    text = (
        f"{what} {again_label}: {at}, 20–80% spread {lo:.3g}–{hi:.3g} ms, against {first[0]:.3g} ms "
        f"({first[1]:.3g}–{first[2]:.3g} ms) {first_label}: "
    )
    mid = meds[len(meds) // 2] if len(meds) % 2 else (meds[len(meds) // 2 - 1] + meds[len(meds) // 2]) / 2
    if abs(mid / first[0] - 1) <= agree_within:
        return text + (
            f"the medians are {pct(abs(mid / first[0] - 1))} apart: the timings agree within {pct(agree_within)}"
            + ("." if n_ok == len(again) else ", though their narrow spreads do not overlap.")
        )
    if n_ok == len(again):
        inside = all(t[1] <= first[0] <= t[2] and first[1] <= t[0] <= first[2] for t in again)
        if inside:
            return text + (
                "the spreads overlap: the timings agree." if n_ok == 1 else "every spread overlaps it: they agree."
            )
        width = lambda t: (t[2] - t[1]) / t[0]  # noqa: E731
        widths = (
            f"{pct(width(again[0]))} of the median {again_label}, {pct(width(first))} {first_label}"
            if len(again) == 1
            else f"{pct(width(first))} of the median {first_label}, {pct(min(map(width, again)))}–"
            f"{pct(max(map(width, again)))} {again_label}"
        )
        overlap = "the spreads overlap" if n_ok == 1 else "every spread overlaps it"
        return text + (
            f"{overlap}, but a median lies outside the other's spread ({mid / first[0]:.2f}× between the medians; "
            f"spread widths {widths}): the timings are noisy, not in agreement."
        )
    if n_ok:
        return text + f"{n_ok} of {len(again)} spreads overlap it; the medians' median is {mid / first[0]:.2f}× it."
    return (
        text + f"no spread overlaps it: the same work, timed twice, disagrees ({mid / first[0]:.2f}× between the "
        f"medians), and a gain computed from either timing is only as sure as that."
    )


def retimed_gain_note(
    rung: str,
    first: Sequence[float],
    again: Sequence[float],
    gain_first: float,
    gain_again: float,
    rests_on: str,
    *,
    agree_within: float = _SAME_MEDIAN,
) -> str:
    """What a retiming that disagrees does to the conclusions drawn from the first timing: ``first`` and ``again``
    are two timings (median, p20, p80) of the same step, ``gain_first`` and ``gain_again`` the rung's gain from
    each, ``rests_on`` what was concluded from the first (a noun phrase). Empty unless they disagree as
    :func:`retimed_note`'s last case has it: medians more than ``agree_within`` apart and spreads that do not
    overlap."""
    _check_timings("retimed_gain_note", first, again)
    if abs(again[0] / first[0] - 1) <= agree_within or spreads_overlap(first, again):
        return ""
    return (
        f"With this timing the {rung} rung gains ×{gain_again:.2f}, against ×{gain_first:.2f} in the ladder: "
        f"{rests_on} rest on the ladder's timing, one of two timings of the same step that disagree, and are only as "
        f"sure as that."
    )


_SPREAD_KEYS = ("before_p20", "before_p80", "after_p20", "after_p80")


def model_miss_summary(rows: Sequence[Mapping]) -> str:
    """Notebook 09's summary: per component (``component``), the measured over the predicted time of its before
    and after paths (``before_ms``, ``before_pred_ms``, ``after_ms``, ``after_pred_ms``), and which side the model
    misses more: predicted / measured gain = (after measured / predicted) / (before measured / predicted).

    With the 20–80% spreads of both times (``before_p20``, ``before_p80``, ``after_p20``, ``after_p80``) a predicted
    gain is called too high or too low only outside the measured gain's range (:func:`gain_range`); inside it, it
    is within the spread. Without them, any difference between the two ratios counts.

    ``again_before`` and ``again_after`` (each (median, p20, p80) in ms, optional) are a second timing of the same
    two paths: where the verdict from it differs from the first one's, the component is called neither too high
    nor too low, and the sentence gives both measured ranges: which way the model misses depends on the timing."""
    if not rows:
        raise ValueError("model_miss_summary: no rows")
    miss, high, low, within, flips = [], [], [], [], []
    for r in rows:
        b, a = r["before_ms"] / r["before_pred_ms"], r["after_ms"] / r["after_pred_ms"]
        miss.append((r["component"], b, a))
        if all(r.get(k) is not None for k in _SPREAD_KEYS):
            lo, hi = gain_range(*(r[k] for k in _SPREAD_KEYS))
            pred = r["before_pred_ms"] / r["after_pred_ms"]
            side = high if pred > hi else low if pred < lo else within
            if r.get("again_before") is not None and r.get("again_after") is not None:
                bb, aa = r["again_before"], r["again_after"]
                lo2, hi2 = gain_range(bb[1], bb[2], aa[1], aa[2])
                side2 = high if pred > hi2 else low if pred < lo2 else within
                if side2 is not side:
                    flips.append(
                        f"{r['component']} (predicted {pred:.3g}×, measured {lo:.3g}–{hi:.3g}× in one timing and "
                        f"{lo2:.3g}–{hi2:.3g}× when the same work was timed again)"
                    )
                    continue
            side.append(f"{r['component']} (predicted {pred:.3g}×, measured {lo:.3g}–{hi:.3g}×)")
        elif a != b:
            (high if a > b else low).append(r["component"])
    text = (
        "Measured over predicted time, before / after path: "
        + ", ".join(f"{c} {b:.2f}× / {a:.2f}×" for c, b, a in miss)
        + ". "
    )
    if high:
        text += (
            f"The predicted gain is too high for {', '.join(high)}: relative to its prediction, the after path ran "
            f"slower than the before path. "
        )
    if low:
        text += (
            f"It is too low for {', '.join(low)}: relative to its prediction, the before path ran slower than the "
            f"after path. "
        )
    if within:
        text += (
            f"It lies within the measured gain's range from the 20–80% spreads of both times for {', '.join(within)}. "
        )
    if flips:
        text += (
            f"Which way it misses depends on the timing for {', '.join(flips)}: two timings of the same work put the "
            f"prediction on either side. "
        )
    if not high and not low and not within and not flips:
        text += "Both paths are off by the same factor everywhere, so every predicted gain is the measured one."
    return text.rstrip()


# ---------------------------------------------------------------------------------------------------
# 10 · the full stack
# ---------------------------------------------------------------------------------------------------


def gain_hits_note(rows: Sequence[tuple[str, float, float]], band: float, trivial_why: str) -> str:
    """How many of a ladder's predicted gains the measurement bears out, counting only those the model predicts away
    from ×1: ``rows`` are (label, predicted gain, measured gain), a gain is hit when the measured one is within
    ``band`` (relative, on a log scale) of the predicted one. A prediction within ``band`` of ×1 is a trivial one
    (``trivial_why``: why the model gives such gains, a clause), and its hit tests the model little."""
    if not band > 0:
        raise ValueError(f"gain_hits_note: band must be > 0, got {band!r}")
    rows = [r for r in rows if math.isfinite(r[1]) and math.isfinite(r[2]) and r[1] > 0 and r[2] > 0]
    if not rows:
        raise ValueError("gain_hits_note: no rung with a predicted and a measured gain")
    near = lambda a, b: abs(math.log(a / b)) <= math.log(1 + band)  # noqa: E731
    real = [r for r in rows if not near(r[1], 1.0)]
    trivial = [r for r in rows if near(r[1], 1.0)]
    text = ""
    if real:
        hits = sum(near(m, p) for _, p, m in real)
        text += (
            f"Of the {len(real)} rung gains the model predicts away from ×1 (by more than {pct(band)}), {hits} "
            f"{'is' if hits == 1 else 'are'} within {pct(band)} of the measurement: "
            + "; ".join(f"*{lab}* predicted ×{p:.3g}, measured ×{m:.3g}" for lab, p, m in real)
            + ". "
        )
    if trivial:
        t_hits = sum(near(m, p) for _, p, m in trivial)
        text += (
            f"The other {len(trivial)} predicted gains are within {pct(band)} of ×1 ({trivial_why}), and {t_hits} of "
            f"them were measured within {pct(band)} of that: such hits test the model little."
            if real
            else f"Every predicted gain is within {pct(band)} of ×1 ({trivial_why}), and {t_hits} of {len(trivial)} "
            f"were measured within {pct(band)} of that: such hits test the model little."
        )
    return text.rstrip()


def same_tokens_phrase(same: bool) -> str:
    """How the CUDA-graph decoder's tokens compare with the eager decoder's."""
    return "with exactly the same tokens" if same else "with tokens that differ only at near-ties"


def slower_rungs_note(rows: Sequence[Mapping]) -> str:
    """The ladder's rungs that made the step slower beyond the spreads, and what that does to the total.

    ``rows``: the standard rungs in ladder order, each with ``label``, ``gain`` (step time of the rung below /
    this rung's; NaN for the first), ``significant`` (the 20–80% ranges of the two step times do not overlap)
    (a bool, or None where unknown) and ``vs_baseline`` (the first rung's step time / this rung's). Empty when no
    rung is slower."""
    if not rows:
        raise ValueError("slower_rungs_note: no rungs")
    slower = [r for r in rows[1:] if r["significant"] is not None and bool(r["significant"]) and r["gain"] < 1]
    if not slower:
        return ""
    names = ", ".join(f"*{r['label']}* (×{r['gain']:.2f})" for r in slower)
    text = f"Slower than the rung below it, beyond both spreads: {names}. "
    best = max(rows, key=lambda r: r["vs_baseline"])
    last = rows[-1]
    if best is not last:
        text += (
            f"So the whole stack ({last['vs_baseline']:.2f}× the baseline) is below the best rung, "
            f"*{best['label']}* ({best['vs_baseline']:.2f}×): in this run the stack is better without "
            + ("that rung. " if len(slower) == 1 else "those rungs. ")
        )
    return text


_T_LAUNCH_FLOOR = (
    "t_launch was measured on a chain of one-element in-place adds, the floor of an op, while an op of a training "
    "step also records autograd state, allocates its output and runs Python around it"
)


def ladder_miss_cause(rows: Sequence[Mapping], *, busy_min: float = 0.8) -> str:
    """Notebook 10: where the model of the ladder misses, rung by rung, from the profiler's kernel time.

    ``rows``: one per modelled rung, with ``rung`` (its name), ``bound`` (the model's largest term: "device
    work", "launches" or "syncs"), ``measured_ms`` (the benchmark's median step), ``predicted_ms``, ``work_ms``
    and ``launch_ms`` (the model's step, device work and launches) and ``kernel_ms`` (the profiled kernel time per
    step; None on a CPU). A rung whose kernels fill at least ``busy_min`` of its measured step is bound by its
    device work, and there the miss is in the device work the model prices; below that, the rest of the step the
    device waited on the host, and the sentence splits that rung's miss into that wait and the kernels' excess
    over the predicted device work."""
    if not rows:
        raise ValueError("ladder_miss_cause: no rungs")
    by_bound: dict[str, list[str]] = {}
    for r in rows:
        by_bound.setdefault(r["bound"], []).append(f"*{r['rung']}*")
    if len(by_bound) == 1:
        text = f"It calls every rung bound by {next(iter(by_bound))}. "
    else:
        text = "It calls " + "; ".join(f"{', '.join(n)} bound by {b}" for b, n in by_bound.items()) + ". "
    if any(r["kernel_ms"] is None for r in rows):
        if set(by_bound) == {"device work"}:
            return text + (
                "On a CPU the same cores dispatch and compute, so the profiler has no kernel time to check that "
                "against, and where the miss lies is not isolated here. "
            )
        return text + f"The model's {_T_LAUNCH_FLOOR}. "
    busy = {r["rung"]: min(1.0, r["kernel_ms"] / r["measured_ms"]) for r in rows}
    device = [r for r in rows if busy[r["rung"]] >= busy_min]
    host = [r for r in rows if busy[r["rung"]] < busy_min]
    span = lambda xs, f: f(min(xs)) if f(min(xs)) == f(max(xs)) else f"{f(min(xs))}–{f(max(xs))}"  # noqa: E731
    if device:
        names = "every rung" if not host else ", ".join(f"*{r['rung']}*" for r in device)
        text += (
            f"In {names} the profiler finds the device running kernels "
            f"{span([busy[r['rung']] for r in device], pct)} of the measured step: there the step is its device "
            f"work, and the miss is in the device work the model prices (each op's roofline time from its traced "
            f"bytes and FLOPs), not in t_launch: the kernels took "
            f"{span([r['kernel_ms'] / r['work_ms'] for r in device], lambda x: f'{x:.2g}')}× the predicted device "
            f"work. "
        )
    for r in host:
        miss, wait = r["measured_ms"] - r["predicted_ms"], r["measured_ms"] - r["kernel_ms"]
        extra = r["kernel_ms"] - r["work_ms"]
        kern = (
            f"{extra:.3g} ms kernels beyond the predicted device work ({r['kernel_ms']:.3g} ms, "
            f"{r['kernel_ms'] / r['work_ms']:.2g}× it)"
            if extra > 0
            else f"its kernels within the predicted device work ({r['kernel_ms']:.3g} against {r['work_ms']:.3g} ms)"
        )
        split = (
            f"of the {miss:.3g} ms the model misses there, {wait:.3g} ms is the device waiting on the host and {kern}"
            if miss > 0
            else f"the model did not miss there (predicted {r['predicted_ms']:.3g} ms), yet {wait:.3g} ms of the step "
            f"is the device waiting on the host, with {kern}"
        )
        text += (
            f"In *{r['rung']}* the device ran kernels only {pct(busy[r['rung']])} of the {r['measured_ms']:.3g} ms "
            f"step: {split}. "
        )
    if host:
        text += (
            "The model prices the host's part as launches ("
            + ", ".join(f"{r['launch_ms']:.3g} ms in *{r['rung']}*" for r in host)
            + f"), but {_T_LAUNCH_FLOOR}. "
        )
    return text


def context_gain_note(label: str, alone: Mapping, ladder: Mapping, *, busy_min: float = 0.8) -> str:
    """Notebook 10: why one optimization (``label``) gains differently alone and in the ladder, from the profiles
    of the steps before and after it in each context.

    ``alone`` and ``ladder``: ``step`` (what it acts on, a noun phrase), ``before_ms`` and ``after_ms`` (the
    benchmark's median steps), ``before_kernel_ms`` and ``after_kernel_ms`` (profiled kernel time per step; None
    on a CPU), ``launches`` and ``syncs`` (kernel launches and host syncs per step of the step before it; launches
    None on a CPU) and ``changes`` (the operators whose time changed most, :func:`op_changes`).

    Where, alone, the device runs kernels less than ``busy_min`` of the step after the change and less of the
    kernel time removed came off the step than in the ladder, the step alone waits on the host; where it stays
    busy, the gains differ by the kernel time removed. Otherwise the cause is not isolated."""
    keys = ("step", "before_ms", "after_ms", "before_kernel_ms", "after_kernel_ms", "launches", "syncs", "changes")
    for ctx_ in (alone, ladder):
        if missing := [k for k in keys if k not in ctx_]:
            raise ValueError(f"context_gain_note: missing {missing}")
        if not (ctx_["before_ms"] > 0 and ctx_["after_ms"] > 0):
            raise ValueError("context_gain_note: step times must be > 0 ms")
    a, ld = alone, ladder
    if a["before_kernel_ms"] is None or ld["before_kernel_ms"] is None:
        return (
            f"*CPU run:* the profiler gives host time by operator (largest changes alone: {a['changes']}; in the "
            f"ladder: {ld['changes']}), which cannot split a step into kernels and waiting: why the gains of "
            f"*{label}* differ is not isolated here."
        )
    text = (
        f"Alone, on {a['step']}, *{label}* took the step from {a['before_ms']:.3g} to {a['after_ms']:.3g} ms and its "
        f"kernels (`torch.profiler`, per step) from {a['before_kernel_ms']:.3g} to {a['after_kernel_ms']:.3g} ms (largest changes: {a['changes']}); "
        f"in the ladder, on {ld['step']}, from {ld['before_ms']:.3g} to {ld['after_ms']:.3g} ms and from "
        f"{ld['before_kernel_ms']:.3g} to {ld['after_kernel_ms']:.3g} ms ({ld['changes']}). "
    )
    cut_a, cut_l = a["before_kernel_ms"] - a["after_kernel_ms"], ld["before_kernel_ms"] - ld["after_kernel_ms"]
    if cut_a <= 0 or cut_l <= 0:
        return text + (
            f"Its kernels did not get shorter in both contexts ({cut_a:.3g} and {cut_l:.3g} ms less), so these profiles "
            f"do not isolate why the gains differ."
        )
    share_a = (a["before_ms"] - a["after_ms"]) / cut_a
    share_l = (ld["before_ms"] - ld["after_ms"]) / cut_l
    busy_a = min(1.0, a["after_kernel_ms"] / a["after_ms"])
    if busy_a < busy_min and share_a < share_l:
        in_ladder = pct(min(1.0, share_l))
        alone_took = (
            f"Alone, {pct(share_a)} of the kernel time it removed came off the step, against {in_ladder} in the ladder"
            if share_a >= 0
            else f"Alone, the step got {a['after_ms'] - a['before_ms']:.3g} ms slower although its kernels took "
            f"{cut_a:.3g} ms less, while in the ladder {in_ladder} of the kernel time it removed came off the step"
        )
        text += (
            f"{alone_took}: after it the device ran kernels only {pct(busy_a)} of the step and waited on the host the "
            f"rest. "
        )
        fewer = ld["launches"] < a["launches"] or ld["syncs"] < a["syncs"]
        return text + (
            (
                f"The step it acts on in the ladder issues {ld['launches']:,.0f} kernel launches and {ld['syncs']:.0f} "
                f"syncs a step, against {a['launches']:,.0f} and {a['syncs']:.0f} alone: less host work to wait on. "
                if fewer
                else f"It issues no fewer launches or syncs ({ld['launches']:,.0f} and {ld['syncs']:.0f}, against "
                f"{a['launches']:,.0f} and {a['syncs']:.0f} alone). "
            )
            + "Which part of the host's work holds each step, these profiles do not isolate."
        )
    if busy_a >= busy_min:
        return text + (
            f"Alone the step stays bound by its kernels (busy {pct(busy_a)} after it), so the gains differ by the "
            f"kernel time it removes: {cut_a:.3g} of {a['before_ms']:.3g} ms alone, {cut_l:.3g} of "
            f"{ld['before_ms']:.3g} ms in the ladder."
        )
    return text + "These profiles do not isolate why the two gains differ."


def bf16_saving_note(
    tokens: float,
    fp32_ms: float,
    bf16_ms: float,
    busy: float,
    *,
    fp32_kernel_ms: float | None = None,
    bf16_kernel_ms: float | None = None,
    host_bound_below: float = 0.5,
) -> str:
    """Notebook 10's batch sweep: what bf16 saved per step (wall time, ``fp32_ms - bf16_ms``) at ``tokens`` tokens,
    against the kernels' time.

    The float32 step's kernels: ``fp32_kernel_ms`` (profiled), else its profiled busy share ``busy`` times
    ``fp32_ms``. A saving larger than all of them cannot come from shorter kernels alone. The bf16 step's kernels,
    ``bf16_kernel_ms``, where profiled; where not, they fit in its wall time, so the kernels got shorter by at least
    ``fp32 kernels - bf16_ms`` (when that is positive), and otherwise the sentence says the saving is at most the
    kernels' time and not profiled. A float32 step whose device is busy less than ``host_bound_below`` of its
    time is host-bound: shorter kernels shorten it only where the host waits for them, so there the cause of
    the saving is not isolated."""
    if not (fp32_ms > 0 and bf16_ms > 0 and 0 <= busy <= 1):
        raise ValueError(f"bf16_saving_note: need times > 0 and 0 <= busy <= 1, got {fp32_ms!r}, {bf16_ms!r}, {busy!r}")
    for name, v in (("fp32_kernel_ms", fp32_kernel_ms), ("bf16_kernel_ms", bf16_kernel_ms)):
        if v is not None and not v >= 0:
            raise ValueError(f"bf16_saving_note: {name} must be a time >= 0 (ms) or None, got {v!r}")
    saved = fp32_ms - bf16_ms
    kernels = fp32_kernel_ms if fp32_kernel_ms is not None else busy * fp32_ms
    at = f"At {tokens:,.0f} tokens"
    if saved <= 0:
        return f"{at} bf16 saved nothing ({bf16_ms:.3g} ms against {fp32_ms:.3g} ms in float32)."
    host_bound = min(1.0, kernels / fp32_ms) < host_bound_below
    host = (
        f" The float32 step is host-bound there (its kernels {pct(min(1.0, kernels / fp32_ms))} of its time): "
        f"shorter kernels shorten such a step only where the host waits for them, so what the saving came from is "
        f"not isolated."
        if host_bound
        else ""
    )
    if bf16_kernel_ms is not None:
        cut = kernels - bf16_kernel_ms
        text = (
            f"{at} bf16 saved {saved:.3g} ms of wall time per step; its kernels took {bf16_kernel_ms:.3g} ms against "
            f"{kernels:.3g} ms in float32"
        )
        if cut <= 0:
            return text + ": they did not get shorter, so the saving is host work, which this sweep does not split."
        if saved > cut:
            return text + (
                f" ({cut:.3g} ms less): it saved more than its kernels did, so the rest is host work (other code "
                f"paths, fewer or cheaper ops), which this sweep does not split."
            )
        return text + f" ({cut:.3g} ms less), enough to account for the saving." + host
    if saved > kernels:
        return (
            f"{at} bf16 saved {saved:.3g} ms per step, more than the {kernels:.3g} ms of kernels the float32 step ran "
            f"(its profiled busy share of its time): it also cut host work there (other code paths, fewer or cheaper "
            f"ops), which this sweep does not split."
        )
    if kernels > bf16_ms:
        return (
            f"{at} bf16 saved {saved:.3g} of the float32 step's {kernels:.3g} ms of kernels: it shortened the busy "
            f"share (the bf16 step's kernels fit in its {bf16_ms:.3g} ms, at least {kernels - bf16_ms:.3g} ms less)."
            + host
        )
    return (
        f"{at} bf16 saved {saved:.3g} ms of wall time per step, at most the {kernels:.3g} ms of kernels the float32 "
        f"step ran, so shorter kernels could account for it; the bf16 step's kernels were not profiled." + host
    )


def measured_launch_crossover(
    b_lo: float,
    step_lo_ms: float,
    kernel_lo_ms: float,
    b_hi: float,
    kernel_hi_ms: float,
    *,
    model_batch: float,
    host_bound_below: float = 0.5,
) -> str:
    """Notebook 10's exercise 3, checked against the measurement rather than the model: the batch at which the
    step's kernels reach the host's pace.

    At the smallest batch ``b_lo`` the step takes ``step_lo_ms`` with ``kernel_lo_ms`` of kernels (profiled). When
    the device is busy less than ``host_bound_below`` of that step, the host sets the pace there, and its time per
    step (launches, Python, autograd: it does not grow with the batch) is about ``step_lo_ms``. The kernels' time
    grows with the batch; interpolated linearly between ``b_lo`` and ``b_hi`` it reaches the host's time at the
    crossover, compared with the model's answer ``model_batch``."""
    if not (0 < b_lo < b_hi and step_lo_ms > 0 and kernel_lo_ms >= 0 and kernel_hi_ms >= 0 and model_batch > 0):
        raise ValueError(
            "measured_launch_crossover: need 0 < b_lo < b_hi, a step time > 0, kernel times >= 0 and a model batch > 0, "
            f"got {b_lo!r}, {b_hi!r}, {step_lo_ms!r}, {kernel_lo_ms!r}, {kernel_hi_ms!r}, {model_batch!r}"
        )
    busy = min(1.0, kernel_lo_ms / step_lo_ms)
    at_lo = (
        f"Measured: at batch {b_lo:.0f} the step took {step_lo_ms:.3g} ms with {kernel_lo_ms:.3g} ms of kernels "
        f"(device busy {pct(busy)})"
    )
    if busy >= host_bound_below:
        return at_lo + f": the kernels already set the pace there, so the measured crossover is below batch {b_lo:.0f}."
    slope = (kernel_hi_ms - kernel_lo_ms) / (b_hi - b_lo)
    reach = f"; the kernels grow to {kernel_hi_ms:.3g} ms at batch {b_hi:.0f}"
    if slope <= 0 or kernel_hi_ms < step_lo_ms:
        return at_lo + reach + f", still under that host time: the measured crossover is above batch {b_hi:.0f}."
    b_star = b_lo + (step_lo_ms - kernel_lo_ms) / slope
    return (
        at_lo
        + ": the host sets the pace at about that time per step, whatever the batch"
        + reach
        + f", so at that rate they reach it near **batch {b_star:.2g}** ({b_star / model_batch:.2g}× the model's "
        f"answer: the model's launch time is the launches alone, and the host spends more per step than that)."
    )


def gain_over_bound_note(
    labels: Sequence[str],
    predicted: Sequence[float],
    bounds: Sequence[float],
    model_graph_ms: Sequence[float],
    graph_ms: Sequence[float],
) -> str:
    """Notebook 05's sweep: a predicted graph gain set beside the bound 1 / busy, the most removing the device's
    idle share can give. A prediction above its bound is not a possible outcome: say so, and where it comes from
    (the model's graphed step against the replay measured), instead of printing it bare."""
    rows = list(zip(labels, predicted, bounds, model_graph_ms, graph_ms, strict=True))
    if not rows or any(not (p > 0 and b > 0 and mg > 0 and g > 0) for _, p, b, mg, g in rows):
        raise ValueError(f"gain_over_bound_note: need gains, bounds and times > 0, got {rows!r}")
    over = [r for r in rows if r[1] > r[2]]
    if not over:
        return " Within the 1 / busy bound at every size."
    at = " and ".join(label for label, *_ in over)
    model = " and ".join(f"{mg:.3g}" for *_, mg, _ in over)
    real = " and ".join(f"{g:.3g}" for *_, g in over)
    return (
        f" Above the 1 / busy bound at {at}, so not a possible outcome: the model's graphed step ({model} ms) is "
        f"shorter than the replay measured ({real} ms), and the host time of a call measured alone includes work "
        f"that, back to back, overlaps the device's. The bound, from the profiled busy share, is the limit to read."
    )


# Why a product of mahia's models is float32 on purpose, by the function that computes it (the reasons their
# code gives). :func:`tf32_warning_note` adds the reason to each product it lists; other functions get none.
FLOAT32_ON_PURPOSE = {
    "fabric_gates": "the fabric's gates (batch × layers), outside autocast so that a block's on/off decision does "
    "not hinge on a bf16 rounding",
    "MoE._route": "the MoE router's logits (tokens × experts), outside autocast so that the routing decision does "
    "not hinge on a bf16 rounding",
    "diffusion_operator": "the graph memory's diffusion operator (nodes × nodes), built in float32 so that its rows "
    "keep summing to 1 through the squarings",
    "_gla_logspace": "the meta-attention's chunked scan in PyTorch, in float32 for the range of its decays (where the "
    "Triton scan runs instead, as on a GPU, it is one custom op whose products Inductor does not see)",
}


def _product_list(products: Sequence) -> str:
    """The products grouped by the function that ran them (first seen first), each group's reason said once."""
    groups: dict[object, list] = {}
    for p in products:
        groups.setdefault(getattr(p, "function", None), []).append(p)
    said = []
    for function, group in groups.items():
        why = FLOAT32_ON_PURPOSE.get(function)
        said.append(", ".join(map(str, group)) + (f": {why}" if why else ""))
    return "; ".join(said)


def tf32_warning_note(traces: Mapping[str, object], *, dtype: str, cuda: bool) -> str:
    """Why Inductor's "TensorFloat32 tensor cores ... available but not enabled" warning appears (or would), from
    the evidence: ``traces`` maps what was traced ("the model's forward") to a
    :class:`mahia.measure.instruments.Float32Matmuls` of one call (``products``: the float32 ones, ``count``,
    ``total``: every matrix product); ``dtype`` names the dtype the rest computes in; ``cuda``: this run's device.
    Inductor warns once per process, on a CUDA GPU of compute capability 8.0 or newer with TF32 off, when a graph it
    compiles holds an ``mm``/``addmm``/``bmm``/``baddbmm`` with a float32 output."""
    if not traces:
        raise ValueError("tf32_warning_note: no traces")
    text = (
        "Inductor warns that *TensorFloat32 tensor cores … are available but not enabled* when a graph it compiles "
        "holds a float32 matrix product (once per process, on a CUDA GPU of compute capability 8.0 or newer with "
        "TF32 off)."
    )
    if not cuda:
        text += f" *CPU run: no such warning here; traced on this CPU in {dtype}, the GPU run's dtype:*"
    else:
        text += " Traced once here (`float32_matmuls`, a dispatch mode):"
    found = False
    for what, t in traces.items():
        n, total = t.count, t.total
        if n:
            found = True
            text += (
                f" {what} computes {n} of its {total} matrix products in float32, "
                f"{_product_list(t.products)}; the other {total - n} run in {dtype}."
            )
        else:
            text += f" {what} computes none of its {total} matrix products in float32: all run in {dtype}."
    every_known = all(getattr(p, "function", None) in FLOAT32_ON_PURPOSE for t in traces.values() for p in t.products)
    if found and every_known:
        text += (
            " Those products are what the warning points at, and they are float32 on purpose: TF32 would round "
            "exactly their inputs, so it stays off."
        )
    elif found:
        text += " Those products are what the warning points at."
    if not all(t.count for t in traces.values()):
        text += (
            " A model with none gives the compiler no cause in its forward graph: a warning in its cell would come "
            "from another graph compiled there (a backward, or code that is not the model's) or from Inductor's "
            "attention-pattern pass (`fuse_attention`), which warns in words of its own (*Skipping pattern matching "
            "to fused flash-attention*)."
        )
    return text
