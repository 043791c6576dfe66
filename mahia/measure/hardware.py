"""What machine is this, and how fast can it go?

:func:`device_report` describes the hardware and software. :func:`ceilings` *measures*, on this machine in this
run, the two limits every later number is compared against:

* copy bandwidth, ``2 * nbytes / time`` of a large device-to-device copy (bytes read plus written): the
  realistic ceiling of a memory-bound kernel;
* matmul rate, ``2 * n**3 / time``, the best of a few large square products in bf16 and in fp32 (TF32 off):
  the ceiling of compute-bound work.

Datasheet numbers are leads, not limits. The runner sets ``MAHIA_RUN_ID``: the first notebook of a run writes
``ceilings.json`` (``ceilings-<profile>.json`` outside the full profile), stamped with the profile and commit,
and the others read it back.
"""

from __future__ import annotations

import contextlib
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

# Dense peaks (no sparsity) of the SXM parts from NVIDIA's datasheets: context for a measured ceiling, never a
# limit. Key: a substring of the GPU name.
DATASHEET = {
    "H100": {"copy_gbps": 3350.0, "matmul_bf16_tflops": 989.0, "matmul_fp32_tflops": 67.0},
    "H200": {"copy_gbps": 4800.0, "matmul_bf16_tflops": 989.0, "matmul_fp32_tflops": 67.0},
    "A100": {"copy_gbps": 2039.0, "matmul_bf16_tflops": 312.0, "matmul_fp32_tflops": 19.5},
}
# The square sizes of the CUDA bf16 ceiling (the best of them; the quick profile takes the first only); the first
# is the fp32 ceiling's one size. Notebook 06 measures fp16 and TF32 the same way.
CUDA_MATMUL_SIZES = (4096, 6144, 8192)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cuda"`` without a GPU raises a clear error."""
    d = str(device).strip().lower() if isinstance(device, (str, torch.device)) else None
    if d == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if d == "cpu":
        return torch.device("cpu")
    if d is None or not re.fullmatch(r"cuda(:\d+)?", d):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} was requested but no CUDA GPU is available "
            "(torch.cuda.is_available() is False); use device='cpu' or 'auto'"
        )
    return torch.device(d)


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_slug(device: str | torch.device = "auto") -> str:
    """A folder name for results, e.g. ``nvidia-h100-80gb-hbm3`` or ``cpu-amd-epyc-7b13-2c`` (the CPU model is in
    it: two different CPUs never share a results folder)."""
    dev = resolve_device(device)
    slug = lambda text: re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")  # noqa: E731
    if dev.type == "cuda":
        return slug(torch.cuda.get_device_name(dev))
    return f"cpu-{slug(_cpu_name())[:40].strip('-')}-{os.cpu_count()}c"


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
        rep |= {
            "gpu": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "sm_count": p.multi_processor_count,
            "gpu_memory_gib": round(p.total_memory / 2**30, 1),
            "l2_cache_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1) or None,
            "driver": _driver_version(),
        }
    return rep


@dataclass(frozen=True)
class Ceilings:
    """Measured limits of one device (GB/s and TFLOP/s), with when, in which run and profile, and by which commit."""

    device_slug: str
    copy_gbps: float
    matmul_bf16_tflops: float
    matmul_fp32_tflops: float
    measured_at: str
    run_id: str | None = None
    profile: str | None = None
    commit: str | None = None

    def limit(self, name: str) -> float:
        """The ceiling a record is compared against: 'copy' (GB/s) or 'matmul_bf16'/'matmul_fp32'."""
        table = {"copy": self.copy_gbps, "matmul_bf16": self.matmul_bf16_tflops, "matmul_fp32": self.matmul_fp32_tflops}
        if name not in table:
            raise ValueError(f"unknown limit {name!r}; expected one of {sorted(table)}")
        return table[name]


def _measure(dev: torch.device, quick: bool) -> dict:
    cuda = dev.type == "cuda"
    # Copy: large enough to dwarf the L2 cache (50-60 MB on Hopper).
    n_bytes = (2 if cuda else 0.25) * 2**30 if not quick else (256 if cuda else 32) * 2**20
    src = torch.randn(int(n_bytes) // 4, device=dev)
    dst = torch.empty_like(src)
    t = bench(lambda s=src, d=dst: d.copy_(s), device=dev, memory=False, rep_ms=200 if cuda else 300)
    copy_gbps = 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9
    del src, dst

    def matmul_rate(dtype: torch.dtype, sizes: tuple[int, ...]) -> float:
        best = 0.0  # the best of a few sizes: the library's kernel choice varies with the shape
        for n in sizes:
            a, b = (torch.randn(n, n, device=dev, dtype=dtype) for _ in range(2))  # random data: zeros run faster
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
    """Measured ceilings of ``device``, measured once per run (module docstring).

    ``profile`` (default ``"quick"`` when ``quick`` else ``"full"``) names the file, so a quick run never replaces
    the full profile's ceilings. Outside a run the measurement is cached for the life of the process.
    """
    dev = resolve_device(device)
    slug, run_id = device_slug(dev), os.environ.get("MAHIA_RUN_ID")
    profile = profile or ("quick" if quick else "full")
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
                    _CACHE[key] = Ceilings(**data)
                    return _CACHE[key]
            except (ValueError, TypeError):
                pass  # unreadable or old format: measure again
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    c = Ceilings(
        slug, **_measure(dev, quick), measured_at=now, run_id=run_id, profile=profile, commit=files.run_commit()
    )
    _CACHE[key] = c
    if path is not None:
        files.atomic_write_text(path, json.dumps(asdict(c), indent=2) + "\n")
    return c


def datasheet(device: str | torch.device = "auto") -> dict | None:
    """Datasheet peaks of the GPU in use, when known (context, not a limit)."""
    dev = resolve_device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
    return next((dict(v) for k, v in DATASHEET.items() if k in name), None)
