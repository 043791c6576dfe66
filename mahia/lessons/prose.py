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
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "amp_gain_verdict",
    "attention_gain_trend",
    "aux_loss_cost_clause",
    "big_weights_clause",
    "bound_name",
    "checkpoint_notes",
    "compile_gain_verdict",
    "copy_timing_modes",
    "decode_bound_clause",
    "disturbed_ceiling_note",
    "eager_efficiency_note",
    "extra_ops_clause",
    "first_failure_phrase",
    "flash_backend_note",
    "foreach_bandwidth_clause",
    "fp16_sum_overflow_note",
    "graph_gain_verdict",
    "in_context_reason",
    "manual_oom_note",
    "memory_model_overshoot_note",
    "misjudged_rung_reason",
    "moe_model_misses",
    "no_gain_note",
    "padding_cost_note",
    "same_tokens_phrase",
    "saved_excess_note",
    "second_pass_note",
    "short_sequence_verdict",
    "small_step_pace",
    "spread_note",
    "sync_gain_verdict",
    "topk_gain_clause",
    "uncounted_sync_clause",
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


# ---------------------------------------------------------------------------------------------------
# 01 · sync elimination
# ---------------------------------------------------------------------------------------------------


def extra_ops_clause(ops_before: int, ops_after: int) -> str:
    """Appended to "the sync-free step dispatches <after> ops against <before>"."""
    return " (the masked arithmetic and `torch.where` are extra kernels)" if ops_after > ops_before else ""


def sync_gain_verdict(speedup: float, predicted: float, *, cuda: bool) -> str:
    """Why the measured gain of the sync-free loop differs from the model's (``predicted``), if it does."""
    if not cuda:
        return (
            "*CPU run:* the CPU executes each op when it is called, so there is no queue to drain and a "
            "'sync' costs only the read itself: the two loops differ by their extra ops, not by waiting. "
            "The counts above are what matters here; the gain is a GPU effect."
        )
    if speedup > predicted * 1.1:
        return (
            "The measured gain is larger than the fixed cost of the syncs: each sync also serializes the "
            "CPU's launches and the GPU's work of the next segment (lost overlap), which the model leaves out."
        )
    if speedup < predicted * 0.9:
        return (
            "The measured gain is smaller: part of the sync cost measured on the chain of tiny kernels "
            "overlaps with work here, and the sync-free step launches extra kernels."
        )
    return "The model accounts for the gain within 10%."


# ---------------------------------------------------------------------------------------------------
# 02 · SDPA attention
# ---------------------------------------------------------------------------------------------------


def attention_gain_trend(first: float, last: float) -> str:
    """Completes "the gain ...": the manual/SDPA time ratio at the shortest and the longest T."""
    return "grows with T, as the T² score traffic takes over. " if last > first else "does not grow with T here. "


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


def decode_bound_clause(frac_of_copy: float) -> str:
    """What bounds one decoding step, from SDPA's fraction of the copy bandwidth."""
    if frac_of_copy > 0.5:
        return "reading k and v, not the score matrix, is the work: "
    return (
        "far from the bandwidth limit: launch overhead dominates a step this small (notebook 05 removes it "
        "with CUDA graphs); "
    )


# ---------------------------------------------------------------------------------------------------
# 03 · Triton fusion
# ---------------------------------------------------------------------------------------------------


def second_pass_note(
    measured_ratio: float, predicted_ratio: float, *, programs: int, block_n: int, sms: int, rows: int
) -> str:
    """Why the dw second pass is slower than its bytes predict, when it is (more than 15% over)."""
    if measured_ratio > 1.15 * predicted_ratio:
        return (
            f" (its dw kernel has only {programs} programs, one per {block_n} columns, "
            f"for {sms} SMs, each walking all {rows:,} rows in turn)"
        )
    return ""


def eager_efficiency_note(experiment: str, frac: float, *, n_ops: int, tiny_ops: int, gain_ratio: float) -> str:
    """Where eager is least efficient (``frac`` of copy bandwidth) and what that does to the bytes model."""
    if frac < 0.8:
        return (
            f"Eager is least efficient on {experiment}, {frac:.2f} of copy bandwidth over its {n_ops} ops"
            + (
                f", {tiny_ops} of which move under 1% of its bytes each (a launch apiece for almost no data)"
                if tiny_ops
                else ""
            )
            + f": the bytes model charges only bytes, so it underestimates eager's time there, and the "
            f"measured gain is {gain_ratio:.2f}× the predicted one."
        )
    return "Eager's ops stream close to the bandwidth, so the bytes model predicts its time well."


