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
from collections.abc import Mapping, Sequence

__all__ = [
    "above_copy_note",
    "aux_tradeoff_sentence",
    "bound_name",
    "cached_buffers_note",
    "compile_evidence",
    "copy_sweep_cpu",
    "copy_timing_modes",
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
    "manual_oom_note",
    "matmul_above_ceiling_note",
    "matmul_tiles_clause",
    "model_miss_summary",
    "padding_cost_note",
    "reorder_print_summary",
    "same_tokens_phrase",
    "shortfall_source",
    "skip_step_summary",
    "specialization_verdict",
    "spread_note",
    "sync_free_loop_note",
    "sync_gain_evidence",
    "train_vs_inference",
    "uncounted_sync_clause",
    "window_mask_note",
    "yes_no",
]


def spread_note(lo: float, hi: float) -> str:
    """Appended to "20–80% spread of the ratio lo–hi": says when the spread contains 1."""
    return "; it contains 1, so the difference is not significant" if lo <= 1 <= hi else ""


def yes_no(flags: Mapping[str, bool]) -> str:
    """ "name yes, other **no**" for a dict of outcomes (e.g. bitwise reproducible or not)."""
    return ", ".join(f"{k} {'yes' if v else '**no**'}" for k, v in flags.items())


def bound_name(launch_bound: bool, *, explain: bool = False) -> str:
    """ "launch-bound" or "device-bound", from a prediction's ``launch_bound`` (04, 05)."""
    if launch_bound:
        return "launch-bound (host time > device time)" if explain else "launch-bound"
    return "device-bound"


# ---------------------------------------------------------------------------------------------------
# 00 · environment and roofline
# ---------------------------------------------------------------------------------------------------


def copy_timing_modes(
    mib: Sequence[float],
    flushed_us: Sequence[float],
    warm_us: Sequence[float],
    host_us: Sequence[float],
    *,
    l2_mib: float | None = None,
) -> str:
    """What the two timing modes of the copy sweep measured (GPU), size by size (ascending ``mib``).

    With the L2 flush each repetition is one copy after the flush, which gives the host time to queue it:
    the events time the kernel on the device, without the host's launch. Without it the copies run back to
    back, so a copy shorter than its launch runs at the host's pace, and data the previous repetition left
    in L2 can be read from there. ``host_us``: the host's time to launch one copy (no sync); ``l2_mib``: the
    L2 cache's size (the device report's ``l2_cache_mb``, which counts MiB)."""
    n = len(mib)
    if not (n and len(flushed_us) == len(warm_us) == len(host_us) == n):
        raise ValueError("copy_timing_modes: mib, flushed_us, warm_us and host_us need the same, non-zero length")
    text = (
        f"With the flush, each repetition times one copy on the device alone: the smallest takes "
        f"{flushed_us[0]:.1f} µs, the device's fixed cost of starting a kernel and reaching its first bytes. "
        f"The host's launch ({host_us[0]:.1f} µs per copy, host clock, no sync) is not in it: the flush before "
        f"each repetition gives the host time to queue the call (notebook 05 measures the device floor as "
        f"`t_floor`). "
    )
    slower = [i for i in range(n) if warm_us[i] > flushed_us[i]]
    if slower:
        w = [warm_us[i] for i in slower]
        h = [host_us[i] for i in slower]
        text += (
            f"Without the flush the copies run back to back, and at {_sizes(mib, slower)} MiB each took longer "
            f"than with it ({min(w):.1f}–{max(w):.1f} µs per copy, against {min(h):.1f}–{max(h):.1f} µs for the "
            f"host to launch one): there the host's launches set the pace, which puts the warm curve *below* "
            f"the flushed one. "
        )
    faster = [i for i in range(n) if warm_us[i] < flushed_us[i]]
    if faster:
        i = max(faster, key=lambda j: flushed_us[j] / warm_us[j])
        where = ""
        if l2_mib:
            fits = "fit" if 2 * mib[i] <= l2_mib else "do not fit"
            where = f"; its source and destination ({2 * mib[i]:g} MiB) {fits} in the {l2_mib:g} MiB L2 cache"
        text += (
            f"At {_sizes(mib, faster)} MiB the warm copy was faster, by up to {flushed_us[i] / warm_us[i]:.2f}× "
            f"at {mib[i]:g} MiB{where}: without the flush, bytes the previous repetition left in L2 can be "
            f"read from there, and the next copy is already queued when one ends. "
        )
    return text


def _sizes(mib: Sequence[float], idx: Sequence[int]) -> str:
    return ", ".join(f"{mib[i]:g}" for i in idx)


def _size(mib: float) -> str:
    return f"{mib * 1024:g} KiB" if mib < 1 else f"{mib:g} MiB"


