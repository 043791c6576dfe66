"""Result records: one row per measurement, appended to CSV files, summarized into headline metrics.

Per device (``<slug>``, ``mahia.measure.hardware.device_slug``) under a results root (``runs/results``, or the
committed ``data/results``: ``mahia.measure.files``)::

    <slug>/device.json          which machine the folder belongs to (checked on every write)
    <slug>/ceilings.json        measured copy bandwidth and matmul rates; ceilings-<profile>.json for another profile
    <slug>/<notebook>.csv       records, appended run after run
    <slug>/summary.json         headline metrics of the full profile from its newest records; summary-<profile>.json
    <slug>/parts/<part>.json    (reference only) the commit each notebook or suite last ran at

Every record carries its ``profile`` and ``commit``; every write goes through a temporary file and a rename.
A ratio key ``x_vs_y`` is time(y) / time(x): above 1 means x is faster.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from mahia.measure import files
from mahia.measure.files import UNKNOWN, atomic_write_text, default_results_dir
from mahia.measure.hardware import Ceilings, device_report, device_slug, resolve_device
from mahia.measure.summary import COLUMNS, write_summary
from mahia.measure.timing import Timing

ROLES = ("baseline", "optimized", "peer", "reference", "metric")


def _shape_str(shape) -> str:
    """``(4, 1024)`` -> ``4x1024``; a string as it is."""
    return "x".join(str(int(s)) for s in shape) if isinstance(shape, (tuple, list)) else str(shape or "")


def _dtype_str(dtype) -> str:
    return str(dtype or "").replace("torch.", "")


class Recorder:
    """The records of one notebook (or benchmark) on one device: ``timing`` a timed variant, ``metric`` a single
    value; each row is written at once, so a notebook that fails later keeps what it measured. ``profile``: given,
    else the ceilings', else ``MAHIA_PROFILE``, else "unknown"; ``commit``: given, else ``files.run_commit()``."""

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
        keys = ("device", "device_slug", "gpu") + (() if self.report.get("gpu") else ("cpu", "cpu_count"))
        mine = {k: self.report.get(k) for k in keys}  # a GPU's folder: any host of it (each row names its host)
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

    def _append(self, experiment: str, variant: str, role: str, shape, dtype, notes: str, **fields) -> dict:
        """Write one row: the given fields, stamped with the notebook, device, versions, date, run, profile, commit."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        files.check_writable(self.path)
        self._check_folder()
        r = self.report
        row = {
            **dict(notebook=self.notebook, device=r.get("gpu") or r.get("cpu"), device_slug=self.slug),
            **dict(torch=r.get("torch"), triton=r.get("triton"), run_id=self.run_id, profile=self.profile),
            **dict(commit=self.commit, date=datetime.now(timezone.utc).isoformat(timespec="seconds")),
            **dict(experiment=experiment, variant=variant, role=role, shape=_shape_str(shape), dtype=_dtype_str(dtype)),
            **dict(notes=notes, **fields),
        }
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
        if not isinstance(timing, Timing):
            raise TypeError(f"timing must be a mahia.measure.timing.Timing, got {type(timing).__name__}")
        sec = timing.median_ms * 1e-3
        gbps = bytes / sec / 1e9 if bytes else None
        tflops = flops / sec / 1e12 if flops else None
        if limit is None and (bytes or flops):
            low = _dtype_str(dtype) in ("bfloat16", "float16")
            limit = "matmul_bf16" if flops and low else "matmul_fp32" if flops else "copy"
        frac = None
        if limit and self.ceilings is not None:
            achieved = gbps if limit == "copy" else tflops
            frac = achieved / self.ceilings.limit(limit) if achieved else None
        t, peak = timing, timing.peak_mem_bytes
        fields = dict(median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms, n=t.n, first_call_ms=t.first_call_ms)
        fields |= dict(peak_mem_mb=peak / 2**20 if peak is not None else None, bytes=bytes, flops=flops, gbps=gbps)
        fields |= dict(tflops=tflops, limit=limit, frac_of_limit=frac, rel_err=rel_err)
        return self._append(experiment, variant, role, shape, dtype, notes, **fields)

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
        return self._append(experiment, variant, role, shape, dtype, notes, value=float(value), unit=unit)

    def frame(self) -> pd.DataFrame:
        """This recorder's rows (this run only) as a DataFrame."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def summarize(self) -> dict:
        """Re-derive the summary of this recorder's profile (``summary.json`` for the full profile,
        ``summary-<profile>.json`` otherwise) from all its records; returns the metrics."""
        return write_summary(self.folder, self.profile)
