"""A static HTML site of a run, readable without a GPU: ``python -m mahia site``.

    python -m mahia site                                        # the committed reference -> runs/site/
    python -m mahia site --results data/results/nvidia-h200 --out /tmp/site
    python -m mahia site --results runs/<date>-<time>-<device>-<profile>   # a run of your own

Reads a results folder: executed notebooks (``notebooks/*.ipynb``, as ``python -m mahia reference``
commits them, or ``*.ipynb`` directly in it, as a ``python -m mahia run`` folder has them), its headline
``summary.json`` (``summary-<profile>.json`` when there is no full-profile one) and the PNG figures of
``figures/<folder name>/``. Writes ``index.html`` (the headline table, the notebooks, the figures) and one
page per notebook (nbconvert's HTML exporter, lab template), with relative links only: the folder works
from ``file://`` and from any static host. A notebook is rendered under ``mahia.measure.executed``'s
policy (no widget state, long streams trimmed, figures as PNG); a page loads nothing from outside unless
its Markdown has math (MathJax, from its CDN).

The output folder is replaced on each build; a folder that holds anything else is refused. Bad input
raises ``UsageError`` (one line, exit code 2).
"""

from __future__ import annotations

import html
import json
import logging
import shutil
import sys
from pathlib import Path

from mahia.measure import files
from mahia.measure.executed import trim_notebook
from mahia.measure.report import commit_marks, grade, reference_parts
from mahia.measure.results import GOALS
from mahia.runner import UsageError

__all__ = ["build_site", "site_notebooks", "default_results"]

MARKER = ".mahia-site"  # written into every site folder: the only kind of folder a build replaces