def copy_sweep_cpu(mib: Sequence[float], gbps: Sequence[float], ceiling_gbps: float) -> str:
    """CPU run: the copy sweep's rate at its smallest and largest size against the ceiling (ascending ``mib``),
    and the sizes where it ran above the ceiling (measured once, at setup, on a large copy)."""
    n = len(mib)
    if not (n and len(gbps) == n) or not ceiling_gbps > 0:
        raise ValueError("copy_sweep_cpu: mib and gbps need the same, non-zero length, and the ceiling must be > 0")
    text = (
        f"*CPU run:* the smallest copy ({_size(mib[0])}) moved {gbps[0]:,.1f} GB/s, {gbps[0] / ceiling_gbps:.2f} "
        f"of the ceiling; the largest ({_size(mib[-1])}) {gbps[-1]:,.1f} GB/s, {gbps[-1] / ceiling_gbps:.2f} of it. "
    )
    above = [i for i in range(n) if gbps[i] > ceiling_gbps]
    if above:
        text += (
            f"Faster than the ceiling at {', '.join(_size(mib[i]) for i in above)}: the ceiling is one large copy "
            f"measured at setup, and a copy beats it when its data are served from the CPU's caches, or when the "
            f"ceiling's own measurement was slowed by other work on the machine. "
        )
    return text


def exp_bound_verdict(fracs: Mapping[str, float], *, pace: float = 0.7) -> str:
    """What bounds each ``torch.exp`` of notebook 00's exercise, from its fraction of the copy bandwidth (by
    dtype name): at least ``pace`` of it, the memory sets its time; below, something else does (its arithmetic,
    or at a small size the cost of a call), although its intensity puts it under the bandwidth slope."""
    if not fracs:
        raise ValueError("exp_bound_verdict: no measurements")
    fast = [k for k, f in fracs.items() if f >= pace]
    slow = [k for k, f in fracs.items() if f < pace]
    parts = []
    if fast:
        parts.append(
            f"{', '.join(fast)} run at the memory's pace (at least {pace:.0%} of copy bandwidth): memory-bound"
        )
    if slow:
        parts.append(
            f"{', '.join(slow)} run below it: there the arithmetic of exp sets the time (a few instructions per "
            f"element, more in float64), so the op is compute-bound in practice although its intensity is far "
            f"below the ridge point, which describes the matrix units, not exp's instructions"
        )
    return "; ".join(parts) + "."


def matmul_above_ceiling_note(frac: float) -> str:
    """Said of a matmul that ran above the matmul ceiling measured at setup (``frac`` of it); empty otherwise."""
    if frac <= 1:
        return ""
    return (
        f" Above 1: the ceiling, the best of a few large matmuls measured once at setup, ran {frac:.2f}× slower "
        f"than this one; on a busy machine that measurement was disturbed, so fractions of it overstate."
    )


