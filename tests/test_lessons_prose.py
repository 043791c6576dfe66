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
    assert prose.bound_name(True, explain=True) == "launch-bound: host time > device time"  # no nested parentheses
    assert prose.bound_name(False) == prose.bound_name(False, explain=True) == "device-bound"


# --- 00 ------------------------------------------------------------------------------------------------


def test_copy_timing_modes_follows_the_run():
    mib = [0.0625, 1.0, 16.0, 64.0, 1024.0]
    flushed, warm = [5.1, 6.0, 17.0, 50.1, 716.4], [9.2, 9.3, 10.2, 47.8, 714.6]
    host, pred = [11.7, 10.5, 10.9, 11.0, 11.2], [0.04, 0.7, 11.2, 44.6, 714.2]
    text = prose.copy_timing_modes(mib, flushed, warm, host, pred, copy_us=1.1, l2_mib=50)
    # the flushed floor split by the profiler's time of the copy: 5.1 - 1.1 = 4.0 µs are not the copy
    assert "the smallest measures 5.1 µs" in text
    assert "the copy itself at 1.1 µs of device time, so 4.0 µs (78%) of the flushed floor is not the copy" in text
    assert "(11.7 µs, host clock, no sync) is longer than that whole time, so the events did not wait" in text
    # warm slower at the two small sizes: its time against the host's launch, computed (9.2/11.7, 9.3/10.5)
    assert "at 64 KiB, 1 MiB each took longer than with it (9.2–9.3 µs per copy, the warm curve *below*" in text
    assert "0.79–0.89 of the host's time per launch measured alone (10.5–11.7 µs)" in text
    assert "the launches, not the device, set their pace" in text and "set the pace, which" not in text
    # warm faster: within the 4.0 µs gap at 64 and 1024 MiB; at 16 MiB beyond it and faster than the ceiling allows
    assert "At 16 MiB, 64 MiB, 1024 MiB the warm copy was faster, by 1.8–6.8 µs per copy" in text
    assert "at 64 MiB, 1024 MiB by no more than the 4.0 µs the flushed timing counts around each copy" in text
    assert "at 16 MiB the warm copy (10.2 µs) beat the time the copy ceiling predicts (11.2 µs)" in text
    assert "(32 MiB) fit in the 50 MiB L2 cache" in text and "does not show" not in text
    # the other branches: profiler no shorter than the floor, host launch not longer, saved beyond the gap only
    other = prose.copy_timing_modes([1.0, 64.0], [5.0, 60.0], [6.0, 50.0], [4.0, 4.0], [0.7, 44.6], copy_us=5.0)
    assert "the events count nothing else" in other and "part of it may be inside it" in other
    assert "at 64 MiB by more than that, without beating the ceiling's prediction" in other and "L2" not in other
    assert "do not fit" in prose.copy_timing_modes([64.0], [50.0], [40.0], [9.0], [44.6], copy_us=1.0, l2_mib=50)
    assert "*below*" not in prose.copy_timing_modes([1.0], [5.0], [4.0], [9.0], [0.7], copy_us=1.0)
    # one size, or equal ends: one number, not "0.3–0.3"; every faster size within the gap: "all"
    one = prose.copy_timing_modes([16.0], [6.0], [5.7], [18.0], [5.0], copy_us=1.0)
    assert "At 16 MiB the warm copy was faster, by 0.3 µs per copy; all by no more than the 5.0 µs" in one
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.copy_timing_modes([1.0], [1.0, 2.0], [1.0], [1.0], [1.0], copy_us=1.0)
    with pytest.raises(ValueError, match="copy_us must be > 0"):
        prose.copy_timing_modes([1.0], [1.0], [1.0], [1.0], [1.0], copy_us=0.0)


# --- 00 (cont.) -----------------------------------------------------------------------------------------


def test_copy_sweep_cpu_names_the_sizes_above_the_ceiling():
    text = prose.copy_sweep_cpu([0.015625, 1.0, 16.0], [28.0, 143.0, 70.0], 55.0)
    assert "the smallest copy (16 KiB) moved 28.0 GB/s, 0.51 of the ceiling" in text
    assert "the largest (16 MiB) 70.0 GB/s, 1.27 of it" in text
    assert "Faster than the ceiling at 1 MiB, 16 MiB:" in text and "no spread kept" in text
    assert "(highest, 143.0 GB/s, at 1 MiB)" in text and "slowed by other work" not in text
    assert "Faster" not in prose.copy_sweep_cpu([1.0], [10.0], 55.0)
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.copy_sweep_cpu([1.0], [1.0, 2.0], 5.0)


def test_exp_bound_verdict_compares_exp_with_a_copy_of_the_same_bytes():
    from mahia.measure.timing import Timing

    copy = Timing(1.0, 0.98, 1.03, 10)
    both = prose.exp_bound_verdict(
        {"exp float32": (Timing(1.02, 1.01, 1.04, 10), copy), "exp float64": (Timing(2.5, 2.4, 2.6, 10), copy)}
    )
    assert both.startswith("Against a copy of the same bytes timed the same way: as fast as a copy")
    assert "exp float32 (1.02 ms against the copy's 1)" in both and "(memory-bound)" in both
    assert "exp float64 (2.50× the copy's 1 ms: 1.5 ms of exp's own work)" in both
    assert "slower" not in prose.exp_bound_verdict({"exp bfloat16": (Timing(0.99, 0.97, 1.0, 5), copy)})
    # bands apart by the slightest margin: p20 of exp above p80 of the copy
    assert "as fast" not in prose.exp_bound_verdict({"exp float32": (Timing(1.1, 1.031, 1.2, 5), copy)})
    # The H200 reference of b0bf60d: float64 exp 1.03x the copy, spreads apart, was called instruction-bound
    near = prose.exp_bound_verdict({"exp float64": (Timing(0.267, 0.266, 0.268, 9), Timing(0.259, 0.258, 0.26, 9))})
    assert "slower than a copy by less than a tenth" in near and "exp float64 (1.03× the copy's 0.259 ms)" in near
    assert "still memory-bound" in near and "instructions" not in near
    with pytest.raises(ValueError, match="no measurements"):
        prose.exp_bound_verdict({})


def test_matmul_ceiling_check_compares_like_with_like():
    # flops 1e12: a time of t ms is 1000 / t TFLOP/s; the band runs from the p80 (slow) to the p20 (fast) time
    b2b = (1.4, 1.38, 1.42)  # 714 TFLOP/s, 704–725
    mode = prose.matmul_ceiling_check("matmul 4096", 1e12, 720.0, 737.0, b2b, (1.35, 1.34, 1.36))
    assert "back to back 714 TFLOP/s (20–80%: 704–725), flushed 741 (735–746): 1.04× the back-to-back rate" in mode
    assert "the two bands apart. The ceiling lies inside the back-to-back band." in mode
    assert "The sweep point's 1.02 of the ceiling comes from the timing mode" in mode and "busy" not in mode
    low = prose.matmul_ceiling_check("matmul 4096", 1e12, 650.0, 700.0, b2b, (1.41, 1.39, 1.43))
    assert "the two bands overlapping" in low and "lies below the back-to-back band" in low
    assert "comes from the ceiling's measurement" in low and "timing mode" not in low
    spread = prose.matmul_ceiling_check("matmul 4096", 1e12, 712.0, 715.0, b2b, (1.41, 1.39, 1.43))
    assert "comes from the timings' spread: the ceiling lies inside its way's band and the sweep point" in spread
    # the H100 run of notebook 00 (b34185d): bands overlap, but the medians are 1.10x apart: not the spread alone
    b2b_wide = (1000 / 674, 1000 / 784, 1000 / 672)
    apart = prose.matmul_ceiling_check(
        "matmul 4096", 1e12, 694.0, 715.0, b2b_wide, (1000 / 739, 1000 / 745, 1000 / 708)
    )
    assert "comes from the timings' spread or the timing mode, which this run does not tell apart" in apart
    assert "the flushed median is 1.10× the back-to-back one, more than the 3% within which" in apart
    none = prose.matmul_ceiling_check("matmul 4096", 1e12, 720.0, 760.0, b2b, (1.41, 1.39, 1.43))
    assert "comes from none of these, within the spreads measured here." in none
    cpu = prose.matmul_ceiling_check("matmul 512", 1e12, 800.0, 700.0, b2b)
    assert "the ceiling's way: 714 TFLOP/s" in cpu and "flushed" not in cpu and "lies above the new band" in cpu
    assert "sweep point" not in cpu  # below the ceiling: nothing to account for
    with pytest.raises(ValueError, match="must be \\(median, p20, p80\\)"):
        prose.matmul_ceiling_check("m", 1e12, 700.0, 700.0, (1.0, 0.0, 1.0))


def test_kernel_time_split():
    text = prose.kernel_time_split(0.006, 0.0026, 0.018)
    assert "its bench time (6.0 µs) is 2.3× its kernels' device time (2.6 µs, profiler): 3.4 µs are" in text
    assert text.endswith("the kernels reach 0.018 of the ceiling; ")
    assert "no longer than" in prose.kernel_time_split(0.002, 0.0026, 0.05)
    assert "(the smallest copy's, above, is 3.4 µs: about the same" in prose.kernel_time_split(
        0.006, 0.0026, 0.01, other_gap_us=3.4
    )
    # the H100 run of notebook 00 (b34185d): 5.984 - 2.78 = 3.20 µs against the copy's 3.34 µs is not two costs
    assert "about the same" in prose.kernel_time_split(0.005984, 0.00278, 0.9, other_gap_us=3.34)
    assert "is 1.2 µs: not one fixed cost" in prose.kernel_time_split(0.006, 0.0026, 0.01, other_gap_us=1.2)
    with pytest.raises(ValueError, match="must be > 0"):
        prose.kernel_time_split(0.006, 0.0, 0.1)


def test_matmul_tiles_clause_counts_tiles_for_the_sms():
    text = prose.matmul_tiles_clause(256, "sm90_xmma_gemm", (128, 128), 132)
    assert "computes 128×128 output tiles, so a 256×256 product is 4 tiles for 132 SMs: 4 of them get work" in text
    assert "132 of them get work" in prose.matmul_tiles_clause(8192, "k", (128, 256), 132)
    assert "states no tile size" in prose.matmul_tiles_clause(256, "gemv2T_kernel", None, 132)
    # the kernel's own fraction below what its busy SMs allow: idle SMs explain at most sms / busy of it
    idle = prose.matmul_tiles_clause(256, "k", (64, 24), 132, kernel_frac=0.018)
    assert "44 of them get work (0.33 of the SMs): idle SMs explain at most a factor 3.0 of the shortfall" in idle
    assert "idle SMs" not in prose.matmul_tiles_clause(256, "k", (64, 24), 132, kernel_frac=0.5)
    assert "idle SMs" not in prose.matmul_tiles_clause(8192, "k", (128, 256), 132, kernel_frac=0.01)


# --- 01 ------------------------------------------------------------------------------------------------


def test_extra_ops_clause():
    assert "are extra ops; section 5's profiler counts the kernels" in prose.extra_ops_clause(10, 12)
    assert "extra kernels" not in prose.extra_ops_clause(10, 12)  # ops, not kernels: the profiler counts those
    assert prose.extra_ops_clause(12, 12) == ""


def test_sync_gain_evidence_states_the_busy_fractions():
    assert prose.sync_gain_evidence(1.2, 1.0, cuda=False).startswith("*CPU run:* nothing runs asynchronously")
    larger = prose.sync_gain_evidence(1.43, 1.02, busy_before=0.55, busy_after=0.92, cuda=True)
    assert (
        "runs kernels 55% of the syncing loop's step and 92% of the sync-free loop's (the profiler's kernel" in larger
    )
    assert "timed without it" in larger and "wall time" not in larger  # not the profiled wall time (01-5)
    assert "runs kernels 100% of the syncing" in prose.sync_gain_evidence(
        1.0, 1.0, busy_before=1.02, busy_after=0.9, cuda=True
    )
    assert "1.43×, is larger than the read-back model's 1.02×" in larger
    same = prose.sync_gain_evidence(0.82, 1.02, busy_before=0.6, busy_after=0.58, cuda=True)
    assert "no larger than the read-back model's" in same and "keeps the device no busier" in same
    busier = prose.sync_gain_evidence(0.95, 1.02, busy_before=0.5, busy_after=0.7, cuda=True)
    assert "the device is busier without syncs" in busier
    with pytest.raises(ValueError, match="busy_before and busy_after"):
        prose.sync_gain_evidence(1.0, 1.0, cuda=True)


