"""Result records: one row per measurement, appended to CSV files, summarized into headline metrics.

Layout, per device (``<slug>`` from ``mahia.measure.hardware.device_slug``), under a results root:
``runs/results`` by default (git-ignored), ``data/results`` for the committed reference (written only by
``python -m mahia reference``; see ``mahia.measure.files``)::

    <root>/<slug>/device.json           which machine this folder belongs to (checked on every write)
    <root>/<slug>/ceilings.json         measured copy bandwidth and matmul rates (mahia.measure.hardware);
                                        ceilings-<profile>.json for a profile other than full
    <root>/<slug>/<notebook>.csv        records, appended run after run (history is kept)
    <root>/<slug>/summary.json          headline metrics of the full profile, from its newest records;
                                        summary-<profile>.json for each other profile
    <root>/<slug>/parts/<part>.json     (reference only) which commit each notebook or suite last ran at

Every record carries the ``profile`` that made it ("quick", "full") and the ``commit`` of the code
(``mahia.measure.files.run_commit``). Records written before these columns existed load as profile
"full" (commit "unknown"): they were all full-profile GPU runs; CPU ones load as profile "unknown".
Summaries are kept per profile, so a quick run never changes the full profile's headline, and each
metric says which commit(s) its records come from.

Every write goes to a temporary file first and is then renamed over the target, so an interrupted
run never leaves a half-written file. A folder that belongs to another device is never written.

A ratio key ``x_vs_y`` is time(y) / time(x): above 1 means x is faster.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from mahia.measure import files
from mahia.measure.files import (
    REPO_ROOT,
    UNKNOWN,
    atomic_write_text,
    default_figures_dir,
    default_results_dir,
)
from mahia.measure.hardware import Ceilings, device_report, device_slug, resolve_device
from mahia.measure.timing import Timing

__all__ = [
    "COLUMNS",
    "HEADLINE_KEYS",
    "REPO_ROOT",
    "Recorder",
    "atomic_write_text",
    "default_results_dir",
    "default_figures_dir",
    "load_records",
    "keep_part_commits",
    "latest",
    "profiles",
    "headline",
    "summarize",
    "write_summary",
    "write_summaries",
    "read_summary",
]

COLUMNS = [
    "notebook",
    "experiment",
    "variant",
    "role",
    "shape",
    "dtype",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "n",
    "first_call_ms",
    "peak_mem_mb",
    "bytes",
    "flops",
    "gbps",
    "tflops",
    "limit",
    "frac_of_limit",
    "rel_err",
    "value",
    "unit",
    "notes",
    "device",
    "device_slug",
    "torch",
    "triton",
    "date",
    "run_id",
    "profile",
    "commit",
]
ROLES = ("baseline", "optimized", "peer", "reference", "metric")


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

    ``profile``: given, else the ceilings' (``setup()`` measures them for its profile), else
    ``MAHIA_PROFILE`` (set by the runner), else "unknown". ``commit``: given, else
    ``mahia.measure.files.run_commit()`` (``MAHIA_COMMIT``, set by the runner, else git's).
    """

    def __init__(
        self,
        notebook: str,
        device: str | torch.device = "auto",
        *,
        results_dir: str | Path | None = None,
        ceilings: Ceilings | None = None,
        run_id: str | None = None,
        profile: str | None = None,
        commit: str | None = None,
    ):
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
        self.profile = (
            profile
            or (ceilings.profile if ceilings is not None else None)
            or os.environ.get("MAHIA_PROFILE")
            or UNKNOWN
        )
        self.commit = commit or files.run_commit()
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
                    "pass a different results_dir."
                )
        else:
            atomic_write_text(marker, json.dumps(mine, indent=2) + "\n")

    def _append(self, row: dict) -> dict:
        files.check_writable(self.path)
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
        return {
            "notebook": self.notebook,
            "device": r.get("gpu") or r.get("cpu"),
            "device_slug": self.slug,
            "torch": r.get("torch"),
            "triton": r.get("triton"),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "run_id": self.run_id,
            "profile": self.profile,
            "commit": self.commit,
        }

    def timing(
        self,
        experiment: str,
        variant: str,
        role: str,
        timing: Timing,
        *,
        shape=None,
        dtype=None,
        bytes: float | None = None,
        flops: float | None = None,
        limit: str | None = None,
        rel_err: float | None = None,
        notes: str = "",
    ) -> dict:
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
            limit = (
                "copy"
                if not flops
                else ("matmul_bf16" if _dtype_str(dtype) in ("bfloat16", "float16") else "matmul_fp32")
            )
        frac = None
        if limit and self.ceilings is not None:
            achieved = gbps if limit == "copy" else tflops
            frac = achieved / self.ceilings.limit(limit) if achieved else None
        row = {
            **self._stamp(),
            "experiment": experiment,
            "variant": variant,
            "role": role,
            "shape": _shape_str(shape),
            "dtype": _dtype_str(dtype),
            "median_ms": timing.median_ms,
            "p20_ms": timing.p20_ms,
            "p80_ms": timing.p80_ms,
            "n": timing.n,
            "first_call_ms": timing.first_call_ms,
            "peak_mem_mb": timing.peak_mem_bytes / 2**20 if timing.peak_mem_bytes is not None else None,
            "bytes": bytes,
            "flops": flops,
            "gbps": gbps,
            "tflops": tflops,
            "limit": limit,
            "frac_of_limit": frac,
            "rel_err": rel_err,
            "notes": notes,
        }
        return self._append(row)

    def metric(
        self,
        experiment: str,
        variant: str,
        value: float,
        *,
        unit: str = "",
        role: str = "metric",
        shape=None,
        dtype=None,
        notes: str = "",
    ) -> dict:
        """Record a single value (a count, a loss difference, a memory figure)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        row = {
            **self._stamp(),
            "experiment": experiment,
            "variant": variant,
            "role": role,
            "shape": _shape_str(shape),
            "dtype": _dtype_str(dtype),
            "value": float(value),
            "unit": unit,
            "notes": notes,
        }
        return self._append(row)

    def frame(self) -> pd.DataFrame:
        """This recorder's rows (this run only) as a DataFrame."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def summarize(self) -> dict:
        """Re-derive the summary of this recorder's profile (``summary.json`` for the full profile,
        ``summary-<profile>.json`` otherwise) from all its records; returns the metrics."""
        return write_summary(self.folder, self.profile)


