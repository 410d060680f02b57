"""make course turns JupyterLab's news pop-up (and its update check) off in the course's environment: the
Makefile's setup step writes etc/jupyterlab/overrides.json into the venv's application settings directory,
and JupyterLab's own settings reader gives the notification plugin those defaults."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "@jupyterlab/apputils-extension:notification"
OVERRIDES = "share/jupyter/lab/settings/overrides.json"


@pytest.fixture
def venv(tmp_path):
    """A stand-in for an installed .venv: its .installed stamp newer than pyproject.toml, so make does not
    install anything and runs only the settings step."""
    v = tmp_path / "venv"
    v.mkdir()
    (v / ".installed").touch()
    return v


def test_make_course_writes_the_lab_settings_into_the_venv(venv, tmp_path):
    plan = subprocess.run(["make", "-n", "course", f"VENV={venv}", f"WORK={tmp_path / 'w'}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert f"cp etc/jupyterlab/overrides.json {venv}/{OVERRIDES}" in plan, plan
    # jupyter lab starts after the settings are in place
    assert plan.index(f"{venv}/{OVERRIDES}") < plan.index("jupyter lab")
    subprocess.run(["make", "-s", f"VENV={venv}", f"{venv}/{OVERRIDES}"], cwd=ROOT, check=True, capture_output=True)
    written = json.loads((venv / OVERRIDES).read_text())
    assert written[PLUGIN] == {"fetchNews": "false", "checkForUpdates": False}


def test_jupyterlab_reads_the_news_setting_from_there(venv):
    """JupyterLab's settings reader (jupyterlab_server, as the server answers the front end) on the written
    application settings directory and this environment's schemas: the plugin's defaults are now
    fetchNews 'Never' and no update check, values its schema allows."""
    settings_utils = pytest.importorskip("jupyterlab_server.settings_utils")
    schemas = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
    if not (schemas / "@jupyterlab" / "apputils-extension" / "notification.json").exists():
        pytest.skip(f"no JupyterLab schemas in {schemas}")
    subprocess.run(["make", "-s", f"VENV={venv}", f"{venv}/{OVERRIDES}"], cwd=ROOT, check=True, capture_output=True)
    settings, _ = settings_utils.get_settings(str((venv / OVERRIDES).parent), str(schemas), str(venv / "user"),
                                              schema_name=PLUGIN)
    props = settings["schema"]["properties"]
    assert props["fetchNews"]["default"] == "false" and props["checkForUpdates"]["default"] is False
    assert "false" in [c["const"] for c in props["fetchNews"]["oneOf"]]
    assert set(json.loads((ROOT / "etc/jupyterlab/overrides.json").read_text())[PLUGIN]) <= set(props)
