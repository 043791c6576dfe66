"""The size policy of the executed notebooks committed with the reference (mahia.measure.executed).

Widget state dropped, long streams trimmed to head and tail, figures kept as PNG only, the folder kept
under a cap (largest images out first), every change reported, and trimming twice changes nothing.
"""

import json

import nbformat
import pytest

from mahia.measure.executed import Policy, cap_folder, copy_executed, notebook_bytes, trim_notebook


def _nb(*cells, widgets=None) -> dict:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    if widgets is not None:
        nb.metadata["widgets"] = widgets
    return json.loads(nbformat.writes(nb))


def _code(*outputs):
    return nbformat.v4.new_code_cell("x = 1", outputs=list(outputs), execution_count=1)


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def _display(data):
    return nbformat.v4.new_output("display_data", data=data)


def test_widget_state_and_views_are_dropped():
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2}}
    state = {"application/vnd.jupyter.widget-state+json": {"state": {"abc": {"big": "x" * 5000}}}}
    nb = _nb(_code(_display(view)), widgets=state)
    notes = trim_notebook(nb)
    assert "widgets" not in nb["metadata"]
    data = nb["cells"][0]["outputs"][0]["data"]
    assert list(data) == ["text/plain"] and "ipywidgets" in data["text/plain"]
    assert any(n.startswith("widget state dropped") for n in notes) and "1 widget view(s) left as text" in notes


def test_a_long_stream_keeps_head_and_tail_around_a_marker():
    policy = Policy(max_stream_lines=20, stream_head=5, stream_tail=3)
    lines = [f"line {i}" for i in range(100)]
    # Printed in two parts (two outputs of one stream), with a progress bar rewritten by \r on one line.
    first, second = "\n".join(lines[:50]) + "\n", "\n".join(lines[50:]) + "\n"
    nb = _nb(_code(_stream(first), _stream("step 1/3\rstep 2/3\rstep 3/3\n" + second)))
    notes = trim_notebook(nb, policy)
    (out,) = nb["cells"][0]["outputs"]  # the two outputs of stdout merged
    kept = out["text"].splitlines()
    assert kept[:5] == lines[:5] and kept[-3:] == lines[-3:]
    assert kept[5] == "... 93 lines trimmed ..." and len(kept) == 9  # 101 lines (with 'step 3/3'), 8 kept
    assert notes == ["1 stream output(s) trimmed (93 lines)"]


def test_streams_of_stdout_and_stderr_are_not_merged_and_short_ones_stay():
    nb = _nb(_code(_stream("a\n"), _stream("warn\n", "stderr"), _stream("b\n")))
    assert trim_notebook(nb) == []
    assert [(o["name"], o["text"]) for o in nb["cells"][0]["outputs"]] == [
        ("stdout", "a\n"),
        ("stderr", "warn\n"),
        ("stdout", "b\n"),
    ]


def test_a_figure_keeps_its_png_and_loses_its_svg_and_pdf_copies():
    both = {"image/png": "iVBORw0KGgo=", "image/svg+xml": "<svg>" + "x" * 2048 + "</svg>", "application/pdf": "JVBE"}
    svg_only = {"image/svg+xml": "<svg></svg>", "text/plain": "<Figure>"}
    nb = _nb(_code(_display(both), _display(svg_only)))
    notes = trim_notebook(nb)
    kept = [o["data"] for o in nb["cells"][0]["outputs"]]
    assert list(kept[0]) == ["image/png"]
    assert sorted(kept[1]) == ["image/svg+xml", "text/plain"]  # no PNG: the SVG is the figure
    assert notes == ["2 SVG/PDF copies of PNG figures dropped (2.0 KiB)"]


def test_trimming_twice_changes_nothing():
    nb = _nb(
        _code(_stream("\n".join(map(str, range(1000))) + "\n")),
        _code(_display({"image/png": "iVBO", "image/svg+xml": "<svg/>"})),
        widgets={"state": {}},
    )
    assert trim_notebook(nb)
    once = json.dumps(nb)
    assert trim_notebook(nb) == [] and json.dumps(nb) == once


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_stream_lines": 0}, "max_stream_lines must be a positive int"),
        ({"max_total_bytes": 1.5}, "max_total_bytes must be a positive int"),
        ({"stream_head": True}, "stream_head must be a positive int"),
        ({"max_stream_lines": 10, "stream_head": 5, "stream_tail": 5}, "would be trimmed again"),
    ],
)
def test_a_bad_policy_is_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match):
        Policy(**kw)


def _write(path, nb):
    path.write_text(json.dumps(nb))
    return path


def test_the_cap_drops_the_largest_images_first_until_the_folder_fits(tmp_path):
    big, mid, small = "A" * 300_000, "B" * 200_000, "C" * 1_000
    _write(tmp_path / "01_a.ipynb", _nb(_code(_display({"image/png": big}), _display({"image/png": small}))))
    _write(tmp_path / "02_b.ipynb", _nb(_code(_display({"image/png": mid}))))
    total = sum(notebook_bytes(json.loads(p.read_text())) for p in tmp_path.glob("*.ipynb"))
    assert cap_folder(tmp_path, total) == []  # within the cap: untouched
    notes = cap_folder(tmp_path, 250_000)
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("01_a.ipynb", "02_b.ipynb"))
    a_data = [o["data"] for o in a["cells"][0]["outputs"]]
    assert "image/png" not in a_data[0] and "left out" in a_data[0]["text/plain"]  # the largest went first
    assert a_data[1] == {"image/png": small}  # the small one stays: the folder fits without dropping it
    assert b["cells"][0]["outputs"][0]["data"] == {"image/png": mid}
    assert notes == ["01_a.ipynb: 1 image(s) left out (0.29 MiB) to stay under the cap"]
    assert sum(p.stat().st_size for p in tmp_path.glob("*.ipynb")) <= 250_000


def test_the_cap_says_so_when_text_alone_is_too_large(tmp_path):
    _write(tmp_path / "01_a.ipynb", _nb(_code(_stream("x" * 50_000), _display({"image/png": "P" * 10_000}))))
    notes = cap_folder(tmp_path, 20_000)
    assert notes[0].startswith("01_a.ipynb: 1 image(s) left out")
    assert "without any image, over the 0.0190735 MiB cap" in notes[1]


def test_copy_executed_copies_trims_and_reports(tmp_path):
    src = tmp_path / "run"
    src.mkdir()
    long = "\n".join(map(str, range(500))) + "\n"
    _write(src / "01_a.ipynb", _nb(_code(_stream(long)), widgets={"state": {}}))
    _write(src / "02_b.ipynb", _nb(_code(_stream("short\n"))))
    dest = tmp_path / "data" / "notebooks"
    notes = copy_executed(sorted(src.glob("*.ipynb")), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["01_a.ipynb", "02_b.ipynb"]
    assert (
        notes[0].startswith("01_a.ipynb: widget state dropped") and "1 stream output(s) trimmed (400 lines)" in notes[0]
    )
    assert notes[1].startswith("02_b.ipynb: nothing trimmed")
    copied = nbformat.read(dest / "01_a.ipynb", as_version=4)
    nbformat.validate(copied)  # still a valid notebook
    assert "... 400 lines trimmed ..." in copied.cells[0].outputs[0].text
    (src / "03_bad.ipynb").write_text("{not json")
    with pytest.raises(ValueError, match=r"03_bad.ipynb: not a readable notebook"):
        copy_executed([src / "03_bad.ipynb"], dest)
