"""Where a training step's time goes: ``python -m mahia.profile``.

A step is *device-bound* when the GPU runs kernels all the time and *host-bound* when it waits for the host
to launch them (Python, dispatch, launch latency, syncs)::

    device busy = (sum of kernel times of a step) / (wall time of a step)

Near 1, faster kernels pay; well below 1, only fewer launches or less Python pay (compile, CUDA graphs). On a
CPU the table lists operators by host time. With ``modules``, each named module's forward time too::

    print(profile_step(step, batch, modules={"attn": [b.attn for b in model.blocks]}))
    python -m mahia.profile --preset small --batch 16 --seq-len 1024 --amp bf16 --compile default
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mahia.measure.checks import check_int

__all__ = ["StepReport", "profile_step", "module_ranges", "block_parts", "main"]


@dataclass
class StepReport:
    """One step, averaged over the profiled steps. Times in ms; ``kernel_ms`` is None on a CPU."""

    device: str
    wall_ms: float
    kernel_ms: float | None
    kernels: int | None  # kernel launches per step
    top: list[dict] = field(default_factory=list)  # operators by self time: name, calls, ms per step
    modules: dict[str, float] = field(default_factory=dict)  # forward ms per step of each named module

    @property
    def busy(self) -> float | None:
        """Fraction of the wall time the device runs kernels (None on a CPU)."""
        return None if self.kernel_ms is None else self.kernel_ms / self.wall_ms

    def __str__(self) -> str:
        lines = [f"{self.device}: {self.wall_ms:.3f} ms per step"]
        if self.kernel_ms is not None:
            lines[0] += (
                f", kernels {self.kernel_ms:.3f} ms ({self.kernels} launches): device busy "
                f"{self.busy:.0%} -> {'device' if self.busy > 0.8 else 'host'}-bound"
            )
        what = "device" if self.kernel_ms is not None else "host"
        lines.append(f"  top operators by self {what} time (ms per step, calls per step):")
        lines += [f"    {r['ms']:9.3f}  {r['calls']:7.1f}  {r['name'][:90]}" for r in self.top]
        if self.modules:
            lines.append(f"  forward {what} time of the named modules (ms per step, their children included):")
            lines += [f"    {ms:9.3f}  {name}" for name, ms in self.modules.items()]
        return "\n".join(lines)


@contextlib.contextmanager
def module_ranges(modules: Mapping[str, nn.Module | Sequence[nn.Module]]):
    """Open a profiler range ``module:<name>`` around every forward call of each named module (or of
    each module of a named sequence).

    Not for steps with activation checkpointing: its recomputation may stop early, before the module's
    forward hook closes the range."""
    named = [(name, m) for name, ms in modules.items() for m in (ms if isinstance(ms, (list, tuple)) else [ms])]
    for name, mod in named:  # all checked before any hook is registered
        if not isinstance(mod, nn.Module):
            raise TypeError(f"module_ranges: {name!r} must be an nn.Module, got {type(mod).__name__}")
    handles = []
    for name, mod in named:
        ranges: list = []  # per module instance: its open range

        def pre(_m, _a, _name=name, _ranges=ranges):
            r = torch.autograd.profiler.record_function(f"module:{_name}")
            r.__enter__()
            _ranges.append(r)

        def post(_m, _a, _o, _ranges=ranges):
            _ranges.pop().__exit__(None, None, None)

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def quiet_profiler_notices(fn: Callable) -> Callable:
    """``fn`` without torch.profiler's "Profiler clears events at the end of each cycle" notice (about schedules
    these helpers do not use; in a notebook's output it reads like an error)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"[\s\S]*Profiler clears events at the end of each cycle")
            return fn(*args, **kwargs)

    return wrapper


@quiet_profiler_notices
def profile_step(
    step: Callable,
    *args,
    steps: int = 3,
    warmup: int = 2,
    rows: int = 15,
    modules: Mapping[str, nn.Module | Sequence[nn.Module]] | None = None,
) -> StepReport:
    """Profile ``step(*args)`` under ``torch.profiler``: ``warmup`` calls, then ``steps`` profiled calls, on the
    device of the first tensor in ``args``. The wall time includes the profiler's overhead (a few µs per
    operator): compare it with the kernel time, not with :func:`mahia.measure.timing.bench`."""
    if not callable(step):
        raise TypeError(f"profile_step: step must be callable, got {type(step).__name__}")
    for name, v in (("steps", steps), ("warmup", warmup), ("rows", rows)):
        check_int("profile_step", name, v, minimum=0 if name == "warmup" else 1)
    flat = [a for x in args for a in (x if isinstance(x, (tuple, list)) else (x,))]
    dev = next((a.device for a in flat if isinstance(a, torch.Tensor)), torch.device("cpu"))
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step(*args)
    sync()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof, module_ranges(modules or {}):
        t0 = time.perf_counter()
        for _ in range(steps):
            step(*args)
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    CPU = torch.autograd.DeviceType.CPU
    # Ranges (record_function, the module ranges, the optimizer's) also appear on the device timeline as
    # "user annotations" spanning their kernels: leave them out, or their kernels count twice.
    host_ops = [
        e
        for e in prof.events()
        if e.device_type == CPU and not getattr(e, "is_user_annotation", False) and not e.name.startswith("module:")
    ]
    kernel_ms = kernels = None
    if cuda:
        kern = [e for e in prof.events() if e.device_type != CPU and not getattr(e, "is_user_annotation", False)]
        kernel_ms = sum(e.time_range.elapsed_us() for e in kern) / 1e3 / steps
        kernels = round(len(kern) / steps)
    # Operators (host events) by the device time of the kernels they launch themselves, or by their own
    # host time on a CPU: every kernel is launched by exactly one operator, so nothing is listed twice.
    by_name: dict[str, list[float]] = {}
    for e in host_ops:
        acc = by_name.setdefault(e.name, [0, 0.0])
        acc[0] += 1
        acc[1] += e.self_device_time_total if cuda else e.self_cpu_time_total
    ranked = sorted(by_name.items(), key=lambda kv: kv[1][1], reverse=True)
    top = [{"name": n, "calls": c / steps, "ms": us / 1e3 / steps} for n, (c, us) in ranked[:rows] if us > 0]
    mods: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == CPU and e.name.startswith("module:"):
            key = e.name[len("module:") :]
            mods[key] = mods.get(key, 0.0) + (e.device_time_total if cuda else e.cpu_time_total) / 1e3 / steps
    mods = {k: mods[k] for k in (modules or {}) if k in mods}
    return StepReport(str(dev), wall_ms, kernel_ms, kernels, top, mods)


