"""The executed notebooks ``python -m mahia reference`` commits to ``data/results/<gpu>/notebooks/`` (what
``python -m mahia site`` renders): what a reader needs, without what makes the repository heavy or ties it to one
machine. Widget state and views go (no static page can use them); streams are merged (nbconvert's
``CoalesceStreamsPreprocessor``) and one over ``MAX_LINES`` keeps its first ``HEAD`` and last ``TAIL`` lines;
absolute paths lose their machine's part (``/any/where/site-packages/torch/...`` -> ``site-packages/torch/...``);
a figure keeps its PNG only; the largest images go until the folder fits ``MAX_TOTAL_BYTES``. Every change is
reported; trimming twice changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from mahia.measure.files import atomic_write_text

__all__ = ["trim_notebook", "cap_folder", "copy_executed"]

MAX_LINES, HEAD, TAIL = 120, 60, 40
MAX_TOTAL_BYTES = 20 * 2**20
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
IMAGES = ("image/png", "image/jpeg", "image/svg+xml", "application/pdf")
# A path from the file system's root (not inside a word or URL; after a terminal colour code too) up to a folder a
# reader knows by its name.
ABSOLUTE = re.compile(
    r"(?:(?<![\w:/.~-])|(?<=\dm))(?:/[\w.+@-]+)+/(?=(?:site-packages|data|runs|mahia|figures|notebooks|tests)/)"
)


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _dump(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _trim(text: str) -> tuple[str, int]:
    lines = ABSOLUTE.sub("", text).split("\n")
    end = [lines.pop()] if lines[-1] == "" else []
    if len(lines) <= MAX_LINES:
        return "\n".join(lines + end), 0
    cut = len(lines) - HEAD - TAIL
    return "\n".join([*lines[:HEAD], f"... {cut} lines trimmed ...", *lines[-TAIL:], *end]), cut


def trim_notebook(nb: dict) -> list[str]:
    """Apply the per-notebook part of the policy to ``nb`` (a notebook's JSON as a dict) in place; returns what
    was changed, one phrase each."""
    import nbformat
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    notes = []
    if (state := nb.get("metadata", {}).pop("widgets", None)) is not None:
        notes.append(f"widget state dropped ({len(json.dumps(state)) / 1024:,.1f} KiB)")
    node = nbformat.reads(json.dumps(nb), as_version=4)  # a stream's lines joined: the preprocessor reads one string
    nb["cells"] = json.loads(json.dumps(CoalesceStreamsPreprocessor().preprocess(node, {})[0]["cells"]))
    views = cut_lines = dupes = 0
    for cell in nb["cells"]:
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):  # papermill's: results_dir = "/..."
            cell["source"] = ABSOLUTE.sub("", _text(cell["source"]))
        for o in cell.get("outputs", []):
            if o["output_type"] == "stream":
                o["text"], cut = _trim(_text(o["text"]))
                cut_lines += cut
            elif o["output_type"] == "error":
                o["traceback"] = [ABSOLUTE.sub("", line) for line in o["traceback"]]
            data = o.get("data", {})
            if data.pop(WIDGET_VIEW, None) is not None:
                data.setdefault("text/plain", "[an ipywidgets control: interactive only in a running notebook]")
                views += 1
            for mime in ("text/plain", "text/html", "text/markdown"):
                if mime in data:
                    data[mime] = ABSOLUTE.sub("", _text(data[mime]))
            if "image/png" in data:
                dupes += sum(data.pop(m, None) is not None for m in ("image/svg+xml", "application/pdf"))
    notes += [f"{views} widget view(s) left as text"] if views else []
    notes += [f"{cut_lines:,} lines of streams trimmed"] if cut_lines else []
    notes += [f"{dupes} SVG/PDF copies of PNG figures dropped"] if dupes else []
    return notes


def cap_folder(folder: Path, max_bytes: int = MAX_TOTAL_BYTES) -> list[str]:
    """Keep the notebooks of ``folder`` within ``max_bytes`` together: replace their largest images by a line that
    says so, largest first, until they fit. Returns one line per notebook changed, and one if still too large."""
    books = {p: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.ipynb"))}
    total = sum(len(_dump(nb).encode()) for nb in books.values())
    images = [
        (len(_text(o["data"][m])), p, o["data"], m)
        for p, nb in books.items()
        for c in nb["cells"]
        for o in c.get("outputs", [])
        for m in IMAGES
        if m in o.get("data", {})
    ]
    dropped: dict[Path, list[int]] = {}
    for size, p, data, mime in sorted(images, key=lambda t: -t[0]):
        if total <= max_bytes:
            break
        del data[mime]
        data.setdefault(
            "text/plain",
            f"[{mime} of {size / 1024:,.0f} KiB left out: the committed notebooks are kept "
            f"under {max_bytes / 2**20:g} MiB; the figure folder has the saved plots]",
        )
        dropped.setdefault(p, []).append(size)
        total -= size
    notes = []
    for p, gone in dropped.items():
        atomic_write_text(p, _dump(books[p]))
        notes.append(f"{p.name}: {len(gone)} image(s) left out ({sum(gone) / 2**20:,.2f} MiB) to stay under the cap")
    if total > max_bytes:
        notes.append(
            f"{folder}: still {total / 2**20:,.2f} MiB without any image, over the cap: the notebooks print too much"
        )
    return notes


def copy_executed(sources: Iterable[Path], dest: Path) -> list[str]:
    """Copy executed notebooks into ``dest``, trimmed (a copy of the same name is replaced), then keep ``dest``
    within the cap; returns what was trimmed, one line per notebook."""
    notes = []
    for src in map(Path, sources):
        nb = json.loads(src.read_text())
        changes = trim_notebook(nb)
        atomic_write_text(Path(dest) / src.name, text := _dump(nb))
        size = f"{src.stat().st_size / 1024:,.0f} KiB -> {len(text.encode()) / 1024:,.0f} KiB"
        notes.append(f"{src.name}: {'; '.join(changes) or 'nothing trimmed'}; {size}")
    return notes + cap_folder(dest)
