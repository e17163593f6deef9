"""memflow installs like a library: one top-level package, `memflow`, beside an agent project's own
`shared/` and `workers/` packages (which used to be shadowed, or to shadow ours)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USERS_SCRIPT = """
import shared, workers
assert shared.WHOSE == "the user's" and workers.WHOSE == "the user's", (shared.__file__, workers.__file__)
import memflow
from memflow import MemoryClient, Settings
from memflow.shared.settings import get_settings
from memflow.workers.cli import app
assert memflow.__file__.startswith(sys.argv[1]), memflow.__file__
assert MemoryClient.__module__ == "memflow.shared.sdk.client"
assert shared.WHOSE == "the user's"
print("ok", Settings().http.port)
"""


def build_wheel(out: Path) -> Path:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(out), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    return next(out.glob("memflow-*.whl"))


def test_the_wheel_holds_one_top_level_package_and_an_agent_projects_own_shared_package_coexists(
        tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"memflow"}
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin") == \
        ["memflow"]
    project = tmp_path / "agent"
    for name in ("shared", "workers"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text('WHOSE = "the user\'s"\n')
    # The agent's project on the path first, then the installed wheel; memflow's dependencies from this venv.
    env = {**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{site}"}
    ran = subprocess.run([sys.executable, "-c", "import sys\n" + USERS_SCRIPT, str(site)], cwd=project, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("ok 8765")
