"""Each widget of the course, in JupyterLab in a real browser: open its notebook, run all cells, find the
widget's rendered view, change one control and see the view change.

The widgets' logic is tested in Python (tests/test_*_viz.py, test_quant_widget.py, test_serving_sim.py);
what only a browser shows is the front end: the widget manager renders the views, the controls reach the
kernel and the kernel's new figure and text come back. The selectors are the DOM classes that ipywidgets
7.7.1 (JupyterLab 3.6, jupyterlab_widgets 1.1) and 8 (JupyterLab 4) share.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import pytest
from playwright.sync_api import expect

RUN_ALL_TIMEOUT_S = 300    # a notebook takes about 20-35 s in quick mode on 2 cores
CHANGE_TIMEOUT_S = 60      # one redraw after a click


@dataclass(frozen=True)
class Widget:
    notebook: str
    name: str
    cell: str             # text from the code cell that displays the widget
    control: str          # label of the button to click, or of the dropdown to change
    option: str | None    # the dropdown's new option; None for a button

    def __str__(self):
        return f"{self.notebook[:2]}-{self.name}"


WIDGETS = [
    Widget("01_where_the_time_goes.ipynb", "RooflineExplorer", "explorer = RooflineExplorer(", "GPU", "H100-SXM"),
    Widget("02_quantization_fundamentals.ipynb", "QuantExplorer", "explorer = QuantExplorer.from_model(",
           "granularity", "channel"),
    Widget("06_paged_attention.ipynb", "PagedVisualizer", "viz = PagedVisualizer(", "Add sequence", None),
    Widget("08_speculative_decoding.ipynb", "SpeculativeStepper", "stepper = SpeculativeStepper(", "Next step", None),
    Widget("09_batching_and_serving.ipynb", "ServingExplorer", "explorer = ServingExplorer(", "policy", "static"),
]


def wait_for_change(read, before, what: str):
    """Poll read() until it differs from `before`; fail naming `what` (not printing a whole data: URL)."""
    deadline = time.monotonic() + CHANGE_TIMEOUT_S
    while read() == before:
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not change within {CHANGE_TIMEOUT_S} s (still {before[:120]!r}...)")
        time.sleep(0.25)


def widget_errors(page) -> list[str]:
    """How a widget that fails to render shows: "Error displaying widget" (the model is missing; ipywidgets
    7 and 8), ipywidgets 8's error view ("Click to show javascript error", no such text), and the widget
    manager's error in the console."""
    shown = {"'Error displaying widget'": page.get_by_text("Error displaying widget"),
             "error view": page.locator(".jupyter-widgets-error-widget")}
    found = [f"{n} x {what}" for what, loc in shown.items() if (n := loc.count())]
    return found + [line for line in page.log.console if line.startswith("error") and "jupyter-widgets" in line]


def run_all_cells(page, notebook: str):
    """Run > Run All Cells, as a student would, then wait until the kernel is idle with no cell queued."""
    # the status bar reads "<kernel name> | Idle" once the kernel is up ("No Kernel | ..." before); not
    # the toolbar's execution indicator, which already says idle while the kernel is still starting
    kernel_idle = page.get_by_text(re.compile(r"^(?!No Kernel).+ \| Idle$"))
    expect(kernel_idle).to_have_count(1, timeout=90_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    # text_contents, not inner_texts: JupyterLab skips rendering off-screen cells (content-visibility),
    # whose innerText is then empty
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt")
    deadline, settled = time.monotonic() + RUN_ALL_TIMEOUT_S, 0
    while settled < 2:   # idle twice in a row: the kernel may idle for a moment between two cells
        if time.monotonic() > deadline:
            pytest.fail(f"{notebook}: cells still running after {RUN_ALL_TIMEOUT_S} s")
        time.sleep(1)
        busy = kernel_idle.count() == 0 or "[*]:" in prompts.all_text_contents()
        settled = 0 if busy else settled + 1
    not_run = [i for i, p in enumerate(prompts.all_text_contents()) if not re.fullmatch(r"\[\d+\]:", p.strip())]
    if not_run:   # Run All stops at the first error: show it
        errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        tracebacks = [t for t in errors.all_text_contents() if "Error" in t]
        pytest.fail(f"{notebook}: code cells {not_run} did not run; errors:\n" + "\n".join(tracebacks)[-4000:])


@pytest.mark.parametrize("widget", WIDGETS, ids=str)
def test_widget_renders_and_responds(widget, page, jupyter_lab):
    page.goto(jupyter_lab.notebook_url(widget.notebook))
    try:
        run_all_cells(page, widget.notebook)
        cell = page.locator(".jp-CodeCell", has_text=widget.cell)
        expect(cell, f"{widget.notebook}: one code cell with {widget.cell!r}").to_have_count(1)
        cell.scroll_into_view_if_needed()   # for the screenshot, if what follows fails
        if errors := widget_errors(page):
            pytest.fail(f"{widget.notebook}: a widget failed to render: {errors}")
        if widget.option is None:
            control = page.locator(".widget-button", has_text=re.compile(f"^{re.escape(widget.control)}$"))
        else:
            label = page.locator(".widget-label", has_text=re.compile(f"^{re.escape(widget.control)}$"))
            control = page.locator(".widget-dropdown", has=label).locator("select")
        # the cell's output holding the view (the Output widget inside it has an output area of its own)
        view = cell.locator(".jp-OutputArea-output", has=control)
        expect(view, f"{widget.name}'s view with its control {widget.control!r}").to_have_count(1)
        figure = view.locator(".widget-output img")
        text = view.locator(".widget-html-content").first   # the summary, counters or metrics
        expect(figure, f"{widget.name} shows its figure").to_have_count(1)
        before_src, before_text = figure.get_attribute("src"), text.text_content()

        if widget.option is None:
            control.click()
        else:
            control.select_option(widget.option)
        wait_for_change(lambda: figure.get_attribute("src"), before_src, f"{widget.name}'s figure (<img> src)")
        wait_for_change(text.text_content, before_text, f"{widget.name}'s text")
        if errors := widget_errors(page):
            pytest.fail(f"{widget.notebook}: a widget failed after the change: {errors}")
    finally:
        jupyter_lab.shutdown_kernels()   # the next notebook gets the two cores
