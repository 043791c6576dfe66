"""Measuring and checking, the ground floor of mahia: it imports nothing else of the package.

timing.py       bench (CUDA events, L2 flush, median and spread; CUDA-graph device time), capture
checks.py       compare against a float64 reference; argument checks shared by every floor
instruments/    dispatch-mode instruments: host-device syncs, ops and launches, live memory
hardware.py     the device report and its measured ceilings (copy, matmul)
cost.py         one cost model: step time from launches, bytes and FLOPs; peak memory from bytes
results.py      result records (CSV): the Recorder
summary.py      reading records; summary.json and the headline goals
report.py       report.md / report.html and the README table
plotting.py     bars with spread, sweeps, rooflines against the measured ceilings
"""
