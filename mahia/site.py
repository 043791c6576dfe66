"""A static HTML site of a run, readable without a GPU: ``python -m mahia site``.

    python -m mahia site                                        # the committed reference -> runs/site/
    python -m mahia site --results runs/<date>-<time>-<device>-<profile>   # a run of your own

Reads a results folder (executed notebooks in ``notebooks/`` or in it, its ``summary.json`` or
``summary-<profile>.json``) and the PNGs of ``figures/<folder name>/``; writes ``index.html`` (the headline
table, the notebooks, the figures) and one page per notebook (nbconvert's ``HTMLExporter``, lab template,
trimmed by ``mahia.measure.executed``), with relative links only: it works from ``file://`` and any static host.
Listings are monospace, wide code and tables scroll in their own box; a page loads nothing from outside unless
its Markdown has math (MathJax). The output folder is replaced on each build; one holding anything else is refused.
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
from mahia.measure.report import grade, reference_parts
from mahia.measure.summary import GOALS
from mahia.runner import UsageError

__all__ = ["build_site", "default_results"]

MARKER = ".mahia-site"  # written into every site folder: the only kind of folder a build replaces
PAGE_CSS = (
    ".mahia-nav{font-family:sans-serif;font-size:14px;padding:8px 0 16px;border-bottom:1px solid #ddd}"
    ".mahia-nav a{margin-right:1.5em}"
    "body .jp-RenderedHTMLCommon pre,body .jp-RenderedHTMLCommon code{font-family:var(--jp-code-font-family),monospace}"
)
# The lab template without require.js (no widget output needs it once widget state is gone), MathJax only where
# a page has math, and a line of relative links above each notebook.
PAGE_TEMPLATE = (
    """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- if resources.mahia_math -%}{{ super() }}{%- endif -%}
{%- endblock html_head_js_mathjax -%}
{%- block extra_css -%}<style>"""
    + PAGE_CSS
    + """</style>{%- endblock extra_css -%}
{%- block body_header -%}{{ super() }}<nav class="mahia-nav">{{ resources.mahia_nav }}</nav>{%- endblock body_header -%}
"""
)
INDEX_CSS = (
    "body{font-family:sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}.scroll{overflow-x:auto}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
    "code{font-family:monospace}figure{display:inline-block;margin:8px}figure img{max-width:100%;width:520px}"
)


def default_results() -> Path:
    """The folder of the committed reference that has executed notebooks; of several, the one whose newest part
    finished last (``parts/*.json``), said on stderr with the others."""
    root = files.reference_results_dir()
    found = sorted(p for p in root.glob("*") if any((p / "notebooks").glob("*.ipynb")))
    if not found:
        raise UsageError(
            f"no executed notebooks in {root}/*/notebooks: name a folder with --results, e.g. a run in runs/"
        )
    finished = {p: max((str(d.get("finished", "")) for d in reference_parts(p)), default="") for p in found}
    newest = max(found, key=lambda p: (finished[p], p.name))
    if len(found) > 1:
        others = ", ".join(p.name for p in found if p != newest)
        print(
            f"site: {newest.name}, the newest of the reference folders with notebooks (its last part finished "
            f"{finished[newest] or 'at an unknown time'}); --results names another ({others})",
            file=sys.stderr,
        )
    return newest


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
    """Build the site of ``results`` (default: ``default_results()``) into ``out`` (default ``runs/site/``) with the
    PNGs of ``figures`` (default ``figures/<results folder name>/``); returns the path of ``index.html``."""
    import nbformat

    results = default_results() if results is None else Path(results)
    if not results.is_dir():
        raise UsageError(f"--results {results}: no such folder")
    paths = sorted((results / "notebooks").glob("*.ipynb")) or sorted(results.glob("*.ipynb"))
    if not paths:
        raise UsageError(f"--results {results} has no executed notebooks (notebooks/*.ipynb or *.ipynb)")
    fig_dir = Path(figures) if figures is not None else files.reference_figures_dir() / results.resolve().name
    if figures is not None and not fig_dir.is_dir():
        raise UsageError(f"--figures {fig_dir}: no such folder")
    try:
        from jinja2 import DictLoader
        from nbconvert import HTMLExporter
    except ImportError:
        raise UsageError("nbconvert is not installed: pip install 'mahia[notebooks]' (or use `make run`)") from None
    log = logging.getLogger("mahia.site.nbconvert")
    log.setLevel(logging.ERROR)  # not a warning per figure that its output has no alt text (nbconvert adds one)
    loader = DictLoader({"mahia_page.html.j2": PAGE_TEMPLATE})
    exporter = HTMLExporter(log=log, template_name="lab", extra_loaders=[loader], template_file="mahia_page.html.j2")
    books = {}
    for path in paths:
        try:
            books[path.stem] = nbformat.read(path, as_version=4)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not a readable notebook ({e})") from None
    found = [p for p in [results / "summary.json", *sorted(results.glob("summary-*.json"))] if p.is_file()]
    summary = json.loads(found[0].read_text()) if found else None
    out = Path(out) if out is not None else files.runs_dir() / "site"
    _prepare_out(out)  # only now: bad input leaves an earlier site as it was
    device = (summary or {}).get("device") or results.resolve().name
    stems = list(books)
    for i, (stem, nb) in enumerate(books.items()):
        trim_notebook(nb)
        nav = [_link("../index.html", "all results")]
        nav += [_link(f"{stems[i - 1]}.html", f"← {stems[i - 1]}")] if i > 0 else []
        nav += [_link(f"{stems[i + 1]}.html", f"{stems[i + 1]} →")] if i + 1 < len(stems) else []
        md = "".join(c["source"] for c in nb.cells if c["cell_type"] == "markdown")
        resources = {"metadata": {"name": f"{stem} — mahia, {device}"}, "mahia_nav": " ".join(nav)}
        resources["mahia_math"] = any(t in md for t in ("$", "\\(", "\\["))
        body, _ = exporter.from_notebook_node(nbformat.from_dict(nb), resources=resources)
        (out / "notebooks" / f"{stem}.html").write_text(body)
    pngs = sorted(fig_dir.glob("*.png")) if fig_dir.is_dir() else []
    for png in pngs:
        (out / "figures").mkdir(exist_ok=True)
        shutil.copy2(png, out / "figures" / png.name)
    cpu = results.resolve().name.startswith("cpu") or str(device).lower().startswith("cpu")
    parts = [f"<h1>mahia: results on {html.escape(str(device))}</h1>", "<h2>Headline metrics</h2>"]
    if summary is None:
        parts.append(f"<p>No summary.json in <code>{html.escape(results.name)}</code>.</p>")
    else:
        rows = "".join(
            f"<tr><td><code>{html.escape(k)}</code></td><td>{'not measured' if v is None else format(v, '.4g')}</td>"
            f"<td>{html.escape(' '.join(map(str, GOALS.get(k, ()))))}</td><td>{html.escape(grade(k, v, cpu=cpu))}</td></tr>"
            for k, v in summary.get("metrics", {}).items()
        )
        meta = f"{summary.get('profile', '?')} profile of <code>{html.escape(results.name)}</code>, commit "
        meta += html.escape(", ".join(summary.get("commits") or []) or "unknown")
        parts.append(
            f"<p>{meta}</p><div class='scroll'><table><tr><th>metric</th><th>value</th><th>goal</th><th></th></tr>{rows}</table></div>"
        )
    parts.append("<h2>Notebooks</h2><ol>")
    for stem, nb in books.items():
        md = "\n".join(c["source"] for c in nb.cells if c["cell_type"] == "markdown").splitlines()
        title = next((ln.lstrip("#").strip() for ln in md if ln.startswith("#")), "")
        parts.append(f"<li>{_link(f'notebooks/{stem}.html', stem)}{': ' + html.escape(title) if title else ''}</li>")
    parts.append("</ol><h2>Figures</h2>" + ("" if pngs else "<p>No PNG figures.</p>"))
    for png in pngs:
        href, name = html.escape(f"figures/{png.name}"), html.escape(png.stem)
        parts.append(
            f"<figure><a href='{href}'><img src='{href}' alt='{name}'></a><figcaption>{name}</figcaption></figure>"
        )
    index = out / "index.html"
    index.write_text(
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' content='width=device-width, "
        f"initial-scale=1'><title>mahia results: {html.escape(str(device))}</title><style>{INDEX_CSS}</style></head>"
        f"<body><main>{''.join(parts)}</main></body></html>\n"
    )
    return index
