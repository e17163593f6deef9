"""A Context is unpacked where a worker starts, and nowhere deeper (issue 29: "`Context` stops being a locator").

The entry points take the process's Context: the query worker's RPC handlers (the RQ jobs), the stream stages'
`build` (the consumer loop's handler), the jobs' `run`, the runner that assembles the stages (workers/system.py),
and the `of` constructors of the typed views a step takes (forgetting.Places, resolve.Resolver...).
Every other function takes what it uses (a store, an applier, keys and a client, a settings section), so that its
signature says what it touches and a test builds just that.
"""

from __future__ import annotations

import ast
from pathlib import Path

from memflow.workers import query

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("workers", "shared", "scheduler", "pipeline")
# The runner builds the context and hands it to every stage: the composition root (docs/conventions.md#a-composition-root).
WHOLE_MODULES = {"workers/system.py"}
# Where a Context is unpacked, by name, in every module: a stage's consumer handler, a typed view's constructor.
ANYWHERE = {"build", "of"}
ENTRY_POINTS = {
    "workers/query.py": {h.run.__name__ for h in query.HANDLERS.values()} | {"serve", "build_worker"},
    "workers/jobs.py": {"run"},  # the RUN_JOB call and `memflow jobs run`
    "workers/trigger.py": {"buffers"},  # the session buffers, bounded as the settings say
}


def _takes_our_context(module: ast.Module) -> list[tuple[str, int]]:
    """(name, line) of each function with a parameter annotated `Context`, when the module's `Context` is
    memflow's (workers/mcp.py's is the MCP SDK's request context)."""
    ours = any(isinstance(node, ast.ImportFrom) and node.module == "memflow.workers.runtime"
               and any(alias.name == "Context" for alias in node.names) for node in ast.walk(module))
    if not ours:
        return []
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(isinstance(p.annotation, ast.Name) and p.annotation.id == "Context" for p in params):
                found.append((node.name, node.lineno))
    return found


def test_only_the_entry_points_take_a_context() -> None:
    deeper = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in WHOLE_MODULES:
                continue
            allowed = ANYWHERE | ENTRY_POINTS.get(name, set())
            deeper += [f"{name}:{line} {fn}" for fn, line in _takes_our_context(ast.parse(path.read_text()))
                       if fn not in allowed]
    assert deeper == [], "these take the whole Context; give them what they use:\n" + "\n".join(deeper)


def test_the_scan_sees_a_context_taken_deeper() -> None:
    """The scan itself: a step taking the Context is found, a function of the MCP SDK's Context is not."""
    ours = ast.parse("from memflow.workers.runtime import Context\ndef locate(ctx: Context, memory_id: str): ...")
    theirs = ast.parse("from mcp.server.mcpserver import Context\ndef recall(self, ctx: Context): ...")
    assert _takes_our_context(ours) == [("locate", 2)]
    assert _takes_our_context(theirs) == []
