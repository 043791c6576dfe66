"""Result records: one row per measurement, appended to CSV files, summarized into headline metrics.

Layout, per device (``<slug>`` from ``mahia.measure.hardware.device_slug``)::

    data/results/<slug>/device.json     which machine this folder belongs to (checked on every write)
    data/results/<slug>/ceilings.json   measured copy bandwidth and matmul rates (mahia.measure.hardware)
    data/results/<slug>/<notebook>.csv  records, appended run after run (history is kept)
    data/results/<slug>/summary.json    headline metrics derived from the newest records

Every write goes to a temporary file first and is then renamed over the target, so an interrupted
run never leaves a half-written file. A folder that belongs to another device is never written.

A ratio key ``x_vs_y`` is time(y) / time(x): above 1 means x is faster.
"""
from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd
import torch

from mahia.measure.hardware import Ceilings, device_report, device_slug, resolve_device
from mahia.measure.timing import Timing

__all__ = [
    "COLUMNS", "HEADLINE_KEYS", "Recorder", "atomic_write_text", "default_results_dir",
    "default_figures_dir", "load_records", "latest", "summarize", "write_summary", "pairs",
]

COLUMNS = [
    "notebook", "experiment", "variant", "role", "shape", "dtype",
    "median_ms", "p20_ms", "p80_ms", "n", "first_call_ms", "peak_mem_mb",
    "bytes", "flops", "gbps", "tflops", "limit", "frac_of_limit", "rel_err",
    "value", "unit", "notes", "device", "device_slug", "torch", "triton", "date", "run_id",
]
ROLES = ("baseline", "optimized", "peer", "reference", "metric")

REPO_ROOT = Path(__file__).resolve().parents[2]


