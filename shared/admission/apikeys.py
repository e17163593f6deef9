"""API keys: who may call the HTTP API and MCP server, and for which subjects.

A key is `mf_<id>_<secret>`. Redis keeps its record (name, subject patterns, read-only flag,
created time, the SHA-256 of the whole key — never the key itself) twice: in the list of keys
under its id, and under its hash, so that each request's lookup is one GET and a revoked key is
refused by the very next request. The secret is 32 random bytes: a fast hash is enough where guessing is hopeless,
which is why this is not a password hash.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

import orjson
import redis
import redis.asyncio

from memflow.pipeline.scopes import allows, check_pattern
from memflow.shared.errors import InvalidInput
from memflow.shared.redisdb.keys import Keys

PREFIX = "mf_"


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    subjects: tuple[str, ...]
    read_only: bool
    created_at: str

    def may_see(self, subject: str) -> bool:
        return allows(self.subjects, subject)

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "name": self.name, "subjects": list(self.subjects), "read_only": self.read_only,
                "created_at": self.created_at}


# The principal of a server started with --no-auth: every subject, every call.
OPEN = ApiKey(id="no-auth", name="no-auth", subjects=("*",), read_only=False, created_at="")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def create(self, name: str, subjects: list[str], *, read_only: bool, now: datetime) -> tuple[ApiKey, str]:
        """A new key and its secret (shown once: only its hash is kept)."""
        if not name.strip():
            raise InvalidInput("name", "a key needs a name")
        try:
            patterns = tuple(check_pattern(p.strip()) for p in subjects)
        except ValueError as exc:
            raise InvalidInput("subjects", str(exc)) from exc
        if not patterns:
            raise InvalidInput("subjects", "a key needs at least one subject pattern ('*' for all)")
        key = ApiKey(id=secrets.token_hex(4), name=name.strip(), subjects=patterns, read_only=read_only,
                     created_at=now.isoformat())
        secret = f"{PREFIX}{key.id}_{secrets.token_urlsafe(32)}"
        record = orjson.dumps({**key.as_json(), "digest": digest(secret)})
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.api_keys, key.id, record)
            pipe.set(self.keys.api_key_hash(digest(secret)), record)  # the lookup's one GET
            pipe.execute()
        return key, secret

    def lookup(self, secret: str) -> ApiKey | None:
        """The key this secret is, if it exists and is not revoked."""
        return _found(self.client.get(self.keys.api_key_hash(digest(secret))))

    async def lookup_async(self, client: redis.asyncio.Redis, secret: str) -> ApiKey | None:
        """`lookup` on an event loop (the HTTP server's): the same GET, without a hop to a thread."""
        return _found(await client.get(self.keys.api_key_hash(digest(secret))))

    def list(self) -> list[ApiKey]:
        records = [orjson.loads(raw) for raw in self.client.hvals(self.keys.api_keys)]
        return sorted((_key(r) for r in records), key=lambda k: (k.created_at, k.id))

    def revoke(self, key_id: str) -> bool:
        """Revoke by id (or by name, when exactly one key has it). False when there is no such key."""
        found = self._record(key_id)
        if found is None:
            return False
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.api_key_hash(str(found["digest"])))
            pipe.hdel(self.keys.api_keys, str(found["id"]))
            pipe.execute()
        return True

    def _record(self, id_or_name: str) -> dict[str, object] | None:
        raw = self.client.hget(self.keys.api_keys, id_or_name)
        if raw is not None:
            record: dict[str, object] = orjson.loads(raw)
            return record
        named = [r for r in (orjson.loads(v) for v in self.client.hvals(self.keys.api_keys)) if r["name"] == id_or_name]
        if len(named) > 1:
            raise InvalidInput("key", f"{len(named)} keys are named {id_or_name!r}: revoke by id")
        return named[0] if named else None


def _found(raw: bytes | str | None) -> ApiKey | None:
    return None if raw is None else _key(orjson.loads(raw))


def _key(record: dict[str, object]) -> ApiKey:
    subjects = record["subjects"]
    assert isinstance(subjects, list)
    return ApiKey(id=str(record["id"]), name=str(record["name"]), subjects=tuple(str(s) for s in subjects),
                  read_only=bool(record["read_only"]), created_at=str(record["created_at"]))