def test_gain_cutoff_sentence():
    steps, pred = [0.1, 1.0, 10.0], [1.2, 1.02, 1.002]
    rising = prose.gain_cutoff_sentence(steps, [0.82, 1.43, 1.01], pred, cut=1.05, model_cut_ms=0.4)
    assert (
        "for every step longer than 0.4 ms" in rising and "(at the measured sizes it predicts 1.002–1.200×)" in rising
    )
    assert rising.startswith("The read-back model gives") and "drain" not in rising  # t_sync: nothing queued
    assert "under 1.05× at step times of 0.1 ms (0.82×), 10 ms (1.01×), and above it at 1 ms (1.43×)" in rising
    assert "does not fall steadily" in rising and "sets it against host time / device time" in rising
    assert "because" not in rising  # no cause asserted: the sweep's summary shows the evidence
    falling = prose.gain_cutoff_sentence(steps, [1.4, 1.1, 1.01], pred, cut=1.05, model_cut_ms=0.4)
    assert falling.endswith("it falls with the step time, as the model's does.")
    # every size under the cut, but the gain rises with the step time: not "falls, as the model's does"
    all_under = prose.gain_cutoff_sentence(steps[:2], [0.67, 0.99], pred[:2], cut=1.05, model_cut_ms=0.4)
    assert "does not fall steadily" in all_under and "as the model's does." not in all_under
    never = prose.gain_cutoff_sentence(steps, [1.4, 1.3, 1.2], pred, cut=1.05, model_cut_ms=0.4)
    assert "stayed at 1.05× or more at every size (1.20× at the least)" in never
    cpu = prose.gain_cutoff_sentence(steps, [0.82, 1.43, 1.01], pred, cut=1.05, model_cut_ms=0.4, cuda=False)
    assert "*CPU run:*" in cpu and "host time / device time" not in cpu
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.gain_cutoff_sentence([], [], [], cut=1.05, model_cut_ms=1.0)
    # with the spreads: a size counts as over (under) the cut only when its whole range is
    spread = prose.gain_cutoff_sentence(
        steps, [0.82, 1.43, 1.07], pred, cut=1.05, model_cut_ms=0.4, lo=[0.74, 1.3, 0.99], hi=[0.86, 1.5, 1.08]
    )
    assert "under 1.05× at step times of 0.1 ms (0.82×, 0.74–0.86), above it at 1 ms (1.43×, 1.30–1.50)" in spread
    assert ", and within the spread of 1.05× at 10 ms (1.07×, 0.99–1.08)" in spread
    with pytest.raises(ValueError, match="both lo and hi"):
        prose.gain_cutoff_sentence(steps, [1.0] * 3, pred, cut=1.05, model_cut_ms=0.4, lo=[1.0] * 3)


def test_predicted_gain_phrase_calls_only_a_gain_a_speedup():
    # 7fed682's H100 run of NB01: the launch model predicted 885 against 905 µs per step, "a 0.98× speedup"
    assert prose.predicted_gain_phrase(885.04 / 905.19, "the sync-free step") == (
        "a predicted **0.98×** (the sync-free step slightly slower)"
    )
    assert prose.predicted_gain_phrase(0.5, "x") == "a predicted **0.50×** (x slower)"
    assert prose.predicted_gain_phrase(1.42, "x") == "a **1.42× speedup**"
    assert prose.predicted_gain_phrase(1.004, "x") == "**1.00×**: no predicted difference"
    with pytest.raises(ValueError, match="> 0"):
        prose.predicted_gain_phrase(0.0, "x")


def test_launch_model_check():
    kw = dict(pred_after_us=800.0, launch_us=8.0, step_us=5200.0, ops_before=78, ops_after=100,
              kernels_before=114, kernels_after=110.25, n_sync=7, sync_us=16.0)  # fmt: skip
    dev = prose.launch_model_check(host_us=4000.0, device_us=5000.0, cuda=True, **kw)
    assert "114 device launches (kernels and copies) of the syncing loop and 110.2 of the sync-free one" in dev
    # the model with the launch counts: (114·8 + 7·16) / (110.25·8) = 1024 / 882 = 1.16; op counts: 736 / 800 = 0.92
    assert "the model predicts 1024 µs against 882 µs per step, 1.16× (the op counts give 0.92×)" in dev
    assert "against 78 and 100 ops counted" in dev and "800 µs of launches" in dev
    assert "host needs 4000 µs to issue one (40.0 µs per op against t_launch = 8.00 µs)" in dev
    assert "busy 5000 µs of the 5200 µs step: device-bound (host/device 0.8)" in dev
    assert "premise of a launch-bound step does not hold" in dev
    host = prose.launch_model_check(host_us=6000.0, device_us=1000.0, cuda=True, **kw)
    assert "host-bound (host/device 6), as the model assumed, at 7.5× its cost per op" in host
    near = prose.launch_model_check(host_us=5400.0, device_us=5000.0, cuda=True, **kw)
    assert "near balance (host/device 1.08: the device's time is within a factor of two" in near
    assert "as the model assumed" not in near
    cpu = prose.launch_model_check(host_us=900.0, device_us=float("nan"), cuda=False, **kw)
    assert "on this CPU" in cpu and "9.0 µs per op on average (900 µs per sync-free step over 100 ops)" in cpu
    assert "device" not in cpu and "launch counts" not in cpu
    # 7fed682's H100 run of NB01 profiled 4 steps: 456 and 441 launches, "110.2" a step read as a count
    steps = prose.launch_model_check(host_us=4000.0, device_us=5000.0, cuda=True, profiled_steps=4, **kw)
    assert (
        "the profiler counts 456 device launches (kernels and copies) in 4 steps of the syncing loop (114 a step)"
        in steps
    )
    assert "and 441 in 4 steps of the sync-free one (110.25 a step), against 78 and 100 ops counted per step" in steps
    assert "110.2 " not in steps and "1.16× (the op counts give 0.92×)" in steps
    with pytest.raises(ValueError, match="kernels_after must be > 0"):
        prose.launch_model_check(host_us=1.0, device_us=1.0, cuda=True, **{**kw, "kernels_after": 0})
    with pytest.raises(ValueError, match="launch_us and ops_after must be > 0"):
        prose.launch_model_check(host_us=1.0, device_us=1.0, cuda=False, **{**kw, "launch_us": 0.0})


def test_host_device_sentence():
    text = prose.host_device_sentence(["a", "b", "c"], [4.5, 4.6, 4.9], [0.2, 1.0, 18.0], [1.04, 1.09, 1.01])
    assert (
        "host needs 4.5 ms to issue a step at a, where the device is busy 0.2 ms (host/device 22.5: host-bound)" in text
    )
    assert "4.9 ms to issue a step at c, where the device is busy 18 ms (host/device 0.272: device-bound)" in text
    assert "at b" not in text and text.endswith("took 1.01–1.09× the larger of the two.")
    one = prose.host_device_sentence(["a"], [1.0], [2.0], [1.0])
    assert ", and" not in one and "device-bound" in one and one.endswith("took 1.00× the larger of the two.")
    short = prose.host_device_sentence(["a", "b"], [5.75, 4.6], [0.2, 1.0], [0.82, 1.03])
    assert "took 0.82–1.03× the larger of the two. A step shorter than the larger of the two cannot be: at a " in short
    assert "at a, b" not in short and "overstates what issuing costs in the timed loop" in short
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.host_device_sentence(["a"], [1.0, 2.0], [1.0], [1.0])


def test_overlap_bound_clause():
    under = prose.overlap_bound_clause(["a", "b"], [1.1, 1.4], [1.0, 1.3], [1.2, 1.5], [1.25, 2.0])
    assert under == "2 of the 2 measured gains lie at or under their overlap bound, 70–88% of it."
    over = prose.overlap_bound_clause(["a", "b"], [1.3, 1.4], [1.28, 1.3], [1.4, 1.5], [1.25, 2.0])
    assert "1 of the 2 measured gains lie at or under their overlap bound, 70% of it;" in over  # b only, not a
    assert "above it: a (1.30× against 1.25×, spread 1.28–1.40, all of it above)." in over
    noisy = prose.overlap_bound_clause(["a"], [1.3], [1.1], [1.4], [1.25])
    assert "a (1.30× against 1.25×, spread 1.10–1.40)." in noisy
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.overlap_bound_clause(["a"], [], [], [], [])


def test_slowdown_sentence():
    kw = dict(gain=0.9, lo=0.78, hi=0.96, step_before_ms=4.2, step_after_ms=4.67, ops_before=78, ops_after=90,
              n_sync=7, sync_us=10.0)  # fmt: skip
    host = prose.slowdown_sentence("batch 64", host_ms=4.5, device_ms=0.2, **kw)
    assert "At batch 64 removing the syncs slowed the loop: 0.90× (20–80% spread 0.78–0.96), 470 µs more" in host
    assert "host-bound there (host/device 22.5: the host needs 4.5 ms to issue it, the device 0.2 ms to run it)" in host
    assert "runs 12 more ops (90 against 78 per step); at the average 50.0 µs of host time per op" in host
    assert "they cost 600 µs, while the syncs it removes cost 7 × 10.0 µs = 70 µs of read-back" in host
    assert host.endswith("+530 µs net, 113% of the +470 µs measured.")  # within the spread's largest loss, 1185 µs
    tight = prose.slowdown_sentence("batch 64", host_ms=4.5, device_ms=0.2, **(kw | dict(lo=0.89)))
    assert tight.endswith(
        "113% of the +470 µs measured: more than even the spread's slowest runs lost, so the extra "
        "ops alone do not account for it."
    )  # largest loss 4200 x (1/0.89 - 1) = 519 µs < 530
    device = prose.slowdown_sentence("x", host_ms=1.0, device_ms=4.0, **kw)
    assert "device-bound there (host/device 0.25)" in device and "do not explain the slowdown" in device
    fewer = prose.slowdown_sentence("x", host_ms=4.5, device_ms=0.2, **(kw | dict(ops_after=70)))
    assert "runs no more ops (70 against 78 per step): the op count does not explain it" in fewer
    # the H100 run of notebook 01 (b34185d): 0.97x with a spread of 0.80-1.11 is no measured slowdown
    noise = prose.slowdown_sentence("batch 64", host_ms=4.5, device_ms=0.2, **(kw | dict(gain=0.97, lo=0.80, hi=1.11)))
    assert "0.80–1.11, holds 1: that is no measured change" in noise and "host-bound" not in noise
    with pytest.raises(ValueError, match="gain < 1"):
        prose.slowdown_sentence("x", host_ms=1.0, device_ms=1.0, **(kw | dict(gain=1.1)))


def test_skip_step_summary_says_what_each_way_did():
    key = "weights after the NaN batch"
    rows = [
        {"step": "if", "syncs": 1, key: "unchanged"},
        {"step": "select + put back", "syncs": 0, key: "unchanged"},
        {"step": "select", "syncs": 0, key: "changed"},
        {"step": "multiply", "syncs": 0, key: "NaN"},
    ]
    text = prose.skip_step_summary(rows)
    assert "`if` 1 sync(s), weights unchanged" in text
    assert "Skipped without a sync and without a trace: `select + put back`." in text
    assert "momentum still moved them" in text and "`nan * 0` is `nan`" in text
    only_if = prose.skip_step_summary(rows[:1])
    assert "none of them" in only_if and "momentum" not in only_if and "nan * 0" not in only_if
    with pytest.raises(ValueError, match="no rows"):
        prose.skip_step_summary([])


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


def test_window_mask_note():
    gpu = prose.window_mask_note(["efficient", "math"])
    assert gpu.startswith("SDPA's flash backend takes no `attn_mask` at all: through SDPA it gets only `is_causal`")
    assert "local (sliding-window) mode" in gpu and "SDPA does not expose it" in gpu
    cpu = prose.window_mask_note(["flash", "math"])
    assert cpu.startswith("Here `flash` ran the mask: on a CPU") and "The CUDA flash backend does not" in cpu


def test_manual_oom_note():
    assert "**T=4096** (predicted: 2048)" in prose.manual_oom_note(4096, 2048)
    assert "(predicted: no OOM in this sweep)" in prose.manual_oom_note(4096, None)
    assert "never ran out of memory in this sweep (predicted first OOM: None)" in prose.manual_oom_note(None, None)


def test_decode_gain_note_splits_the_gain_into_kernel_and_host_time():
    # H100-like: manual 247 us timed, 6 kernels busy 60 us; SDPA 87 us timed, 2 kernels busy 50 us
    host = prose.decode_gain_note(247.0, 87.0, 60.0, 50.0, 6, 2, cuda=True)
    assert "manual path runs 6 kernels per call for 60.0 µs" in host and "SDPA 2 for 50.0 µs" in host
    assert "manual 187.0 µs, SDPA 37.0 µs" in host  # timed less kernels
    assert "Of the 160.0 µs SDPA saves per call, 10.0 µs is kernel time and 150.0 µs host time" in host
    assert "the larger part, 94%, is the host's (6 kernel launches" in host
    kernels = prose.decode_gain_note(200.0, 50.0, 180.0, 40.0, 6, 2, cuda=True)
    assert "140.0 µs is kernel time and 10.0 µs host time: the larger part, 93%, is in the kernels." in kernels
    only_host = prose.decode_gain_note(200.0, 50.0, 30.0, 40.0, 6, 2, cuda=True)
    assert "all of the gain is the host's" in only_host and "SDPA's kernels are not faster" in only_host
    only_kernels = prose.decode_gain_note(100.0, 50.0, 90.0, 20.0, 6, 2, cuda=True)
    assert "all of the gain is in the kernels" in only_kernels
    none = prose.decode_gain_note(50.0, 60.0, 30.0, 40.0, 6, 2, cuda=True)
    assert none.endswith("SDPA saves nothing here: it takes 10.0 µs longer per call.")
    cpu = prose.decode_gain_note(300.0, 100.0, 250.0, 80.0, 7, 1, cuda=False)
    assert cpu.startswith("*CPU run:*") and "kernel time" not in cpu and "7 top-level operators spent 250.0 µs" in cpu
    with pytest.raises(ValueError, match="must be > 0"):
        prose.decode_gain_note(0.0, 50.0, 1.0, 1.0, 6, 2, cuda=True)


