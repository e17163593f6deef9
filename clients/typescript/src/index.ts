// memflow's HTTP API for TypeScript: one method per route, the API's own types (src/schema.ts, generated from
// its OpenAPI document), typed errors carrying the API's error code, message and field. No dependency: `fetch`
// (Node 18+, Deno, Bun, browsers).
import type {
  Adopted,
  ChangesPage,
  ChatEvent,
  ErrorBody,
  EventFate,
  ExportEnd,
  ExportHeader,
  ExportRecord,
  FeedEntry,
  FeedbackRequest,
  Forgotten,
  Health,
  History,
  ImportReport,
  InspectReport,
  PackRequest,
  PackedPrompt,
  People,
  ProfileReply,
  Published,
  SearchRequest,
  SearchResult,
  SubjectList,
  Trace,
  WriteRequest,
  Written,
} from "./schema.js";

export type * from "./schema.js";

/** The API's stable error codes (docs/front-doors.md#http-api), plus `network` and `bad_reply` from this client. */
export type ErrorCode = ErrorBody["code"] | "network" | "bad_reply";

/** One line of an export: the header first, one record per stored point, then the end line counting them
 *  (docs/export-format.md). */
export type ExportLine = ExportHeader | ExportRecord | ExportEnd;

/** What a followed change feed yields (docs/changes.md): a change; a cursor (once, at the opening of a stream
 *  followed from now: the moment it opened, naming no entry); or a gap (the stream was trimmed past the cursor
 *  asked with: read the subject again). `id` is the cursor to resume after (`follow({after: id})`), so a reader
 *  that stops misses nothing and sees nothing twice. Every `id` is the key's own entry's or that moment. */
export type FeedItem =
  | { type: "change"; id: string; entry: FeedEntry }
  | { type: "cursor"; id: string }
  | { type: "gap"; id: string | null; after: string };

/** A request the API refused or could not answer: `status` (HTTP), `code`, `message` and the `field` it names. */
export class MemflowError extends Error {
  override readonly name: string = "MemflowError";
  constructor(
    readonly status: number,
    readonly code: ErrorCode,
    message: string,
    readonly field: string | null = null,
    /** Seconds to wait before trying again (429 `rate_limited`, 503 `busy`), when the server said. */
    readonly retryAfterS: number | null = null,
    /** The reply's body as it came (a failed search's `SearchResult` with `status: "failed"`). */
    readonly body: unknown = null,
  ) {
    super(field ? `${code} (${field}): ${message}` : `${code}: ${message}`);
  }
}

/** 422/413/400: the input was refused, `field` names what (`ts`, `3.ts` in a batch, `records.2.memory.content`). */
export class InvalidInput extends MemflowError {
  override readonly name = "InvalidInput";
}
/** 401: no key, or an unknown or revoked one. */
export class Unauthorized extends MemflowError {
  override readonly name = "Unauthorized";
}
/** 403 (or 421 for a Host the server does not answer to): the key may not touch this subject, or is read-only. */
export class Forbidden extends MemflowError {
  override readonly name = "Forbidden";
}
/** 404: no such memory for this key (another subject's memory is answered so too). */
export class NotFound extends MemflowError {
  override readonly name = "NotFound";
}
/** 429 `rate_limited` or 503 `busy`: try again after `retryAfterS`. */
export class RateLimited extends MemflowError {
  override readonly name = "RateLimited";
}
/** 503 `store_unavailable`, 504 `timeout`, 500 `internal`, a network failure: memory could not look. */
export class Unavailable extends MemflowError {
  override readonly name = "Unavailable";
}

const CLASSES: Record<string, typeof MemflowError> = {
  invalid_input: InvalidInput,
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  not_found: NotFound,
  rate_limited: RateLimited,
  busy: RateLimited,
  store_unavailable: Unavailable,
  timeout: Unavailable,
  internal: Unavailable,
  network: Unavailable,
};

function errorOf(status: number, code: ErrorCode, message: string, field: string | null, retry: number | null,
                 body: unknown): MemflowError {
  const Class = CLASSES[code] ?? MemflowError;
  return new Class(status, code, message, field, retry, body);
}

export interface MemflowOptions {
  /** The server, e.g. "http://127.0.0.1:8765" (`memflow serve`). */
  baseUrl: string;
  /** An API key, `mf_…` (`memflow keys create`); omit for a `--no-auth` server. */
  key?: string;
  /** Milliseconds before a request is given up (default 60 000): an `Unavailable` with code `timeout`. */
  timeoutMs?: number;
  /** Another `fetch` (tests, proxies). */
  fetch?: typeof fetch;
}

