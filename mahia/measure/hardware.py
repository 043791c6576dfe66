"""What machine is this, and how fast can it go?

``device_report()`` describes the hardware and software. ``ceilings()`` *measures* the two limits
every later number is compared against, on this machine, in this run:

* copy bandwidth: a large device-to-device copy, counting bytes read plus bytes written
  (``2 * nbytes / time``); the realistic ceiling of a memory-bound kernel;
* matmul rate: the best of a few large square matrix products in bf16 and in fp32 (TF32 off),
  ``2 * n**3 / time``;
  the ceiling of compute-bound work.

Datasheet numbers are leads, not limits (e.g. an H100 SXM lists 3.35 TB/s and 989 dense bf16
TFLOP/s); measured ceilings are what a kernel can actually reach. The measurement is made once per
run: the runner sets ``MAHIA_RUN_ID`` and the first notebook writes ``ceilings.json`` (full profile;
``ceilings-<profile>.json`` for any other) that the others reuse. The file carries the profile and the
commit of the code that measured it, like every record.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import torch

from mahia.measure import files
from mahia.measure.timing import bench

__all__ = ["resolve_device", "device_slug", "device_report", "Ceilings", "ceilings", "DATASHEET", "CUDA_MATMUL_SIZES"]

# Datasheet peaks, for context only (dense, no sparsity). Key: substring of the GPU name.
DATASHEET = {
    "H100": {"copy_gbps": 3350.0, "matmul_bf16_tflops": 989.0, "matmul_fp32_tflops": 67.0},
    "H200": {"copy_gbps": 4800.0, "matmul_bf16_tflops": 989.0, "matmul_fp32_tflops": 67.0},
    "A100": {"copy_gbps": 2039.0, "matmul_bf16_tflops": 312.0, "matmul_fp32_tflops": 19.5},
}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cuda"`` without a GPU raises a clear error."""
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    d = device.strip().lower()
    if d == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if d == "cpu":
        return torch.device("cpu")
    if re.fullmatch(r"cuda(:\d+)?", d):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device={device!r} was requested but no CUDA GPU is available "
                "(torch.cuda.is_available() is False); use device='cpu' or 'auto'"
            )
        return torch.device(d)
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_slug(device: str | torch.device = "auto") -> str:
    """A folder name for results: e.g. ``nvidia-h100-80gb-hbm3`` or ``cpu-amd-epyc-7b13-2c``."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return _slug(torch.cuda.get_device_name(dev))
    # The CPU model is part of the name: two different CPUs never share a results folder.
    return f"cpu-{_slug(_cpu_name())[:40].strip('-')}-{os.cpu_count()}c"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


@cache
def device_report(device: str = "auto") -> dict:
    """Hardware and software of this run, as a flat dict (also stamped onto every result record)."""
    dev = resolve_device(device)
    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    rep = {
        "device": dev.type,
        "device_slug": device_slug(dev),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_runtime": torch.version.cuda,
    }
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        rep.update(
            {
                "gpu": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "gpu_memory_gib": round(p.total_memory / 2**30, 1),
                "l2_cache_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1) or None,
                "driver": _driver_version(),
            }
        )
    return rep


@dataclass(frozen=True)
class Ceilings:
    """Measured limits of one device (GB/s and TFLOP/s), with when and where they were measured."""

    device_slug: str
    copy_gbps: float
    matmul_bf16_tflops: float
    matmul_fp32_tflops: float
    measured_at: str
    run_id: str | None = None
    profile: str | None = None  # "quick" | "full" | ...; None in files written before it was recorded
    commit: str | None = None  # the code that measured it (mahia.measure.files.run_commit)

    def limit(self, name: str) -> float:
        """The ceiling a record is compared against: 'copy' (GB/s) or 'matmul_bf16'/'matmul_fp32'."""
        table = {"copy": self.copy_gbps, "matmul_bf16": self.matmul_bf16_tflops, "matmul_fp32": self.matmul_fp32_tflops}
        if name not in table:
            raise ValueError(f"unknown limit {name!r}; expected one of {sorted(table)}")
        return table[name]

    def as_dict(self) -> dict:
        return asdict(self)


# The square sizes of the CUDA bf16 ceiling (the best of them; the quick profile takes the first only), and the
# first is the fp32 ceiling's one size. Notebook 06 measures fp16 and TF32 the same way.
CUDA_MATMUL_SIZES = (4096, 6144, 8192)


def _measure(dev: torch.device, quick: bool) -> dict:
    cuda = dev.type == "cuda"
    # Copy: large enough to dwarf the L2 cache (50-60 MB on Hopper).
    n_bytes = (2 if cuda else 0.25) * 2**30 if not quick else (256 if cuda else 32) * 2**20
    src = torch.randn(int(n_bytes) // 4, device=dev)
    dst = torch.empty_like(src)
    t = bench(lambda s=src, d=dst: d.copy_(s), device=dev, memory=False, rep_ms=200 if cuda else 300)
    copy_gbps = 2 * src.numel() * 4 / (t.median_ms * 1e-3) / 1e9
    del src, dst

    def matmul_rate(dtype: torch.dtype, sizes: tuple[int, ...]) -> float:
        # The best of a few large sizes: the library's kernel choice varies with the shape.
        best = 0.0
        for n in sizes:
            a = torch.randn(n, n, device=dev, dtype=dtype)  # random data: zeros run faster
            b = torch.randn(n, n, device=dev, dtype=dtype)
            t = bench(lambda a=a, b=b: torch.mm(a, b), device=dev, memory=False, flush_l2=False, rep_ms=150)
            best = max(best, 2 * n**3 / (t.median_ms * 1e-3) / 1e12)
        return best

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 ceiling is true fp32
    try:
        sizes = (CUDA_MATMUL_SIZES if not quick else CUDA_MATMUL_SIZES[:1]) if cuda else (512,)
        bf16 = matmul_rate(torch.bfloat16, sizes)
        fp32 = matmul_rate(torch.float32, sizes[:1] if cuda else sizes)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return {"copy_gbps": copy_gbps, "matmul_bf16_tflops": bf16, "matmul_fp32_tflops": fp32}


_CACHE: dict[str, Ceilings] = {}


def ceilings(
    device: str | torch.device = "auto",
    *,
    results_dir: str | Path | None = None,
    quick: bool = False,
    refresh: bool = False,
    profile: str | None = None,
) -> Ceilings:
    """Measured ceilings of ``device``, measured once per run.

    ``profile`` (default ``"quick"`` when ``quick`` else ``"full"``) is stamped on the result with the
    commit, and names its file: ``ceilings.json`` for the full profile, ``ceilings-<profile>.json``
    otherwise, so a quick run never replaces the full profile's ceilings. Within a runner run
    (``MAHIA_RUN_ID`` set) the first caller writes that file in the device's results folder and later
    notebooks read it back. Outside a run the measurement is cached for the life of the process.
    """
    dev = resolve_device(device)
    slug = device_slug(dev)
    profile = profile or ("quick" if quick else "full")
    run_id = os.environ.get("MAHIA_RUN_ID")
    key = f"{slug}:{run_id}:{profile}"
    if not refresh and key in _CACHE:
        return _CACHE[key]
    path = None
    if results_dir is not None:
        path = files.profile_file(Path(results_dir) / slug, "ceilings", profile)
        files.check_writable(path)
        if not refresh and run_id and path.exists():
            try:
                data = json.loads(path.read_text())
                if data.get("run_id") == run_id and data.get("profile") == profile:
                    c = Ceilings(**data)
                    _CACHE[key] = c
                    return c
            except (ValueError, TypeError):
                pass  # unreadable or old format: measure again
    m = _measure(dev, quick)
    c = Ceilings(
        device_slug=slug,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        run_id=run_id,
        profile=profile,
        commit=files.run_commit(),
        **m,
    )
    _CACHE[key] = c
    if path is not None:
        files.atomic_write_text(path, json.dumps(c.as_dict(), indent=2) + "\n")
    return c


def datasheet(device: str | torch.device = "auto") -> dict | None:
    """Datasheet peaks for the GPU in use, when known (context, not a limit)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    for k, v in DATASHEET.items():
        if k in name:
            return dict(v)
    return None
