"""Execute the notebooks headlessly with papermill and write the run report.

Each notebook runs in its own process (``python -m papermill``) so that a per-notebook time limit
can stop it, a crash cannot take the runner down, and one GPU notebook's memory is gone before the
next starts. A failing or timed-out notebook is reported (with the failing cell) and the run goes
on; the exit code is non-zero at the end if any failed.
"""
from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from mahia.measure.results import REPO_ROOT, default_figures_dir, default_results_dir

__all__ = ["UsageError", "list_notebooks", "select_notebooks", "run", "notebook_is_clean", "clean_notebook"]

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


def list_notebooks(folder: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if NAME_RE.match(p.name))


def select_notebooks(spec: str | None, folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """``None``/'all' -> every notebook; else comma-separated numbers ('00,3') or name prefixes."""
    nbs = list_notebooks(folder)
    if not nbs:
        raise UsageError(f"no notebooks found in {folder}")
    if spec in (None, "", "all"):
        return nbs
    chosen: list[Path] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item.isdigit():
            hits = [p for p in nbs if int(p.name[:2]) == int(item)]
        else:
            stem = item[:-6] if item.endswith(".ipynb") else item
            hits = [p for p in nbs if p.stem == stem or p.stem[3:] == stem or p.stem.startswith(stem)]
        if len(hits) != 1:
            names = ", ".join(p.stem for p in nbs)
            why = "matches nothing" if not hits else "is ambiguous"
            raise UsageError(f"notebook {item!r} {why}; available: {names}")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


RESERVED = ("device", "profile", "seed", "interactive", "results_dir")


def parse_params(items: Sequence[str]) -> dict:
    """``["batch=8", "modes=['default']"]`` -> ``{"batch": 8, "modes": ["default"]}``."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"--param expects NAME=VALUE with a Python identifier as NAME, got {item!r}")
        if name in RESERVED:
            raise UsageError(f"--param {name}=...: use the runner's own --{name.replace('_', '-')} option")
        try:
            value = json.loads(raw)
        except ValueError:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def notebook_is_clean(path: Path) -> bool:
    """True when no code cell has outputs or an execution count."""
    nb = _load(path)
    return not any(c.get("outputs") or c.get("execution_count")
                   for c in nb["cells"] if c["cell_type"] == "code")


def clean_notebook(path: Path) -> bool:
    """Strip outputs and execution counts in place; returns True if the file changed."""
    nb = _load(path)
    changed = False
    for c in nb["cells"]:
        if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count")):
            c["outputs"], c["execution_count"] = [], None
            changed = True
    if changed:
        Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def _has_parameters_cell(path: Path) -> bool:
    return any("parameters" in c.get("metadata", {}).get("tags", []) for c in _load(path)["cells"])


def declared_parameters(path: Path) -> set[str]:
    """The names a notebook's cell tagged ``parameters`` assigns (empty without one)."""
    names: set[str] = set()
    for c in _load(path)["cells"]:
        if "parameters" in c.get("metadata", {}).get("tags", []):
            try:
                tree = ast.parse("".join(c["source"]))
            except SyntaxError:
                continue
            names |= {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      for t in node.targets if isinstance(t, ast.Name)}
    return names


def _failure(out_nb: Path) -> tuple[int | None, str]:
    """(cell number, 'Error: message') of the first cell with an error output."""
    if not out_nb.exists():
        return None, "no output notebook was written"
    try:
        nb = _load(out_nb)
    except ValueError:
        return None, "output notebook is unreadable"
    code_idx = 0
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        code_idx += 1
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                tags = c.get("metadata", {}).get("tags", [])
                if "injected-parameters" in tags:
                    continue
                return code_idx, f"{o.get('ename')}: {str(o.get('evalue'))[:300]}"
    return None, "the kernel stopped without an error cell (killed, or out of memory?)"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(*, profile: str = "auto", device: str = "auto", notebooks: str | None = None,
        out: str | None = None, timeout: float = 1800, results_dir: str | None = None,
        figures_dir: str | None = None, seed: int = 0, progress: bool = True,
        params: Sequence[str] = ()) -> int:
    """Execute notebooks; returns the exit code (0 all ok, 1 some failed).

    ``params`` are extra ``NAME=VALUE`` settings injected into every selected notebook's
    parameters cell (VALUE is read as JSON or a Python literal, else kept as a string)."""
    import torch

    from mahia.measure import hardware
    from mahia.measure.report import write_report

    if profile not in ("auto", "quick", "full"):
        raise UsageError(f"--profile must be auto, quick or full, got {profile!r}")
    try:
        dev = hardware.resolve_device(device)
    except (RuntimeError, ValueError) as e:
        raise UsageError(str(e)) from None
    if timeout <= 0:
        raise UsageError(f"--timeout must be positive seconds, got {timeout}")
    prof = profile if profile != "auto" else ("full" if dev.type == "cuda" else "quick")
    extra = parse_params(params)
    chosen = select_notebooks(notebooks)
    # A -p NAME that no selected notebook declares would be injected and then ignored (a typo, or the
    # wrong notebook): refuse it. Each notebook gets only the names its parameters cell declares.
    declared = {nb: declared_parameters(nb) for nb in chosen}
    unknown = sorted(set(extra) - set().union(*declared.values()))
    if unknown:
        valid = sorted(set().union(*declared.values()) - set(RESERVED))
        raise UsageError(f"--param {', '.join(unknown)}: no selected notebook has such a parameter; "
                         f"theirs: {', '.join(valid)}")
    try:
        import papermill  # noqa: F401
    except ImportError:
        raise UsageError("papermill is not installed: pip install 'mahia[notebooks]' (or use `make run`)") from None

    slug = hardware.device_slug(dev)
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    out_dir = Path(out) if out else REPO_ROOT / "runs" / f"{datetime.now():%Y-%m-%d}-{slug}-{prof}"
    out_dir.mkdir(parents=True, exist_ok=True)
    res_root = Path(results_dir).resolve() if results_dir else default_results_dir()
    fig_root = Path(figures_dir).resolve() if figures_dir else default_figures_dir()
    env = dict(os.environ, MAHIA_RUN_ID=run_id, MAHIA_HEADLESS="1", MAHIA_RESULTS_DIR=str(res_root),
               MAHIA_FIGURES_DIR=str(fig_root), MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    # A notebook runs what a user's session would: the test suite's Triton interpreter (set by
    # tests/conftest.py on CPU machines) must not leak into the kernels the runner starts.
    env.pop("TRITON_INTERPRET", None)
    del torch

    outcomes = []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(chosen), unit="notebook", file=sys.stderr)
    print(f"mahia run {run_id}: {len(chosen)} notebook(s), device={dev}, profile={prof} -> {out_dir}",
          flush=True)
    for nb in chosen:
        if bar is not None:
            bar.set_description(nb.stem)
        out_nb, log = out_dir / nb.name, out_dir / f"{nb.stem}.log"
        outcome = {"name": nb.stem, "output": str(out_nb)}
        if not _has_parameters_cell(nb):
            outcome.update(status="failed", seconds=0.0, cell=None,
                           error="no cell tagged 'parameters' (see CONTRIBUTING.md)")
            outcomes.append(outcome)
            if bar is not None:
                bar.update(1)
            continue
        cmd = [sys.executable, "-m", "papermill", str(nb), str(out_nb), "-k", "python3",
               "--cwd", str(nb.parent), "--log-output", "--no-progress-bar",
               "-p", "device", str(dev), "-p", "profile", prof, "-p", "seed", str(seed),
               "-p", "interactive", "False", "-p", "results_dir", str(res_root)]
        mine = {k: v for k, v in extra.items() if k in declared[nb]}
        if mine:
            cmd += ["-y", json.dumps(mine)]  # JSON is YAML: lists and tuples keep their type
        t0 = time.perf_counter()
        with open(log, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
        secs = time.perf_counter() - t0
        if rc == 0:
            outcome.update(status="ok", seconds=secs)
        elif rc is None:
            cell, _ = _failure(out_nb)
            outcome.update(status="timeout", seconds=secs, cell=cell,
                           error=f"stopped after the {timeout:.0f} s limit (--timeout)")
        else:
            cell, err = _failure(out_nb)
            outcome.update(status="failed", seconds=secs, cell=cell, error=err)
        outcomes.append(outcome)
        msg = f"  {nb.stem}: {outcome['status']} in {secs:.0f} s"
        if outcome["status"] != "ok":
            msg += f" — cell {outcome.get('cell')}: {outcome.get('error')} (log: {log})"
        (bar.write if bar is not None else print)(msg)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()

    folder = res_root / slug
    if folder.exists():
        md, html = write_report(folder, out_dir, outcomes, run_id=run_id)
        print(f"report: {md} and {html}; results: {folder}; figures: {fig_root / slug}")
    (out_dir / "outcomes.json").write_text(json.dumps(outcomes, indent=2) + "\n")
    failed = [o for o in outcomes if o["status"] != "ok"]
    if failed:
        print(f"{len(failed)} of {len(outcomes)} notebook(s) did not finish: "
              + ", ".join(f"{o['name']} ({o['status']})" for o in failed), file=sys.stderr)
        return 1
    print(f"all {len(outcomes)} notebook(s) ran")
    return 0
