"""The widgets show their figures with viz._output.show_figure: one state update of the Output widget,
no capture context. These tests check what it shows, and that a notebook drawing through it runs
headless under nbclient (papermill, nbconvert --execute) without the stall of nbclient issue #312."""
import time

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_lib.viz._output import show_figure  # noqa: E402

W = pytest.importorskip("ipywidgets")


def test_show_figure_replaces_the_output_with_the_figure_and_closes_it():
    out = W.Output()
    out.outputs = ({"output_type": "stream", "name": "stdout", "text": "old"},)
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    show_figure(out, fig)
    assert len(out.outputs) == 1 and out.outputs[0]["output_type"] == "display_data"
    assert "image/png" in out.outputs[0]["data"] and "text/plain" in out.outputs[0]["data"]
    assert not plt.fignum_exists(fig.number)            # closed: pyplot will not draw it again
    show_figure(out, None)
    assert out.outputs == ()


@pytest.mark.slow
def test_widget_cells_do_not_stall_headless_execution():
    """Six cells that each redraw a widget figure slowly (the draw is made to take 1.5 s). Drawn inside
    `with out:`, about half such cells stalled nbclient until its timeout (here 40 s), so six cells all
    finishing in time would be a 1-in-64 fluke; with show_figure each takes the draw time."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    setup = ("%matplotlib inline\n"
             "import time\n"
             "from course_lib.viz import RooflineExplorer\n"
             "_draw = RooflineExplorer.draw\n"
             "def slow_draw(self, r=None):\n"
             "    time.sleep(1.5)\n"
             "    return _draw(self, r)\n"
             "RooflineExplorer.draw = slow_draw\n")
    cells = [setup, "e = RooflineExplorer()\ne"] + [f"e.batch.value = {b}" for b in (2, 4, 8, 16, 32)]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(nb, timeout=40, kernel_name="python3")
    seconds = []
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            t = time.perf_counter()
            client.execute_cell(cell, i)
            seconds.append(time.perf_counter() - t)
    assert all(s < 20 for s in seconds[1:]), f"cell times {[round(s, 1) for s in seconds]} (a stall takes 40 s)"
    assert any(o.get("output_type") == "display_data" for o in nb.cells[1].outputs)   # the explorer was shown