def no_gain_note(hidden_sizes: Iterable[int], best_peer_frac: float | None) -> str:
    """The hidden sizes where the fused kernel gains under 5% over the best peer, and why (if the peer is
    already at 0.85 of copy bandwidth or more); empty when there are none."""
    sizes = list(hidden_sizes)
    if not sizes:
        return ""
    why = (
        f": there the best peer already reaches {best_peer_frac:.2f} of copy bandwidth or more, and a "
        "fused forward has nothing left to win. "
        if best_peer_frac >= 0.85
        else ". "
    )
    return f"No gain (under 5%) at N = {', '.join(map(str, sizes))}" + why


# ---------------------------------------------------------------------------------------------------
# 04 · torch.compile
# ---------------------------------------------------------------------------------------------------


def compile_gain_verdict(ratio: float) -> str:
    """The measured gain of ``default`` mode over the predicted one (``ratio`` = measured / predicted)."""
    if ratio < 0.8:
        return (
            "`default` gains less than the model says: the generated kernels do not run at copy "
            "bandwidth at these sizes, and Inductor splits some chains the model fuses (reductions "
            "followed by broadcasts, the attention layout changes)."
        )
    if ratio > 1.25:
        return (
            "`default` gains more than the model says: the compiled code also drops work the op count "
            "does not see (dtype casts folded into loads, layout copies removed), and its launches are "
            "cheaper than eager PyTorch's dispatch of one op."
        )
    return "The model accounts for the `default` gain within 25%."


# ---------------------------------------------------------------------------------------------------
# 05 · CUDA graphs
# ---------------------------------------------------------------------------------------------------


def graph_gain_verdict(speedup: float, predicted: float) -> str:
    """The measured gain of a CUDA graph against the launch model's prediction."""
    if speedup < 0.8 * predicted:
        return (
            "Less than predicted: the replayed kernels take longer than the floor-or-roofline estimate "
            "(small matmuls and attention kernels run far below peak), so the graph is slower than the "
            "model's device time."
        )
    if speedup > 1.25 * predicted:
        return (
            "More than predicted: eager costs more per op than the tiny-op chain measured (module "
            "calls and input checks in Python add to every launch of the real model)."
        )
    return "The launch model accounts for the gain within 25%."


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


def amp_gain_verdict(speedup: float, amdahl: float) -> str:
    """The measured bf16 speedup against the Amdahl estimate (only the matmuls sped up)."""
    if speedup > amdahl * 1.1:
        return (
            "The measured gain is larger than that: the memory-bound ops also got faster, because their "
            "bf16 activations move half the bytes. "
        )
    if speedup < amdahl * 0.9:
        return (
            "The measured gain is smaller even than that. Likely causes: the model's matmuls are smaller than "
            "the square matmul the rate was measured on (lower efficiency), and autocast adds cast kernels "
            "(every weight is cast to bf16 in each forward). "
        )
    return "The Amdahl estimate accounts for the measurement within 10%. "


# ---------------------------------------------------------------------------------------------------
# 07 · gradient checkpointing
# ---------------------------------------------------------------------------------------------------


def checkpoint_notes(
    *, selective_overhead: float, full_overhead: float, full_saving: float, predicted_full_saving: float
) -> str:
    """What stands out in the measured policies: selective slower than full; full saving less than predicted
    (by more than 5 points). Empty when neither."""
    text = ""
    if selective_overhead > full_overhead:
        text += (
            "Selective costs *more* time than full here. Its policy runs in a Python dispatch mode that sees "
            "every op of the forward and of the recompute; with ops this small, that per-op bookkeeping can "
            "cost more than the matmuls full checkpointing recomputes. "
        )
    if full_saving < predicted_full_saving - 0.05:
        text += (
            "Full checkpointing saves less than predicted because those temporaries and the head, which "
            "are not checkpointed, are a larger share of what is left. "
        )
    return text


def saved_excess_note(part: str, ratio: float) -> str:
    """Where autograd keeps the most beyond the memory model (``ratio`` measured/modelled of that part),
    when it is more than 10% over."""
    if ratio > 1.1:
        return (
            f"The model counts what the fused paths keep; the largest excess, in the {part}, is what its path "
            f"on this device keeps beyond that (an eager reference keeps intermediates a kernel recomputes: "
            f"the log-space scan its pairwise decays, the eager norm its normalized input, eager RoPE both "
            f"rotations). "
        )
    return ""