def test_gqa_note_compares_with_the_call_without_gqa():
    def row(b, gqa, mha, gpk, mpk, spread=0.01):
        return dict(
            backend=b,
            gqa_ms=gqa,
            gqa_p20=gqa - spread,
            gqa_p80=gqa + spread,
            mha_ms=mha,
            mha_p20=mha - spread,
            mha_p80=mha + spread,
            gqa_peak_mib=gpk,
            mha_peak_mib=mpk,
        )

    rows = [
        row("flash", 0.896, 0.899, 65.0, 65.0),
        row("cudnn", 0.49, 0.52, 64.0, 64.0),
        row("efficient", 1.83, 1.72, 192.0, 64.0),
        row("math", 28.8, 28.9, 9856.25, 9792.25, spread=0.2),
    ]
    text = prose.gqa_note(rows, repeat_mib=128.0, kv_saved_ms=0.0335)
    assert "flash 0.997×, cudnn 0.94×, efficient 1.06×, math 0.997×" in text  # 3 decimals near 1
    assert (
        "faster beyond both 20–80% spreads: cudnn; slower beyond both spreads: efficient; within them: flash, math"
        in text
    )
    assert "worth 0.0335 ms at the copy bandwidth, 6.8% of the fastest GQA call" in text
    assert "flash +0 MiB, cudnn +0 MiB, efficient +128 MiB, math +64 MiB" in text
    assert "as a call through `repeat_kv` does: efficient." in text
    assert text.endswith("no full copy of k and v was made: flash, cudnn.")  # math: its own model
    cpu = prose.gqa_note([row("flash", 1.0, 1.0, float("nan"), None)], repeat_mib=1.0, kv_saved_ms=0.01)
    assert cpu.endswith("which backends copy k and v is not shown.") and "Peak memory" not in cpu
    with pytest.raises(ValueError, match="no rows"):
        prose.gqa_note([], repeat_mib=1.0, kv_saved_ms=1.0)


# --- 03 ------------------------------------------------------------------------------------------------


def test_above_copy_note_uses_the_plain_stream():
    fracs = {"rmsnorm_fwd": 0.88, "swiglu_fwd": 1.01}
    rpw = {"rmsnorm_fwd": 1.0, "swiglu_fwd": 2.0}
    assert prose.above_copy_note({"rmsnorm_fwd": 0.88}, rpw, 1.02, cuda=True) == ""
    gpu = prose.above_copy_note(fracs, rpw, 1.02, cuda=True)
    assert "Above 1: swiglu_fwd at 1.01 (reads 2× the bytes it writes)" in gpu and "rmsnorm_fwd" not in gpu
    assert "ran at 1.02 of it" in gpu and "not a ceiling for a read-heavy mix" in gpu
    assert "does not explain these fractions" in prose.above_copy_note(fracs, rpw, 0.97, cuda=True)
    cpu = prose.above_copy_note(fracs, rpw, 10.9, cuda=False)
    assert cpu.startswith("*CPU run:* above 1") and "it is the size, not the kernel" in cpu
    assert "the caches alone do not explain" in prose.above_copy_note(fracs, rpw, 0.5, cuda=False)


# --- 04 ------------------------------------------------------------------------------------------------


def _summary(cuda, launches, busy, wall):
    from types import SimpleNamespace

    return SimpleNamespace(cuda=cuda, launches=launches, busy_ms=busy, wall_ms=wall)


def test_compile_evidence_splits_the_time_saved():
    # the benchmark's saving (1.1 ms), not the profiler's wall-time drop (2.0 - 0.9), is what gets split
    gpu = prose.compile_evidence(0.8, _summary(True, 74, 0.9, 5.0), _summary(True, 12, 0.6, 0.9), 1.1)
    assert (
        "`default` measured 0.80× the predicted gain" in gpu
        and "74 device events (kernels, copies and memsets) eager and 12 compiled" in gpu
    )
    assert "Of the 1.1 ms per call that the benchmark's medians save, the profiler puts 0.3 ms in kernel time" in gpu
    assert "the other 0.8 ms is the host's" in gpu and gpu.endswith(".") and "4.1 ms" not in gpu
    cpu = prose.compile_evidence(1.0, _summary(False, 74, 0.45, 0.79), _summary(False, 2, 0.32, 0.4), 0.3)
    assert "counts 74 operators eager" in cpu and "*CPU run:" in cpu  # review 04-8: events, not "launches"
    all_device = prose.compile_evidence(1.0, _summary(True, 74, 0.9, 2.0), _summary(True, 12, 0.4, 0.9), 0.3)
    assert "drops by 0.5 ms, all of that saving or more" in all_device and "host's" not in all_device
    slower = prose.compile_evidence(0.5, _summary(True, 10, 1.0, 1.0), _summary(True, 5, 1.0, 0.5), -0.1)
    assert slower.endswith("In the benchmark the compiled call was not faster.")
    with pytest.raises(ValueError, match="saved_ms"):
        prose.compile_evidence(1.0, _summary(True, 1, 1.0, 1.0), _summary(True, 1, 1.0, 1.0), float("nan"))


def test_train_vs_inference():
    apart = dict(train_range=(900, 1100), infer_range=(4000, 6000))
    train = prose.train_vs_inference(1.5, 1000, 1.2, 5000, **apart)
    assert (
        "the training step gained more per call and paid its compile time back sooner (1,000 steps against "
        "5,000 calls)" in train
    )
    assert "Training is the better case" in train
    infer = prose.train_vs_inference(1.2, 48000, 1.9, 19000, train_range=(40000, 60000), infer_range=(15000, 25000))
    assert "the inference forward gained more per call and paid" in infer and "Per call, inference" in infer
    mixed = prose.train_vs_inference(1.5, 9000, 1.2, 5000, train_range=(8000, 10000), infer_range=(4000, 6000))
    assert "the training step gained more per call, but the inference forward paid" in mixed
    # 1,157 against 1,154 with overlapping spreads: neither is sooner
    tie = prose.train_vs_inference(2.44, 1157.2, 3.13, 1154.0, train_range=(1100, 1200), infer_range=(1120, 1190))
    assert "after 1,157 steps against 1,154 calls; the timings' 20–80% spreads allow" in tie
    assert "1,100–1,200 and 1,120–1,190, which overlap: neither paid back measurably sooner" in tie
    # fewer calls but within the spreads, and no spreads at all: both stated, no "sooner"
    assert "back sooner" not in prose.train_vs_inference(
        1.5, 1000, 1.2, 1200, train_range=(900, 1300), infer_range=(1100, 1400)
    )
    bare = prose.train_vs_inference(1.5, 1000, 1.2, 5000)
    assert "sooner" not in bare and "overlap" not in bare and "after 1,000 steps against 5,000 calls." in bare
    never = prose.train_vs_inference(
        1.5, 1000, 0.9, math.inf, train_range=(900, 1100), infer_range=(math.inf, math.inf)
    )
    assert (
        "the training step gained more per call and paid its compile time back sooner (1,000 steps against "
        "never)" in never
    )


def test_group_change_sentence_names_one_sided_groups():
    before, after = (
        {"matmuls": 250.0, "attention": 0.0, "casts": 0.0, "other": 382.0},
        {"matmuls": 22.7, "attention": 6.2, "casts": 0.0, "other": 68.3},
    )
    text = prose.group_change_sentence(before, after, ["matmuls", "attention", "casts"], ("fp32", "bf16"))
    assert text == "matmuls 250 → 22.7 ms (×11), attention only in bf16: 6.2 ms, other 382 → 68.3 ms (×5.59)"
    assert "x only in fp32: 3 ms" in prose.group_change_sentence({"x": 3.0}, {}, ["x"], ("fp32", "bf16"))


def test_bytes_bound_note():
    ops32, ops16 = {"gla_bwd": 200.0, "add": 50.0, "mul": 10.0}, {"gla_bwd": 26.3, "add": 25.0, "mul": 12.0}
    above = prose.bytes_bound_note(5.59, 2, ops32, ops16)
    assert "×5.59, more than the ≤ 2×" in above and "at least one operator in it gained more" in above
    assert above.endswith("Its largest drops: `gla_bwd` 200 → 26.3 ms, `add` 50 → 25 ms.")  # mul grew: not a drop
    within = prose.bytes_bound_note(1.8, 2, ops32, ops16)
    assert within == "The operators in other changed by ×1.80, within the ≤ 2× that fewer bytes give memory-bound work."
    with pytest.raises(ValueError, match="positive"):
        prose.bytes_bound_note(float("nan"), 2, ops32, ops16)


def test_not_faster_note():
    sizes, ratios = [1024, 2048, 4096, 8192, 16384], [1.06, 1.32, 0.962, 0.995, 2.01]
    assert prose.not_faster_note(sizes, ratios, "bf16", "tokens") == (
        "bf16 was not faster at 4,096 and 8,192 tokens (0.96×, 0.99×)."
    )
    assert prose.not_faster_note([64, 128, 256], [0.9, 1.1, 0.8], "bf16", "tokens").startswith(
        "bf16 was not faster at 64 and 256 tokens"
    )
    assert (
        prose.not_faster_note([1, 2, 3], [0.5, 0.6, 0.7], "x", "u")
        == "x was not faster at 1, 2 and 3 u (0.50×, 0.60×, 0.70×)."
    )
    assert prose.not_faster_note([1, 2], [1.1, 1.5], "bf16", "tokens") == "bf16 was faster at every size."
    with pytest.raises(ValueError, match="as many sizes"):
        prose.not_faster_note([1, 2], [1.0], "bf16", "tokens")


def test_not_faster_note_reads_the_spread():
    # Review 06-4: a 1.02x median whose spread holds 1 is no measured gain, so not "faster at every size".
    sizes, ratios = [1024, 16384], [1.02, 2.53]
    ranges = [(0.85, 1.2), (2.3, 2.7)]
    assert prose.not_faster_note(sizes, ratios, "bf16", "tokens", ranges) == (
        "bf16 was faster at every size by the median, but at 1,024 tokens (1.02×, spread 0.85–1.20×) the ratio's "
        "spread holds 1: no measured gain there."
    )
    assert prose.not_faster_note(
        [1, 2, 3], [0.9, 1.1, 2.0], "bf16", "tokens", [(0.8, 0.95), (0.9, 1.3), (1.8, 2.2)]
    ) == (
        "bf16 was not faster at 1 tokens (0.90×); at 2 tokens (1.10×, spread 0.90–1.30×) the ratio's spread holds 1: "
        "no measured gain there."
    )
    assert prose.not_faster_note([1, 2], [1.1, 1.5], "bf16", "tokens", [(1.05, 1.2), (1.4, 1.6)]) == (
        "bf16 was faster at every size, beyond the spread of every ratio."
    )
    import pandas as pd  # notebook 06 passes its table's columns

    assert prose.not_faster_note(
        pd.Series([1, 2]), pd.Series([1.1, 1.5]), "x", "u", pd.Series([(1.05, 1.2), (1.4, 1.6)])
    )
    with pytest.raises(ValueError, match="as many sizes"):
        prose.not_faster_note([1, 2], [1.1, 1.5], "bf16", "tokens", [(1.0, 1.2)])


def test_reorder_print_summary():
    rows = [
        {"print": "print(h.shape)", "reorderable": False, "graphs": 2, "graph breaks": 1},
        {"print": "print(h.shape)", "reorderable": True, "graphs": 2, "graph breaks": 1},
        {"print": "print(h.norm())", "reorderable": False, "graphs": 3, "graph breaks": 2},
        {"print": "print(h.norm())", "reorderable": True, "graphs": 1, "graph breaks": 0},
    ]
    text = prose.reorder_print_summary(rows)
    assert text.startswith("`print(h.shape)`: 2 graph(s) and 1 break(s); registered as reorderable, 2 graph(s)")
    assert "the break stays" in text and "`print(h.norm())`: 3 graph(s) and 2 break(s)" in text
    assert "replays it after the graph, so it no longer splits the function." in text
    with pytest.raises(ValueError, match="no rows"):
        prose.reorder_print_summary([])
    # Dynamo itself failing (seen with torch 2.11 on CUDA) is said, not hidden
    failed = rows[:3] + [
        {
            "print": "print(h.norm())",
            "reorderable": True,
            "graphs": None,
            "graph breaks": None,
            "why": "Dynamo failed: AssertionError",
        }
    ]
    text = prose.reorder_print_summary(failed)
    assert "`print(h.norm())`: Dynamo could not trace the function registered as reorderable " in text
    assert "(Dynamo failed: AssertionError)" in text and text.startswith("`print(h.shape)`: 2 graph(s)")


