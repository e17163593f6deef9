"""A proof fails when its protection is off (issue 43): each guarantee of docs/guarantees.md, its protection
switched off in a copy of the tree, and the tests that must then fail.

    python -m memflow.bench.mutants            # every mutant, one after another (a few minutes)
    python -m memflow.bench.mutants revision   # the named ones
    python -m memflow.bench.mutants --list

Each mutant is one exact replacement in one file of a copy of the working tree (the repository is never
touched), or a setting that turns the protection off; the tests named run on the copy and must fail. A mutant
whose tests pass "survived": its tests prove nothing about that protection. tests/test_mutants.py checks that
every replacement still finds its text, so a refactor cannot silently retire one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str  # its section of docs/guarantees.md
    protection: str  # what is switched off, in words
    tests: tuple[str, ...]
    edits: tuple[tuple[str, str, str], ...] = ()  # (file, text, its replacement); none: switched off by `env` alone
    env: dict[str, str] = field(default_factory=dict)


MUTANTS: tuple[Mutant, ...] = (
    Mutant("durable-ack", "nothing-acknowledged-is-lost",
           "a publish no longer waits for the AOF (MEMFLOW_REDIS_WAIT_AOF=false) on a server at everysec",
           ("tests/faults/test_durable_ack.py::test_events_acknowledged_the_moment_before_a_kill_9_are_all_there_after"
            "_the_restart[everysec]",),
           env={"MEMFLOW_REDIS_WAIT_AOF": "false"}),
    Mutant("durable-own", "nothing-acknowledged-is-lost",
           "memflow's own server fsyncs once a second (everysec) and a publish does not wait for the AOF",
           ("tests/faults/test_durable_ack.py::test_events_acknowledged_the_moment_before_a_kill_9_are_all_there_after"
            "_the_restart[memflow's own]",),
           edits=(("shared/redisdb/server.py", '"--appendfsync", "always", "--save", ""',
                   '"--appendfsync", "everysec", "--save", ""'),),
           env={"MEMFLOW_REDIS_WAIT_AOF": "false"}),
    Mutant("revision", "nothing-is-doubled-and-no-update-is-lost",
           "a patch no longer checks the revision it was planned on (edge_store.set_fields)",
           ("tests/test_races.py::test_no_interleaving_resurrects_loses_or_reorders",),
           edits=(("shared/storage/edge_store.py",
                   'rev = [] if if_rev is None else [qe.FieldCondition("rev", match=qe.MatchValue(if_rev))]',
                   "rev = []"),)),
    Mutant("replay", "nothing-is-doubled-and-no-update-is-lost",
           "resolve does not know a candidate already recorded from the same events (a replay writes again)",
           ("tests/test_write_path.py::test_any_sequence_of_events_published_again_changes_nothing",),
           edits=(("pipeline/resolve.py",
                   "    if any(_recorded(f, n, duplicate_threshold) for n in mine for f in forms):\n",
                   "    if False:\n"),)),
    Mutant("replay-by-events", "nothing-is-doubled-and-no-update-is-lost",
           "resolve does not ask what a candidate's events were already read into (only its key and live neighbours)",
           ("tests/test_write_path.py::test_a_replay_of_a_statement_merged_into_another_key_does_not_bring_it_back",),
           edits=(("workers/resolve.py", "sources=candidate.source_event_ids)", "sources=[])"),)),
    Mutant("tombstones", "forgetting-is-provable",
           "a write no longer reads forget's tombstones (what was forgotten can be written back)",
           ("tests/test_races.py::test_a_redelivered_write_does_not_bring_back_what_was_forgotten",
            "tests/test_races.py::test_a_batch_decided_before_the_forget_does_not_write_the_forgotten_words_back"),
           edits=(("shared/writer/applier.py",
                   "plan = writes.plan(mutation, current, tombstones=a.tombstones(mutation))",
                   "plan = writes.plan(mutation, current, tombstones=writes.Tombstones())"),)),
    Mutant("fencing", "one-subjects-writes-never-race",
           "a batch is settled (its outputs appended, its entries acknowledged) by a consumer that lost its lease",
           ("tests/test_partitions.py::test_a_consumer_that_lost_its_lease_settles_nothing",
            "tests/test_progress_leases.py::test_a_consumer_that_lost_its_lease_applies_nothing_more_of_its_batch"),
           edits=(("shared/streaming/consumer.py",
                   "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\nlocal n",
                   "if false then return 0 end\nlocal n"),)),
    Mutant("leases", "one-subjects-writes-never-race",
           "a partition's lease is taken even while another consumer holds it (SET without NX)",
           ("tests/test_partitions.py::test_consumers_share_the_partitions_fairly_and_each_subject_is_handled_in_order",),
           edits=(("shared/streaming/leases.py",
                   "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
                   "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])"),)),
    Mutant("subject-scoping", "a-key-reaches-its-own-subjects-memories-and-nothing-else-by-id-too",
           "an API key's subject patterns are not checked at the doors",
           ("tests/test_api.py::test_a_key_touches_only_its_subjects_everywhere",
            "tests/test_mcp.py::test_a_key_may_not_name_another_subject_and_a_revoked_key_is_refused_at_once"),
           edits=(("workers/front.py",
                   "    if not key.may_see(subject):\n        raise ApiError(403",
                   "    if False:\n        raise ApiError(403"),)),
    Mutant("secret-gate", "secrets-are-redacted-and-injections-dropped-before-anything-is-stored",
           "no secret is redacted: neither by publish (the SDK) nor by the gate (the trigger) behind it",
           ("tests/test_corpus.py::test_no_secret_or_injection_survives_the_pipeline",),
           edits=(("pipeline/gate.py",
                   "    cleaned, kinds = _redact(text, SECRETS)\n",
                   "    cleaned, kinds = text, []\n"),
                  ("shared/sdk/client.py",
                   "    text, kinds = redact_secrets(event.text)\n    return event.model_copy(",
                   "    text, kinds = event.text, []\n    return event.model_copy("))),
    Mutant("secret-at-publish", "no-secret-reaches-redis",
           "publish writes the raw text to the stream (the gate still redacts before anything is stored)",
           ("tests/test_forgetting.py",),
           edits=(("shared/sdk/client.py",
                   "    text, kinds = redact_secrets(event.text)\n    return event.model_copy(",
                   "    text, kinds = event.text, []\n    return event.model_copy("),)),
    Mutant("pending-layer", "what-was-just-said-is-found-at-once",
           "a search does not read the pending layer (what was said but not yet stored)",
           ("tests/test_pending.py::test_a_statement_is_found_before_it_is_stored_then_as_the_stored_memory",),
           edits=(("shared/search/reader.py",
                   "        return pending_of(self.settings.pending, self.client, self.keys, subject)",
                   "        return []"),)),
    Mutant("store-subject-filter", "subjects-never-see-each-other",
           "the store's queries are not filtered by subject",
           ("tests/test_isolation.py::test_a_thousand_searches_find_only_the_subjects_own_memories",),
           edits=(("shared/storage/edge_store.py", "    must: list[Any] = [_subject(flt.subject)]\n",
                   "    must: list[Any] = []\n"),)),
    Mutant("host-check", "a-page-of-another-site-gets-nothing-from-memflow-serve-keys-or---no-auth",
           "the HTTP doors answer any Host header (DNS rebinding)",
           ("tests/test_door_origin.py::test_a_host_naming_another_port_is_refused_421",),
           edits=(("workers/front.py", "    if host is not None and not allowed.host(host, port):",
                   "    if False:"),)),
    Mutant("tool-arguments", "an-mcp-tool-does-only-what-its-arguments-say",
           "an MCP tool ignores an argument it does not name (the SDK's default)",
           ("tests/test_mcp.py::test_every_tool_refuses_an_argument_it_does_not_name",),
           edits=(("workers/mcp.py", 'config = ConfigDict(**{**loose.model_config, "extra": "forbid"})',
                   'config = ConfigDict(**{**loose.model_config, "extra": "ignore"})'),)),
    Mutant("retention", "what-redis-keeps-and-for-how-long",
           "retention trims past the oldest entry still pending",
           ("tests/test_partitions.py::test_retention_trims_what_was_acknowledged_and_keeps_what_is_unread_or_pending",),
           edits=(("shared/streaming/backlog.py", '            bound = min(bound, _id(oldest["min"]))',
                   "            pass"),)),
    Mutant("undecodable-to-dlq", "bad-input-gets-a-clear-error-and-blocks-nothing",
           "an entry a stage cannot decode is left pending instead of dead-lettered with its reason",
           ("tests/test_fuzz_input.py::test_every_bad_entry_of_a_stage_is_dead_lettered_and_the_stream_flows",),
           edits=(("shared/streaming/consumer.py",
                   '                self._dead_letter(entry, f"undecodable: {exc}", entry.deliveries)\n',
                   "                continue\n"),)),
    Mutant("import-undo", "an-import-never-half-applies-a-subject",
           "a refused import does not take back the slices it already wrote",
           ("tests/test_transfer.py::test_a_slice_refused_as_it_is_written_takes_back_the_slices_written_before_it",),
           edits=(("workers/transfer.py",
                   "        ours = export.written_by(_held(applier.store, req.subject, req.records).values(), keys)",
                   "        ours = []"),)),
    Mutant("transient-server", "a-search-waits-for-no-fsync",
           "the embedded mode starts no transient server: a search's writes wait for the durable server's fsyncs",
           ("tests/test_transient_server.py",),
           edits=(("workers/process.py",
                   "queues = None if settings.redis.queue_url else start_redis(",
                   "queues = None if True else start_redis("),)),
    Mutant("gate-refuses-all", "stored-text-is-data-never-an-instruction",
           "the gate keeps nothing (a corpus test that only compared counts passed)",
           ("tests/test_corpus.py::test_planted_orders_are_never_rendered_as_rules_and_genuine_wishes_still_are",),
           edits=(("pipeline/gate.py",
                   "return GateVerdict(keep=True, text=cleaned,",
                   "return GateVerdict(keep=False, text=cleaned,"),)),
    Mutant("replica-rewrite", "which-copies-hold-what-and-for-how-long",
           "forget rewrites the master's AOF only, not its replicas'",
           ("tests/test_forgetting_copies.py::test_forget_contains_takes_a_raw_copy_off_the_master_and_the_replica"
            "_disk",),
           edits=(("workers/forgetting.py", "    for replica in _replicas(client):", "    for replica in []:"),)),
    Mutant("stream-node-entries", "which-copies-hold-what-and-for-how-long",
           "memflow's own server packs streams 100 entries a node (a deleted entry's bytes stay in the node)",
           ("tests/test_forgetting_copies.py::test_forget_contains_takes_a_raw_copy_off_the_master_and_the_replica"
            "_disk",),
           edits=(("shared/redisdb/server.py", '"--stream-node-max-entries", "1")', ")"),)),
    Mutant("outage-dead-letters", "outages-are-waited-out-not-turned-into-answers",
           "a store outage is taken for the message's fault (StoreUnavailable is Permanent: dead-lettered at once)",
           ("tests/faults/test_store_outage.py",),
           edits=(("shared/errors.py", "class StoreUnavailable(Retryable):", "class StoreUnavailable(Permanent):"),)),
    Mutant("outage-answers-empty", "outages-are-waited-out-not-turned-into-answers",
           "a search whose whole-subject route the store fails answers with what the other routes found (empty)",
           ("tests/faults/test_store_outage.py",),
           edits=(("shared/search/reader.py", "        if not route.dirs:\n            raise\n",
                   "        if False:\n            raise\n"),)),
    Mutant("key-concurrency", "one-tenant-cannot-hold-anothers-searches",
           "a key's requests in flight are not counted (no MEMFLOW_HTTP_KEY_CONCURRENCY)",
           ("tests/test_fairness.py::test_a_key_flooding_slow_searches_cannot_hold_another_keys_search",
            "tests/test_fairness.py::test_a_keys_places_are_counted_across_server_processes"),
           edits=(("shared/admission/fairness.py", "    if len(live) >= limits.concurrency:", "    if False:"),)),
    Mutant("query-workers", "one-tenant-cannot-hold-anothers-searches",
           "a process runs one search worker whatever MEMFLOW_QUERY_WORKERS says",
           ("tests/test_fairness.py::test_a_key_flooding_slow_searches_cannot_hold_another_keys_search",),
           edits=(("workers/system.py", "for i in range(ctx.settings.consumer.query_workers)]",
                   "for i in range(1)]"),)),
)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    caught: bool
    code: int
    seconds: float
    last: str  # pytest's summary line


def copy_tree(target: Path) -> None:
    """The working tree's tracked files (as they are now, edits included) and its symlinks, into `target`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, dest = ROOT / name, target / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            dest.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, dest)


