"""The executed notebooks committed with the reference: widget state dropped, streams trimmed to head and tail,
no absolute path, figures as PNG only, the folder under a cap (largest images first); trimming twice changes
nothing."""

import json

import nbformat

from mahia.measure.executed import cap_folder, trim_notebook


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


def test_a_notebook_is_trimmed_once_and_a_second_trim_changes_nothing():
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}
    nb = _nb(
        _code(_stream("".join(f"{i}\n" for i in range(300))), _stream("step 1\rstep 2\n"), _stream("err\n", "stderr")),
        _code(_display({"image/png": "iVBO", "image/svg+xml": "<svg/>", "text/plain": "fig"}), _display(view)),
        _code(_stream("saved /home/me/repo/data/results/x.csv, see https://x.org/a/data/b\n")),
        _code(
            nbformat.v4.new_output("error", ename="E", evalue="v", traceback=["\x1b[0;32m/opt/v/site-packages/t.py"])
        ),
        widgets={"state": {}},
    )
    nb["cells"][0]["metadata"]["tags"] = ["injected-parameters"]
    nb["cells"][0]["source"] = 'results_dir = "/home/me/repo/data/results"\n'
    notes = trim_notebook(nb)
    assert notes[0].startswith("widget state dropped") and "widget" not in json.dumps(nb["metadata"])
    assert notes[1:] == [
        "1 widget view(s) left as text",
        "201 lines of streams trimmed",
        "1 SVG/PDF copies of PNG figures dropped",
    ]
    out = [c["outputs"] for c in nb["cells"]]
    assert [o["name"] for o in out[0]] == ["stdout", "stderr"]  # stdout merged, stderr kept apart
    lines = out[0][0]["text"].splitlines()
    assert lines[:2] == ["0", "1"] and "... 201 lines trimmed ..." in lines and lines[-2:] == ["299", "step 2"]
    assert out[1][0]["data"] == {"image/png": "iVBO", "text/plain": "fig"}
    assert "ipywidgets control" in out[1][1]["data"]["text/plain"]
    assert out[2][0]["text"] == "saved data/results/x.csv, see https://x.org/a/data/b\n"
    assert out[3][0]["traceback"] == ["\x1b[0;32msite-packages/t.py"]
    assert nb["cells"][0]["source"] == 'results_dir = "data/results"\n'  # papermill's injected parameters
    once = json.dumps(nb)
    assert trim_notebook(nb) == [] and json.dumps(nb) == once
    nbformat.validate(nbformat.from_dict(nb))  # still a valid notebook


def test_the_cap_drops_the_largest_images_first_until_the_folder_fits(tmp_path):
    big, mid, small = "A" * 300_000, "B" * 200_000, "C" * 1_000
    for name, images in (("01_a", (big, small)), ("02_b", (mid,))):
        (tmp_path / f"{name}.ipynb").write_text(json.dumps(_nb(_code(*(_display({"image/png": i}) for i in images)))))
    assert cap_folder(tmp_path, 600_000) == []  # within the cap: untouched
    assert cap_folder(tmp_path, 250_000) == ["01_a.ipynb: 1 image(s) left out (0.29 MiB) to stay under the cap"]
    a = json.loads((tmp_path / "01_a.ipynb").read_text())["cells"][0]["outputs"]
    assert "left out" in a[0]["data"]["text/plain"] and a[1]["data"] == {"image/png": small}  # the largest only
    assert sum(p.stat().st_size for p in tmp_path.glob("*.ipynb")) <= 250_000
    (tmp_path / "03_c.ipynb").write_text(json.dumps(_nb(_code(_stream("x" * 300_000)))))
    assert "without any image, over the cap" in cap_folder(tmp_path, 250_000)[-1]
