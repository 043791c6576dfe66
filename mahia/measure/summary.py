"""Reading result records and deriving the headline metrics (``summary.json``) from the newest of them.

A ratio key ``x_vs_y`` is time(y) / time(x): above 1 means x is faster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from mahia.measure import files
from mahia.measure.files import UNKNOWN, atomic_write_text

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
    for c in ("profile", "commit"):
        df[c] = df[c].astype(object).where(df[c].notna(), UNKNOWN).astype(str)
    return df


def profiles(df: pd.DataFrame) -> list[str]:
    """The profiles that have records, full first."""
    found = set(df["profile"]) if not df.empty else set()
    return sorted(found, key=lambda p: (p != "full", p))


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Newest row per (experiment, variant, shape, dtype), whichever notebook wrote it, from each notebook's newest
    commit only: a case that an older run recorded and the newer one dropped (a smaller grid) does not linger."""
    if df.empty:
        return df
    df, key = df.sort_values("date"), ["experiment", "variant", "shape", "dtype"]
    df = df[df["commit"] == df.groupby("notebook")["commit"].transform("last")]
    return df.groupby(key, as_index=False, sort=False).tail(1).reset_index(drop=True)


def _rows(df, experiment, shape=None, dtype=None):
    return df[
        (df["experiment"] == experiment)
        & (shape is None or df["shape"] == shape)
        & (dtype is None or df["dtype"] == dtype)
    ]


# The rows a headline rule read, collected while ``headline`` evaluates it (which commit made them).
_USED: list | None = None


def _use(rows: pd.DataFrame) -> pd.DataFrame:
    if _USED is not None:
        _USED.extend(rows.index)
    return rows


def _newest(sel: pd.DataFrame, column: str) -> float | None:
    return float(_use(sel.sort_values("date").iloc[[-1]])[column].iloc[0]) if len(sel) else None


def _field(df, experiment, variant, field="median_ms", shape=None, dtype=None):
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
        t_den = _field(df, experiment, den, "median_ms", sh, dtype)
        t_num = [t for t in (_field(df, experiment, v, "median_ms", sh, dtype) for v in nums) if t is not None]
        return min(t_num) / t_den if t_den and t_num else None

    return rule


def field(experiment, variant, name, shape=None, dtype=None) -> Callable:
    return lambda df: _field(df, experiment, variant, name, shape, dtype)


def best(experiment, name, shape=None, dtype=None) -> Callable:
    def rule(df):
        sel = _rows(df, experiment, shape, dtype)
        sel = sel[sel[name].notna()]
        return float(_use(sel.loc[[sel[name].idxmax()]])[name].iloc[0]) if len(sel) else None

    return rule


def ladder_ratio(num: str, den: str) -> Callable:
    """``ratio("full_stack_train", num, den)`` for records of the ladder that starts at the loop-free baseline
    (notebook 10 records ``full_stack_tokens`` with it); None for the earlier ladder, whose "baseline" was
    the naive step at 2 x 64 tokens: another quantity under the same variant names."""
    rule = ratio("full_stack_train", num, den)
    return lambda df: rule(df) if _field(df, "full_stack_tokens", "ladder", "value", None, None) is not None else None


def worst(*rules: Callable) -> Callable:
    """The smallest value of ``rules``; None unless every rule has one."""

    def rule(df):
        values = [r(df) for r in rules]
        return None if any(v is None for v in values) else min(values)

    return rule