def memory_model_overshoot_note(overshoots: bool) -> str:
    """Said when the memory model alone predicts a larger batch than the one that ran, for some policy."""
    if overshoots:
        return (
            " The memory model alone predicts too large a batch where it misses the backward pass's "
            "temporaries (the logits' gradient, the eager paths' copies), which grow with the batch too; "
            "two measured steps capture them."
        )
    return ""


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


def aux_loss_cost_clause(task_loss_without: float, task_loss_strongest: float) -> str:
    """Completes "the balancing term spreads the load ...": whether the strongest coefficient's task loss
    stayed within 20% of the run without the aux loss."""
    if task_loss_strongest <= 1.2 * task_loss_without:
        return "without hurting this fit."
    return "at some cost in this fit: the coefficient trades balance against the task."


def moe_model_misses(
    loop_ratio: float, grouped_ratio: float, *, grouped_work_ms: float, grouped_launch_ms: float, cuda: bool = True
) -> str:
    """Where the launch model misses each path (``*_ratio`` = measured / predicted time; within 0.8–1.25
    counts as a hit). ``grouped_work_ms`` / ``grouped_launch_ms``: the grouped path's predicted terms.
    ``cuda=False``: a CPU run, where nothing overlaps and a sync waits for nothing."""
    why = []
    if loop_ratio > 1.25:
        why.append(
            f"the loop took {loop_ratio:.1f}× its prediction: its ops (boolean compare, `nonzero`, "
            f"integer-index gathers, `index_add_`) cost more to dispatch than the one-element add "
            f"`t_launch` was measured on"
            + (", and after each sync the device idles while the host prepares the next expert" if cuda else "")
        )
    elif loop_ratio < 0.8:
        why.append(
            f"the loop took only {loop_ratio:.2f}× its prediction: "
            + (
                "some of its ops overlap with the previous expert's matmuls, which the per-expert sum does not credit"
                if cuda
                else "`t_expert`, timed on its own, already contains the dispatch of the expert's ops, which the "
                "model counts again as launches"
            )
        )
    if grouped_ratio > 1.25:
        why.append(
            f"the grouped path took {grouped_ratio:.1f}× its prediction: besides the two grouped GEMMs it "
            f"moves the tokens (the gather, the `N·k` rows of SwiGLU, the combine) and the grouped GEMM "
            f"itself runs below the ceiling of one large square matmul"
        )
    elif grouped_ratio < 0.8:
        why.append(
            f"the grouped path took only {grouped_ratio:.2f}× its prediction: "
            + (
                "the prediction is its FLOPs at the matmul ceiling, and a layer cannot beat the ceiling: the ceiling "
                "measured at setup is too low (see the note above)"
                if grouped_work_ms >= grouped_launch_ms
                else "the launch estimate overcounts the cost of its few ops"
            )
        )
    return "Where the model misses: " + "; ".join(why) + "." if why else "Both paths are within 25% of the model."


def topk_gain_clause(gain_low_k: float, gain_high_k: float, k_ratio: float, *, syncs: int) -> str:
    """Why the gain changed from the smallest to the largest top-k of the sweep (``k_ratio`` between them)."""
    if gain_high_k < gain_low_k:
        return (
            f": the loop still syncs {syncs} times, but each expert's matmuls get {k_ratio:.0f}× longer and "
            f"hide more of the fixed cost. "
        )
    return (
        f": the gain does not shrink here, because the loop's gathers and `index_add_` also grow with the "
        f"{k_ratio:.0f}× more assignments. "
    )


# ---------------------------------------------------------------------------------------------------
# 09 · hybrid components
# ---------------------------------------------------------------------------------------------------


def first_failure_phrase(first_t: int | None, largest_t: int) -> str:
    """Completes "it returns NaN/inf ...": the first sequence length that failed, if any."""
    return f"from T = {first_t} on" if first_t else f"nowhere up to T = {largest_t}"


def short_sequence_verdict(gain_shortest: float, gain_longest: float) -> str:
    """Whether the gain over the loop shrinks at short sequence lengths, and why."""
    if gain_shortest < gain_longest:
        return (
            "The loop's cost grows linearly with T from the first step, while the fused or chunked path pays a "
            "fixed cost that dominates short sequences. For a few tokens at a time (decoding, say) the recurrence "
            "itself, one step per token with the state in hand, is the right tool."
        )
    return (
        "Here the gain does not shrink at short T: both paths are dominated by fixed per-call costs of the same "
        "order, so their ratio stays flat."
    )