def block_parts(model) -> dict[str, list[nn.Module]]:
    """The parts of a HybridModel's blocks by name (``attn``, ``mlp``, ...), each with its module in
    every block that has one: as ``modules`` of :func:`profile_step`, a part's time summed over the blocks."""
    parts: dict[str, list[nn.Module]] = {}
    for block in model.blocks:
        for name, child in block.named_children():
            parts.setdefault(name, []).append(child)
    return parts


# The default sequence length: this, or the preset's max_seq_len where that is shorter (tiny: 128).
SEQ_LEN = 512


def _parser() -> argparse.ArgumentParser:
    from mahia.model.config import CHECKPOINT_POLICIES, PRESETS
    from mahia.model.optimize import AMP, COMPILE

    p = argparse.ArgumentParser(
        prog="python -m mahia.profile",
        description=__doc__.split("\n\n")[0],
        epilog="example:\n  python -m mahia.profile --preset small --batch 16 --seq-len 1024 --amp bf16 "
        "--checkpoint full",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--preset",
        default="small",
        choices=sorted(PRESETS),
        help="model size, HybridConfig.preset (default: %(default)s)",
    )
    p.add_argument(
        "--impl",
        default="optimized",
        choices=("optimized", "baseline"),
        help="every layer on its fast path, or on its reference path (default: %(default)s)",
    )
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default: %(default)s)")
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help=f"tokens per sequence (default: {SEQ_LEN}, or the preset's max_seq_len where that is shorter)",
    )
    p.add_argument(
        "--amp", default=None, choices=[a for a in AMP if a], help="autocast dtype (default: none, the weights' fp32)"
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        choices=[c for c in CHECKPOINT_POLICIES if c],
        help="activation checkpointing of every block (default: none)",
    )
    p.add_argument(
        "--compile",
        default=None,
        choices=[c for c in COMPILE if c],
        help="torch.compile mode of the model's forward (default: none, eager)",
    )
    p.add_argument("--steps", type=int, default=3, help="profiled steps, after 2 warm-up steps (default: %(default)s)")
    p.add_argument("--rows", type=int, default=15, help="operators listed, the busiest first (default: %(default)s)")
    p.add_argument(
        "--device", default="auto", help="auto (CUDA if present), cpu, cuda or cuda:N (default: %(default)s)"
    )
    p.add_argument(
        "--by-module",
        action="store_true",
        help="also the forward time of each block part; not with --checkpoint (default: off)",
    )
    return p


def main(argv=None) -> int:
    from mahia.measure.hardware import resolve_device
    from mahia.model import HybridConfig, HybridModel, SyntheticTokens, make_train_step

    a = _parser().parse_args(argv)
    try:
        dev = resolve_device(a.device)
        cfg = HybridConfig.preset(a.preset)
        cfg = cfg.optimized() if a.impl == "optimized" else cfg.baseline()
        if a.seq_len is None:
            a.seq_len = min(SEQ_LEN, cfg.max_seq_len)
        for name in ("batch", "seq_len", "steps"):
            if getattr(a, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
        if a.by_module and a.checkpoint:
            raise ValueError(
                "--by-module cannot time modules under --checkpoint (the recompute may stop early, "
                "before a module's forward ends)"
            )
        if a.seq_len > cfg.max_seq_len:
            raise ValueError(f"--seq-len {a.seq_len} exceeds the preset's max_seq_len {cfg.max_seq_len}")
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    with dev:
        model = HybridModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    step = make_train_step(model, opt, amp=a.amp, checkpoint=a.checkpoint, compile=a.compile)
    batch = SyntheticTokens(cfg.vocab_size, a.seq_len, seed=0).batch(a.batch, dev)
    print(
        f"preset {a.preset} ({a.impl}), batch {a.batch} x {a.seq_len}, amp={a.amp}, checkpoint={a.checkpoint}, "
        f"compile={a.compile}"
    )
    report = profile_step(step, batch, steps=a.steps, rows=a.rows, modules=block_parts(model) if a.by_module else None)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
