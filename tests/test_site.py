"""``python -m mahia site``, opened in headless Chromium from ``file://``: every page renders its cells, images
and relative links, listings in monospace, wide code and tables scroll inside the page, no absolute path, nothing
fetched from outside, no console error. Bad input is one line and exit 2."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest
from browser import chromium, needs_chromium

from mahia.__main__ import main as cli
from mahia.measure import files
from mahia.site import build_site

pytestmark = pytest.mark.xdist_group("site")  # one worker builds the module's site once (make test runs two)

SLUG = "cpu-test-machine"
MATHJAX = "cdnjs.cloudflare.com/ajax/libs/mathjax/"

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="  # 1x1, base64


def _executed(title: str, printed: str, math: bool = False) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    md = f"# {title}\n\nWhat this notebook measures." + (" The ratio is $t_b / t_a$." if math else "")
    wide = "x = " + " + ".join(["1"] * 200)  # wider than the page: its box scrolls, the page does not
    code = nbformat.v4.new_code_cell(f"print('hello')\nplot()\n{wide}", execution_count=1)
    table = "<table>" + "".join(f"<td>column_{i}</td>" for i in range(60)) + "</table>"
    listing = f"<table style='width:100%;table-layout:fixed'><tr><td><pre style='white-space:pre'>{wide}</pre></td></tr></table>"
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=printed + "saved /home/someone/repo/data/results/x.csv\n"),
        nbformat.v4.new_output("display_data", data={"text/html": table, "text/plain": "a table"}),
        nbformat.v4.new_output("display_data", data={"text/html": listing, "text/plain": "a listing"}),
        nbformat.v4.new_output(
            "display_data",
            data={
                "image/png": PNG,
                "image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'></svg>",
                "text/plain": "<Figure size 300x200>",
            },
        ),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell(md), code]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    return nb


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[Path, Path]:
    """A results folder (two executed notebooks, summary.json) and its figures folder."""
    root = tmp_path_factory.mktemp("site")
    folder, figures = root / "results" / SLUG, root / "figures" / SLUG
    (folder / "notebooks").mkdir(parents=True)
    figures.mkdir(parents=True)
    long = "hello\n" + "".join(f"step {i}\n" for i in range(300))  # trimmed to head and tail
    nbformat.write(_executed("00 · First", long), folder / "notebooks" / "00_first.ipynb")
    nbformat.write(_executed("01 · Second", "hello\n", math=True), folder / "notebooks" / "01_second.ipynb")
    summary = {"device": "CPU test machine", "device_slug": SLUG, "profile": "full", "commits": ["abc123"]}
    summary |= {"newest_record": "2026-11-24T10:00:00+00:00", "newest_commit": "abc123"}
    summary["metrics"] = {"copy_gbps": 12.5, "amp_speedup": 2.0, "moe_vs_loop": None}
    (folder / "summary.json").write_text(json.dumps(summary))
    (figures / "00_first_plot.png").write_bytes(base64.b64decode(PNG))
    (figures / "00_first_plot.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'></svg>")
    return folder, figures


@pytest.fixture(scope="module")
def site(results, tmp_path_factory) -> Path:
    folder, figures = results
    out = tmp_path_factory.mktemp("out") / "site"
    index = build_site(folder, out, figures)
    assert index == out / "index.html"
    return out


def test_the_site_has_an_index_a_page_per_notebook_and_the_pngs(site):
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")) == [
        "index.html",
        "notebooks/00_first.html",
        "notebooks/01_second.html",
    ]
    assert [p.name for p in (site / "figures").iterdir()] == ["00_first_plot.png"]  # PNGs only
    index = (site / "index.html").read_text()
    assert "<code>copy_gbps</code>" in index and "12.5" in index and "not graded (CPU run)" in index
    page = (site / "notebooks" / "00_first.html").read_text()
    assert "... 202 lines trimmed ..." in page and "mathjax" not in page.lower()  # nothing from outside without math
    assert "mathjax" in (site / "notebooks" / "01_second.html").read_text().lower()  # a page with math gets it
    assert "saved data/results/x.csv" in page and "/home/someone" not in page  # no absolute path
    assert str(site.parent) not in index
    hrefs = [set(re.findall(r"""href=["']([^"']+)["']""", text)) for text in (index, page)]  # links both ways
    assert {"notebooks/00_first.html", "notebooks/01_second.html", "figures/00_first_plot.png"} <= hrefs[0]
    assert {"../index.html", "01_second.html"} <= hrefs[1]


@pytest.mark.browser
@needs_chromium
def test_every_page_renders_in_chromium_with_its_images_and_links(site, tmp_path):
    pages = sorted(site.rglob("*.html"))
    problems, outside = [], []
    with chromium(tmp_path / "profile") as context:
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))

        def route(r):
            if r.request.url.startswith(("file:", "data:")):
                return r.continue_()
            outside.append(r.request.url)  # the site must not need the network: refuse and note it
            return r.abort()

        # MathJax (a page with math) is the one thing a page may fetch: answer it with an empty script.
        page.route(f"https://{MATHJAX}**", lambda r: r.fulfill(body="", content_type="text/javascript"))
        page.route(lambda url: MATHJAX not in url, route)
        for path in pages:
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            name = path.relative_to(site).as_posix()
            title, body = page.title(), page.inner_text("body")
            assert title.strip(), f"{name}: no title"
            if path.parent.name == "notebooks":
                assert path.stem in title, f"{name}: title {title!r}"
                assert "What this notebook measures." in body and "hello" in body, f"{name}: cells not rendered"
                assert page.locator(".jp-Cell").count() == 2, f"{name}: not the notebook's two cells"
            bad = [b for b in ("Traceback", "No renderer could be found", "Error") if b in body]
            assert not bad, f"{name}: {bad} on the page"
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name}: the page is {overflow} px wider than the window: wide code or tables"
            fonts = page.eval_on_selector_all("pre", "els => els.map(e => getComputedStyle(e).fontFamily)")
            assert all("mono" in f.lower() for f in fonts), f"{name}: a listing is not monospace: {set(fonts)}"
            images = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.getAttribute('src').slice(0, 40), e.complete, e.naturalWidth])"
            )
            assert images, f"{name}: no image"
            for src, complete, width in images:
                assert complete and width > 0, f"{name}: image {src} did not load"
            links = page.eval_on_selector_all("a[href]", "els => els.map(e => [e.getAttribute('href'), e.href])")
            assert links, f"{name}: no link"
            for raw, resolved in links:
                assert "://" not in raw and not raw.startswith("/"), f"{name}: link {raw!r} is not relative"
                if raw.startswith("#"):  # an anchor: the id as written or decoded, as a browser looks it up
                    ids = [raw[1:], unquote(raw[1:])]
                    found = page.evaluate("ids => ids.some(i => !!document.getElementById(i))", ids)
                    assert found, f"{name}: anchor {raw} has no target"
                    continue
                target = Path(unquote(urlparse(resolved).path))
                assert target.is_file() and site in target.parents, f"{name}: link {raw!r} -> missing {target}"
    assert not outside, f"the site fetched from outside: {outside}"
    assert not problems, "\n".join(problems)


def test_bad_input_is_one_line_and_exit_2_and_leaves_other_folders_alone(results, tmp_path, capsys):
    folder, figures = results
    out = tmp_path / "site"
    build_site(folder, out, figures)
    (out / "notebooks" / "stale.html").write_text("from an earlier build")
    build_site(folder, out, figures)  # a rebuild replaces the site
    assert not (out / "notebooks" / "stale.html").exists()
    mine, empty, broken = tmp_path / "mine", tmp_path / "empty", tmp_path / "broken"
    for d in (mine, empty, broken):
        d.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (broken / "00_x.ipynb").write_text("{not json")
    for args, message in (
        (["--results", str(folder), "--out", str(mine)], "holds other files"),
        (["--results", str(tmp_path / "nope")], "no such folder"),
        (["--results", str(empty)], "has no executed notebooks"),
        (["--results", str(broken)], "00_x.ipynb: not a readable notebook"),
        (["--results", str(folder), "--figures", str(tmp_path / "nofigs")], "--figures"),
    ):
        assert cli(["site", *args] + ([] if "--out" in args else ["--out", str(tmp_path / "out")])) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert (mine / "notes.txt").read_text() == "keep me"


def test_the_default_is_the_newest_reference_folder_with_notebooks(results, tmp_path, monkeypatch, capsys):
    root = tmp_path / "data" / "results"
    root.mkdir(parents=True)
    monkeypatch.setattr(files, "reference_results_dir", lambda: root)
    monkeypatch.setattr(files, "runs_dir", lambda: tmp_path / "runs")
    assert cli(["site"]) == 2 and "no executed notebooks in" in capsys.readouterr().err
    for name, finished in (("gpu-old", "2026-11-27T10:00:00+00:00"), ("gpu-new", "2026-11-29T09:00:00+00:00")):
        shutil.copytree(results[0], root / name)
        (root / name / "parts").mkdir(exist_ok=True)
        (root / name / "parts" / "01_second.json").write_text(json.dumps({"finished": finished}))
    assert cli(["site"]) == 0 and (tmp_path / "runs" / "site" / "notebooks" / "01_second.html").is_file()
    assert "gpu-new, the newest" in capsys.readouterr().err