type Query = Record<string, string | number | boolean | string[] | null | undefined>;

function queryString(query: Query | undefined): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query ?? {})) {
    if (value === undefined || value === null) continue;
    for (const one of Array.isArray(value) ? value : [value]) params.append(name, String(one));
  }
  const text = params.toString();
  return text ? `?${text}` : "";
}

/** A subject in a path: its `/` kept (the API's subjects may hold one: `team-a/alice`), the rest escaped. */
function subjectPath(subject: string): string {
  if (typeof subject !== "string" || subject.length === 0) {
    throw new InvalidInput(0, "invalid_input", "a subject is a non-empty string", "subject");
  }
  return subject.split("/").map(encodeURIComponent).join("/");
}

export class Memflow {
  readonly baseUrl: string;
  private readonly key: string | undefined;
  private readonly timeoutMs: number;
  private readonly fetcher: typeof fetch;

  constructor(options: MemflowOptions) {
    if (!options || typeof options.baseUrl !== "string" || !/^https?:\/\//.test(options.baseUrl)) {
      throw new InvalidInput(0, "invalid_input", "baseUrl must be an http(s) URL such as http://127.0.0.1:8765",
                             "baseUrl");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.key = options.key;
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  // -- writes ------------------------------------------------------------------------------

  /** Publish one event or a batch, validated all or nothing; answered (202) before the pipeline works. */
  publish(events: ChatEvent | ChatEvent[]): Promise<Published> {
    return this.json("POST", "/v1/events", { body: events });
  }

  /** What became of a published event, by its `event_id`: `accepted` (not decided yet), `stored` (as `memory_ids`),
   *  `nothing_to_remember`, `dropped` or `dead_lettered`, and why (`reason`). A key over more than one subject
   *  names the event's `subject`; an event of a subject the key may not see is a `NotFound`, as one never
   *  published. */
  eventFate(eventId: string, options: { subject?: string } = {}): Promise<EventFate> {
    return this.json("GET", `/v1/events/${encodeURIComponent(eventId)}`, { query: { subject: options.subject } });
  }

  /** Remember `content` explicitly; searchable once the pipeline has it. A statement the gate would drop (an
   *  instruction to the assistant, filler, a secret) is an `InvalidInput` naming `content`, and is not published. */
  write(request: WriteRequest): Promise<Written> {
    return this.json("POST", "/v1/memories", { body: request });
  }

  /** Count memories as used in an answer (their strength grows). */
  feedback(request: FeedbackRequest): Promise<Adopted> {
    return this.json("POST", "/v1/feedback", { body: request });
  }

  /** Forget by ids or by `contains`; the reply carries the proof (`proof.verified`) that nothing is left, the
   * records of the turns they came from forgotten with them (`records`), and what still holds their words
   * (`still_held`). */
  forget(subject: string, what: { memoryIds?: string[]; contains?: string }): Promise<Forgotten> {
    const body: Record<string, unknown> = {};
    if (what?.memoryIds !== undefined) body.memory_ids = what.memoryIds;
    if (what?.contains !== undefined) body.contains = what.contains;
    return this.json("DELETE", `/v1/subjects/${subjectPath(subject)}/memories`, { body });
  }

  // -- reads -------------------------------------------------------------------------------

  /** `status` ok or empty; a search that could not look throws `Unavailable` (its body: `status: "failed"`). */
  search(request: SearchRequest): Promise<SearchResult> {
    return this.json("POST", "/v1/search", { body: request });
  }

  /** The memories that matter for a task, packed into a prompt within `budget_tokens`. */
  pack(request: PackRequest): Promise<PackedPrompt> {
    return this.json("POST", "/v1/pack", { body: request });
  }

  /** The subjects with memories that the key may see. */
  subjects(): Promise<SubjectList> {
    return this.json("GET", "/v1/subjects");
  }

  /** Every memory of a subject with its type, tier, strength now, uses and status. */
  inspect(subject: string, options: { now?: string } = {}): Promise<InspectReport> {
    return this.json("GET", `/v1/subjects/${subjectPath(subject)}/memories`, { query: { now: options.now } });
  }

  /** The people the subject has talked about, each with what is known of them now. */
  people(subject: string): Promise<People> {
    return this.json("GET", `/v1/subjects/${subjectPath(subject)}/people`);
  }

  /** What holds now for the subject, without a query (docs/profile.md): identity, preferences, rules, people,
   *  open contests; `revision` to pass back as `since` (then `changes` says what changed after it);
   *  `maxTokens` adds `prompt`, the profile as text within that budget. */
  profile(subject: string, options: { since?: string; maxTokens?: number } = {}): Promise<ProfileReply> {
    return this.json("GET", `/v1/subjects/${subjectPath(subject)}/profile`,
                     { query: { since: options.since, max_tokens: options.maxTokens } });
  }

  /** How the subject's last `count` searches were answered. */
  traces(subject: string, count = 20): Promise<Trace[]> {
    return this.json("GET", `/v1/subjects/${subjectPath(subject)}/traces`, { query: { count } });
  }

  /** Every version of a memory and why each changed; another subject's memory is a `NotFound`. */
  history(memoryId: string, options: { subject?: string } = {}): Promise<History> {
    return this.json("GET", `/v1/memories/${encodeURIComponent(memoryId)}/history`,
                     { query: { subject: options.subject } });
  }

  /** Up or down; with a key, what answers and how many memories there are (a 503 is returned, not thrown). */
  async health(): Promise<Health> {
    const reply = await this.send("GET", "/healthz", {});
    if (reply.status === 503) return (await reply.json()) as Health;
    return this.parsed<Health>(reply);
  }

  // -- the change feed ---------------------------------------------------------------------

  /** A page of the change feed (ids and kinds, never words) after `after` (`0` or none: the oldest kept);
   *  ask again with the page's `next` (as it came: it may be sealed, `~…`) while `more`. Only the subjects the
   *  key may see, and nothing of the others' entries, `next` and `more` included. */
  changes(options: { subject?: string; after?: string; limit?: number } = {}): Promise<ChangesPage> {
    return this.json("GET", "/v1/changes",
                     { query: { subject: options.subject, after: options.after, limit: options.limit } });
  }

  /** Follow the change feed as it grows (Server-Sent Events), from now or after `after`; ends when `signal`
   *  aborts, the loop breaks, or the server ends the stream (a revoked key). */
  async *follow(options: { subject?: string; after?: string; signal?: AbortSignal } = {}
  ): AsyncGenerator<FeedItem, void, undefined> {
    const { signal } = options;
    if (signal?.aborted) return;
    let reply: Response;
    try {
      reply = await this.send("GET", "/v1/changes", {
        query: { subject: options.subject, after: options.after }, accept: "text/event-stream",
        signal: signal ?? null,
      });
    } catch (error) {
      // Aborted before the stream opened: the caller asked it to end, so it ends (as it does later on).
      if (signal?.aborted) return;
      throw error;
    }
    if (!reply.ok) throw await this.failure(reply);
    if (!reply.body) throw new MemflowError(reply.status, "bad_reply", "the change feed came without a body");
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", lastId: string | null = options.after ?? null;
    try {
      for (;;) {
        let chunk;
        try {
          chunk = await reader.read();
        } catch (error) {
          if (options.signal?.aborted) return;
          throw new Unavailable(0, "network", `the change feed broke off: ${String(error)}`);
        }
        if (chunk.done) return;
        buffer += decoder.decode(chunk.value, { stream: true }).replace(/\r\n?/g, "\n");
        let end: number;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const item = parseEvent(block, lastId);
          if (item === null) continue;
          if (item.id !== null) lastId = item.id;
          yield item;
        }
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }

  // -- export and import ---------------------------------------------------------------------

  /** The subject's export as JSON Lines text, as `memflow import` and `importFile` read it. */
  async exportText(subject: string, options: { withVectors?: boolean } = {}): Promise<string> {
    const reply = await this.send("GET", `/v1/subjects/${subjectPath(subject)}/export`,
                                  { query: { with_vectors: options.withVectors ? "true" : undefined } });
    if (!reply.ok) throw await this.failure(reply);
    return reply.text();
  }

  /** The subject's export, parsed: the header, one record per stored point, the end line. */
  async export(subject: string, options: { withVectors?: boolean } = {}): Promise<ExportLine[]> {
    const text = await this.exportText(subject, options);
    return text.split("\n").filter((line) => line.trim() !== "").map((line, i) => {
      try {
        return JSON.parse(line) as ExportLine;
      } catch {
        throw new MemflowError(200, "bad_reply", `line ${i + 1} of the export is not JSON`, null, null, line);
      }
    });
  }

  /** Import an export (its text, bytes, or its parsed lines): checked whole, then each subject the key may write
   *  gets what it lacks. The same file twice changes nothing. `asSubject`: the file's one subject imported as this
   *  one (new ids, provenance kept, the file's subject untouched; the key must be allowed to write it). */
  importFile(file: string | Uint8Array | ExportLine[], options: { asSubject?: string } = {}): Promise<ImportReport> {
    let body: string | Uint8Array;
    if (Array.isArray(file)) body = file.map((line) => JSON.stringify(line)).join("\n") + "\n";
    else if (typeof file === "string" || file instanceof Uint8Array) body = file;
    else throw new InvalidInput(0, "invalid_input", "an export is JSON Lines text, bytes or an array of lines", "file");
    return this.json("POST", "/v1/import", { raw: body, contentType: "application/x-ndjson",
                                             query: { as_subject: options.asSubject } });
  }

  // -- the wire ------------------------------------------------------------------------------

  private async json<T>(method: string, path: string,
                        options: { body?: unknown; raw?: string | Uint8Array; contentType?: string; query?: Query } = {},
  ): Promise<T> {
    return this.parsed<T>(await this.send(method, path, options));
  }

  private async send(method: string, path: string,
                     options: { body?: unknown; raw?: string | Uint8Array; contentType?: string; query?: Query;
                                accept?: string; signal?: AbortSignal | null },
  ): Promise<Response> {
    const headers: Record<string, string> = { accept: options.accept ?? "application/json" };
    if (this.key) headers.authorization = `Bearer ${this.key}`;
    let body: string | Uint8Array | undefined;
    if (options.raw !== undefined) {
      body = options.raw;
      headers["content-type"] = options.contentType ?? "application/octet-stream";
    } else if (options.body !== undefined) {
      body = JSON.stringify(options.body);
      headers["content-type"] = "application/json";
    }
    const url = this.baseUrl + path + queryString(options.query);
    try {
      // A stream lives as long as its reader: no timeout unless the caller's signal says so.
      const signal = options.signal === undefined ? AbortSignal.timeout(this.timeoutMs) : options.signal;
      return await this.fetcher(url, { method, headers, body: body as BodyInit | undefined, signal });
    } catch (error) {
      const timedOut = error instanceof Error && error.name === "TimeoutError";
      throw new Unavailable(0, timedOut ? "timeout" : "network",
                            timedOut ? `no answer from ${url} within ${this.timeoutMs} ms`
                                     : `${method} ${url}: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  private async parsed<T>(reply: Response): Promise<T> {
    if (!reply.ok) throw await this.failure(reply);
    const text = await reply.text();
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new MemflowError(reply.status, "bad_reply", `the reply is not JSON: ${text.slice(0, 200)}`);
    }
  }

  /** The API's error (`{"error": {code, message, field}}`, or a failed search's `SearchResult`) as a typed error. */
  private async failure(reply: Response): Promise<MemflowError> {
    const text = await reply.text();
    const retry = reply.headers.get("retry-after");
    const retryAfterS = retry !== null && retry !== "" && !Number.isNaN(Number(retry)) ? Number(retry) : null;
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      return errorOf(reply.status, reply.status >= 500 ? "internal" : "bad_reply",
                     `HTTP ${reply.status}: ${text.slice(0, 200)}`, null, retryAfterS, text);
    }
    const wrapped = (body as { error?: unknown })?.error;
    if (wrapped && typeof wrapped === "object") {
      const error = wrapped as Partial<ErrorBody>;
      return errorOf(reply.status, (error.code ?? "internal") as ErrorCode, error.message ?? `HTTP ${reply.status}`,
                     error.field ?? null, retryAfterS, body);
    }
    const failed = body as Partial<SearchResult> & { code?: ErrorCode };
    if (failed && failed.status === "failed") {
      return errorOf(reply.status, failed.code ?? "store_unavailable", failed.error ?? "the search could not look",
                     null, retryAfterS, body);
    }
    return errorOf(reply.status, "bad_reply", `HTTP ${reply.status}: ${text.slice(0, 200)}`, null, retryAfterS, body);
  }
}

/** One Server-Sent Event's lines as a FeedItem; null for a keep-alive comment. */
function parseEvent(block: string, lastId: string | null): FeedItem | null {
  let id: string | null = null, event = "message";
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = value;
    else if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (data.length === 0) return id === null ? null : { type: "cursor", id };
  let payload: unknown;
  try {
    payload = JSON.parse(data.join("\n"));
  } catch {
    throw new MemflowError(200, "bad_reply", `a change feed event is not JSON: ${data.join("\n").slice(0, 200)}`);
  }
  if (event === "gap") return { type: "gap", id: id ?? lastId, after: (payload as { after: string }).after };
  if (event === "change") {
    const entry = payload as FeedEntry;
    return { type: "change", id: id ?? entry.id, entry };
  }
  return id === null ? null : { type: "cursor", id };
}
