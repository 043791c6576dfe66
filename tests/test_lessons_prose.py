"""mahia.lessons.prose: every branch of every sentence the notebooks choose by a measured number."""

import math
from pathlib import Path

import pytest

from mahia.lessons import prose


def test_every_public_function_is_tested_here():
    src = Path(__file__).read_text()
    assert [n for n in prose.__all__ if f"prose.{n}(" not in src] == []


# --- shared --------------------------------------------------------------------------------------------


def test_spread_note():
    assert "not significant" in prose.spread_note(0.9, 1.2)
    assert prose.spread_note(1.1, 1.3) == "" and prose.spread_note(0.5, 0.9) == ""


def test_yes_no():
    assert prose.yes_no({"atomic": False, "persistent": True}) == "atomic **no**, persistent yes"


def test_bound_name():
    assert prose.bound_name(True) == "launch-bound"
    assert prose.bound_name(True, explain=True) == "launch-bound (host time > device time)"
    assert prose.bound_name(False) == prose.bound_name(False, explain=True) == "device-bound"


# --- 00 ------------------------------------------------------------------------------------------------


def test_copy_timing_modes_follows_the_run():
    mib = [0.0625, 1.0, 16.0, 1024.0]
    # warm slower (host-paced) at the two small sizes, faster at the two large ones: both are said
    text = prose.copy_timing_modes(
        mib, [4.8, 4.9, 13.1, 505.2], [11.7, 10.2, 12.1, 504.6], [9.5, 9.8, 10.0, 10.4], l2_mib=60
    )
    assert "the smallest takes 4.8 µs" in text and "9.5 µs per copy" in text and "not in it" in text
    assert "at 0.0625, 1 MiB each took longer" in text and "*below*" in text
    assert "At 16, 1024 MiB the warm copy was faster, by up to 1.08× at 16 MiB" in text
    assert "(32 MiB) fit in the 60 MiB L2 cache" in text
    # warm never slower: no host-paced claim; never faster: no cache claim; no L2 size: no fit clause
    only_faster = prose.copy_timing_modes([1.0, 2.0], [5.0, 6.0], [4.0, 5.0], [3.0, 3.0])
    assert "*below*" not in only_faster and "faster, by up to 1.25× at 1 MiB:" in only_faster
    only_slower = prose.copy_timing_modes([1.0], [5.0], [9.0], [8.0])
    assert "*below*" in only_slower and "was faster" not in only_slower
    assert "do not fit" in prose.copy_timing_modes([64.0], [40.0], [35.0], [9.0], l2_mib=50)
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.copy_timing_modes([1.0], [1.0, 2.0], [1.0], [1.0])


# --- 01 ------------------------------------------------------------------------------------------------


def test_extra_ops_clause():
    assert "extra kernels" in prose.extra_ops_clause(10, 12)
    assert prose.extra_ops_clause(12, 12) == ""


@pytest.mark.parametrize(
    "speedup, cuda, expect",
    [
        (1.0, False, "*CPU run:*"),
        (1.5, True, "larger than the fixed cost"),
        (0.5, True, "The measured gain is smaller"),
        (1.05, True, "within 10%"),
    ],
)
def test_sync_gain_verdict(speedup, cuda, expect):
    assert expect in prose.sync_gain_verdict(speedup, 1.0, cuda=cuda)


# --- 02 ------------------------------------------------------------------------------------------------


def test_flash_backend_note():
    kw = dict(shape="4x16x4096x128")
    assert prose.flash_backend_note(None, 600.0, capability="9.0", flash_impl=None, **kw) == ""
    assert prose.flash_backend_note(340.0, None, capability="9.0", flash_impl=None, **kw) == ""
    hopper = prose.flash_backend_note(300.0, 600.0, capability="9.0", flash_impl=None, **kw)
    assert "2.00× the rate" in hopper and "600 against 300 TFLOP/s" in hopper
    assert "bundled FlashAttention-2" in hopper and "wgmma" in hopper and "compute capability 9.0" in hopper
    other = prose.flash_backend_note(300.0, 270.0, capability="8.0", flash_impl=None, **kw)
    assert "0.90× the rate" in other and "bundled FlashAttention-2" in other and "wgmma" not in other
    fa3 = prose.flash_backend_note(500.0, 600.0, capability="9.0", flash_impl="FA3", **kw)
    assert "FA3 implementation" in fa3 and "bundled" not in fa3


def test_attention_gain_trend():
    assert prose.attention_gain_trend(2.0, 5.0).startswith("grows with T")
    assert prose.attention_gain_trend(5.0, 2.0) == "does not grow with T here. "


def test_manual_oom_note():
    assert "**T=4096** (predicted: 2048)" in prose.manual_oom_note(4096, 2048)
    assert "(predicted: no OOM in this sweep)" in prose.manual_oom_note(4096, None)
    assert "never ran out of memory in this sweep (predicted first OOM: None)" in prose.manual_oom_note(None, None)