# -- reading and deriving ---------------------------------------------------------------------------
_QUICK_NOTE = re.compile(r"\bquick profile\b|\bprofile[ =:]+quick\b", re.IGNORECASE)


def _legacy_profile(row) -> str:
    """The profile of a record written before records carried one: the committed ones are all
    full-profile GPU runs, except where the notes say quick; a CPU one is not known."""
    if _QUICK_NOTE.search(str(row["notes"])):
        return "quick"
    return UNKNOWN if str(row["device_slug"]).startswith("cpu-") else "full"


def load_records(folder: str | Path) -> pd.DataFrame:
    """All records of one device folder (records without a profile or commit: see the module doc)."""
    folder = Path(folder)
    frames = [pd.read_csv(p) for p in sorted(folder.glob("*.csv"))]
    frames = [f.reindex(columns=COLUMNS) for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    for c in ("shape", "dtype", "notes", "unit"):
        df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str)
    old = df["profile"].isna() | (df["profile"].astype(str) == "")
    df["profile"] = df["profile"].astype(object)
    if old.any():
        df.loc[old, "profile"] = df[old].apply(_legacy_profile, axis=1)
    df["commit"] = df["commit"].astype(object).where(df["commit"].notna(), UNKNOWN).astype(str)
    df["profile"] = df["profile"].astype(str)
    return df


def keep_part_commits(folder: str | Path) -> dict[str, int]:
    """Drop, from each ``<part>.csv`` of a reference folder, the rows that its ``parts/<part>.json`` does not
    vouch for: rows of another commit (older runs of the part) or another profile. Afterwards every summary
    of the folder is made by the commits its parts name, one per part. Returns ``{csv name: rows dropped}``.

    Refuses, changing nothing, when a CSV has no part file (a reference made before parts were recorded):
    there is no commit to keep, and dropping everything would lose the only measurements."""
    folder = Path(folder)
    csvs = sorted(folder.glob("*.csv"))
    keep: dict[Path, str] = {}
    missing = []
    for path in csvs:
        part = folder / "parts" / f"{path.stem}.json"
        try:
            commit = json.loads(part.read_text()).get("commit") if part.exists() else None
        except ValueError:
            commit = None
        if not commit:
            missing.append(path.name)
        else:
            keep[path] = str(commit)
    if missing:
        raise ValueError(
            f"{folder}: no parts/<part>.json with a commit for {', '.join(missing)}; nothing was dropped "
            "(only a folder written by `python -m mahia reference` can be pruned)"
        )
    kept = {}  # every CSV is checked before any is written: a refusal changes nothing
    for path, commit in keep.items():
        df = pd.read_csv(path, dtype={"commit": str})
        mine = (df["commit"].astype(str) == commit) & (df["profile"].astype(str) == "full")
        if not mine.any():
            raise ValueError(f"{path}: no full-profile row of commit {commit}, which parts/ names; nothing dropped")
        kept[path] = (df, mine)
    for path, (df, mine) in kept.items():
        if not mine.all():
            atomic_write_text(path, df[mine].to_csv(index=False))
    return {path.name: int((~mine).sum()) for path, (_, mine) in kept.items()}