# The lab template without require.js (no widget or JavaScript output needs it once widget state is gone),
# with MathJax only where a page has math, and a line of relative links above each notebook.
PAGE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- if resources.mahia_math -%}{{ super() }}{%- endif -%}
{%- endblock html_head_js_mathjax -%}
{%- block extra_css -%}<style>{{ resources.mahia_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}
<nav class="mahia-nav">{{ resources.mahia_nav }}</nav>
{%- endblock body_header -%}
"""
NAV_CSS = (
    ".mahia-nav{font-family:sans-serif;font-size:14px;padding:8px 0 16px;border-bottom:1px solid #ddd;"
    "margin-bottom:12px}.mahia-nav a{margin-right:1.5em}"
)
INDEX_CSS = (
    "body{font-family:sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
    "th{background:#eee}td.num{text-align:right;font-variant-numeric:tabular-nums}.missed{color:#b00}"
    ".met{color:#070}.meta{color:#555;font-size:14px}figure{display:inline-block;margin:8px;vertical-align:top}"
    "figure img{max-width:520px;border:1px solid #ddd}figcaption{font-size:12px;color:#555}"
)


def site_notebooks(results: Path) -> list[Path]:
    """The executed notebooks of a results folder: ``notebooks/*.ipynb``, else ``*.ipynb`` in it."""
    results = Path(results)
    found = sorted((results / "notebooks").glob("*.ipynb"))
    return found or sorted(results.glob("*.ipynb"))


def _finished(folder: Path) -> str:
    """When the newest part of a reference folder finished (its ``parts/*.json``; '' without part files)."""
    return max((str(p.get("finished", "")) for p in reference_parts(folder)), default="")


def default_results() -> Path:
    """The folder of the committed reference (``data/results/<gpu>/``) that has executed notebooks; of
    several, the one whose newest part finished last (``parts/*.json``), said on stderr with the others."""
    root = files.reference_results_dir()
    found = sorted(p for p in root.glob("*") if p.is_dir() and list((p / "notebooks").glob("*.ipynb")))
    if not found:
        raise UsageError(
            f"no executed notebooks in {root}/*/notebooks (`python -m mahia reference` commits them, on a "
            "GPU): name a folder with --results, e.g. a run of your own in runs/"
        )
    finished = {p: _finished(p) for p in found}
    newest = max(found, key=lambda p: (finished[p], p.name))
    if len(found) > 1:
        others = ", ".join(p.name for p in found if p != newest)
        print(
            f"site: {newest.name}, the newest of the reference folders with notebooks (its last part finished "
            f"{finished[newest] or 'at an unknown time'}); --results names another ({others})",
            file=sys.stderr,
        )
    return newest


def _summary(results: Path) -> tuple[dict | None, str]:
    """The headline summary of a results folder and its file name (the full profile's first)."""
    candidates = [results / "summary.json", *sorted(results.glob("summary-*.json"))]
    for path in candidates:
        if path.is_file():
            try:
                return json.loads(path.read_text()), path.name
            except ValueError:
                raise UsageError(f"{path} is not valid JSON") from None
    return None, ""


def _title(nb: dict, stem: str) -> str:
    """The notebook's first Markdown heading, else its file name."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", "")).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip() or stem
    return stem


def _has_math(nb: dict) -> bool:
    md = "".join("".join(c.get("source", "")) for c in nb.get("cells", []) if c.get("cell_type") == "markdown")
    return any(token in md for token in ("$", "\\(", "\\["))


def _fmt(v) -> str:
    return "not measured" if v is None else format(v, ".4g")


def _headline_html(doc: dict, name: str, cpu: bool) -> str:
    rows = []
    for key, value in doc.get("metrics", {}).items():
        goal = " ".join(map(str, GOALS[key])) if key in GOALS else ""
        status = grade(key, value, cpu=cpu)
        marks = commit_marks(doc, key) if "sources" in doc and "stale" in doc else ""
        rows.append(
            f"<tr><td><code>{html.escape(key)}</code></td><td class='num'>{_fmt(value)}</td>"
            f"<td>{html.escape(goal)}</td><td class='{html.escape(status)}'>{html.escape(status)}</td>"
            f"<td>{html.escape(marks)}</td></tr>"
        )
    head = "<tr><th>metric</th><th>value</th><th>goal</th><th></th><th>commit</th></tr>"
    meta = (
        f"{html.escape(str(doc.get('profile', '?')))} profile, from <code>{html.escape(name)}</code>; newest record "
        f"{html.escape(str(doc.get('newest_record') or '—')[:19])} by commit "
        f"{html.escape(str(doc.get('newest_commit') or '—'))}"
    )
    return f"<p class='meta'>{meta}</p><table>{head}{''.join(rows)}</table>"


def _exporter():
    try:
        from jinja2 import DictLoader
        from nbconvert import HTMLExporter
    except ImportError:
        raise UsageError("nbconvert is not installed: pip install 'mahia[notebooks]' (or use `make run`)") from None
    log = logging.getLogger("mahia.site.nbconvert")
    log.setLevel(logging.ERROR)  # not a warning per figure that its output has no alt text (nbconvert adds one)
    return HTMLExporter(
        log=log,
        template_name="lab",
        extra_loaders=[DictLoader({"mahia_page.html.j2": PAGE_TEMPLATE})],
        template_file="mahia_page.html.j2",
    )


def _prepare_out(out: Path) -> None:
    """Empty ``out`` for a new build: only a folder that is new, empty or an earlier site is touched."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise UsageError(
                f"--out {out} holds other files (not a site built by `python -m mahia site`): name a new folder"
            )
        shutil.rmtree(out)
    try:
        (out / "notebooks").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    (out / MARKER).write_text("built by `python -m mahia site`; replaced by the next build\n")


def _link(href: str, text: str) -> str:
    return f"<a href='{html.escape(href)}'>{html.escape(text)}</a>"