def test_launch_count_note_splits_the_profilers_counts():
    import pandas as pd

    from mahia.lessons.profiler_summary import ProfileSummary

    def prof(calls_by_name, device="cuda"):
        top = pd.DataFrame([{"name": n, "calls": c, "ms": 0.01} for n, c in calls_by_name.items()])
        return ProfileSummary(device, 3, 1.0, 0.5, float(top["calls"].sum()), top.assign(share=0.1))

    # 7fed682's H100 run of NB04: 68 ops traced eager and 9 generated kernels + 12 library calls compiled,
    # where the profiler counted 71 and 27 events per call (the split by name below is made up for the test).
    eager = prof({"void at::native::elementwise_kernel<...>": 66, "Memset (Device)": 2, "cudnn_sdpa_fprop": 3})
    compiled = prof(
        {
            "triton_poi_fused_add_0": 5,
            "triton_red_fused_mean_1": 4,
            "Memcpy DtoD (Device -> Device)": 1,
            "nvjet_tst_128x64": 10,
            "cudnn_sdpa_fprop": 3,
            "gla_fwd_kernel": 4,
        }  # fmt: skip
    )
    text = prose.launch_count_note(68, 9, 12, eager, compiled)
    assert "Eager: 71 events (2 of them copies and memsets) for 68 traced ops." in text
    assert (
        "Compiled: 27 events for the code's 21 launches: 9 Inductor kernels (`triton_...`) for its 9 generated" in text
    )
    assert "ones, and 18 other events (1 of them copies and memsets) for its 12 library calls." in text
    assert prose.launch_count_note(68, 9, 12, prof({"aten::mm": 3}, "cpu"), prof({"aten::mm": 3}, "cpu")) == ""


def test_per_tensor_reads_counts_the_tensors_with_gradients():
    # 7fed682's H100 run of NB05: the default (foreach) AdamW read 256 step counts, for 134 parameter tensors of
    # which 128 had gradients: each step count read twice (bias corrections 1 and 2).
    text = prose.per_tensor_reads("aten._local_scalar_dense ×256", 256, 128, 134)
    assert text == (
        "aten._local_scalar_dense ×256, 2 per updated tensor (128 of the model's 134 parameter tensors have a gradient)"
    )
    assert (
        prose.per_tensor_reads("x ×100", 100, 128, 134)
        == "x ×100 (128 of the model's 134 parameter tensors have a gradient)"
    )
    with pytest.raises(ValueError, match="with_grad <= tensors"):
        prose.per_tensor_reads("x", 1, 200, 134)


def test_specialization_verdict():
    assert "Specialization bought 1.19–1.79× per call" in prose.specialization_verdict(1.19, 1.79)
    assert "bought nothing measurable" in prose.specialization_verdict(0.8, 0.95)
    assert prose.specialization_verdict(0.9, 1.2).startswith("Mixed")
    host = prose.specialization_evidence(512, 1.0, 1.8, 0.32, 0.35)
    assert "kernels at 0.32 ms and the dynamic one's at 0.35 ms, against 1 and 1.8 ms per call" in host
    assert "hold 0.03 of the 0.8 ms difference, so most of it is host work per call" in host
    assert "mostly device work" in prose.specialization_evidence(512, 1.0, 1.8, 0.32, 1.0)
    assert "was not slower in the benchmark there; nor were its kernels (0.938×" in prose.specialization_evidence(
        512, 1.0, 0.9, 0.32, 0.3
    )


def test_specialization_verdict_on_host_dominated_calls_uses_kernel_times():
    # 7fed682's H100 run of NB04 c41: T = 512 benchmarked 1.61 ms static, 1.15 ms dynamic, with 0.318 and
    # 0.324 ms of kernels; the benchmark's 0.71-1.67x range over the lengths was host noise.
    rows = [
        {"static ms": 0.995, "dynamic ms": 1.66, "static kernel ms": 0.17, "dynamic kernel ms": 0.172},
        {"static ms": 1.07, "dynamic ms": 1.17, "static kernel ms": 0.245, "dynamic kernel ms": 0.25},
        {"static ms": 1.61, "dynamic ms": 1.15, "static kernel ms": 0.318, "dynamic kernel ms": 0.324},
    ]
    text = prose.specialization_verdict(0.71, 1.67, rows)
    assert not text.startswith("Mixed") and "host noise" in text
    assert "benchmarked time is 3.5–9.7× its kernels' time" in text and "0.71–1.67× range is host noise" in text
    assert (
        "kernels took 1.012–1.020× the static ones': the static kernels were faster at every length, by 1.2–2.0%"
        in text
    )
    faster = [{**r, "dynamic kernel ms": r["static kernel ms"] * 0.99} for r in rows]
    assert "bought no device time" in prose.specialization_verdict(0.71, 1.67, faster)
    mixed = [rows[0], faster[1], rows[2]]
    assert "faster at some lengths and slower at others" in prose.specialization_verdict(0.71, 1.67, mixed)
    # calls near their kernel time: the benchmark's ratios decide, as without rows
    device = [{**r, "static ms": r["static kernel ms"] * 1.2} for r in rows]
    assert prose.specialization_verdict(0.9, 1.2, device).startswith("Mixed")
    with pytest.raises(ValueError, match="missing"):
        prose.specialization_verdict(0.9, 1.2, [{"static ms": 1.0}])
    with pytest.raises(ValueError, match="> 0"):
        prose.specialization_verdict(0.9, 1.2, [{**rows[0], "static kernel ms": 0.0}])
    # the gap <= 0 branch reports the kernels' difference too (the dynamic kernels 2% slower there)
    evidence = prose.specialization_evidence(512, 1.61, 1.15, 0.318, 0.324)
    assert "not slower in the benchmark there; its kernels took 0.006 ms more (1.019×)" in evidence


# --- 05 ------------------------------------------------------------------------------------------------


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


def test_mib_amount():
    # notebook 06 (7fed682, H100) printed "0.0 MiB in bool, 0.0 MiB in int32" for amounts that were not zero
    assert prose.mib_amount(1536 * 2**20) == "1,536 MiB" and prose.mib_amount(13241.3 * 2**20) == "13,241 MiB"
    # notebook 07 (7fed682, H100), exercise 2: "528.00 MiB" and "527.01 MiB", with decimals no measurement has
    assert prose.mib_amount(527.01 * 2**20) == "527 MiB" and prose.mib_amount(9.4 * 2**20) == "9.4 MiB"
    assert prose.mib_amount(0.53 * 2**20) == "0.53 MiB"
    assert prose.mib_amount(3 * 1024) == "<0.1 MiB" and prose.mib_amount(1) == "<0.1 MiB"
    assert prose.mib_amount(0) == "0 MiB"
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="n_bytes"):
            prose.mib_amount(bad)


def test_matmul_time_check():
    # notebook 06 (7fed682, H100): 14.4 TFLOP at 51.65 TFLOP/s is 279 ms, the step 615 ms, so the Amdahl estimate
    # took 336 ms for the rest; the profiler put the matmuls themselves at 336 ms and the rest at 286 ms
    text = prose.matmul_time_check(278.820583, 335.786143, 16.68489 + 269.512982, 614.695129 - 278.820583, "device")
    assert text.startswith("The profiler puts the fp32 matmuls at 336 ms of device time, above the 279 ms their FLOPs")
    assert "(they ran at 0.83 of it)" in text
    assert "everything else at 286 ms, where the Amdahl estimate took 336 ms" in text
    within = prose.matmul_time_check(300.0, 280.0, 10.0, 0.0, "host")
    assert "280 ms of host time, below the 300 ms" in within and "ran at" not in within
    with pytest.raises(ValueError, match="profiled_ms"):
        prose.matmul_time_check(279.0, 0.0, 1.0, 1.0, "device")
    with pytest.raises(ValueError, match="rest_ms"):
        prose.matmul_time_check(279.0, 336.0, -1.0, 1.0, "device")


def test_tail_loss_list_and_unscaled_fp16_note():
    # notebook 06 (7fed682, H100) printed "fp16, no scaler nan" among the mean losses, with no reason
    nan_run = [5.0, 4.8, 4.7] + [math.nan] * 17
    curves = {"fp16, no scaler": nan_run, "fp32": [4.3] * 18 + [4.2305, 4.2305]}
    text = prose.tail_loss_list(curves, 2)
    assert text == "fp16, no scaler diverged (NaN from step 4 on), fp32 4.2305"
    flicker = prose.tail_loss_list({"x": [1.0, math.inf, 1.0]}, 1)
    assert flicker == "x not finite at 1 steps, from step 2"
    with pytest.raises(ValueError, match="n_tail"):
        prose.tail_loss_list(curves, 0)
    note = prose.unscaled_fp16_note(nan_run, True, 65504.0)
    assert note.startswith("Without a loss scaler the fp16 loss became NaN at step 4.")
    assert "they do not make a loss NaN" in note and "past 65,504" in note and "was not measured here" in note
    assert "The fp16 run with a GradScaler stayed finite: a GradScaler finds an inf or NaN" in note
    assert "did not stay finite either" in prose.unscaled_fp16_note(nan_run, False, 65504.0)
    assert prose.unscaled_fp16_note(nan_run, None, 65504.0).endswith("the losses after it follow. ")
    assert "became inf at step 1" in prose.unscaled_fp16_note([math.inf], None, 65504.0)
    assert prose.unscaled_fp16_note([4.0, 3.9], True, 65504.0) == ""


def test_loss_log_softmax_note():
    # notebook 06 (7fed682, H100): "the log-softmax of the loss 1 in bfloat16" next to "autocast alone would have
    # given float32 for a softmax", with no reason given: F.cross_entropy passes the dtype explicitly
    cuda = prose.loss_log_softmax_note({"bfloat16": 1}, {"float32": 1}, "float32")
    assert cuda.startswith("The loss's log-softmax ran 1 in bfloat16, although autocast gives float32")
    assert "with its input's dtype given explicitly" in cuda and "ran 1 in float32: it reads a float32 copy" in cuda
    cpu = prose.loss_log_softmax_note({"float32": 1}, {"float32": 1}, "bfloat16")  # CPU autocast: a float32 loss
    assert "ran 1 in float32: on this device autocast casts the loss's input to float32" in cpu
    same = prose.loss_log_softmax_note({"bfloat16": 1}, {"bfloat16": 1}, "bfloat16")
    assert "as autocast runs a softmax here (bfloat16)" in same
    assert prose.loss_log_softmax_note({}, {}, "float32") == "The loss ran no log-softmax here."


# --- 07 ------------------------------------------------------------------------------------------------


def test_recompute_cost_note():
    # notebook 07 (7fed682, H100): selective added 30.5 ms (161.5 -> 192.0 ms) with the device busy 99% of both
    # steps (190 ms of kernels against about 160): its Python policy hides behind device work
    busy = prose.recompute_cost_note(30.5, 30.0, 0.99, 0.99, "selective checkpointing", "its Python policy")
    assert "99% of the benchmarked step without checkpointing and 99% with selective checkpointing" in busy
    assert "device-bound, so the host's work (its Python policy) overlaps device work" in busy
    assert "the added time is kernel time (30 ms more of kernels for 30.5 ms more per step)" in busy
    host = prose.recompute_cost_note(30.5, 10.0, 0.6, 0.5, "selective checkpointing", "its Python policy")
    assert (
        "where it waits on the host, the host's work (its Python policy) adds wall time" in host
        and "(20.5 of the 30.5 ms)" in host
    )
    # b34185d (H100): selective added 63.2 ms, 33.1 of them not kernel time, while keep_attention, whose policy
    # PyTorch calls the same way, added 39.1 ms for about as much kernel time: the policy's calls are not the cause
    peer = prose.recompute_cost_note(
        63.2, 30.1, 0.99, 0.85, "selective checkpointing", "its Python policy", peer=("keep_attention", 39.1, 39.0)
    )
    assert "33.1 of the 63.2 ms added per step are not kernel time" in peer
    assert "keep_attention does the same kind of host work (its Python policy) and shows no such excess" in peer
    assert "adds wall time" not in peer and "does not isolate the cause" in peer
    same = prose.recompute_cost_note(30.5, 10.0, 0.6, 0.5, "selective", "its Python policy", peer=("k", 30.0, 10.0))
    assert "the host's work (its Python policy) adds wall time" in same
    covered = prose.recompute_cost_note(10.0, 12.0, 0.6, 0.5, "full checkpointing", "the recompute's launches")
    assert "covers the added wall time (10 ms)" in covered
    with pytest.raises(ValueError, match="busy_after"):
        prose.recompute_cost_note(1.0, 1.0, 0.9, math.nan, "x", "y")


def test_growth_crossover_note():
    # notebook 07 (7fed682, H100): the memory model's activations (236.9 MiB per 1,024-token sequence) put the
    # crossover at 4,356 tokens, yet the sweep saved 48% of all training memory at 4,096 tokens; the step's peak
    # grew by 396.6 MiB per sequence (section 5), which puts it near 2,600
    mib = 2**20
    fixed = (251.9 + 251.9 + 503.8) * mib  # weights, gradients, AdamW state
    tokens = [1024, 4096, 16384, 32768]
    peaks = [900 * mib + 396.640686 * mib * t / 1024 for t in tokens]
    text = prose.growth_crossover_note(tokens, peaks, fixed, 236.875 * mib / 1024)
    assert "grew by 397 MiB per 1,024 tokens (the memory model's activations 237 MiB, which would put it at " in text
    assert "4,356 tokens)" in text and "(1,008 MiB) above about **2,601 tokens per step**" in text
    assert "saves less than half of all training memory there" in text
    flat = prose.growth_crossover_note([1024, 2048], [5 * mib, 5 * mib], fixed, 236.875 * mib / 1024)
    assert flat.startswith("The step's peak did not grow with the tokens") and "4,356 tokens" in flat
    with pytest.raises(ValueError, match="at least 2"):
        prose.growth_crossover_note([1024], [1.0], fixed, 1.0)