def set_aside_run(path: str | Path, run_id: str, to: str | Path) -> int:
    """Move the rows of run ``run_id`` from the records file ``path`` to ``to`` (appended; same columns);
    returns how many moved. For a reference part that did not finish: its first cells' rows would
    otherwise sit beside the finished parts' and survive a prune (same commit). Nothing is lost: they
    go to the run's own folder."""
    path, to = Path(path), Path(to)
    if not path.exists():
        return 0
    df = pd.read_csv(path, dtype={"commit": str, "run_id": str})
    mine = df["run_id"] == run_id
    if not mine.any():
        return 0
    to.parent.mkdir(parents=True, exist_ok=True)
    moved = df[mine]
    if to.exists():
        moved = pd.concat([pd.read_csv(to, dtype={"commit": str, "run_id": str}), moved], ignore_index=True)
    atomic_write_text(to, moved.to_csv(index=False))  # first the copy, then the removal
    atomic_write_text(path, df[~mine].to_csv(index=False))
    return int(mine.sum())


def profiles(df: pd.DataFrame) -> list[str]:
    """The profiles that have records, full first."""
    found = set(df["profile"]) if not df.empty else set()
    return sorted(found, key=lambda p: (p != "full", p))


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


# The rows a headline rule read, collected while ``headline`` evaluates it (which commit made them).
_USED: list | None = None


def _use(rows: pd.DataFrame) -> None:
    if _USED is not None:
        _USED.extend(rows.index)


def _newest(sel: pd.DataFrame, column: str) -> float | None:
    if not len(sel):
        return None
    row = sel.sort_values("date").iloc[[-1]]
    _use(row)
    return float(row[column].iloc[0])


def _time(df, experiment, variant, shape=None, dtype=None):
    sel = _rows(df, experiment, shape, dtype)
    return _newest(sel[(sel["variant"] == variant) & sel["median_ms"].notna()], "median_ms")


def _field(df, experiment, variant, field, shape=None, dtype=None):
    sel = _rows(df, experiment, shape, dtype)
    return _newest(sel[(sel["variant"] == variant) & sel[field].notna()], field)


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
        sel = _rows(df, experiment, shape, dtype)
        sel = sel[sel[name].notna()]
        if not len(sel):
            return None
        _use(sel.loc[[sel[name].idxmax()]])
        return float(sel[name].max())

    return rule


def ladder_ratio(num: str, den: str) -> Callable:
    """``ratio("full_stack_train", num, den)`` for records of the ladder that starts at the loop-free baseline
    (notebook 10 records ``full_stack_tokens`` with it); None for the earlier ladder, whose "baseline" was
    the naive step at 2 x 64 tokens: another quantity under the same variant names."""
    rule = ratio("full_stack_train", num, den)
    return lambda df: rule(df) if _field(df, "full_stack_tokens", "ladder", "value", None, None) is not None else None


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
    "rmsnorm_fwdbwd_vs_best_peer": ratio(
        "rmsnorm_fwdbwd", ["F.rms_norm", "torch.compile", "liger"], "mahia_triton", RMS, "bfloat16"
    ),
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
    "moe_layer_over_gemms": ratio("moe_fwd", "grouped", "gemms", MOE, "bfloat16"),
    "moe_fwdbwd_tflops": field("moe_fwdbwd", "grouped", "tflops", MOE, "bfloat16"),
    "meta_attention_vs_loop": ratio("meta_attention_fwdbwd", "loop", "triton", GLA),
    # notebook 10: the ladder from the loop-free baseline, the loops' own gain, MFU against a plain GPT
    "full_stack_tokens_per_step": field("full_stack_tokens", "ladder", "value"),
    "full_stack_speedup": ladder_ratio("baseline", "all"),
    "hybrid_loops_speedup": field("hybrid_loops", "speedup", "value"),
    "full_stack_mfu_vs_plain_gpt": field("mfu_vs_plain_gpt", "dense-350m", "value"),
    "full_stack_mfu_datasheet": field("mfu_datasheet", "dense-350m", "value"),
    "full_stack_mfu": field("mfu", "dense-350m", "value"),
    "hybrid_mfu": field("mfu", "hybrid", "value"),
    "hybrid_mfu_datasheet": field("mfu_datasheet", "hybrid", "value"),
}
# Keys a benchmark suite derives from its own records with rules that live beside its experiments; the
# suite writes them to <folder>/<stem>.json (<stem>-<profile>.json for other profiles) and headline()
# merges them. mahia.bench.kernels.write_summary writes the kernel benchmark's (issue 13's goals).
SUITE_SUMMARIES: dict[str, list[str]] = {
    "bench_kernels_summary": [
        "rmsnorm_host_fwd_vs_native",
        "rmsnorm_host_fwdbwd_vs_native",
        *[f"{k}_fwdbwd_eager_vs_best_peer" for k in ("rmsnorm", "swiglu", "rope")],
        *[f"{k}_fwdbwd_eager_worst_vs_best_peer" for k in ("rmsnorm", "swiglu", "rope")],
        *[f"{k}_device_worst_vs_best_peer" for k in ("rmsnorm", "swiglu", "rope")],
        "rmsnorm_fwdbwd_frac_of_copy",
        "rmsnorm_fwd_worst_frac_of_copy",
    ],
}
HEADLINE_KEYS = ["copy_gbps", "matmul_bf16_tflops", *HEADLINES, *(k for ks in SUITE_SUMMARIES.values() for k in ks)]