def matmul_tiles_clause(n: int, kernel: str, tile: tuple[int, int] | None, sms: int | None) -> str:
    """What the profiler's kernel name says about an (n, n) x (n, n) product: its output tiles against the
    GPU's SMs, when the name states a tile size (:func:`mahia.lessons.profiler_summary.tile_shape`)."""
    if tile is None or not sms:
        return f"its kernel is `{kernel}` (the name states no tile size). "
    tm, tn = tile
    tiles = -(-n // tm) * -(-n // tn)
    return (
        f"its kernel, `{kernel}`, computes {tm}×{tn} output tiles, so a {n}×{n} product is {tiles} tile(s) for "
        f"{sms} SMs: {min(tiles, sms)} of them get work. "
    )


# ---------------------------------------------------------------------------------------------------
# 01 · sync elimination
# ---------------------------------------------------------------------------------------------------


def extra_ops_clause(ops_before: int, ops_after: int) -> str:
    """Appended to "the sync-free step dispatches <after> ops against <before>"."""
    return " (the masked arithmetic and `torch.where` are extra kernels)" if ops_after > ops_before else ""


def sync_gain_evidence(
    speedup: float, predicted: float, *, busy_before: float | None = None, busy_after: float | None = None, cuda: bool
) -> str:
    """Why the measured gain of the sync-free loop differs from the drain-only model's (``predicted``), stated
    with the profiler's device-busy fractions of the two loops (GPU); on a CPU, where the evidence is by
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
        f"The profiler has the device busy {busy_before:.0%} of the syncing loop's wall time and {busy_after:.0%} "
        f"of the sync-free loop's. "
    )
    if speedup > predicted:
        return text + (
            f"The gain, {speedup:.2f}×, is larger than the drain model's {predicted:.2f}×: after each sync the "
            f"device also waits while the host launches the next kernels, time the model does not charge; the "
            f"busy fractions show that idle time."
        )
    return text + (
        f"The gain, {speedup:.2f}×, is no larger than the drain model's {predicted:.2f}×: "
        + (
            "the sync-free loop keeps the device no busier, so the syncs cost less here than the drain measured "
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
) -> str:
    """Where the measured gain of the sync sweep (ascending ``step_ms``) is under ``cut``, against where the
    drain-only model crosses it (``model_cut_ms``: the step time at which 1 + syncs·t_sync / t_step = cut).
    ``cuda=False``: a CPU run, where nothing overlaps, so no reason is given for the shape of the curve."""
    if not (len(step_ms) == len(measured) == len(predicted)) or not len(step_ms):
        raise ValueError("gain_cutoff_sentence: step_ms, measured and predicted need the same, non-zero length")
    under = [i for i, m in enumerate(measured) if m < cut]
    text = (
        f"The drain-only model gives less than {cut:g}× for every step longer than {model_cut_ms:.3g} ms "
        f"(at the measured sizes it predicts {min(predicted):.3f}–{max(predicted):.3f}×). "
    )
    if not under:
        return (
            text + f"Measured, the gain stayed at {cut:g}× or more at every size ({min(measured):.2f}× at the least)."
        )
    where = ", ".join(f"{step_ms[i]:.3g} ms ({measured[i]:.2f}×)" for i in under)
    text += f"Measured, it is under {cut:g}× at step times of {where}"
    over = [i for i in range(len(measured)) if i not in under]
    if over:
        text += ", and above it at " + ", ".join(f"{step_ms[i]:.3g} ms ({measured[i]:.2f}×)" for i in over)
    if not cuda:
        return (
            text
            + ". *CPU run:* nothing is asynchronous here, so these ratios are the loops' different ops and the machine's noise; the question is about a GPU."
        )
    return text + (
        ": the measured gain does not fall steadily with the step time as the model's does, because what a sync "
        "costs is mostly the overlap it breaks, largest where host and device times are about equal (the host "
        "share in the sweep's table)."
        if over and under and max(over) > min(under)
        else ": it falls with the step time, as the model's does."
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
    """Notebook 02's first exercise: why FlashAttention cannot take a sliding-window mask, and what it means when
    a backend named ``flash`` ran one anyway (on a CPU, PyTorch's own CPU kernel of that name takes any mask)."""
    text = ""
    if "flash" in runs_masked:
        text = (
            "Here `flash` ran the mask: on a CPU that backend is PyTorch's own CPU kernel, which takes any mask. "
            "The CUDA FlashAttention kernel does not: "
        )
    else:
        text = "FlashAttention's kernel takes no mask at all: "
    return text + (
        "it has only `is_causal`, a pattern its loop builds into which tiles it visits, with no input for an "
        "arbitrary one. A window is a block-sparse pattern a kernel could skip tile by tile (FlexAttention "
        "generates such kernels)."
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


def compile_evidence(ratio: float, eager, compiled) -> str:
    """`default`'s measured gain over the predicted one (``ratio``), with the profiler's account of one eager and
    one compiled call (two :class:`mahia.lessons.profiler_summary.ProfileSummary`): launches, busy and wall time,
    and how the time saved splits between the device (operators on a CPU) and the host."""
    what = "kernel" if eager.cuda else "operator"
    text = (
        f"`default` measured {ratio:.2f}× the predicted gain. Per call, the profiler counts {eager.launches:.0f} "
        f"{what} launches eager and {compiled.launches:.0f} compiled; {what} time {eager.busy_ms:.3g} → "
        f"{compiled.busy_ms:.3g} ms, wall time {eager.wall_ms:.3g} → {compiled.wall_ms:.3g} ms. "
    )
    saved_wall, saved_busy = eager.wall_ms - compiled.wall_ms, eager.busy_ms - compiled.busy_ms
    if saved_wall <= 0:
        return text + "Under the profiler the compiled call was not faster."
    text += (
        f"Of the {saved_wall:.3g} ms saved per call, {saved_busy:.3g} ms is {what} time and {saved_wall - saved_busy:.3g} "
        f"ms the host's (Python, dispatch, launches)"
    )
    if not eager.cuda:
        return (
            text
            + ": *CPU run: Inductor's C++ code runs inside a few calls the profiler does not split into operators.*"
        )
    return text + "."


def train_vs_inference(train_gain: float, train_break_even: float, infer_gain: float, infer_break_even: float) -> str:
    """Notebook 04's first exercise: which of a compiled training step and a compiled inference forward of the same
    block gained more per call and paid its compile time back sooner, as measured."""
    more = "the training step" if train_gain > infer_gain else "the inference forward"
    sooner = "the training step" if train_break_even < infer_break_even else "the inference forward"
    if more == sooner:
        text = f"Measured here, {more} gained more per call and paid its compile time back sooner. "
    else:
        text = f"Measured here, {more} gained more per call, but {sooner} paid its compile time back sooner. "
    if sooner == "the training step":
        return text + (
            "Training is the better case: it repeats one step of one shape for a whole run, so the compile time is "
            "paid once, and its backward adds elementwise work that fusion removes too."
        )
    return text + (
        "Per call, inference is the better case at this size; training still repeats one step of one shape for a "
        "whole run, so its compile time is paid once against far more calls than a short inference job makes."
    )


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


def specialization_verdict(lo: float, hi: float) -> str:
    """What static-shape specialization bought, from the range ``lo``-``hi`` of dynamic / static time per call."""
    if lo > 1:
        return (
            f"Specialization bought {lo:.2f}–{hi:.2f}× per call: kernels compiled for known sizes (sizes as constants, "
            f"no guards on symbolic sizes, block sizes chosen for the shape)."
        )
    if hi < 1:
        return (
            "The dynamic compile was faster at every length here: specialization bought nothing measurable at these "
            "sizes, and the static compiles cost one compilation per length."
        )
    return (
        "Mixed: the dynamic compile was faster at some lengths and slower at others, so specialization bought "
        "nothing consistent here; what it certainly costs is one compilation per length."
    )


# ---------------------------------------------------------------------------------------------------
# 05 · CUDA graphs
# ---------------------------------------------------------------------------------------------------


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
    if t_free_ms < t_loop_ms:
        saved = t_loop_ms - t_free_ms
        return (
            f"Without its {syncs} syncs the loop takes {t_free_ms:.3g} ms against {t_loop_ms:.3g} ms {what}: "
            f"{saved:.3g} ms per forward, {saved * 1e3 / max(syncs, 1):.3g} µs per sync removed, is at most what "
            f"the syncs cost here. "
        )
    return (
        f"Without its {syncs} syncs the loop is no faster: {t_free_ms:.3g} ms against {t_loop_ms:.3g} ms {what}. "
        f"So at this size the syncs are not what the loop's time is: the device waits on the host's work per "
        f"op (§5's profile), with or without a sync. "
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
) -> str:
    """Notebook 08's second exercise: where the measured gains of the expert sweep (``rows`` tokens per expert)
    part from the model that holds one expert's rate fixed at its ``rows_at``-row measurement (``rate_at``
    TFLOP/s; ``model``: its gains), and why, from the rate one expert's matmuls reached at each swept size
    (``rates``, TFLOP/s, from the sweep's t_expert); and where the measured gain is under ``target``."""
    n = len(rows)
    if not (n and len(measured) == len(model) == len(rates) == n) or not peak > 0:
        raise ValueError("fixed_rate_model_note: rows, measured, model and rates need the same, non-zero length")
    below = [i for i in range(n) if measured[i] < model[i]]
    above = [i for i in range(n) if measured[i] > model[i]]
    text = ""
    if below:
        text += f"The measurement is below the fixed-rate model at {_rows(rows, below)} rows per expert. "
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
        text += f"It is above the model at {_rows(rows, above)} rows. "
    if not below and not above:
        text += "The measurement equals the model at every swept size. "
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
# 09 · hybrid components
# ---------------------------------------------------------------------------------------------------


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
        return text + f"Its kernels took {kernel_ms:.3g} ms per call (the device busy {busy:.0%} of the time)."
    text += f"Its kernels took {kernel_ms:.3g} ms per call, the device busy {busy:.0%} of the profiled wall time"
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


def model_miss_summary(rows: Sequence[Mapping]) -> str:
    """Notebook 09's summary: per component (``component``), the measured over the predicted time of its before
    and after paths (``before_ms``, ``before_pred_ms``, ``after_ms``, ``after_pred_ms``), and which side the model
    misses more: predicted / measured gain = (after measured / predicted) / (before measured / predicted)."""
    if not rows:
        raise ValueError("model_miss_summary: no rows")
    miss = [(r["component"], r["before_ms"] / r["before_pred_ms"], r["after_ms"] / r["after_pred_ms"]) for r in rows]
    text = (
        "Measured over predicted time, before / after path: "
        + ", ".join(f"{c} {b:.2f}× / {a:.2f}×" for c, b, a in miss)
        + ". "
    )
    high = [c for c, b, a in miss if a > b]
    low = [c for c, b, a in miss if a < b]
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
    if not high and not low:
        text += "Both paths are off by the same factor everywhere, so every predicted gain is the measured one."
    return text.rstrip()


# ---------------------------------------------------------------------------------------------------
# 10 · the full stack
# ---------------------------------------------------------------------------------------------------


def same_tokens_phrase(same: bool) -> str:
    """How the CUDA-graph decoder's tokens compare with the eager decoder's."""
    return "with exactly the same tokens" if same else "with tokens that differ only at near-ties"
