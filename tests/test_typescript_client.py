"""The TypeScript client (clients/typescript) against a live `memflow serve`: its build, its types checked
against the server's own OpenAPI document, and its `node:test` suite (publish → search → forget with proof →
another subject refused → bad input as typed errors) run with keys made by `memflow keys create`.

Skipped, saying so, where node or npm is absent; .ci/run installs Debian's so it never skips there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from memflow.shared.settings import to_env
from tests import test_api
from tests.test_api import Served

served = test_api.served  # the fixture: a system and `memflow serve` for this module

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "typescript"
NODE, NPM = shutil.which("node"), shutil.which("npm")
needs_node = pytest.mark.skipif(NODE is None or NPM is None,
                                reason="node and npm are not installed (apt-get install nodejs npm): "
                                       "the TypeScript client is built and tested with them")


def run(args: list[str], env: dict[str, str] | None = None, timeout_s: float = 240, cwd: Path = CLIENT) -> str:
    done = subprocess.run(args, cwd=cwd, env=env or dict(os.environ), capture_output=True, text=True,
                          timeout=timeout_s)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def cli_key(served: Served, name: str, subjects: str) -> str:
    """A key made as docs/front-doors.md#keys says: `memflow keys create`, the key alone on the last line."""
    env = {**os.environ, **to_env(served.settings)}
    done = subprocess.run([sys.executable, "-m", "memflow.workers.cli", "keys", "create", "--name", name,
                           "--subjects", subjects], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("mf_"), done.stdout
    return key


@pytest.fixture(scope="module")
def built() -> None:
    """`npm ci && npm run build`, once for the module."""
    assert NPM is not None
    run([NPM, "ci", "--no-audit", "--no-fund"])
    run([NPM, "run", "build"])


@needs_node
def test_the_clients_types_are_the_servers_openapi_document(served: Served, built: None) -> None:
    assert NODE is not None
    out = run([NODE, "scripts/generate.mjs", "--check", f"{served.url}/openapi.json"])
    assert "matches" in out


@needs_node
def test_the_typescript_client_against_a_live_server(served: Served, built: None) -> None:
    assert NODE is not None
    tag = uuid.uuid4().hex[:8]
    prefix, other = f"ts-{tag}/", f"ts-other-{tag}"
    env = {**os.environ, "MEMFLOW_URL": served.url, "MEMFLOW_SUBJECTS": prefix,
           "MEMFLOW_KEY": cli_key(served, f"ts-{tag}", f"{prefix}*"),
           "MEMFLOW_OTHER_KEY": cli_key(served, f"ts-other-{tag}", other), "MEMFLOW_OTHER_SUBJECT": other}
    out = run([NODE, "--test", "--test-reporter=spec", "test/client.test.mjs"], env=env, timeout_s=180)
    assert "# fail 0" in out or "fail 0" in out, out


IMPORT_CHECK = ("import('memflow-client').then((m) => console.log(typeof m.Memflow, typeof m.Forbidden))")


def fresh_copy(into: Path) -> Path:
    """The client as a fresh clone has it: no dist/, no node_modules/."""
    return Path(shutil.copytree(CLIENT, into / "client", ignore=shutil.ignore_patterns("dist", "node_modules")))


def project(where: Path) -> Path:
    where.mkdir()
    (where / "package.json").write_text('{"name": "uses-memflow", "version": "1.0.0", "type": "module"}\n')
    return where


@needs_node
def test_npm_install_of_the_folder_as_the_readme_says_then_an_import_works(tmp_path: Path) -> None:
    # Issue 41: dist/ was not built and there was no `prepare`: ERR_MODULE_NOT_FOUND …/dist/index.js.
    assert NODE is not None and NPM is not None
    client, user = fresh_copy(tmp_path), project(tmp_path / "app")
    run([NPM, "install", "--no-audit", "--no-fund", str(client)], cwd=user)
    assert run([NODE, "-e", IMPORT_CHECK], cwd=user).split() == ["function", "function"]


@needs_node
def test_npm_pack_holds_what_an_import_needs(tmp_path: Path) -> None:
    """The tarball `npm pack` makes (what a registry would serve), installed into a project and imported."""
    assert NODE is not None and NPM is not None
    client, user = fresh_copy(tmp_path), project(tmp_path / "app")
    name = run([NPM, "pack", "--pack-destination", str(tmp_path)], cwd=client).strip().splitlines()[-1]
    with tarfile.open(tmp_path / name) as packed:
        held = set(packed.getnames())
    assert {"package/package.json", "package/dist/index.js", "package/dist/index.d.ts"} <= held, sorted(held)
    run([NPM, "install", "--no-audit", "--no-fund", str(tmp_path / name)], cwd=user)
    assert run([NODE, "-e", IMPORT_CHECK], cwd=user).split() == ["function", "function"]
    installed = user / "node_modules" / "memflow-client"
    exports = json.loads((installed / "package.json").read_text())["exports"]["."]
    assert {"types", "import"} <= set(exports) and all((installed / path).is_file() for path in exports.values())


@needs_node
def test_check_schema_takes_the_servers_base_url(served: Served, built: None) -> None:
    # Issue 41: given the base URL it fetched the HTML page there: "Unexpected token '<'".
    assert NPM is not None
    out = run([NPM, "run", "check-schema", "--", served.url])
    assert "matches" in out and f"{served.url}/openapi.json" in out, out