def test_extra_work_time_note():
    # notebook 07 (7fed682, H100), exercise 2: recomputing attention on top of selective measured "-22.0% time
    # (248 -> 193 ms)" against a selective step retimed at 248 ms, while section 4 timed selective at 192 ms
    # (p20-p80 191.9-199); the exercise's own spreads were not printed, so those here are narrow stand-ins
    sec4 = (191.988647, 191.9, 199.0)
    text = prose.extra_work_time_note(
        (193.0, 192.5, 194.0),
        {"section 4's selective step": sec4, "the selective step timed again here": (248.0, 247.0, 249.0)},
    )
    assert text.startswith(
        "193 ms (p20–p80 192.5–194) against section 4's selective step, 192 ms (191.9–199), and the "
    )
    assert "the reference's timings disagree with each other (their spreads are apart)" in text
    assert "**no measurable difference**" in text and "its spread overlaps that of section 4's selective step" in text
    assert "22% faster than the selective step timed again here while doing more work: timing noise, not a gain" in text
    slower = prose.extra_work_time_note((210.0, 208.0, 212.0), {"selective": sec4})
    assert slower.endswith(": +9% time against selective, the spreads apart.")
    mixed = prose.extra_work_time_note((210.0, 208.0, 212.0), {"a": sec4, "b": (209.0, 205.0, 215.0)})
    assert "+9% time against a, the spreads apart; no measurable difference otherwise (its spread overlaps" in mixed
    with pytest.raises(ValueError, match="p20 <= median"):
        prose.extra_work_time_note((1.0, 2.0, 3.0), {"x": sec4})
    with pytest.raises(ValueError, match="no reference"):
        prose.extra_work_time_note(sec4, {})


# --- 08 ------------------------------------------------------------------------------------------------


def test_disturbed_ceiling_note():
    assert prose.disturbed_ceiling_note(10.0, 20.0) == ""
    assert "(1.5×)" in prose.disturbed_ceiling_note(30.0, 20.0)


def test_aux_tradeoff_sentence_claims_a_trade_off_only_when_the_loss_rises():
    # the H100 run: the strongest coefficient fitted better, the middle one worse: no trade-off is claimed
    text = prose.aux_tradeoff_sentence([0.0, 0.01, 0.1], [0.56, 0.10, 0.01], [3.1e-4, 1.8e-3, 2.9e-4], steps=100)
    assert "coef 0, cv 0.56 and task loss 0.00031; coef 0.01, cv 0.10 and task loss 0.0018" in text
    assert "the balancing term spreads the load" in text and "trades" not in text
    assert "does not rise with the coefficient (at coef 0.1 it ends at 0.94× the run with coef 0" in text
    assert "the highest, 0.0018, is at coef 0.01" in text and "one seed over 100 steps, is a noisy" in text
    assert "noisy" not in prose.aux_tradeoff_sentence([0, 1], [0.5, 0.1], [2.0, 1.0], steps=5, seeds=3)
    rising = prose.aux_tradeoff_sentence([0.0, 0.1], [0.5, 0.6], [1.0, 1.5], steps=10)
    assert "rises with it, to 1.50× the run with coef 0 at coef 0.1" in rising and "trades the balance" in rising
    assert "does not fall steadily with the coefficient (lowest, 0.50, at coef 0)" in rising
    with pytest.raises(ValueError, match="at least 2"):
        prose.aux_tradeoff_sentence([0.0], [0.5], [1.0], steps=1)


def test_sync_free_loop_note():
    kw = dict(syncs=64, ops_free=780, ops_loop=724, cap_rows=640, rows=512)
    slower = prose.sync_free_loop_note(24.8, 21.3, cuda=True, **kw)
    assert "not faster: 24.8 ms against 21.3 ms (780 ops against 724, and 640 rows" in slower
    assert "cannot price the syncs alone" in slower and "not what" not in slower
    faster = prose.sync_free_loop_note(15.0, 21.4, cuda=True, **kw)
    assert "6.4 ms per forward, 100 µs per sync removed" in faster and "at least that much" in faster
    # a sync-free loop with fewer ops is not the loop minus its syncs: no bound either way
    kw_less = dict(kw, ops_free=600)
    assert "more than the syncs, so this is not" in prose.sync_free_loop_note(15.0, 21.4, cuda=True, **kw_less)
    assert "does not price the syncs" in prose.sync_free_loop_note(24.8, 21.3, cuda=True, **kw_less)
    assert "*CPU run:*" in prose.sync_free_loop_note(2.0, 1.0, cuda=False, **kw)
    with pytest.raises(ValueError, match="> 0"):
        prose.sync_free_loop_note(0.0, 1.0, cuda=True, **kw)


def test_fixed_rate_model_note_says_where_and_why_the_measurement_parts():
    rows, measured, model = [8192, 4096, 1024, 256], [1.89, 2.72, 13.9, 33.9], [7.87, 7.96, 8.51, 20.9]
    text = prose.fixed_rate_model_note(
        rows, measured, model, [409, 382, 90, 60], rate_at=92.2, rows_at=512, peak=721.2, target=2
    )
    assert "below the fixed-rate model at 8192, 4096 rows per expert" in text
    assert "up to 409 TFLOP/s (0.57 of the ceiling, at 8192 rows), against the 92.2 TFLOP/s" in text
    assert "overstates the loop's time" in text and "It is above the model at 1024, 256 rows" in text
    assert "under 2× at 8192 rows (1.89×)." in text and "does not explain" not in text
    flat = prose.fixed_rate_model_note(
        [64, 32], [1.5, 3.0], [4.0, 3.0], [50, 60], rate_at=92, rows_at=32, peak=700, target=2
    )
    assert "At 64 rows one expert's rate was not above the model's" in flat and "overstates" not in flat
    assert "under 2× at 64 rows (1.50×)" in flat and "It is above" not in flat
    same = prose.fixed_rate_model_note([8], [3.0], [3.0], [1.0], rate_at=1, rows_at=8, peak=2, target=2)
    assert "equals the model" in same and "stayed at 2× or more" in same
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.fixed_rate_model_note([1], [1, 2], [1], [1], rate_at=1, rows_at=1, peak=1, target=2)


def test_fixed_rate_model_note_counts_a_gap_within_the_spreads_as_equal():
    # NB08 (7fed682), exercise 2: at 512 rows (the model's calibration point) 13.64× measured against 13.95×
    # modelled, with loop 20.27–20.81 ms and grouped 1.362–1.742 ms: a gain range that holds the model's gain
    rows, measured, model = [8192, 4096, 512, 256], [1.61, 2.54, 13.64, 32.21], [3.93, 4.03, 13.95, 24.90]
    spreads = [(1.55, 1.66), (2.45, 2.6), prose.gain_range(20.27, 20.81, 1.362, 1.742), (31.0, 33.0)]
    kw = dict(rate_at=197, rows_at=512, peak=757.4, target=2)
    text = prose.fixed_rate_model_note(rows, measured, model, [408, 380, 197, 83], spreads=spreads, **kw)
    assert "below the fixed-rate model beyond the measured gain's 20–80% range at 8192, 4096 rows" in text
    assert "At 512 rows the model's gain lies inside the measured gain's 20–80% range" in text
    assert "512 rows is where the model takes its rate from" in text and "does not explain" not in text
    assert "above the model beyond the measured gain's 20–80% range at 256 rows" in text
    inside = prose.fixed_rate_model_note([512], [13.64], [13.95], [197], spreads=[spreads[2]], **kw)
    assert "inside the measured gain's 20–80% range at every swept size" in inside
    with pytest.raises(ValueError, match="around its measured gain"):
        prose.fixed_rate_model_note([512], [13.64], [13.95], [197], spreads=[(1.0, 2.0)], **kw)


# --- 09 ------------------------------------------------------------------------------------------------


def test_first_failure_phrase():
    assert prose.first_failure_phrase(1024, 4096) == "from T = 1024 on"
    assert prose.first_failure_phrase(None, 4096) == "nowhere up to T = 4096"


def test_uncounted_sync_clause():
    assert prose.uncounted_sync_clause(1) == ""
    assert prose.uncounted_sync_clause(0) == ", invisible to the counter on a CPU"


def test_faster_or_slower():
    assert prose.faster_or_slower(2.5) == "2.5× faster"
    assert prose.faster_or_slower(17.3 / 84.2) == "4.87× slower"
    assert prose.faster_or_slower(1.0) == "as fast"
    with pytest.raises(ValueError, match="> 0"):
        prose.faster_or_slower(0.0)


def test_shortfall_source_splits_host_and_device():
    host = prose.shortfall_source("the branch path", 7.26, 3.23, 0.748, 0.08)
    assert "The branch path took 2.25× its prediction" in host and "device busy 8% of the profiled wall time" in host
    assert "does not explain the 4.03 ms the model misses; the device waits on the host" in host
    device = prose.shortfall_source("x", 10.0, 4.0, 7.0, 0.9)
    assert "up to 3 ms is device time" in device and "the rest, 3 ms, the host's" in device
    assert "misses" not in prose.shortfall_source("x", 3.0, 4.0, 1.0, 0.3)
    assert "*CPU run:*" in prose.shortfall_source("x", 2.0, 1.0, None, None)
    with pytest.raises(ValueError, match="> 0"):
        prose.shortfall_source("x", 1.0, 0.0, 1.0, 0.5)


def test_flat_time_verdict():
    grew = prose.flat_time_verdict("The masked path", [0.60, 0.80, 1.20], [0.55, 0.75, 1.1], [0.65, 0.85, 1.3])
    assert (
        "did not stay flat" in grew and "0.6–1.2 ms over the sweep (0.6 ms at the first point, 1.2 at the last)" in grew
    )
    assert "2.00× from its fastest" in grew
    flat = prose.flat_time_verdict("The masked path", [1.0, 1.05], [0.9, 0.95], [1.1, 1.2])
    assert flat.startswith("The masked path stayed flat, as expected") and "overlap" in flat
    with pytest.raises(ValueError, match="same, non-zero length"):
        prose.flat_time_verdict("x", [1.0], [], [1.0])


def test_cached_buffers_note():
    assert prose.cached_buffers_note([0.43, 0.87]) == ""
    assert "(Above 1, at 1.20: the buffers stayed in a cache" in prose.cached_buffers_note([0.6, 1.2])


def _host_row(**kw):
    row = dict(path="The loop", ops=1000, syncs=0)
    row.update({"host instance": "T=32", "host ops": 1000, "host µs/op": 24.0, "t_launch µs": 10.0})
    row.update({"measured ms": 30.0, "p20 ms": 28.0, "p80 ms": 33.0, "predicted ms": 10.0, "refined ms": 24.0})
    row = {**row, **kw}
    # the instance's whole host time: its ops at the cost per op (no syncs), unless a test gives it
    return {"host ms": row["host µs/op"] * row["host ops"] / 1e3, **row}


def test_host_cost_sentences_decompose_the_miss():
    say = lambda cuda=True, queue=None, **kw: prose.host_cost_sentences([_host_row(**kw)], cuda=cuda, queue=queue)
    short = say()
    assert short.startswith("The loop: the host took 24 µs per op to issue it (2.40× t_launch = 10 µs).")
    assert "predicts 24 ms, against 30 ms measured and 10 ms with t_launch (the measurement is 3.00× that)" in short
    assert "it still misses. The measured host cost moves the prediction by +14 ms, 70% of the 20 ms miss" in short
    assert "and leaves 6 ms (1.25× the refined model) that is not host time per op" in short
    inside = say(**{"refined ms": 29.0})
    assert "inside the measurement's 20–80% spread (28–33 ms): per-op host cost is the miss." in inside
    over = say(queue=1000, **{"refined ms": 40.0, "host ops": 50})
    assert "measured on T=32 (50 ops; the full call's 1,000 would overfill the launch queue of about 1,000" in over
    assert "it overshoots, 1.33× the measurement" in over and "need not carry over" in over
    assert "it syncs 64× per call, so its host time holds the waits" in say(syncs=64)
    # the host alone would take longer than the whole call (40 µs x 1,000 ops = 40 ms > p80 33 ms): no prediction
    inflated = say(**{"host µs/op": 40.0, "refined ms": 40.0})
    assert "no prediction: at that cost the host alone would need 40 ms for the call's ops" in inflated
    assert "(30 ms, 20–80% 28–33 ms)" in inflated and "overshoots" not in inflated
    assert prose.host_cost_overstated(_host_row(**{"host µs/op": 40.0, "refined ms": 40.0}), cuda=True)
    assert not prose.host_cost_overstated(_host_row(**{"host µs/op": 34.0, "refined ms": 34.0}), cuda=True)
    assert not prose.host_cost_overstated(_host_row(**{"host µs/op": 40.0, "refined ms": 40.0}), cuda=False)
    assert "no prediction" not in say(cuda=False, **{"host µs/op": 40.0, "refined ms": 40.0})  # CPU: host is all
    # above the spread (28–33 ms) by less than its width (5 ms): as close as the timing resolves
    close = say(**{"host µs/op": 34.0, "refined ms": 34.0})
    assert "just above the measurement's 20–80% spread (28–33 ms), by less than its width: 1.13×" in close
    assert "no prediction" not in close and "overshoots" not in close
    faster = say(**{"predicted ms": 40.0, "refined ms": 20.0})
    assert "moves the prediction by -20 ms and leaves" in faster  # no share of a miss the other way
    two = prose.host_cost_sentences([_host_row(syncs=64), _host_row(path="the other")], cuda=False)
    assert "The other: the host took" in two and "syncs 64×" not in two  # a CPU sync waits for nothing
    assert two.count("*CPU run:*") == 1 and two.endswith("the model's compute at the measured ceilings is larger.")
    # the H100 run of notebook 09 (b34185d): the momentum loop's host, issued alone with its 72 syncs, took 2.23 ms
    # for a call that takes 1.67 ms (p80 1.74) back to back; its per-op cost alone (15.89 µs x 96) would not show it
    momentum = _host_row(ops=96, syncs=72, **{"host ops": 96, "host µs/op": 15.89, "host ms": 2.23})
    momentum.update({"measured ms": 1.67, "p20 ms": 1.60, "p80 ms": 1.74, "predicted ms": 0.9, "refined ms": 2.23})
    assert prose.host_cost_overstated(momentum, cuda=True)
    # the fabric's masked+plan path: 0.874 ms predicted, inside a wide 0.822-2.05 ms spread, half the 1.71 ms median
    wide = _host_row(**{"measured ms": 1.71, "p20 ms": 0.822, "p80 ms": 2.05, "predicted ms": 0.5, "refined ms": 0.874})
    assert not prose.host_model_lands(wide) and prose.host_model_lands(_host_row(**{"refined ms": 29.0}))
    wide_text = prose.host_cost_sentences([wide], cuda=True)
    assert "only because that spread is wide (72% of the median): the median is 1.96× the refined model" in wide_text
    with pytest.raises(ValueError, match="p20 <= measured <= p80"):
        say(**{"p20 ms": 31.0})
    with pytest.raises(ValueError, match="no rows"):
        prose.host_cost_sentences([], cuda=True)