def build_site(
    results: str | Path | None = None, out: str | Path | None = None, figures: str | Path | None = None
) -> Path:
    """Build the site of ``results`` (default: the reference folder with executed notebooks) into ``out``
    (default ``runs/site/``), with the PNGs of ``figures`` (default ``figures/<results folder name>/``, when
    it exists); returns the path of ``index.html``."""
    results = default_results() if results is None else Path(results)
    if not results.is_dir():
        raise UsageError(f"--results {results}: no such folder")
    nbs = site_notebooks(results)
    if not nbs:
        raise UsageError(f"--results {results} has no executed notebooks (notebooks/*.ipynb or *.ipynb)")
    fig_dir = Path(figures) if figures is not None else files.reference_figures_dir() / results.resolve().name
    if figures is not None and not fig_dir.is_dir():
        raise UsageError(f"--figures {fig_dir}: no such folder")
    exporter = _exporter()  # nbconvert, and with it nbformat, is installed
    import nbformat

    books = {}
    for path in nbs:
        try:
            books[path.stem] = nbformat.read(path, as_version=4)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not a readable notebook ({e})") from None
    summary, summary_name = _summary(results)
    out = Path(out) if out is not None else files.runs_dir() / "site"
    _prepare_out(out)  # only now: bad input leaves an earlier site as it was
    device = (summary or {}).get("device") or results.resolve().name
    stems = list(books)
    for i, stem in enumerate(stems):
        _page(exporter, books[stem], stem, stems, i, device, out)
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    if pngs:
        (out / "figures").mkdir()
    for png in pngs:
        shutil.copy2(png, out / "figures" / png.name)
    index = out / "index.html"
    index.write_text(_index_html(results, books, summary, summary_name, device, fig_dir, pngs))
    return index


def _page(exporter, nb: dict, stem: str, stems: list[str], i: int, device: str, out: Path) -> None:
    import nbformat

    trim_notebook(nb)
    nav = [_link("../index.html", "all results")]
    if i > 0:
        nav.append(_link(f"{stems[i - 1]}.html", f"← {stems[i - 1]}"))
    if i + 1 < len(stems):
        nav.append(_link(f"{stems[i + 1]}.html", f"{stems[i + 1]} →"))
    resources = {
        "metadata": {"name": f"{stem} — mahia, {device}"},
        "mahia_nav": " ".join(nav),
        "mahia_math": _has_math(nb),
        "mahia_css": NAV_CSS,
    }
    body, _ = exporter.from_notebook_node(nbformat.from_dict(nb), resources=resources)
    (out / "notebooks" / f"{stem}.html").write_text(body)


def _index_html(results, books, summary, summary_name, device, fig_dir, pngs) -> str:
    cpu = results.resolve().name.startswith("cpu") or str(device).lower().startswith("cpu")
    parts = [f"<h1>mahia: results on {html.escape(str(device))}</h1>"]
    parts.append(
        f"<p class='meta'>Built by <code>python -m mahia site</code> from <code>{html.escape(str(results))}</code>: "
        "the executed notebooks as they ran, their headline metrics and figures.</p>"
    )
    parts.append("<h2>Headline metrics</h2>")
    if summary is None:
        parts.append(f"<p>No summary.json in <code>{html.escape(str(results))}</code>.</p>")
    else:
        parts.append(_headline_html(summary, summary_name, cpu))
    parts.append("<h2>Notebooks</h2><ol>")
    for stem, nb in books.items():
        title = _title(nb, stem)
        extra = f": {html.escape(title)}" if title != stem else ""
        parts.append(f"<li>{_link(f'notebooks/{stem}.html', stem)}{extra}</li>")
    parts.append("</ol><h2>Figures</h2>")
    if not pngs:
        parts.append(f"<p>No PNG figures in <code>{html.escape(str(fig_dir))}</code>.</p>")
    for png in pngs:
        href = f"figures/{png.name}"
        parts.append(
            f"<figure><a href='{html.escape(href)}'><img src='{html.escape(href)}' alt='{html.escape(png.stem)}'></a>"
            f"<figcaption>{html.escape(png.stem)}</figcaption></figure>"
        )
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>mahia results: {html.escape(str(device))}</title><style>{INDEX_CSS}</style></head>"
        f"<body><main>{''.join(parts)}</main></body></html>\n"
    )
