"""Run a course notebook the one way the tests and the site do, and keep the executed copy.

    from tools import nbexec       # the repository's root on sys.path (pytest's rootdir, tools/site.py)
    nbexec.execute_notebook(Path("notebooks/05_kv_caching.ipynb"), Path("build/executed"))

The tracked notebook runs exactly as committed (nothing is added to it), with nbclient, in a kernel whose
working folder is the notebook's folder. Widget state is kept (`store_widget_state=True`): nbval dropped
the comm messages. nbclient records it once, at the end of the notebook, after later cells may have changed
a widget; so each cell that displays a widget also keeps in its metadata (`course_widget_state`) the state
of that widget's models when the cell finished, from which the site draws the widget's stand-in. A run
that succeeds writes `<out>/<name>.ipynb` with `metadata.course_execution`: the tracked file's sha256 (so
a later build can tell whether the copy is still current), quick mode, the device, torch's version, the
date and the seconds it took. A failing cell raises NotebookFailed whose message is that cell's source and traceback.
"""
from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import re
import time
from pathlib import Path

import nbformat

META_KEY = "course_execution"
SNAPSHOT_KEY = "course_widget_state"   # a cell's metadata: its widgets' state when the cell finished
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CELL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class NotebookFailed(Exception):
    """A notebook did not run through; the message names the cell and holds its source and traceback."""


def source_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@functools.lru_cache(maxsize=1)
def _environment() -> dict:
    """What the kernel ran on: it is this interpreter with this environment (COURSE_QUICK included), so the
    answers here are the kernel's."""
    import torch

    from course_lib import env
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"quick": env.quick(), "device": device, "torch": torch.__version__}


def model_refs(value, views: bool = True):
    """The model ids a widget's state refers to ("IPY_MODEL_<id>", alone or in lists and dicts), in order;
    with `views`, also the widget views among an Output widget's outputs (the site renders those outputs
    itself, so it asks for the references alone)."""
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        yield value[len("IPY_MODEL_"):]
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from model_refs(v, views)
    elif isinstance(value, dict):
        if views and WIDGET_VIEW in value and isinstance(value[WIDGET_VIEW], dict):
            yield value[WIDGET_VIEW].get("model_id")
        for v in value.values():
            yield from model_refs(v, views)


def widget_snapshot(widget_state: dict, widget_buffers: dict, view_ids) -> dict:
    """The state of the models reachable from the widget views `view_ids` (children, layouts, the widgets
    an Output widget displays), copied now, in the shape nbclient gives `metadata.widgets` (with the same
    serialization), so that a reader takes either."""
    state, todo = {}, list(view_ids)
    while todo:
        model_id = todo.pop()
        if model_id in state or model_id not in widget_state or "_model_name" not in widget_state[model_id]:
            continue
        st = copy.deepcopy(widget_state[model_id])   # nbclient updates these dicts (and Output lists) in place
        state[model_id] = {"model_name": st.get("_model_name"), "model_module": st.get("_model_module"),
                           "model_module_version": st.get("_model_module_version"), "state": st}
        if buffers := widget_buffers.get(model_id):
            state[model_id]["buffers"] = copy.deepcopy(list(buffers.values()))
        todo += model_refs(st)
    return {"state": state, "version_major": 2, "version_minor": 0}


def _snapshot_cell_widgets(client, cell, cell_index=None, execute_reply=None) -> None:
    """nbclient's on_cell_executed hook (every output of the cell has arrived): keep the state of the
    widgets this cell displayed in the cell's metadata."""
    views = [o["data"][WIDGET_VIEW]["model_id"] for o in cell.get("outputs", [])
             if isinstance(o.get("data", {}).get(WIDGET_VIEW), dict)]
    if views:
        cell.metadata[SNAPSHOT_KEY] = widget_snapshot(client.widget_state, client.widget_buffers, views)


def execute_notebook(path: Path, out_dir: Path, timeout: int = CELL_TIMEOUT_S) -> Path:
    """Execute the notebook at `path` (each cell within `timeout` seconds) and write the executed copy to
    `out_dir/<name>.ipynb`; returns that path. Raises NotebookFailed on a failing cell, a timeout or a dead
    kernel (no copy is written then)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise ValueError(f"path must be an existing .ipynb file, got {str(path)!r}")
    sha = source_sha256(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    client.on_cell_executed = functools.partial(_snapshot_cell_widgets, client)
    start = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:   # its message: the cell's source, then the traceback
        failed = next((f"cell {i + 1} of {len(nb.cells)}" for i, c in enumerate(nb.cells)
                       if any(o.get("output_type") == "error" for o in c.get("outputs", []))), "a cell")
        raise NotebookFailed(f"{path.name}: {failed} failed\n{_ANSI.sub('', str(e))}") from None
    except CellTimeoutError as e:
        raise NotebookFailed(f"{path.name}: a cell ran past {timeout} s\n{_ANSI.sub('', str(e))}") from None
    except DeadKernelError as e:
        raise NotebookFailed(f"{path.name}: the kernel died\n{e}") from None
    nb.metadata[META_KEY] = {"source_sha256": sha, **_environment(),
                             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "seconds": round(time.perf_counter() - start, 1)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / path.name
    tmp = dest.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    tmp.replace(dest)   # a reader never sees half a copy
    return dest


def recorded_sha(copy: Path) -> str | None:
    """The source sha256 an executed copy records (None when it records none or is unreadable)."""
    try:
        nb = nbformat.read(copy, as_version=4)
    except (OSError, ValueError, nbformat.ValidationError):   # not a notebook: not a current copy
        return None
    return nb.metadata.get(META_KEY, {}).get("source_sha256")


def current_copy(path: Path, dirs) -> Path | None:
    """The first executed copy of `path`, searching `dirs` in order, that was executed from exactly the
    tracked file (same sha256); None when there is none."""
    sha = source_sha256(path)
    for d in dirs:
        copy = Path(d) / Path(path).name
        if copy.is_file() and recorded_sha(copy) == sha:
            return copy
    return None