def test_model_miss_summary_names_the_side_the_model_misses():
    rows = [
        dict(component="GLA", before_ms=845.0, before_pred_ms=326.0, after_ms=2.89, after_pred_ms=0.098),
        dict(component="memory", before_ms=4.0, before_pred_ms=1.0, after_ms=1.0, after_pred_ms=0.5),
    ]
    text = prose.model_miss_summary(rows)
    assert not text.endswith(" ")
    assert "before / after path: GLA 2.59× / 29.49×, memory 4.00× / 2.00×." in text
    assert "too high for GLA: relative to its prediction, the after path ran slower than the before" in text
    assert "too low for memory: relative to its prediction, the before path ran slower than the after" in text
    even = prose.model_miss_summary([dict(component="x", before_ms=2, before_pred_ms=1, after_ms=2, after_pred_ms=1)])
    assert "same factor" in even and "too high" not in even
    with pytest.raises(ValueError, match="no rows"):
        prose.model_miss_summary([])


def test_model_miss_summary_uses_the_measured_gain_range():
    # fabric on the H100: 9.73x predicted; measured 6.60 / 0.683 ms with spreads 5.03–8.28 and 0.633–1.24 ms
    fab = dict(component="fabric", before_ms=6.60, before_pred_ms=3.10, after_ms=0.683, after_pred_ms=0.3185)
    fab.update(before_p20=5.03, before_p80=8.28, after_p20=0.633, after_p80=1.24)
    text = prose.model_miss_summary([fab])
    assert "too high" not in text and "too low" not in text and "same factor" not in text
    assert "within the measured gain's range" in text and "fabric (predicted 9.73×, measured 4.06–13.1×)" in text
    # a predicted gain above the range's top, and one below its bottom
    tight = dict(component="mom", before_ms=2.51, before_pred_ms=2.1, after_ms=0.506, after_pred_ms=0.167)
    tight.update(before_p20=2.46, before_p80=2.56, after_p20=0.505, after_p80=0.507)
    slow = dict(tight, component="slow", before_pred_ms=0.5)
    text = prose.model_miss_summary([tight, slow])
    assert "too high for mom (predicted 12.6×, measured 4.85–5.07×)" in text
    assert "too low for slow (predicted 2.99×" in text and "within" not in text


def test_spreads_overlap():
    assert prose.spreads_overlap((1.0, 0.9, 1.1), (1.2, 1.1, 1.3))  # touching ends count
    assert prose.spreads_overlap((1.2, 1.1, 1.3), (1.0, 0.9, 1.1))  # either order
    assert prose.spreads_overlap((1.0, 0.5, 2.0), (1.1, 1.05, 1.15))  # one inside the other
    assert not prose.spreads_overlap((1.0, 0.9, 1.1), (1.3, 1.2, 1.4))
    assert not prose.spreads_overlap((1.3, 1.2, 1.4), (1.0, 0.9, 1.1))


def test_retimed_note():
    one = prose.retimed_note("batched at N = 64", (1.09, 1.07, 1.13), [(0.70, 0.68, 0.73)], "above", "timed again")
    assert one.startswith("batched at N = 64 timed again: 0.7 ms, 20–80% spread 0.68–0.73 ms, against 1.09 ms")
    assert "no spread overlaps it" in one and "(0.64× between the medians)" in one
    same = prose.retimed_note("x", (1.0, 0.9, 1.1), [(1.05, 1.0, 1.2)], "a", "b")
    assert same.endswith("the spreads overlap: the timings agree.")
    # the fabric's masked path: table 0.683 (0.633–1.24), sweep 1.10–1.17 with tight spreads: all overlap the wide one
    sweep = [(1.14, 1.12, 1.16), (1.10, 1.09, 1.12), (1.17, 1.15, 1.19)]
    assert "every spread overlaps it" in prose.retimed_note("m", (0.683, 0.633, 1.24), sweep, "a", "b")
    later = [(0.69, 0.68, 0.71), (1.1, 1.0, 1.2), (1.2, 1.1, 1.3)]
    some = prose.retimed_note("m", (0.683, 0.633, 0.70), later, "a", "b")
    assert "1 of 3 spreads overlap it; the medians' median is 1.61× it." in some
    with pytest.raises(ValueError, match="median"):
        prose.retimed_note("x", (1.0, 1.1, 1.2), [(1.0, 0.9, 1.1)], "a", "b")
    with pytest.raises(ValueError, match="no later"):
        prose.retimed_note("x", (1.0, 0.9, 1.1), [], "a", "b")


def test_retimed_note_calls_overlapping_but_wide_spreads_noisy():
    # NB09 (7fed682): the batched memory path at N = 64, 0.779 ms (0.682–0.833) in the table and 1.04 ms
    # (0.652–1.15) in the sweep: the spreads overlap, but the sweep's median is outside the table's spread
    batched = prose.retimed_note(
        "The batched path at N = 64", (0.779, 0.682, 0.833), [(1.04, 0.652, 1.15)], "in the table above", "in the sweep"
    )
    assert (
        "timings agree" not in batched
        and "the spreads overlap, but a median lies outside the other's spread" in batched
    )
    assert (
        "(1.34× between the medians; spread widths 48% of the median in the sweep, 19% in the table above)" in batched
    )
    assert batched.endswith("the timings are noisy, not in agreement.")
    # NB10: the bf16 step, 87.4 ms (86.8–122) in the ladder, 88.2 ms (73.8–100) in the sweep: each median inside
    bf16 = prose.retimed_note("The bf16 step", (87.4, 86.8, 122.0), [(88.2, 73.8, 100.0)], "in the ladder", "here")
    assert bf16.endswith("the medians are 0.9% apart: the timings agree within 3%.")
    near = prose.retimed_note("m", (1.0, 0.95, 1.3), [(1.1, 0.97, 1.4)], "a", "b")  # 10% apart, each inside
    assert near.endswith("the spreads overlap: the timings agree.")
    # NB09 on the H100 (b34185d): the foreach update 0.507 ms (tight) and again 0.504 ms: no overlap, 0.6% apart
    tight = prose.retimed_note("The foreach update", (0.507, 0.505, 0.508), [(0.504, 0.503, 0.5045)], "above", "here")
    assert tight.endswith(
        "the medians are 0.6% apart: the timings agree within 3%, though their narrow spreads do not overlap."
    )
    wide = prose.retimed_note("m", (0.683, 0.633, 1.24), [(1.14, 1.12, 1.16), (1.10, 1.09, 1.12)], "a", "b")
    assert "every spread overlaps it, but a median lies outside" in wide and "89% of the median a, 3%–4% b" in wide


def test_gain_range():
    assert prose.gain_range(2.0, 4.0, 0.5, 1.0) == (2.0, 8.0)
    with pytest.raises(ValueError, match="p20 is above"):
        prose.gain_range(4.0, 2.0, 0.5, 1.0)
    with pytest.raises(ValueError, match="> 0"):
        prose.gain_range(0.0, 2.0, 0.5, 1.0)


# --- 10 ------------------------------------------------------------------------------------------------


def test_same_tokens_phrase():
    assert prose.same_tokens_phrase(True) == "with exactly the same tokens"
    assert prose.same_tokens_phrase(False) == "with tokens that differ only at near-ties"


def test_pct_never_rounds_a_small_share_to_zero():
    assert prose.pct(0.004) == "0.4%" and prose.pct(0.0004) == "<0.1%" and prose.pct(0.0) == "0%"
    assert prose.pct(0.15) == "15%" and prose.pct(1.0) == "100%"
    with pytest.raises(ValueError, match="pct"):
        prose.pct(float("nan"))


def test_plain_numbers_writes_out_positive_exponents_only():
    assert prose.plain_numbers("2.59e+03 ms of wall time") == "2,590 ms of wall time"
    assert prose.plain_numbers("1.596e+05 → 239.4 ms") == "159,600 → 239.4 ms"
    assert prose.plain_numbers("within 0.0e+00 (tolerance 1e-05)") == "within 0 (tolerance 1e-05)"
    assert prose.plain_numbers("spread 910–1.17e+03 ms, 2e+00×") == "spread 910–1,170 ms, 2×"
    assert prose.plain_numbers("-3.5e+02") == "-350"
    assert (
        prose.plain_numbers("overflows past 3.39e+38, and 1.2e+09") == "overflows past 3.39 × 10^38, and 1,200,000,000"
    )
    assert prose.plain_numbers("equal within 0.0e+00. Next") == "equal within 0. Next"  # a sentence's full stop
    # a negative exponent, a version or an identifier is left alone
    for keep in ("error 1.1e-01", "v1.2e+03", "x1e+03y"):
        assert prose.plain_numbers(keep) == keep


def test_slower_rungs_note_names_significant_losses_and_the_best_rung():
    nan = float("nan")
    rung = lambda label, gain, sig, vs: dict(label=label, gain=gain, significant=sig, vs_baseline=vs)
    rows = [rung("baseline", nan, None, 1.0), rung("+ bf16", 2.72, True, 3.09), rung("+ compile", 0.89, True, 2.74)]
    text = prose.slower_rungs_note(rows)
    assert "beyond both spreads: *+ compile* (×0.89)" in text
    assert "the whole stack (2.74× the baseline) is below the best rung, *+ bf16* (3.09×)" in text
    assert "without that rung." in text
    # a loss within the spreads, or a gain, is not named
    assert prose.slower_rungs_note([rows[0], rows[1], rung("+ compile", 0.97, False, 3.0)]) == ""
    assert prose.slower_rungs_note(rows[:2]) == ""
    # a slower rung in the middle that the next rungs outgrow: named, without the total's clause
    mid = [rows[0], rung("+ a", 0.9, True, 0.9), rung("+ b", 3.0, True, 2.7)]
    assert "*+ a* (×0.90)" in prose.slower_rungs_note(mid) and "whole stack" not in prose.slower_rungs_note(mid)
    with pytest.raises(ValueError, match="no rungs"):
        prose.slower_rungs_note([])


def test_bf16_saving_note_compares_the_saving_with_the_kernels_time():
    more = prose.bf16_saving_note(1024, 113.2, 85.0, 0.21)  # 28.2 ms saved, 23.8 ms of kernels
    assert more.startswith("At 1,024 tokens bf16 saved 28.2 ms per step, more than the 23.8 ms of kernels")
    assert "cut host work" in more
    less = prose.bf16_saving_note(16384, 175.0, 78.8, 0.96)
    assert "saved 96.2 of the float32 step's 168 ms of kernels: it shortened the busy share" in less
    assert "saved nothing (90 ms against 80 ms in float32)" in prose.bf16_saving_note(8, 80.0, 90.0, 0.5)
    with pytest.raises(ValueError, match="busy"):
        prose.bf16_saving_note(8, 80.0, 90.0, 1.5)