# The project's goals for the headline metrics on an H100/H200 (direction, bound).
GOALS: dict[str, tuple[str, float]] = {
    "rmsnorm_fwd_frac_of_copy": (">=", 0.92),
    "rmsnorm_fwd_vs_liger": (">=", 1.0),
    "rmsnorm_fwdbwd_vs_best_peer": (">=", 1.4),
    "swiglu_fwd_vs_compile": (">=", 1.0),
    "swiglu_fwdbwd_vs_compile": (">=", 1.0),
    "rope_fwdbwd_frac_of_copy": (">=", 0.85),
    "attention_sdpa_vs_manual": (">=", 20.0),
    "attention_best_fwd_tflops": (">=", 550.0),
    "sync_count_optimized": ("<=", 0.0),
    "cudagraph_speedup": (">=", 3.0),
    "decode_cudagraph_speedup": (">=", 3.0),
    "amp_speedup": (">=", 3.0),
    "amp_loss_rel_diff": ("<=", 0.01),
    "checkpoint_memory_saving": (">=", 0.6),
    "checkpoint_overhead": ("<=", 0.25),
    "moe_fwd_tflops": (">=", 350.0),  # a floor, so that slower GEMMs cannot buy the ratio below
    "moe_layer_over_gemms": ("<=", 1.3),
    "meta_attention_vs_loop": (">=", 100.0),
    "full_stack_tokens_per_step": (">=", 16384),
    "full_stack_speedup": (">=", 8.0),
    "full_stack_mfu_vs_plain_gpt": (">=", 1.10),
    "full_stack_mfu_datasheet": (">=", 0.45),
    "hybrid_mfu": (">=", 0.40),
    # the kernel benchmark's (issue 13): x_vs_y = time(y) / time(x)
    "rmsnorm_host_fwd_vs_native": (">=", 0.8),
    "rmsnorm_host_fwdbwd_vs_native": (">=", 0.8),
    **{f"{k}_fwdbwd_eager_vs_best_peer": (">=", 1.0) for k in ("rmsnorm", "swiglu", "rope")},
    **{f"{k}_fwdbwd_eager_worst_vs_best_peer": (">=", 0.8) for k in ("rmsnorm", "swiglu", "rope")},
    **{f"{k}_device_worst_vs_best_peer": (">=", 0.97) for k in ("rmsnorm", "swiglu", "rope")},
    "rmsnorm_fwdbwd_frac_of_copy": (">=", 0.9),
    "rmsnorm_fwd_worst_frac_of_copy": (">=", 0.97),
}


def goal_status(key: str, value: float | None) -> str:
    """'met', 'missed', 'not measured' or '' (no goal) for a headline value."""
    if key not in GOALS:
        return ""
    if value is None:
        return "not measured"
    op, bound = GOALS[key]
    return "met" if (value >= bound if op == ">=" else value <= bound) else "missed"