def _root_default(sub: str, env: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    # In a checkout, results live beside the package; an installed package writes to the cwd.
    base = REPO_ROOT if (REPO_ROOT / "notebooks").is_dir() else Path.cwd()
    return base / sub


def default_results_dir() -> Path:
    return _root_default("data/results", "MAHIA_RESULTS_DIR")


def default_figures_dir() -> Path:
    return _root_default("figures", "MAHIA_FIGURES_DIR")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _shape_str(shape) -> str:
    if shape is None:
        return ""
    if isinstance(shape, str):
        return shape
    if isinstance(shape, torch.Size) or isinstance(shape, (tuple, list)):
        return "x".join(str(int(s)) for s in shape)
    return str(shape)


def _dtype_str(dtype) -> str:
    if dtype is None:
        return ""
    return str(dtype).replace("torch.", "")


def _identity(rep: dict) -> dict:
    return {k: rep.get(k) for k in ("device", "device_slug", "gpu", "cpu", "cpu_count")}


class Recorder:
    """Collects the records of one notebook (or benchmark) on one device and writes them.

    ``rec.timing(...)`` records a timed variant, ``rec.metric(...)`` a single value (a sync count,
    a loss difference). Rows are written to disk at once (atomically), so a notebook that fails
    later keeps what it measured.
    """

    def __init__(self, notebook: str, device: str | torch.device = "auto", *,
                 results_dir: str | Path | None = None, ceilings: Ceilings | None = None,
                 run_id: str | None = None):
        if not notebook or "/" in notebook:
            raise ValueError(f"notebook must be a plain name like '03_triton_fusion', got {notebook!r}")
        self.notebook = notebook
        self.device = resolve_device(device)
        self.report = device_report(str(self.device))
        self.slug = device_slug(self.device)
        self.root = Path(results_dir) if results_dir is not None else default_results_dir()
        self.folder = self.root / self.slug
        self.path = self.folder / f"{notebook}.csv"
        self.ceilings = ceilings
        self.run_id = run_id or os.environ.get("MAHIA_RUN_ID") or uuid.uuid4().hex[:12]
        self.rows: list[dict] = []

    # -- writing --------------------------------------------------------------------------------
    def _check_folder(self) -> None:
        marker = self.folder / "device.json"
        mine = _identity(self.report)
        if marker.exists():
            theirs = json.loads(marker.read_text())
            if {k: theirs.get(k) for k in mine} != mine:
                raise RuntimeError(
                    f"{self.folder} holds results of another device ({theirs.get('gpu') or theirs.get('cpu')}); "
                    f"this run is on {mine.get('gpu') or mine.get('cpu')}. Refusing to mix them: "
                    "pass a different results_dir.")
        else:
            atomic_write_text(marker, json.dumps(mine, indent=2) + "\n")

    def _append(self, row: dict) -> dict:
        self._check_folder()
        full = {c: row.get(c) for c in COLUMNS}
        self.rows.append(full)
        new = pd.DataFrame([full], columns=COLUMNS)
        if self.path.exists():
            old = pd.read_csv(self.path)
            df = pd.concat([old.reindex(columns=COLUMNS), new], ignore_index=True) if len(old) else new
        else:
            df = new
        atomic_write_text(self.path, df.to_csv(index=False))
        return full

    def _stamp(self) -> dict:
        r = self.report
        return {"notebook": self.notebook, "device": r.get("gpu") or r.get("cpu"),
                "device_slug": self.slug, "torch": r.get("torch"), "triton": r.get("triton"),
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run_id": self.run_id}

    def timing(self, experiment: str, variant: str, role: str, timing: Timing, *, shape=None,
               dtype=None, bytes: float | None = None, flops: float | None = None,
               limit: str | None = None, rel_err: float | None = None, notes: str = "") -> dict:
        """Record a timed variant. GB/s, TFLOP/s and the fraction of the measured ceiling
        (``limit``: 'copy', 'matmul_bf16' or 'matmul_fp32'; default 'copy' when ``bytes`` is given
        and ``flops`` is not, else by dtype) are computed here, never typed in."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if not isinstance(timing, Timing):
            raise TypeError(f"timing must be a mahia.measure.timing.Timing, got {type(timing).__name__}")
        sec = timing.median_ms * 1e-3
        gbps = bytes / sec / 1e9 if bytes else None
        tflops = flops / sec / 1e12 if flops else None
        if limit is None and (bytes or flops):
            limit = "copy" if not flops else ("matmul_bf16" if _dtype_str(dtype) in ("bfloat16", "float16")
                                               else "matmul_fp32")
        frac = None
        if limit and self.ceilings is not None:
            achieved = gbps if limit == "copy" else tflops
            frac = achieved / self.ceilings.limit(limit) if achieved else None
        row = {
            **self._stamp(), "experiment": experiment, "variant": variant, "role": role,
            "shape": _shape_str(shape), "dtype": _dtype_str(dtype),
            "median_ms": timing.median_ms, "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms,
            "n": timing.n, "first_call_ms": timing.first_call_ms,
            "peak_mem_mb": timing.peak_mem_bytes / 2**20 if timing.peak_mem_bytes is not None else None,
            "bytes": bytes, "flops": flops, "gbps": gbps, "tflops": tflops, "limit": limit,
            "frac_of_limit": frac, "rel_err": rel_err, "notes": notes,
        }
        return self._append(row)

    def metric(self, experiment: str, variant: str, value: float, *, unit: str = "",
               role: str = "metric", shape=None, dtype=None, notes: str = "") -> dict:
        """Record a single value (a count, a loss difference, a memory figure)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        row = {**self._stamp(), "experiment": experiment, "variant": variant, "role": role,
               "shape": _shape_str(shape), "dtype": _dtype_str(dtype), "value": float(value),
               "unit": unit, "notes": notes}
        return self._append(row)

    def frame(self) -> pd.DataFrame:
        """This recorder's rows (this run only) as a DataFrame."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def summarize(self) -> dict:
        """Re-derive the device's ``summary.json`` from all its records; returns the metrics."""
        return write_summary(self.folder)


# -- reading and deriving ---------------------------------------------------------------------------
def load_records(folder: str | Path) -> pd.DataFrame:
    """All records of one device folder."""
    folder = Path(folder)
    frames = [pd.read_csv(p) for p in sorted(folder.glob("*.csv"))]
    frames = [f.reindex(columns=COLUMNS) for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    for c in ("shape", "dtype", "notes", "unit"):
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    return df


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Newest row per (experiment, variant, shape, dtype), whichever notebook wrote it."""
    if df.empty:
        return df
    key = ["experiment", "variant", "shape", "dtype"]
    return df.sort_values("date").groupby(key, as_index=False, sort=False).tail(1).reset_index(drop=True)


def _rows(df, experiment, shape=None, dtype=None):
    sel = df[df["experiment"] == experiment]
    if shape is not None:
        sel = sel[sel["shape"] == shape]
    if dtype is not None:
        sel = sel[sel["dtype"] == dtype]
    return sel


def _time(df, experiment, variant, shape=None, dtype=None):
    sel = _rows(df, experiment, shape, dtype)
    sel = sel[(sel["variant"] == variant) & sel["median_ms"].notna()]
    return float(sel.sort_values("date")["median_ms"].iloc[-1]) if len(sel) else None


def _field(df, experiment, variant, field, shape=None, dtype=None):
    sel = _rows(df, experiment, shape, dtype)
    sel = sel[(sel["variant"] == variant) & sel[field].notna()]
    return float(sel.sort_values("date")[field].iloc[-1]) if len(sel) else None


def ratio(experiment, num: str | Sequence[str], den: str, shape=None, dtype=None) -> Callable:
    """time(best of ``num``) / time(``den``): how many times faster ``den`` is."""
    nums = [num] if isinstance(num, str) else list(num)

    def rule(df):
        sh = shape
        if sh is None:  # pair with the shape of the newest ``den`` record, never across shapes
            sel = _rows(df, experiment, None, dtype)
            sel = sel[(sel["variant"] == den) & sel["median_ms"].notna()]
            if sel.empty:
                return None
            sh = sel.sort_values("date")["shape"].iloc[-1]
        t_den = _time(df, experiment, den, sh, dtype)
        t_num = [t for t in (_time(df, experiment, v, sh, dtype) for v in nums) if t is not None]
        return min(t_num) / t_den if t_den and t_num else None
    return rule


def field(experiment, variant, name, shape=None, dtype=None) -> Callable:
    return lambda df: _field(df, experiment, variant, name, shape, dtype)


def best(experiment, name, shape=None, dtype=None) -> Callable:
    def rule(df):
        sel = _rows(df, experiment, shape, dtype)[name].dropna()
        return float(sel.max()) if len(sel) else None
    return rule


# Canonical shapes of the headline measurements (sweeps use other experiment names).
RMS, SWI = "16384x4096", "16384x11008"
ROPE = "8x2048x32x8x128"
MOE = "N=16384,D=1024,H=2048,E=64,k=2"
GLA = "B=4,H=8,T=2048,K=64,V=64"
# Headline metrics (summary.json). Each rule maps the newest records to one number or None.
HEADLINES: dict[str, Callable[[pd.DataFrame], float | None]] = {
    "rmsnorm_fwd_frac_of_copy": field("rmsnorm_fwd", "mahia_triton", "frac_of_limit", RMS, "bfloat16"),
    "rmsnorm_fwd_vs_liger": ratio("rmsnorm_fwd", "liger", "mahia_triton", RMS, "bfloat16"),
    "rmsnorm_fwdbwd_ms": field("rmsnorm_fwdbwd", "mahia_triton", "median_ms", RMS, "bfloat16"),
    "rmsnorm_fwdbwd_vs_best_peer": ratio("rmsnorm_fwdbwd", ["F.rms_norm", "torch.compile", "liger"],
                                         "mahia_triton", RMS, "bfloat16"),
    "swiglu_fwd_vs_compile": ratio("swiglu_fwd", "torch.compile", "mahia_triton", SWI, "bfloat16"),
    "swiglu_fwdbwd_vs_compile": ratio("swiglu_fwdbwd", "torch.compile", "mahia_triton", SWI, "bfloat16"),
    "swiglu_fwdbwd_frac_of_copy": field("swiglu_fwdbwd", "mahia_triton", "frac_of_limit", SWI, "bfloat16"),
    "rope_fwdbwd_frac_of_copy": field("rope_fwdbwd", "mahia_triton", "frac_of_limit", ROPE, "bfloat16"),
    "attention_sdpa_vs_manual": ratio("attention_fwd", "manual", "sdpa"),
    "attention_best_fwd_tflops": best("attention_backends", "tflops"),
    "sync_count_baseline": field("sync_count", "baseline", "value"),
    "sync_count_optimized": field("sync_count", "optimized", "value"),
    "sync_speedup": ratio("sync_loop", "baseline", "optimized"),
    "compile_speedup": ratio("compile_model", "eager", "best_compile"),
    "cudagraph_speedup": ratio("cudagraph_infer", "eager", "cuda_graph"),
    "decode_cudagraph_speedup": ratio("decode", "eager", "cuda_graph"),
    "amp_speedup": ratio("amp_train_step", "fp32", "bf16"),
    "amp_loss_rel_diff": field("amp_loss", "bf16_vs_fp32", "value"),
    "checkpoint_memory_saving": field("checkpoint", "memory_saving", "value"),
    "checkpoint_overhead": field("checkpoint", "overhead", "value"),
    "moe_vs_loop": ratio("moe_fwd", "loop", "grouped", MOE, "bfloat16"),
    "moe_fwd_tflops": field("moe_fwd", "grouped", "tflops", MOE, "bfloat16"),
    "meta_attention_vs_loop": ratio("meta_attention_fwdbwd", "loop", "triton", GLA),
    "full_stack_speedup": ratio("full_stack_train", "baseline", "all"),
    "full_stack_mfu": field("mfu", "dense-350m", "value"),
}
HEADLINE_KEYS = ["copy_gbps", "matmul_bf16_tflops", *HEADLINES]

# The project's goals for the headline metrics on an H100/H200 (direction, bound).
GOALS: dict[str, tuple[str, float]] = {
    "rmsnorm_fwd_frac_of_copy": (">=", 0.92), "rmsnorm_fwd_vs_liger": (">=", 1.0),
    "rmsnorm_fwdbwd_vs_best_peer": (">=", 1.4), "swiglu_fwd_vs_compile": (">=", 1.0),
    "swiglu_fwdbwd_vs_compile": (">=", 1.0), "rope_fwdbwd_frac_of_copy": (">=", 0.85),
    "attention_sdpa_vs_manual": (">=", 20.0), "attention_best_fwd_tflops": (">=", 550.0),
    "sync_count_optimized": ("<=", 0.0), "cudagraph_speedup": (">=", 3.0),
    "decode_cudagraph_speedup": (">=", 3.0), "amp_speedup": (">=", 3.0),
    "amp_loss_rel_diff": ("<=", 0.01), "checkpoint_memory_saving": (">=", 0.6),
    "checkpoint_overhead": ("<=", 0.25), "moe_vs_loop": (">=", 15.0), "moe_fwd_tflops": (">=", 300.0),
    "meta_attention_vs_loop": (">=", 100.0), "full_stack_speedup": (">=", 5.0),
    "full_stack_mfu": (">=", 0.65),
}


def goal_status(key: str, value: float | None) -> str:
    """'met', 'missed', 'not measured' or '' (no goal) for a headline value."""
    if key not in GOALS:
        return ""
    if value is None:
        return "not measured"
    op, bound = GOALS[key]
    return "met" if (value >= bound if op == ">=" else value <= bound) else "missed"


def summarize(folder: str | Path) -> dict:
    """Headline metrics of one device folder (None where not measured)."""
    folder = Path(folder)
    df = latest(load_records(folder))
    out: dict[str, float | None] = {k: None for k in HEADLINE_KEYS}
    ceil = folder / "ceilings.json"
    if ceil.exists():
        c = json.loads(ceil.read_text())
        out["copy_gbps"] = c.get("copy_gbps")
        out["matmul_bf16_tflops"] = c.get("matmul_bf16_tflops")
    if not df.empty:
        for k, rule in HEADLINES.items():
            v = rule(df)
            out[k] = None if v is None or v != v else round(float(v), 6)
    return out


def write_summary(folder: str | Path) -> dict:
    folder = Path(folder)
    metrics = summarize(folder)
    dev = json.loads((folder / "device.json").read_text()) if (folder / "device.json").exists() else {}
    df = load_records(folder)
    doc = {
        "device": dev.get("gpu") or dev.get("cpu"),
        "device_slug": folder.name,
        "newest_record": None if df.empty else str(df["date"].max()),
        "metrics": metrics,
    }
    atomic_write_text(folder / "summary.json", json.dumps(doc, indent=2) + "\n")
    return metrics


@dataclass
class Pair:
    notebook: str
    experiment: str
    shape: str
    dtype: str
    baseline: str
    optimized: str
    speedup: float
    low: float
    high: float
    frac_of_limit: float | None
    limit: str | None
    rel_err: float | None
    date: str
    device: str

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)


def pairs(df: pd.DataFrame) -> list[Pair]:
    """One before/after pair per (experiment, shape, dtype) that has a baseline and an optimized row.

    The spread of a speedup is the ratio of the 20/80 percentiles crossed over:
    [base.p20 / opt.p80, base.p80 / opt.p20]. When it contains 1.0 the speedup is not significant.
    """
    out = []
    df = latest(df)
    df = df[df["median_ms"].notna()]
    for (exp, shape, dtype), g in df.groupby(["experiment", "shape", "dtype"], sort=False):
        base, opt = g[g["role"] == "baseline"], g[g["role"] == "optimized"]
        if base.empty or opt.empty:
            continue
        b = base.sort_values("date").iloc[-1]
        for _, o in opt.iterrows():
            out.append(Pair(
                notebook=str(o["notebook"]), experiment=exp, shape=shape, dtype=dtype,
                baseline=str(b["variant"]), optimized=str(o["variant"]),
                speedup=b["median_ms"] / o["median_ms"],
                low=b["p20_ms"] / o["p80_ms"], high=b["p80_ms"] / o["p20_ms"],
                frac_of_limit=None if pd.isna(o["frac_of_limit"]) else float(o["frac_of_limit"]),
                limit=None if pd.isna(o["limit"]) else str(o["limit"]),
                rel_err=None if pd.isna(o["rel_err"]) else float(o["rel_err"]),
                date=str(o["date"])[:10], device=str(o["device"])))
    return out


def records_for(folders: Iterable[Path]) -> pd.DataFrame:
    frames = [load_records(f) for f in folders]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