def uncounted_sync_clause(counted: int) -> str:
    """Said of the plan's read-back when the sync counter did not see it (a CPU tensor's ``.tolist()``)."""
    return "" if counted else ", invisible to the counter on a CPU"


def foreach_bandwidth_clause(frac_of_copy: float) -> str:
    """Why the foreach update is below, or above, the copy bandwidth on its minimum traffic."""
    if frac_of_copy < 1:
        return " (it makes more passes than the minimum: the temporary θ·g, and a separate scale and add)."
    return " (above 1: these tensors stay in a cache between calls, which the ceiling's large copy does not)."


def big_weights_clause(gain_smallest: float, gain_largest: float) -> str:
    """Ends the weight-size sweep's sentence: says why the gain shrank, if it did."""
    if gain_largest < gain_smallest:
        return ": the loop's syncs and launches are a fixed cost that the bytes of big weights hide."
    return "."


# ---------------------------------------------------------------------------------------------------
# 10 · the full stack
# ---------------------------------------------------------------------------------------------------


def misjudged_rung_reason(
    *, bound_below: str, bound: str, ratio_below: float, amp_changed: bool, compiled: bool, cuda: bool
) -> str:
    """Why the cost model misjudges the gain of one rung of the ladder, from what the rung changes.

    ``bound_below`` / ``bound``: what the model says bounds the step below the rung and with it
    ("launches", "device work" or "syncs"); ``ratio_below``: the measured / predicted time of the rung
    below; ``amp_changed``: the rung switches autocast; ``compiled``: the rung is torch.compile.
    """
    if bound != bound_below:
        return (
            f"In the model this rung moves the step from being bound by {bound_below} to being bound by {bound}, "
            f"so the bias no longer cancels: the rung below it took {ratio_below:.2g}× its predicted time, mostly "
            f"launches, and the launches are what this rung removes."
        )
    if amp_changed:
        return (
            "Autocast changes more than the matmul rate: it adds a cast kernel before matmuls whose inputs are "
            "float32, and the elementwise kernels between matmuls run in bf16, which the model counts as launches "
            "and bytes only"
            + ("." if cuda else "; this CPU's bf16 elementwise and cast kernels are slower than its float32 ones.")
        )
    if compiled:
        return (
            "The fusion estimate is an ideal compiler's: it merges every chain of pointwise ops; inductor also "
            "picks its own matmul kernels and leaves some ops unfused."
        )
    if bound == "device work":
        return (
            "The model calls it device-bound: the trace counts bytes as if every kernel streamed at the copy "
            "bandwidth and every matmul ran at the rate of a large square one, which small kernels do not reach."
        )
    return (
        "The model counts ops, not what each costs: a `nonzero` waits for the device, a `topk`, an "
        "`index_add_` or a large copy is more than a launch, and a rung changes the mix of ops."
    )


def in_context_reason(*, alone: float, in_ladder: float) -> str:
    """Completes "... alone and ... in the ladder, because": why an optimization's gain depends on context."""
    if in_ladder > alone:
        return (
            "it helps more once the bottlenecks below it are gone: a faster kernel cannot show while the host "
            "waits in a Python loop."
        )
    return "part of what it removes alone is already gone in the ladder (or what it adds costs more on a faster step)."


def same_tokens_phrase(same: bool) -> str:
    """How the CUDA-graph decoder's tokens compare with the eager decoder's."""
    return "with exactly the same tokens" if same else "with tokens that differ only at near-ties"


def small_step_pace(measured_gain: float, predicted_gain: float, *, launches_ms: float, work_ms: float) -> str:
    """Completes "..., so": what sets the pace of the smallest float32 step of the bf16 sweep, and whether the
    measured gain is far (over 25%) from the prediction there."""
    if launches_ms > work_ms:
        far = abs(math.log(measured_gain / predicted_gain)) > math.log(1.25)
        return "the launches set the pace and faster matmuls cannot help (autocast even adds cast kernels); " + (
            "a measured gain this far from the prediction is host time, which varies from run to run on "
            "a launch-bound step (see the spread of the ladder's timings). "
            if far
            else ""
        )
    return "the device work sets the pace. "