def test_bf16_saving_note_does_not_credit_the_kernels_with_a_host_bound_saving():
    # NB10 (7fed682), batch 1: float32 106.4 ms at 18% busy (19.5 ms of kernels), bf16 95.8 ms, bf16 unprofiled
    lo = prose.bf16_saving_note(1024, 106.4, 95.8, 0.183)
    assert "shortened the busy share" not in lo
    assert lo.startswith("At 1,024 tokens bf16 saved 10.6 ms of wall time per step, at most the 19.5 ms of kernels")
    assert "shorter kernels could account for it; the bf16 step's kernels were not profiled" in lo
    assert "host-bound there (its kernels 18% of its time)" in lo and "not isolated" in lo
    # batch 16: 97% busy, 210 ms of kernels against a bf16 step of 88.2 ms: its kernels are at least 122 ms shorter
    hi = prose.bf16_saving_note(16384, 215.8, 88.2, 0.973)
    assert "it shortened the busy share (the bf16 step's kernels fit in its 88.2 ms, at least 122 ms less)" in hi
    assert "host-bound" not in hi
    # with the bf16 step profiled
    both = prose.bf16_saving_note(16384, 215.8, 88.2, 0.973, fp32_kernel_ms=210.0, bf16_kernel_ms=43.3)
    assert "its kernels took 43.3 ms against 210 ms in float32 (167 ms less), enough to account for the saving" in both
    host = prose.bf16_saving_note(1024, 106.4, 95.8, 0.183, fp32_kernel_ms=19.5, bf16_kernel_ms=12.0)
    assert "(7.5 ms less): it saved more than its kernels did, so the rest is host work" in host
    same = prose.bf16_saving_note(1024, 106.4, 95.8, 0.183, fp32_kernel_ms=19.5, bf16_kernel_ms=19.5)
    assert "they did not get shorter" in same
    small = prose.bf16_saving_note(1024, 106.4, 100.0, 0.183, fp32_kernel_ms=19.5, bf16_kernel_ms=10.0)
    assert "enough to account for the saving. The float32 step is host-bound there" in small
    with pytest.raises(ValueError, match="bf16_kernel_ms"):
        prose.bf16_saving_note(8, 80.0, 70.0, 0.5, bf16_kernel_ms=-1.0)


def test_ladder_miss_cause_follows_each_rungs_busy_share():
    # NB10 (7fed682): every rung "bound by device work" by the model; the profiler found grouped_moe's device busy
    # 213 of its 216 ms, the bf16 step's only 43.3 of its 87.4 ms (predicted 19.7 ms of device work, 15.2 of launches)
    rung = lambda name, ms, pred, work, launch, kern: dict(  # noqa: E731
        rung=name,
        bound="device work",
        measured_ms=ms,
        predicted_ms=pred,
        work_ms=work,
        launch_ms=launch,
        kernel_ms=kern,
    )
    moe = rung("grouped_moe", 215.7, 104.4, 104.4, 13.3, 213.0)
    bf16 = rung("bf16", 87.4, 19.7, 19.7, 15.2, 43.3)
    text = prose.ladder_miss_cause([moe, bf16])
    assert text.startswith("It calls every rung bound by device work. In *grouped_moe* the profiler finds the device")
    assert (
        "running kernels 99% of the measured step" in text and "the kernels took 2× the predicted device work" in text
    )
    assert (
        "In *bf16* the device ran kernels only 50% of the 87.4 ms step: of the 67.7 ms the model misses there, "
        "44.1 ms is the device waiting on the host and 23.6 ms kernels beyond the predicted device work" in text
    )
    assert "prices the host's part as launches (15.2 ms in *bf16*)" in text
    # every rung busy: the device-work conclusion for all of them, nothing about the host
    busy = prose.ladder_miss_cause([moe, dict(moe, rung="triton", measured_ms=217.2, kernel_ms=210.0)])
    assert "In every rung the profiler finds the device running kernels 97%–99%" in busy and "host" not in busy
    # a CPU: no kernel time, no conclusion about where the miss lies
    cpu = prose.ladder_miss_cause([dict(moe, kernel_ms=None)])
    assert "not isolated here" in cpu and "the miss is in the device work" not in cpu
    mixed = prose.ladder_miss_cause([dict(moe, kernel_ms=None, bound="launches"), dict(bf16, kernel_ms=None)])
    assert mixed.startswith(
        "It calls *grouped_moe* bound by launches; *bf16* bound by device work. The model's t_launch"
    )
    with pytest.raises(ValueError, match="no rungs"):
        prose.ladder_miss_cause([])


def test_context_gain_note_says_what_the_profiles_show_and_no_more():
    # NB10 (7fed682): bf16 gains x1.09 alone (242.1 -> 222.7 ms) and x2.47 in the ladder (215.7 -> 87.4 ms, kernels
    # 213 -> 43.3 ms, 2,003 launches, no sync). The run did not profile the bf16-alone step: its kernels are made up.
    ladder = dict(
        step="the grouped_moe step",
        before_ms=215.7,
        after_ms=87.4,
        before_kernel_ms=213.0,
        after_kernel_ms=43.3,
        launches=2003,
        syncs=0,
        changes="`aten::mm` 63.5 → 6.43 ms",
    )
    alone = dict(
        ladder,
        step="the loop-free baseline",
        before_ms=242.1,
        after_ms=222.7,
        before_kernel_ms=230.0,
        after_kernel_ms=70.0,
        launches=3300,
        syncs=33,
        changes="`aten::mm` 84.8 → 8 ms",
    )
    host = prose.context_gain_note("bf16 autocast", alone, ladder)
    assert host.startswith("Alone, on the loop-free baseline, *bf16 autocast* took the step from 242 to 223 ms")
    assert "Alone, 12% of the kernel time it removed came off the step, against 76% in the ladder" in host
    # NB10 on the H100 (b34185d): alone, bf16 made the step slower (241 -> 267 ms) while cutting 112 ms of kernels
    slower = prose.context_gain_note("bf16 autocast", {**alone, "after_ms": 267.0, "after_kernel_ms": 109.0}, ladder)
    assert "Alone, the step got 24.9 ms slower although its kernels took 121 ms less" in slower and "0%" not in slower
    assert "the device ran kernels only 31% of the step" in host and "2,003 kernel launches and 0 syncs" in host
    assert "these profiles do not isolate" in host and "share of the step it removes" not in host
    busy = prose.context_gain_note("bf16", dict(alone, after_ms=210.0, after_kernel_ms=200.0), ladder)
    assert "stays bound by its kernels (busy 95% after it)" in busy and "30 of 242 ms alone, 170 of 216 ms" in busy
    same = prose.context_gain_note("bf16", dict(alone, launches=1000, syncs=0), ladder)
    assert "It issues no fewer launches or syncs" in same
    longer = prose.context_gain_note("bf16", dict(alone, after_kernel_ms=240.0), ladder)
    assert "did not get shorter in both contexts (-10 and 170 ms less), so these profiles do not isolate" in longer
    cpu = prose.context_gain_note("bf16", dict(alone, before_kernel_ms=None), dict(ladder, before_kernel_ms=None))
    assert cpu.startswith("*CPU run:*") and "not isolated here" in cpu
    with pytest.raises(ValueError, match="missing"):
        prose.context_gain_note("bf16", {"step": "x"}, ladder)


def test_memory_loop_error_note_says_why_the_loop_is_exempt():
    # NB09 (7fed682): the bf16 loop against float64, out0 3.28e-03 and gradients up to 4.42e-02, tolerance 2e-02
    errors = dict(out0=3.28e-03, grad0=4.20e-02, grad3=4.42e-02, grad6=7.52e-03)
    text = prose.memory_loop_error_note(errors, 2e-02, dtype="bfloat16", nodes=64, steps=4)
    assert text.startswith("The loop's own error, 4.4e-02, is above bfloat16's tolerance (2e-02); it is shown, not")
    assert "in its gradients (up to 4.4e-02; the output's is 3.3e-03)" in text
    assert "each of the 64 node rows reads the whole state" in text and "accumulates in float32" in text
    fwd = prose.memory_loop_error_note(dict(out0=5e-02, grad0=1e-02), 2e-02, dtype="bfloat16", nodes=8, steps=4)
    assert "The error is in its output (5.0e-02" in fwd
    ok = prose.memory_loop_error_note(dict(out0=1e-07, grad0=3e-07), 1e-05, dtype="float32", nodes=8, steps=4)
    assert ok == "The loop itself is within float32's tolerance as well (3.0e-07, tolerance 1e-05)."
    with pytest.raises(ValueError, match="no output error"):
        prose.memory_loop_error_note(dict(grad0=1.0), 1e-05, dtype="float32", nodes=8, steps=4)


def test_measured_launch_crossover_uses_the_host_time_of_the_smallest_batch():
    # notebook 10's H100 sweep (b34185d): batch 1 106.7 ms with 28.1 ms of kernels, batch 16 212 ms of kernels
    text = prose.measured_launch_crossover(1, 106.7, 28.1, 16, 212.0, model_batch=2.1)
    assert "batch 7.4" in text and "device busy 26%" in text and "3.5×" in text
    busy = prose.measured_launch_crossover(1, 30.0, 28.0, 16, 212.0, model_batch=2.1)
    assert "below batch 1" in busy
    never = prose.measured_launch_crossover(1, 300.0, 28.0, 16, 212.0, model_batch=2.1)
    assert "above batch 16" in never
    with pytest.raises(ValueError, match="measured_launch_crossover"):
        prose.measured_launch_crossover(16, 100.0, 28.0, 1, 212.0, model_batch=2.1)


def test_gain_over_bound_note_flags_a_prediction_above_one_over_busy():
    # notebook 05's H100 sweep (b34185d): 67.36x and 6.49x predicted against bounds of 17.82x and 2.59x
    text = prose.gain_over_bound_note(
        ["16 tokens", "16384 tokens"], [67.36, 6.49], [17.82, 2.59], [0.335, 3.4], [0.706, 8.61]
    )
    assert "at 16 tokens and 16384 tokens" in text and "0.335 and 3.4 ms" in text and "0.706 and 8.61 ms" in text
    one = prose.gain_over_bound_note(
        ["16 tokens", "16384 tokens"], [12.0, 6.49], [17.82, 2.59], [0.335, 3.4], [0.706, 8.61]
    )
    assert "at 16384 tokens," in one and "16 tokens and" not in one
    assert (
        prose.gain_over_bound_note(["a", "b"], [2.0, 1.5], [17.8, 2.6], [1, 1], [1, 1])
        == " Within the 1 / busy bound at every size."
    )
    with pytest.raises(ValueError, match="gain_over_bound_note"):
        prose.gain_over_bound_note(["a"], [2.0], [0.0], [1], [1])


def test_pick_margin_note():
    """07's H100 run picked keep_attention at 200.2 ms (200.1–208.7) over full at 201.7 ms: a tie, said as one."""
    tie = prose.pick_margin_note(
        "keep_attention", {"keep_attention": (200.2, 200.1, 208.7), "full": (201.7, 199.0, 203.0)}
    )
    assert "does not show keep_attention to be the faster" in tie and "full 201.7 ms" in tie
    apart = prose.pick_margin_note("a", {"a": (10, 9, 11), "b": (20, 19, 21)})
    assert "it is the faster beyond the noise" in apart and "not" not in apart
    assert "only candidate" in prose.pick_margin_note("a", {"a": (10, 9, 11)})
    with pytest.raises(ValueError, match="not among"):
        prose.pick_margin_note("c", {"a": (10, 9, 11)})
    with pytest.raises(ValueError, match="p20"):
        prose.pick_margin_note("a", {"a": (10, 11, 12)})


def test_out_of_proportion_note():
    """07's H100 sweep (b34185d): full checkpointing took 176.7 ms for 1 sequence and 136.4 ms for 32, so its
    +169% at 1,024 tokens was not the recompute's price."""
    tokens = [1024, 4096, 16384, 32768]
    text = prose.out_of_proportion_note(
        tokens, {"none": [65.8, 105.4, 85.7, 84.9], "full": [176.7, 127.2, 144.7, 136.4]}
    )
    assert text.startswith("Up to 16,384 tokens per step the steps are not in proportion")
    assert "the full step took 144.7 ms at 16,384 tokens, no less than 136.4 ms at 32,768" in text
    # 08's top-k sweep (b34185d, H100): the loop took 15.5, 11.6, 27.1, 15.1 ms for top-1, 2, 4, 8 of 8,192 tokens
    loop = prose.out_of_proportion_note(
        [8192, 16384, 32768, 65536],
        {"loop": [15.5, 11.6, 27.1, 15.1]},
        unit="assignments",
        price="the gain's trend over top-k is not the work's",
    )
    assert loop.startswith("Up to 32,768 assignments per step") and "27.1 ms at 32,768 assignments, no less" in loop
    assert loop.endswith("so the gain's trend over top-k is not the work's.")
    # The H200 reference of b0bf60d: full checkpointing 163.7 ms at 16,384 tokens and 165.0 at 32,768 (twice the
    # tokens, +0.8%) was not flagged, and "+43% at 32,768 tokens" read as the recompute's price
    h200 = prose.out_of_proportion_note(
        [1024, 4096, 16384, 32768], {"none": [109.3, 95.0, 86.4, 115.5], "full": [150.0, 155.0, 163.7, 165.0]}
    )
    assert h200.startswith("Up to 32,768 tokens per step the steps are not in proportion")
    assert "the full step took 165 ms at 32,768 tokens, 0.8% more than 163.7 ms at 16,384 (2× the tokens)" in h200
    fine = prose.out_of_proportion_note(tokens, {"none": [1, 2, 4, 8], "full": [2, 3, 5, 9]})
    assert fine.startswith("Every policy's step took longer")
    with pytest.raises(ValueError, match="increase"):
        prose.out_of_proportion_note([2, 1], {"a": [1, 2]})
    with pytest.raises(ValueError, match="times for"):
        prose.out_of_proportion_note([1, 2], {"a": [1]})