# Canonical shapes of the headline measurements (sweeps use other experiment names).
RMS, SWI, ROPE = "16384x4096", "16384x11008", "8x2048x32x8x128"
MOE, GLA = "N=16384,D=1024,H=2048,E=64,k=2", "B=4,H=8,T=2048,K=64,V=64"
GLA_MODEL = ("B=16,H=8,T=1024,K=64,V=64", "B=8,H=16,T=2048,K=64,V=64")  # mahia.bench.meta.FLA_SHAPES


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
    "gla_fwd_vs_fla": worst(*(ratio("gla_fwd", "fla", "triton", s, "bfloat16") for s in GLA_MODEL)),
    "gla_fwdbwd_vs_fla": worst(*(ratio("gla_fwdbwd", "fla", "triton", s, "bfloat16") for s in GLA_MODEL)),
    # notebook 10: the ladder from the loop-free baseline, the loops' own gain, MFU against a plain GPT
    "full_stack_tokens_per_step": field("full_stack_tokens", "ladder", "value"),
    "full_stack_speedup": ladder_ratio("baseline", "all"),
    "hybrid_loops_speedup": field("hybrid_loops", "speedup", "value"),
    # ... and issue 36's: no rung slower than the one below, compile's gain, the compiled step (no graph) on the GPU
    "full_stack_rungs_slower": field("full_stack_rungs", "slower", "value"),
    "full_stack_compile_gain": field("full_stack_compile", "gain", "value"),
    "full_stack_device_busy": field("full_stack_compiled_step", "device_busy", "value"),
    "full_stack_launches_per_step": field("full_stack_compiled_step", "launches", "value"),
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
    "gla_fwd_vs_fla": (">=", 1.0),  # the worse of the two model shapes (issue 36)
    "gla_fwdbwd_vs_fla": (">=", 1.0),
    "full_stack_tokens_per_step": (">=", 16384),
    "full_stack_speedup": (">=", 8.0),
    "full_stack_rungs_slower": ("<=", 0),
    "full_stack_compile_gain": (">=", 1.15),
    "full_stack_device_busy": (">=", 0.80),
    "full_stack_launches_per_step": ("<=", 600),
    # compiled, both models run the same cuBLAS and cuDNN kernels: parity, not a gain (issue 36)
    "full_stack_mfu_vs_plain_gpt": (">=", 0.98),
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


def _profile_doc(folder: Path, stem: str, profile: str) -> dict | None:
    """``<stem>.json`` (``<stem>-<profile>.json``) of one profile; a file without a profile is a full run's."""
    path = files.profile_file(folder, stem, profile)
    doc = json.loads(path.read_text()) if path.exists() else None
    return doc if doc is not None and doc.get("profile", "full") == profile else None


def headline(folder: str | Path, profile: str = "full") -> dict:
    """Headline metrics of one profile of a device folder, with where each comes from: ``{"metrics": {key: value
    or None}, "sources": {key: [commits]}, "commits", "newest_record", "newest_commit", "stale": [keys]}``;
    ``sources`` names the commits of the records (or ceilings, or suite summary) a metric was derived from,
    ``stale`` the metrics made by another commit than the newest record's."""
    global _USED
    folder = Path(folder)
    records = load_records(folder)
    records = records[records["profile"] == profile] if not records.empty else records
    df = latest(records)
    found: dict[str, tuple] = {}  # key: (value, the commits it was made from)
    ceil = _profile_doc(folder, "ceilings", profile)
    if ceil is not None:
        found |= {k: (ceil.get(k), [ceil.get("commit") or UNKNOWN]) for k in ("copy_gbps", "matmul_bf16_tflops")}
    for k, rule in HEADLINES.items() if not df.empty else ():
        _USED = []
        try:
            v, used = rule(df), list(_USED)
        finally:
            _USED = None
        commits = sorted(set(df.loc[used, "commit"].astype(str))) or [UNKNOWN]
        found[k] = (None if v is None or v != v else round(float(v), 6), commits)
    for stem, keys in SUITE_SUMMARIES.items():
        suite = _profile_doc(folder, stem, profile)
        for k in keys if suite is not None else ():
            v = suite.get("metrics", {}).get(k)
            found[k] = (None if v is None else round(float(v), 6), list(suite.get("commits") or [UNKNOWN]))
    metrics = {k: found.get(k, (None,))[0] for k in HEADLINE_KEYS}
    sources = {k: cs for k, (v, cs) in found.items() if v is not None}
    newest = records.sort_values("date").iloc[-1] if not records.empty else None
    newest_commit = str(newest["commit"]) if newest is not None else ceil and (ceil.get("commit") or UNKNOWN)
    return {
        "profile": profile,
        "newest_record": None if newest is None else str(newest["date"]),
        "newest_commit": newest_commit,
        "commits": sorted({c for cs in sources.values() for c in cs}),
        "stale": [k for k, cs in sources.items() if any(c != newest_commit for c in cs)],
        "metrics": metrics,
        "sources": sources,
    }


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
        if p not in found and _profile_doc(folder, "ceilings", p) is not None:
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
