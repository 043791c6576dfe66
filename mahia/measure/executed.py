"""The executed notebooks committed beside the reference results, and how big they may be.

``python -m mahia reference`` copies each notebook it ran to ``data/results/<gpu>/notebooks/``, so that
the run can be read (and turned into a static site, ``python -m mahia site``) without a GPU. A copy keeps
what a reader needs and leaves out what only makes the repository heavy:

* widget state: ``metadata.widgets`` and the widget views of outputs (a reference run builds no
  explorer; what state there is would be JSON no static page can use);
* long streams: a stream output (consecutive ones of a cell merged, progress-bar rewrites after ``\\r``
  resolved) over ``max_stream_lines`` keeps its first ``stream_head`` and last ``stream_tail`` lines
  around a ``... N lines trimmed ...`` line;
* figures as PNG: an output that has a PNG loses its SVG and PDF copies of the same figure;
* the folder within ``max_total_bytes``: when all the notebooks there are larger together, the largest
  images are replaced by a line that says so, largest first, until they fit.

Every change is reported as a line (``copy_executed``'s return value), so a run says what it trimmed.
Trimming is idempotent: a notebook already trimmed is left as it is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mahia.measure.files import atomic_write_text

__all__ = ["Policy", "trim_notebook", "cap_folder", "copy_executed", "notebook_bytes"]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
DUPLICATES_OF_PNG = ("image/svg+xml", "application/pdf")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml", "application/pdf")


@dataclass(frozen=True)
class Policy:
    """What a committed executed notebook keeps (see the module's docstring)."""

    max_stream_lines: int = 120
    stream_head: int = 60
    stream_tail: int = 40
    max_total_bytes: int = 20 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_stream_lines", "stream_head", "stream_tail", "max_total_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Policy: {name} must be a positive int, got {value!r}")
        if self.stream_head + self.stream_tail + 1 > self.max_stream_lines:
            raise ValueError(
                f"Policy: stream_head + stream_tail + 1 ({self.stream_head + self.stream_tail + 1}) must not "
                f"exceed max_stream_lines ({self.max_stream_lines}): a trimmed stream would be trimmed again"
            )


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def notebook_bytes(nb: dict) -> int:
    """The size of ``nb`` as ``copy_executed`` writes it."""
    return len(_dump(nb).encode())


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _resolve_returns(text: str) -> str:
    """A line rewritten with ``\\r`` (a progress bar) as a terminal shows it: the text after the last one."""
    out = []
    for line in text.split("\n"):
        if "\r" in line:
            parts = [p for p in line.split("\r") if p]
            line = parts[-1] if parts else ""
        out.append(line)
    return "\n".join(out)


def _merge_streams(outputs: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for o in outputs:
        prev = merged[-1] if merged else None
        if (
            o.get("output_type") == "stream"
            and prev is not None
            and prev.get("output_type") == "stream"
            and prev.get("name") == o.get("name")
        ):
            prev["text"] = _text(prev["text"]) + _text(o.get("text", ""))
        else:
            merged.append(dict(o) if o.get("output_type") == "stream" else o)
    return merged


def _trim_lines(text: str, policy: Policy) -> tuple[str, int]:
    lines = text.split("\n")
    ends_with_newline = lines[-1] == ""
    if ends_with_newline:
        lines.pop()
    if len(lines) <= policy.max_stream_lines:
        return text, 0
    cut = len(lines) - policy.stream_head - policy.stream_tail
    kept = [*lines[: policy.stream_head], f"... {cut} lines trimmed ...", *lines[len(lines) - policy.stream_tail :]]
    return "\n".join(kept) + ("\n" if ends_with_newline else ""), cut


def trim_notebook(nb: dict, policy: Policy | None = None) -> list[str]:
    """Apply the per-notebook part of the policy (default ``Policy()``) to ``nb`` (a notebook's JSON as a
    dict) in place; returns what was changed, one phrase each (empty when nothing was)."""
    policy = policy or Policy()
    notes = []
    state = nb.get("metadata", {}).pop("widgets", None)
    if state is not None:
        notes.append(f"widget state dropped ({len(json.dumps(state)) / 1024:,.1f} KiB)")
    views = streams = cut_lines = dupes = dupe_bytes = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        outputs = _merge_streams(cell.get("outputs", []))
        for o in outputs:
            if o.get("output_type") == "stream":
                text = _resolve_returns(_text(o.get("text", "")))
                text, cut = _trim_lines(text, policy)
                o["text"] = text
                if cut:
                    streams, cut_lines = streams + 1, cut_lines + cut
                continue
            data = o.get("data")
            if not isinstance(data, dict):
                continue
            if WIDGET_VIEW in data:
                del data[WIDGET_VIEW]
                data.setdefault("text/plain", "[an ipywidgets control: interactive only in a running notebook]")
                views += 1
            if "image/png" in data:
                for mime in DUPLICATES_OF_PNG:
                    if mime in data:
                        dupe_bytes += len(_text(data.pop(mime)))
                        dupes += 1
        cell["outputs"] = outputs
    if views:
        notes.append(f"{views} widget view(s) left as text")
    if streams:
        notes.append(f"{streams} stream output(s) trimmed ({cut_lines:,} lines)")
    if dupes:
        notes.append(f"{dupes} SVG/PDF copies of PNG figures dropped ({dupe_bytes / 1024:,.1f} KiB)")
    return notes


def _images(nb: dict) -> list[tuple[int, dict, str]]:
    """(size, output data, mime) of every image in ``nb``."""
    found = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            data = o.get("data")
            if isinstance(data, dict):
                found += [(len(_text(data[m])), data, m) for m in IMAGE_TYPES if m in data]
    return found


def cap_folder(folder: Path, max_bytes: int) -> list[str]:
    """Keep the notebooks of ``folder`` within ``max_bytes`` together: replace their largest images by a
    line that says so, largest first, until they fit. Returns one line per notebook changed, and one that
    says so if the notebooks are still too large without any image."""
    paths = sorted(Path(folder).glob("*.ipynb"))
    books = {p: json.loads(p.read_text()) for p in paths}
    sizes = {p: notebook_bytes(nb) for p, nb in books.items()}
    total = sum(sizes.values())
    if total <= max_bytes:
        return []
    images = sorted(
        ((size, p, data, m) for p, nb in books.items() for size, data, m in _images(nb)), key=lambda t: -t[0]
    )
    dropped: dict[Path, list[int]] = {}
    for size, p, data, mime in images:
        if total <= max_bytes:
            break
        del data[mime]
        data.setdefault(
            "text/plain",
            f"[{mime} output of {size / 1024:,.0f} KiB left out: the committed notebooks are kept under "
            f"{max_bytes / 2**20:g} MiB (mahia.measure.executed); the figure folder has the saved plots]",
        )
        dropped.setdefault(p, []).append(size)
        new_size = notebook_bytes(books[p])
        total, sizes[p] = total - sizes[p] + new_size, new_size
    notes = []
    for p, gone in dropped.items():
        atomic_write_text(p, _dump(books[p]))
        notes.append(f"{p.name}: {len(gone)} image(s) left out ({sum(gone) / 2**20:,.2f} MiB) to stay under the cap")
    if total > max_bytes:
        notes.append(
            f"{folder}: still {total / 2**20:,.2f} MiB without any image, over the {max_bytes / 2**20:g} MiB cap: "
            "the notebooks print too much"
        )
    return notes


def copy_executed(sources: Iterable[Path], dest: Path, policy: Policy | None = None) -> list[str]:
    """Copy executed notebooks into ``dest`` under the policy (default ``Policy()``; a copy of the same name
    is replaced), then keep ``dest`` within ``policy.max_total_bytes``; returns what was trimmed, one line
    per notebook."""
    policy = policy or Policy()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    notes = []
    for src in sources:
        src = Path(src)
        try:
            nb = json.loads(src.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{src}: not a readable notebook ({e})") from None
        before = src.stat().st_size
        changes = trim_notebook(nb, policy)
        text = _dump(nb)
        atomic_write_text(dest / src.name, text)
        size = len(text.encode())
        what = "; ".join(changes) if changes else "nothing trimmed"
        notes.append(f"{src.name}: {what}; {before / 1024:,.0f} KiB -> {size / 1024:,.0f} KiB")
    return notes + cap_folder(dest, policy.max_total_bytes)