def test_model_miss_summary_says_when_a_retiming_flips_the_verdict():
    """09's H100 run (b34185d): the momentum update's 3.75× predicted was 'too high' against 3.19–3.44× measured,
    while the sweep timed the same work again at 2.37 / 0.507 ms, a gain of 4.70×, above the prediction."""
    mom = dict(component="momentum update", before_ms=1.67, before_pred_ms=1.875, after_ms=0.504, after_pred_ms=0.5)
    mom.update(before_p20=1.62, before_p80=1.74, after_p20=0.503, after_p80=0.508)
    assert "too high for momentum update" in prose.model_miss_summary([mom])
    text = prose.model_miss_summary([dict(mom, again_before=(2.37, 2.33, 2.41), again_after=(0.507, 0.506, 0.508))])
    assert "too high" not in text and "too low" not in text
    assert "Which way it misses depends on the timing for momentum update (predicted 3.75×, measured 3.19–3.46×" in text
    assert "4.59–4.76× when the same work was timed again)" in text
    same = prose.model_miss_summary([dict(mom, again_before=(1.68, 1.62, 1.74), again_after=(0.504, 0.503, 0.508))])
    assert "too high for momentum update" in same and "depends on the timing" not in same


def test_within_phrase():
    """09's H100 run printed 'the same output within 0' for an exact match."""
    assert prose.within_phrase(0.0) == "bit-identical"
    assert prose.within_phrase(1.234e-7) == "within 1.2e-07"
    with pytest.raises(ValueError, match="finite"):
        prose.within_phrase(math.nan)


def test_gain_hits_note():
    """10's H100 run (b34185d) said 'much of the bias cancels: 5 of 6 rung gains are within 25%', four of them float32
    rungs the model gives ×1 by construction; of the two it predicts away from ×1, one is hit."""
    rows = [
        ("sync-free", 1.00015, 1.00),
        ("sdpa", 1.0, 1.01),
        ("triton", 1.0, 1.06),
        ("grouped", 1.0048, 1.05),
        ("bf16", 5.32, 1.82),
        ("compile", 1.50, 1.69),
    ]
    text = prose.gain_hits_note(rows, 0.25, "one op trace")
    assert text.startswith("Of the 2 rung gains the model predicts away from ×1 (by more than 25%), 1 is within 25%")
    assert "*bf16* predicted ×5.32, measured ×1.82; *compile* predicted ×1.5, measured ×1.69." in text
    assert "The other 4 predicted gains are within 25% of ×1 (one op trace), and 4 of them" in text
    flat = prose.gain_hits_note(rows[:2], 0.25, "x")
    assert flat.startswith("Every predicted gain is within 25% of ×1 (x), and 2 of 2")
    assert prose.gain_hits_note(rows[4:], 0.25, "x").endswith("measured ×1.69.")
    with pytest.raises(ValueError, match="band"):
        prose.gain_hits_note(rows, 0, "x")
    with pytest.raises(ValueError, match="no rung"):
        prose.gain_hits_note([("a", math.nan, 1.0)], 0.25, "x")


def test_retimed_gain_note():
    """10's H100 run (b34185d): the bf16 step took 117 ms (115-119) in the ladder and 92.3 ms (86.8-93) when the sweep
    timed it again, a gain of x2.33 instead of x1.82; the ladder's conclusions about bf16 rest on the first."""
    text = prose.retimed_gain_note("bf16", (117, 115, 119), (92.3, 86.8, 93), 1.82, 2.33, "its gain and its host wait")
    assert text == (
        "With this timing the bf16 rung gains ×2.33, against ×1.82 in the ladder: its gain and its host wait rest on the ladder's "
        "timing, one of two timings of the same step that disagree, and are only as sure as that."
    )
    assert prose.retimed_gain_note("g", (214, 214, 215), (215, 215, 216), 1.05, 1.04, "x") == ""  # within 3%
    assert prose.retimed_gain_note("g", (100, 90, 110), (80, 70, 95), 1.0, 1.2, "x") == ""  # spreads overlap
    with pytest.raises(ValueError, match="p20"):
        prose.retimed_gain_note("g", (100, 110, 120), (80, 70, 95), 1.0, 1.2, "x")


def test_spread_range_never_prints_an_empty_range():
    # 00-8: the H100's bench spread of a 4096 matmul, 2.6376-2.6416 ms, printed "2.64–2.64" at 3 figures
    assert prose.spread_range(2.6376, 2.6416) == "2.638–2.642"
    assert prose.spread_range(2.61, 2.68) == "2.61–2.68"
    assert prose.spread_range(2.64, 2.64) == "2.64"
    assert prose.spread_range(1234.0, 1567.0) == "1,230–1,570"
    with pytest.raises(ValueError, match="sig must be 1 to 6"):
        prose.spread_range(1.0, 2.0, sig=0)


def test_matmul_tiles_clause_says_tile_or_tiles():
    assert "is 44 tiles for 132 SMs" in prose.matmul_tiles_clause(256, "k", (64, 24), 132)
    assert "is 1 tile for 132 SMs" in prose.matmul_tiles_clause(128, "k", (128, 128), 132)


def test_time_drop_note():
    # Review 02/03 #5: SDPA took longer at T=512 than at T=1024, with a wide spread, and no sentence said so.
    sizes, med = [256, 512, 1024, 2048], [0.0147, 0.0603, 0.0516, 0.12]
    lo, hi = [0.0145, 0.0447, 0.051, 0.119], [0.015, 0.0760, 0.0525, 0.121]
    assert prose.time_drop_note(sizes, med, lo, hi, "SDPA", "tokens") == (
        "SDPA took 0.0603 ms at 512 tokens, more than the 0.0516 ms at 1,024 (20–80% spread 0.0447–0.076 ms, 52% of the "
        "median, wide: its calls varied, so the drop is not a cost of the size)."
    )
    narrow = prose.time_drop_note([1, 2], [2.0, 1.5], [1.98, 1.49], [2.02, 1.51], "x", "rows")
    assert narrow.endswith("of the median, narrow: the drop repeated call after call).")
    # The H200 reference of b0bf60d (notebook 05): 19.6 ms at 8,192 tokens against 19.5 ms at 16,384, spreads
    # overlapping, was called a drop that repeated
    close = prose.time_drop_note([8192, 16384], [19.6, 19.5], [19.46, 19.31], [19.73, 19.70], "eager", "tokens")
    assert close.endswith("narrow, but overlapping the larger size's 19.3–19.7 ms: no measured drop).")
    assert prose.time_drop_note([2, 1], [2.0, 1.0], [1.9, 0.9], [2.1, 1.1], "x", "u") == ""  # unsorted, rising
    import pandas as pd  # a notebook passes one group of a table: its index does not start at 0

    g = pd.DataFrame({"T": sizes, "m": med, "lo": lo, "hi": hi}, index=[5, 7, 9, 11])
    assert prose.time_drop_note(g["T"], g["m"], g["lo"], g["hi"], "SDPA", "tokens").startswith("SDPA took 0.0603")
    with pytest.raises(ValueError, match="as many"):
        prose.time_drop_note([1, 2], [1.0], [1.0], [1.0], "x", "u")


def test_autotune_verdict():
    # Review 04-3: max-autotune-no-cudagraphs was slower than default on the H100 and no sentence said so.
    slower = prose.autotune_verdict("max-autotune-no-cudagraphs", "default", 1.27, 1.07, 82.5, 5.6, (0.8, 0.88))
    assert slower == (
        "`max-autotune-no-cudagraphs` 1.27 ms against `default` 1.07 ms, after 82.5 s of compiling against 5.6 s: "
        "1.19× slower, so here autotuning did not pay; the profiler's comparison below shows which kernels it replaced."
    )
    faster = prose.autotune_verdict("max-autotune", "reduce-overhead", 0.2, 0.3, 50.0, 10.0, (1.3, 1.7))
    assert faster.endswith("the autotuned kernels made the call 1.5× faster.")
    tie = prose.autotune_verdict("max-autotune", "reduce-overhead", 0.29, 0.3, 50.0, 10.0, (0.9, 1.1))
    assert tie.endswith("within the spread of each other (0.90–1.10×), so autotuning bought no measured gain.")
    with pytest.raises(ValueError, match="> 0"):
        prose.autotune_verdict("a", "b", 0.0, 1.0, 1.0, 1.0, (1.0, 1.0))
    # The H200 reference of b0bf60d: 0.806 ms against 1.61 ms, but `default`'s kernels take 0.319 ms per call, so
    # the 0.8 ms saved cannot be the autotuned kernels'.
    host = prose.autotune_verdict("max-autotune-no-cudagraphs", "default", 0.806, 1.61, 100.1, 5.7, (1.7, 2.3), 0.319)
    assert "2× faster, but the 0.804 ms saved is more than all of `default`'s kernel time (0.319 ms" in host
    assert "autotuned kernels made" not in host
    kernels = prose.autotune_verdict("max-autotune", "reduce-overhead", 0.2, 0.3, 50.0, 10.0, (1.3, 1.7), 0.25)
    assert kernels.endswith("the autotuned kernels made the call 1.5× faster.")  # 0.1 ms saved of 0.25: can be
    with pytest.raises(ValueError, match="plain_kernel_ms"):
        prose.autotune_verdict("a", "b", 1.0, 1.0, 1.0, 1.0, (1.0, 1.0), -1.0)


def test_absolute_miss_note():
    # Review 04-2: on the H100 eager ran 3.9x and `default` 4.2x its predicted time, so the ratio's 0.92x agreement
    # was two misses cancelling; the text gave no reason.
    miss = prose.absolute_miss_note(2.40, 0.620, 1.07, 0.255, 68, 9.12)
    assert miss.startswith("Eager measured 2.4 ms against 0.62 ms predicted (3.87× the prediction), `default` 1.07 ms")
    assert "Eager took 35.3 µs per traced op against t_launch = 9.12 µs" in miss
    assert "two misses cancelling" in miss
    held = prose.absolute_miss_note(1.0, 0.9, 0.5, 0.45, 68, 9.12)
    assert "prediction that held" in held and "cancelling" not in held
    apart = prose.absolute_miss_note(2.4, 0.6, 1.0, 0.8, 68, 40.0)
    assert "cancelling" not in apart and "per traced op" not in apart
    with pytest.raises(ValueError, match="> 0"):
        prose.absolute_miss_note(0.0, 1.0, 1.0, 1.0, 1, 1.0)


def test_trace_check_note():
    # Review 05-1: 244 traced kernels against 295 profiled events was called a cross-check, and not commented on.
    gap = prose.trace_check_note(244, 295)
    assert gap.startswith("the profiler sees 295 device events on the GPU, 51 more (21% of the trace's count)")
    assert gap.endswith("leaves out")
    assert prose.trace_check_note(290, 295) == "the profiler sees 295 device events on the GPU: the trace's count holds"
    assert "fewer" in prose.trace_check_note(300, 200)
    with pytest.raises(ValueError, match="traced > 0"):
        prose.trace_check_note(0, 3)


def test_tf32_warning_note():
    # Review 04-6, 05-8, 11-8: the TF32 warning of a bf16 run, explained from the traced float32 products.
    from types import SimpleNamespace as NS

    def trace(*products, total):
        return NS(products=list(products), count=sum(p.count for p in products), total=total)

    gate = type("P", (), {"count": 1, "function": "fabric_gates", "__str__": lambda s: "`addmm` (2×64) @ (64×2)"})()
    odd = type("P", (), {"count": 2, "function": "mine", "__str__": lambda s: "`mm` (3×3) @ (3×3) ×2"})()
    gpu = prose.tf32_warning_note({"The hybrid's forward": trace(gate, total=46)}, dtype="bf16", cuda=True)
    assert gpu.startswith("Inductor warns that *TensorFloat32")
    assert "The hybrid's forward computes 1 of its 46 matrix products in float32, `addmm` (2×64) @ (64×2): " in gpu
    assert "the fabric's gates" in gpu and "the other 45 run in bf16." in gpu
    assert "float32 on purpose" in gpu and "CPU run" not in gpu and "fuse_attention" not in gpu
    both = prose.tf32_warning_note(
        {"The dense model's forward": trace(total=13), "The model's forward": trace(odd, total=5)},
        dtype="bf16",
        cuda=False,
    )
    assert "*CPU run: no such warning here; traced on this CPU in bf16" in both
    assert "The dense model's forward computes none of its 13 matrix products in float32: all run in bf16." in both
    assert "`mm` (3×3) @ (3×3) ×2; the other 3 run in bf16. Those products are what the warning points at." in both
    assert "on purpose" not in both and "`fuse_attention`" in both  # an unknown function, and a model with none
    # the products of one function share its reason, said once
    scans = [
        type("P", (), {"count": 2, "function": "_gla_logspace", "__str__": lambda s, m=m: f"`bmm` in {m}"})()
        for m in ("blocks.0.meta", "blocks.1.meta")
    ]
    two = prose.tf32_warning_note({"The model's forward": trace(gate, *scans, total=20)}, dtype="bf16", cuda=True)
    assert "`bmm` in blocks.0.meta, `bmm` in blocks.1.meta: the meta-attention's chunked scan" in two
    assert two.count("chunked scan") == 1 and "blocks.0.meta: " not in two and ": the fabric's gates" in two
    with pytest.raises(ValueError, match="no traces"):
        prose.tf32_warning_note({}, dtype="bf16", cuda=True)