def test_decode_bound_clause():
    assert prose.decode_bound_clause(0.7).startswith("reading k and v")
    assert "launch overhead dominates" in prose.decode_bound_clause(0.2)


# --- 03 ------------------------------------------------------------------------------------------------


def test_second_pass_note():
    kw = {"programs": 128, "block_n": 32, "sms": 132, "rows": 16384}
    assert "only 128 programs, one per 32 columns, for 132 SMs, each walking all 16,384 rows" in prose.second_pass_note(
        2.0, 1.5, **kw
    )
    assert prose.second_pass_note(1.6, 1.5, **kw) == ""


def test_eager_efficiency_note():
    weak = prose.eager_efficiency_note("rope_fwdbwd", 0.41, n_ops=30, tiny_ops=4, gain_ratio=2.5)
    assert "least efficient on rope_fwdbwd, 0.41" in weak and "4 of which" in weak and "2.50×" in weak
    assert "of which" not in prose.eager_efficiency_note("x", 0.41, n_ops=30, tiny_ops=0, gain_ratio=2.5)
    assert prose.eager_efficiency_note("x", 0.9, n_ops=30, tiny_ops=4, gain_ratio=1.0).startswith(
        "Eager's ops stream close"
    )


def test_no_gain_note():
    assert prose.no_gain_note([], None) == ""
    high = prose.no_gain_note([512, 1024], 0.9)
    assert high.startswith("No gain (under 5%) at N = 512, 1024: there the best peer already reaches 0.90")
    assert prose.no_gain_note([512], 0.5) == "No gain (under 5%) at N = 512. "


# --- 04 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio, expect", [(0.5, "gains less"), (1.5, "gains more"), (1.0, "within 25%")])
def test_compile_gain_verdict(ratio, expect):
    assert expect in prose.compile_gain_verdict(ratio)


# --- 05 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "speedup, expect", [(1.0, "Less than predicted"), (3.0, "More than predicted"), (2.0, "within 25%")]
)
def test_graph_gain_verdict(speedup, expect):
    assert expect in prose.graph_gain_verdict(speedup, 2.0)


def test_padding_cost_note():
    assert prose.padding_cost_note(True).endswith("no measurable difference).*")
    assert prose.padding_cost_note(False) == " *CPU run: no graphs, so this measures only what the padding costs.*"


# --- 06 ------------------------------------------------------------------------------------------------


def test_fp16_sum_overflow_note():
    assert prose.fp16_sum_overflow_note(500_000.0, 65504.0, 1e-3) == ""
    assert "(500,000) does not fit under 65,504: error inf" in prose.fp16_sum_overflow_note(
        500_000.0, 65504.0, math.inf
    )
    assert "error nan" in prose.fp16_sum_overflow_note(500_000.0, 65504.0, math.nan)


@pytest.mark.parametrize(
    "speedup, expect", [(2.0, "larger than that"), (1.0, "smaller even than that"), (1.5, "within 10%")]
)
def test_amp_gain_verdict(speedup, expect):
    assert expect in prose.amp_gain_verdict(speedup, 1.5)


# --- 07 ------------------------------------------------------------------------------------------------


def test_checkpoint_notes():
    both = prose.checkpoint_notes(selective_overhead=0.4, full_overhead=0.3, full_saving=0.4, predicted_full_saving=0.6)
    assert "Selective costs *more* time" in both and "saves less than predicted" in both
    assert (
        prose.checkpoint_notes(selective_overhead=0.1, full_overhead=0.3, full_saving=0.58, predicted_full_saving=0.6)
        == ""
    )
    only_saving = prose.checkpoint_notes(
        selective_overhead=0.1, full_overhead=0.3, full_saving=0.4, predicted_full_saving=0.6
    )
    assert only_saving.startswith("Full checkpointing saves less")


def test_saved_excess_note():
    assert "the largest excess, in the ffn," in prose.saved_excess_note("ffn", 1.5)
    assert prose.saved_excess_note("ffn", 1.05) == ""


def test_memory_model_overshoot_note():
    assert "predicts too large a batch" in prose.memory_model_overshoot_note(True)
    assert prose.memory_model_overshoot_note(False) == ""


# --- 08 ------------------------------------------------------------------------------------------------


def test_disturbed_ceiling_note():
    assert prose.disturbed_ceiling_note(10.0, 20.0) == ""
    assert "(1.5×)" in prose.disturbed_ceiling_note(30.0, 20.0)


def test_aux_loss_cost_clause():
    assert prose.aux_loss_cost_clause(1.0, 1.1) == "without hurting this fit."
    assert prose.aux_loss_cost_clause(1.0, 1.3).startswith("at some cost")


