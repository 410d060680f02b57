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


def test_make_course_starts_jupyterlab_with_a_passive_openmp_wait_policy(venv, tmp_path):
    """Kernels inherit JupyterLab's environment: PASSIVE unless the student set a policy (spinning OpenMP
    threads made notebook 03 take 479 s instead of 52 s beside two busy loops on 2 cores). `make course` runs
    here with stand-ins for the venv's `course` and `jupyter` that report what they were given."""
    import os
    (venv / "bin").mkdir()
    for tool in ("course", "jupyter"):
        script = venv / "bin" / tool
        script.write_text(f"#!/bin/sh\necho {tool} OMP_WAIT_POLICY=$OMP_WAIT_POLICY\n")
        script.chmod(0o755)
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        if given:
            env["OMP_WAIT_POLICY"] = given
        out = subprocess.run(["make", "-s", "course", f"VENV={venv}", f"WORK={tmp_path / 'w'}"], cwd=ROOT,
                             env=env, capture_output=True, text=True, check=True).stdout
        assert f"jupyter OMP_WAIT_POLICY={expected}" in out, out