def _ceilings_doc(folder: Path, profile: str) -> dict | None:
    path = files.profile_file(folder, "ceilings", profile)
    if not path.exists():
        return None
    c = json.loads(path.read_text())
    return c if c.get("profile", "full") == profile else None  # files without a profile are full runs'


def _suite_summary(folder: Path, stem: str, profile: str) -> dict | None:
    path = files.profile_file(folder, stem, profile)
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return doc if doc.get("profile", "full") == profile else None


def headline(folder: str | Path, profile: str = "full") -> dict:
    """Headline metrics of one profile of a device folder, with where each comes from.

    Returns ``{"metrics": {key: value or None}, "sources": {key: [commits]}, "commits": [...],
    "newest_record": date, "newest_commit": commit, "stale": [keys]}``: ``sources`` names the commit(s)
    of the records (or ceilings) a measured metric was derived from; ``stale`` lists the metrics made
    by another commit than the newest record's.
    """
    global _USED
    folder = Path(folder)
    records = load_records(folder)
    records = records[records["profile"] == profile] if not records.empty else records
    df = latest(records)
    metrics: dict[str, float | None] = {k: None for k in HEADLINE_KEYS}
    sources: dict[str, list[str]] = {}
    ceil = _ceilings_doc(folder, profile)
    if ceil is not None:
        for k in ("copy_gbps", "matmul_bf16_tflops"):
            metrics[k] = ceil.get(k)
            if metrics[k] is not None:
                sources[k] = [ceil.get("commit") or UNKNOWN]
    if not df.empty:
        for k, rule in HEADLINES.items():
            _USED = []
            try:
                v = rule(df)
                used = list(_USED)
            finally:
                _USED = None
            metrics[k] = None if v is None or v != v else round(float(v), 6)
            if metrics[k] is not None:
                sources[k] = sorted(set(df.loc[used, "commit"].astype(str))) or [UNKNOWN]
    for stem, keys in SUITE_SUMMARIES.items():
        suite = _suite_summary(folder, stem, profile)
        if suite is None:
            continue
        for k in keys:
            v = suite.get("metrics", {}).get(k)
            metrics[k] = None if v is None else round(float(v), 6)
            if metrics[k] is not None:
                sources[k] = list(suite.get("commits") or [UNKNOWN])
    newest = records.sort_values("date").iloc[-1] if not records.empty else None
    newest_commit = (
        str(newest["commit"]) if newest is not None else ((ceil.get("commit") or UNKNOWN) if ceil is not None else None)
    )
    return {
        "profile": profile,
        "newest_record": None if newest is None else str(newest["date"]),
        "newest_commit": newest_commit,
        "commits": sorted({c for cs in sources.values() for c in cs}),
        "stale": [k for k, cs in sources.items() if any(c != newest_commit for c in cs)],
        "metrics": metrics,
        "sources": sources,
    }


def summarize(folder: str | Path, profile: str = "full") -> dict:
    """Headline metrics of one profile of a device folder (None where not measured)."""
    return headline(folder, profile)["metrics"]


def write_summary(folder: str | Path, profile: str = "full") -> dict:
    """Write one profile's summary (``summary.json`` for full, ``summary-<profile>.json`` otherwise);
    returns its metrics. Only that profile's file is touched."""
    folder = Path(folder)
    dev = json.loads((folder / "device.json").read_text()) if (folder / "device.json").exists() else {}
    doc = {"device": dev.get("gpu") or dev.get("cpu"), "device_slug": folder.name, **headline(folder, profile)}
    atomic_write_text(files.profile_file(folder, "summary", profile), json.dumps(doc, indent=2) + "\n")
    return doc["metrics"]


def write_summaries(folder: str | Path) -> dict[str, dict]:
    """Write the summary of every profile that has records or ceilings; ``{profile: metrics}``."""
    folder = Path(folder)
    found = profiles(load_records(folder))
    for path in folder.glob("ceilings*.json"):
        p = path.stem.partition("-")[2] or "full"
        if p not in found and _ceilings_doc(folder, p) is not None:
            found.append(p)
    return {p: write_summary(folder, p) for p in found}


def read_summary(folder: str | Path, profile: str = "full") -> dict:
    """The summary document of one profile (raises FileNotFoundError when there is none)."""
    path = files.profile_file(folder, "summary", profile)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist: {Path(folder)} has no {profile}-profile summary "
            "(`python -m mahia report <folder>` writes it from the records)"
        )
    return json.loads(path.read_text())


def records_for(folders: Iterable[Path]) -> pd.DataFrame:
    frames = [load_records(f) for f in folders]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