@pytest.mark.parametrize(
    "loop, grouped, work, launch, expect",
    [
        (1.0, 1.0, 1.0, 1.0, ["Both paths are within 25% of the model."]),
        (2.0, 1.0, 1.0, 1.0, ["the loop took 2.0× its prediction", "`t_launch` was measured on"]),
        (0.5, 1.0, 1.0, 1.0, ["the loop took only 0.50× its prediction"]),
        (1.0, 2.0, 1.0, 1.0, ["the grouped path took 2.0× its prediction"]),
        (1.0, 0.5, 2.0, 1.0, ["the grouped path took only 0.50×", "ceiling measured at setup is too low"]),
        (1.0, 0.5, 1.0, 2.0, ["the launch estimate overcounts"]),
        (2.0, 2.0, 1.0, 1.0, ["Where the model misses: the loop took 2.0×", "; the grouped path took 2.0×"]),
    ],
)
def test_moe_model_misses(loop, grouped, work, launch, expect):
    text = prose.moe_model_misses(loop, grouped, grouped_work_ms=work, grouped_launch_ms=launch)
    assert all(e in text for e in expect)


def test_moe_model_misses_on_a_cpu_claims_no_overlap_and_no_idle_device():
    slow = prose.moe_model_misses(1.6, 1.0, grouped_work_ms=1.0, grouped_launch_ms=0.1, cuda=False)
    assert "1.6× its prediction" in slow and "idles" not in slow
    assert "idles" in prose.moe_model_misses(1.6, 1.0, grouped_work_ms=1.0, grouped_launch_ms=0.1)
    fast = prose.moe_model_misses(0.5, 1.0, grouped_work_ms=1.0, grouped_launch_ms=0.1, cuda=False)
    assert "already contains the dispatch" in fast and "overlap" not in fast


def test_topk_gain_clause():
    assert "still syncs 8 times, but each expert's matmuls get 4× longer" in prose.topk_gain_clause(
        5.0, 3.0, 4.0, syncs=8
    )
    assert "does not shrink here" in prose.topk_gain_clause(3.0, 5.0, 4.0, syncs=8)


# --- 09 ------------------------------------------------------------------------------------------------


def test_first_failure_phrase():
    assert prose.first_failure_phrase(1024, 4096) == "from T = 1024 on"
    assert prose.first_failure_phrase(None, 4096) == "nowhere up to T = 4096"


def test_short_sequence_verdict():
    assert prose.short_sequence_verdict(2.0, 50.0).startswith("The loop's cost grows linearly")
    assert prose.short_sequence_verdict(50.0, 50.0).startswith("Here the gain does not shrink")


def test_uncounted_sync_clause():
    assert prose.uncounted_sync_clause(1) == ""
    assert prose.uncounted_sync_clause(0) == ", invisible to the counter on a CPU"


def test_foreach_bandwidth_clause():
    assert "more passes than the minimum" in prose.foreach_bandwidth_clause(0.6)
    assert "stay in a cache" in prose.foreach_bandwidth_clause(1.3)


def test_big_weights_clause():
    assert "fixed cost" in prose.big_weights_clause(5.0, 1.1)
    assert prose.big_weights_clause(1.1, 5.0) == "."


# --- 10 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "below, bound, amp_changed, compiled, cuda, expect",
    [
        ("launches", "device work", False, False, True, "from being bound by launches to being bound by device work"),
        ("launches", "launches", True, False, True, "bytes only."),
        ("launches", "launches", True, False, False, "slower than its float32 ones."),
        ("launches", "launches", False, True, True, "ideal compiler's"),
        ("device work", "device work", False, False, True, "The model calls it device-bound"),
        ("launches", "launches", False, False, True, "The model counts ops"),
    ],
)
def test_misjudged_rung_reason(below, bound, amp_changed, compiled, cuda, expect):
    assert expect in prose.misjudged_rung_reason(
        bound_below=below, bound=bound, ratio_below=3.0, amp_changed=amp_changed, compiled=compiled, cuda=cuda
    )


def test_in_context_reason():
    assert prose.in_context_reason(alone=1.2, in_ladder=3.0).startswith("it helps more")
    assert prose.in_context_reason(alone=3.0, in_ladder=1.2).startswith("part of what it removes")


def test_same_tokens_phrase():
    assert prose.same_tokens_phrase(True) == "with exactly the same tokens"
    assert prose.same_tokens_phrase(False) == "with tokens that differ only at near-ties"


def test_small_step_pace():
    assert prose.small_step_pace(1.0, 1.0, launches_ms=2.0, work_ms=1.0).endswith("adds cast kernels); ")
    far = prose.small_step_pace(2.0, 1.0, launches_ms=2.0, work_ms=1.0)
    assert "this far from the prediction is host time" in far
    assert prose.small_step_pace(2.0, 1.0, launches_ms=1.0, work_ms=2.0) == "the device work sets the pace. "
