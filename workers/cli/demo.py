"""`memflow demo`: everything started in a temporary directory, a short conversation, what was remembered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import typer

from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient
from memflow.workers.cli.common import load_settings
from memflow.workers.cli.memories import print_memories
from memflow.workers.process import temporary_data_dir

# Two sessions a day apart: a compound introduction with the assistant's small talk, then a move said in passing.
# The searches find the current city first, and the job the move left alone.
DEMO_SESSIONS = [
    ("s1", [
        ("user", "Hi! I'm planning the Atlas project rollout this quarter."),
        ("assistant", "Great, how can I help with Atlas?"),
        ("user", "I live in Lyon and I work as a site reliability engineer."),
        ("user", "I prefer short answers with bullet points, please."),
        ("user", "Remember: never deploy on Fridays."),
        ("user", "We decided to use PostgreSQL 16 for the Atlas database."),
        ("user", "我不喜欢冗长的解释，回答请尽量简短。"),
    ]),
    ("s2", [
        ("user", "Quick news: we moved to Geneva last week."),
        ("assistant", "Congratulations on the move! Anything I can help with today?"),
    ]),
]
DEMO_QUERIES = ["where do I live?", "what is my job?", "how should answers be formatted?",
                "which database does Atlas use?", "when must we not deploy?"]


def demo() -> None:
    """Start everything in a temporary directory, hold a short conversation, show what was remembered."""
    from memflow.workers.embedded import embedded

    with temporary_data_dir(load_settings("WARNING")) as tmp_settings, embedded(tmp_settings) as system:
        _demo_conversation(system.client)


def _demo_conversation(client: MemoryClient) -> None:
    subject, now = "demo-user", datetime.now(UTC)
    for day, (session, turns) in enumerate(DEMO_SESSIONS):
        start = now - timedelta(days=len(DEMO_SESSIONS) - day, minutes=10)
        typer.echo(f"== an agent publishes a conversation (session {session}, {start:%Y-%m-%d})")
        for i, (role, text) in enumerate(turns):
            client.publish({"event_id": f"demo-{session}-{i}", "subject": subject, "session_id": session,
                            "kind": "message", "role": role, "text": text, "ts": start + timedelta(seconds=10 * i)})
            typer.echo(f"   {role:>9}: {text}")
        client.publish({"event_id": f"demo-{session}-end", "subject": subject, "session_id": session,
                        "kind": "session_end", "ts": start + timedelta(minutes=5)})
    typer.echo("== waiting for trigger → extract → resolve → upsert ...")
    if not client.wait_idle(timeout_s=120):
        raise SystemExit("the pipeline did not go idle within 120 s")
    typer.echo("== memories written")
    print_memories(client.call(rpc.INSPECT, subject=subject).memories)
    for query in DEMO_QUERIES:
        result = client.search(subject, query, k=3)
        typer.echo(f"== search {query!r}: {result.status}, {result.latency_ms:.1f} ms")
        for hit in result.hits:
            typer.echo(f"   {hit.score:.4f} {hit.dir.value}/{hit.mtype.value}  {hit.content}")