def mutate(mutant: Mutant, tree: Path) -> None:
    """Apply the mutant's replacements; ValueError unless each one's text is found exactly once."""
    for name, old, new in mutant.edits:
        path = tree / name
        text = path.read_text()
        if text.count(old) != 1:
            raise ValueError(f"{mutant.name}: {name} holds {text.count(old)} copies of its text, not 1")
        path.write_text(text.replace(old, new))


def run(mutant: Mutant) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        mutate(mutant, tree)
        env = {**os.environ, "PYTHONPATH": str(tree), **mutant.env}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                               "--tb=line", *mutant.tests], cwd=tree, env=env, capture_output=True, text=True,
                              check=False)
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        # --tb=line: one "path:line: Error: message" line per failed test, what the test said
        said = next((line.split(": ", 1)[-1] for line in lines if line.startswith(("/", "tests/", "E "))), "")
        # pytest exits 1 when a test failed: anything else (2-5) is no verdict on the protection
        return Outcome(mutant, done.returncode == 1, done.returncode, time.monotonic() - started,
                       (lines[-1] if lines else done.stderr.strip()[-200:]) + (f": {said[:160]}" if said else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="the mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list them and exit")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no mutant {', '.join(sorted(unknown))} (see --list)")
    if args.list:
        for m in chosen:
            print(f"{m.name:<20} {m.protection}")
        return 0
    survived = 0
    for m in chosen:
        outcome = run(m)
        survived += not outcome.caught
        verdict = "caught" if outcome.caught else "SURVIVED" if outcome.code == 0 else f"no verdict ({outcome.code})"
        print(f"{m.name:<20} {verdict:<10} {outcome.seconds:6.0f} s  {outcome.last}", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
