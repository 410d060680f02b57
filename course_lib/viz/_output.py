"""Show a matplotlib figure in an ipywidgets Output widget, the way every widget of the course does.

The figure's rich display data (PNG and text) is written into the widget's ``outputs`` in one state
update, instead of capturing ``display(fig)`` inside ``with out: clear_output(wait=True)``. Same result
on screen in JupyterLab, Notebook and Colab (ipywidgets 7 and 8), without the flicker of clear-then-draw,
and it keeps headless runs working: with the capture context, a cell that draws for a second or more
stalls nbclient (papermill, nbconvert --execute, jupyter-book) until its cell timeout, forever without
one, in about half the runs (nbclient issue #312, open upstream; reproduced with plain ipywidgets).
"""
from __future__ import annotations


def _display_data(obj) -> dict:
    from IPython import get_ipython
    shell = get_ipython()
    if shell is None:   # plain Python (tests, scripts): IPython's formatter without a running kernel
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
    data, metadata = shell.display_formatter.format(obj)
    if not any(k.startswith("image/") for k in data) and hasattr(obj, "savefig"):
        # no image formatter registered for figures (plain Python, or a kernel on a non-inline
        # backend): render the PNG here, as the inline backend would
        import base64
        import io
        buf = io.BytesIO()
        obj.savefig(buf, format="png", bbox_inches="tight")
        data = {**data, "image/png": base64.b64encode(buf.getvalue()).decode("ascii")}
    return {"output_type": "display_data", "data": data, "metadata": metadata}


def show_figure(out, fig, close: bool = True) -> None:
    """Replace what the Output widget `out` shows with `fig` (nothing if fig is None); close the figure
    afterwards unless close=False, so that pyplot does not also draw it below the cell."""
    if fig is None:
        out.outputs = ()
        return
    try:
        out.outputs = (_display_data(fig),)
    finally:
        if close:
            import matplotlib.pyplot as plt
            plt.close(fig)
