// The client: Baton.connect(), leases held through Hold streams, leaderships through Campaign
// streams, and plain calls.

import * as fs from "node:fs";
import * as net from "node:net";
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate, type Duration } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type CallOptions, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  AutocompleteFeature,
  AutocompleteMatchKind,
  AutocompleteMatchMode,
  AutocompleteOrder,
  AutocompleteService,
  AutocompleteTermSchema,
} from "./gen/baton/v1/autocomplete_pb.js";
import {
  ElectionService,
  type ElectionServiceCampaignResponse,
  type ElectionServiceLeaderResponse,
  type ElectionServiceObserveResponse,
} from "./gen/baton/v1/election_pb.js";
import { LockMode, LockService, type LockLease } from "./gen/baton/v1/lock_pb.js";
import { RateLimitAlgorithm, RateLimitDecidedBy, RateLimitService } from "./gen/baton/v1/ratelimit_pb.js";
import { SemaphoreService, type SemaphorePermit } from "./gen/baton/v1/semaphore_pb.js";
import {
  BatonError,
  ClientClosedError,
  DeadlineExceededError,
  fromError,
  InvalidArgumentError,
  NotAcquiredError,
  UnavailableError,
} from "./errors.js";
import { Leadership, Lease, type Grant, type HoldEvent } from "./lease.js";

/** The address used when neither the caller nor BATON_ADDR gives one (Baton's default). */
export const DEFAULT_ADDR = "127.0.0.1:50051";
/** Attempts of a call that fails UNAVAILABLE before giving up. */
const RETRIES = 4;
/** The connection's keepalive: a ping every PING_INTERVAL_MS, answered within PING_TIMEOUT_MS. */
const PING_INTERVAL_MS = 30_000;
const PING_TIMEOUT_MS = 10_000;
/** Delay before retrying UNAVAILABLE when Baton suggested none, and the longest. */
const DEFAULT_RETRY_DELAY_MS = 100;
const MAX_RETRY_DELAY_MS = 2000;
/** Baton's longest wait per call; longer waits are made of several. */
const MAX_WAIT_MS = 3_600_000;
/** The longest delay setTimeout keeps (a longer one fires at once); longer ones are chained. */
const MAX_TIMER_MS = 2 ** 31 - 1;

// Arguments are checked before anything is sent: a number protobuf cannot encode (NaN, a
// fraction in an integer field, a negative count) would otherwise fail the call as an opaque
// Internal error, or be encoded as something else (an unknown mode as UNSPECIFIED). A value of
// the wrong type throws TypeError; a value out of range InvalidArgumentError, whose `field` is
// the option's name.

/** What a value is, for a TypeError's message. */
function typeOf(value: unknown): string {
  return value === null ? "null" : Array.isArray(value) ? "an array" : typeof value;
}

/** An options argument: an object, or undefined (no options). */
function optionsOf<T extends object>(value: T | undefined, field = "options"): Partial<T> {
  if (value === undefined) return {};
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`${field}: an object of options, not ${typeOf(value)}`);
  }
  return value;
}

/** `value`, or `fallback` when it is undefined (null is not: it is refused as the wrong type). */
function or<T>(value: T | undefined, fallback: T): T {
  return value === undefined ? fallback : value;
}

/** A boolean option (default false); anything but true, false or undefined throws TypeError. */
function flag(value: unknown, field: string): boolean {
  if (value === undefined) return false;
  if (typeof value !== "boolean") throw new TypeError(`${field}: true or false, not ${typeOf(value)}`);
  return value;
}

/** A string option (default ""). */
function optText(value: unknown, field: string): string {
  return value === undefined ? "" : text(value, field);
}

/** The caller's `signal` option: an AbortSignal or undefined. */
function signalOf(value: unknown): AbortSignal | undefined {
  if (value === undefined || value instanceof AbortSignal) return value;
  throw new TypeError(`signal: an AbortSignal, not ${typeOf(value)}`);
}

/** A function argument (the work of withLock, withSemaphore, withLeadership). */
function fn(value: unknown, field: string): void {
  if (typeof value !== "function") throw new TypeError(`${field}: a function, not ${typeOf(value)}`);
}

function describe(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : typeof value === "bigint" ? `${value}n` : String(value);
}

function badValue(field: string, value: unknown, want: string): InvalidArgumentError {
  return new InvalidArgumentError(`${field}: ${describe(value)} is not ${want}`, field);
}

/** A duration of `value` ms (a finite number from 0), rounded up to the millisecond as Python's is. */
function msDuration(value: unknown, field: string): Duration {
  if (typeof value !== "number") throw new TypeError(`${field}: milliseconds as a number, not ${typeOf(value)}`);
  if (!(value >= 0 && value <= MAX_DURATION_MS)) throw badValue(field, value, "a finite number of milliseconds from 0");
  // To the microsecond first (as Python does), so that 1000.0000001 stays 1000.
  return durationFromMs(Math.ceil(Math.round(value * 1000) / 1000) || 0);
}

/**
 * A wait in ms: undefined or Infinity wait as long as it takes (undefined is returned), else a
 * number from 0 up.
 */
function checkWait(value: unknown, field = "waitMs"): number | undefined {
  if (value === undefined || value === Infinity) return undefined;
  if (typeof value !== "number") throw new TypeError(`${field}: milliseconds as a number, not ${typeOf(value)}`);
  if (!(value >= 0)) throw badValue(field, value, "a number of milliseconds from 0 up (or Infinity: no end)");
  return value;
}

/** The wait of an Acquire (one call: Baton waits at most MAX_WAIT_MS), default 0. */
function acquireWait(value: unknown): number {
  if (value === undefined) return 0;
  if (typeof value !== "number") throw new TypeError(`waitMs: milliseconds as a number, not ${typeOf(value)}`);
  if (!(value >= 0 && value < Infinity)) {
    throw badValue("waitMs", value, `a number of milliseconds from 0 (an Acquire waits at most ${MAX_WAIT_MS}; lock() and semaphore() wait longer)`);
  }
  return value;
}

const UINT32_MAX = 2 ** 32 - 1;
/** protobuf's longest Duration (10000 years). */
const MAX_DURATION_MS = 315_576_000_000_000;
const UINT64_MAX = 2n ** 64n - 1n;

/** A count: an integer from `min` to 2^32 - 1. */
function count(value: unknown, field: string, min = 0): number {
  if (typeof value !== "number") throw new TypeError(`${field}: a number, not ${typeOf(value)}`);
  if (!Number.isInteger(value) || value < min || value > UINT32_MAX) {
    throw badValue(field, value, `an integer from ${min} to ${UINT32_MAX}`);
  }
  return value;
}

/** A 64-bit count: an integer (number or bigint) from 0 to 2^64 - 1. */
function count64(value: unknown, field: string): bigint {
  if (typeof value !== "number" && typeof value !== "bigint") {
    throw new TypeError(`${field}: a number or bigint, not ${typeOf(value)}`);
  }
  if (typeof value === "number" && !Number.isSafeInteger(value)) {
    throw badValue(field, value, `an integer from 0 to ${UINT64_MAX} (a bigint past 2^53)`);
  }
  const n = BigInt(value);
  if (n < 0n || n > UINT64_MAX) throw badValue(field, value, `an integer from 0 to ${UINT64_MAX}`);
  return n;
}

/** The enum value `name` stands for in `table`, like Python's ValueError for an unknown one. */
function choice<T>(table: Record<string, T>, name: unknown, field: string): T {
  if (typeof name !== "string") throw new TypeError(`${field}: one of ${Object.keys(table).join(", ")}, not ${typeOf(name)}`);
  if (Object.hasOwn(table, name)) return table[name];
  throw new InvalidArgumentError(`${field}: ${describe(name)} is not one of ${Object.keys(table).join(", ")}`, field);
}

function text(value: unknown, field: string): string {
  if (typeof value !== "string") throw new TypeError(`${field}: a string, not ${typeOf(value)}`);
  return value;
}

function bytes(value: unknown, field: string, want = "bytes (a Uint8Array or Buffer; encode text with TextEncoder)"): Uint8Array {
  if (!(value instanceof Uint8Array)) {
    throw new TypeError(`${field}: ${want}, not ${typeOf(value)}`);
  }
  return value;
}

/** A list of display texts: one string, or an array of strings. */
function texts(value: unknown, field: string): string[] {
  if (typeof value === "string") return [value];
  if (!Array.isArray(value)) throw new TypeError(`${field}: a string or an array of strings, not ${typeOf(value)}`);
  return value.map((v, i) => text(v, `${field}[${i}]`));
}

/**
 * Runs `fn` after `delayMs` (any length: a delay above what setTimeout keeps is chained);
 * returns what cancels it.
 */
function longTimeout(fn: () => void, delayMs: number): () => void {
  const due = Date.now() + delayMs;
  let timer: ReturnType<typeof setTimeout>;
  const arm = () => {
    const left = due - Date.now();
    timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(fn, Math.max(0, left));
  };
  arm();
  return () => clearTimeout(timer);
}

/** Where Baton is: a base URL (`https://` for TLS), and the Unix socket to reach it through, if any. */
export interface Address {
  baseUrl: string;
  socketPath?: string;
}

/**
 * Parses `host:port`, `http://host:port`, `https://host:port` (TLS), `unix:///path`,
 * `unix:/path` or `/path` (default: BATON_ADDR, then 127.0.0.1:50051). Over a Unix socket the
 * `:authority` is `localhost`.
 */
export function resolveAddress(addr?: string): Address {
  if (addr !== undefined) text(addr, "addr");
  const a = (addr || process.env.BATON_ADDR || DEFAULT_ADDR).trim();
  if (a.startsWith("unix:") || a.startsWith("/")) {
    let path = a.startsWith("unix:") ? a.slice("unix:".length) : a;
    if (path.startsWith("//")) path = path.slice(2);
    if (!path.startsWith("/")) {
      throw new TypeError(`BATON_ADDR: "${a}": a Unix socket path must be absolute`);
    }
    return { baseUrl: "http://localhost", socketPath: path };
  }
  const https = a.startsWith("https://");
  const hostport = a.replace(/^https?:\/\//, "");
  if (!hostport.includes(":")) {
    throw new TypeError(`BATON_ADDR: "${a}" is not host:port, https://host:port or unix:///path`);
  }
  return { baseUrl: `${https ? "https" : "http"}://${hostport}` };
}

/** The variable naming the API token file when neither `apiToken` nor `apiTokenFile` is given. */
export const TOKEN_FILE_ENV = "BATON_API_TOKEN_FILE";
/** Largest token file read, in bytes (Baton's own bound). */
const MAX_TOKEN_FILE_BYTES = 4096;

/** Options of Baton.connect. */
export interface ConnectOptions {
  /** Deadline of each plain call in ms (waits get theirs on top); default 10 s. */
  timeoutMs?: number;
  /** Baton's API token, sent as `authorization: Bearer <token>` on every call. */
  apiToken?: string;
  /**
   * A file whose first non-empty line is Baton's API token, checked before each call and read
   * again when it changed (a rotated Kubernetes Secret is used without reconnecting). Without
   * `apiToken` or this, the file BATON_API_TOKEN_FILE names, if set.
   */
  apiTokenFile?: string;
  /**
   * The CA bundle (PEM; a file path, or the PEM itself as bytes) Baton's certificate must chain
   * to: connects with TLS, as an `https://` address does (checked against Node's roots without
   * it).
   */
  tlsCa?: string | Uint8Array;
  /** A client certificate chain (PEM; a path or bytes) for mutual TLS, with `tlsKey`. */
  tlsCert?: string | Uint8Array;
  /** The private key (PEM; a path or bytes) of `tlsCert`. */
  tlsKey?: string | Uint8Array;
  /** The name Baton's certificate must carry (and the SNI sent), in place of the address's host. */
  tlsServerName?: string;
}

function checkToken(token: string, where: string): string {
  const t = token.trim();
  if (t.length === 0) throw new TypeError(`${where}: no token (it is empty)`);
  if (!/^[\x21-\x7e]+$/.test(t)) {
    throw new TypeError(`${where}: the token holds a character that is not visible ASCII (a token must fit an HTTP header)`);
  }
  return t;
}

function readBounded(path: string, limit: number, what: string): Buffer {
  let data: Buffer;
  try {
    const fd = fs.openSync(path, "r");
    try {
      data = Buffer.alloc(limit + 1);
      data = data.subarray(0, fs.readSync(fd, data, 0, limit + 1, null));
    } finally {
      fs.closeSync(fd);
    }
  } catch (e) {
    throw new TypeError(`${what}: cannot read ${path}: ${(e as Error).message}`);
  }
  if (data.length > limit) throw new TypeError(`${what}: ${path} is more than the ${limit} bytes accepted`);
  return data;
}

function tokenFromFile(path: string): string {
  const text = readBounded(path, MAX_TOKEN_FILE_BYTES, "apiTokenFile").toString("utf8");
  const line = text.split(/\r?\n/).find((l) => l.trim().length > 0);
  if (line === undefined) throw new TypeError(`the API token file ${path} holds no token (it is empty)`);
  return checkToken(line, `the API token file ${path}`);
}

/**
 * The `authorization` value of each call: a fixed token, or a file's, read again whenever the
 * file changed (inode, size or modification time); should the file become unreadable or empty,
 * the last token read stays in use.
 */
class TokenSource {
  #header: string;
  #stamp?: string;
  constructor(token: string | undefined, readonly path: string | undefined) {
    if (token !== undefined) {
      this.#header = `Bearer ${checkToken(token, "apiToken")}`;
    } else {
      this.#stamp = this.#stat();
      this.#header = `Bearer ${tokenFromFile(path as string)}`;
    }
  }

  #stat(): string | undefined {
    try {
      const st = fs.statSync(this.path as string, { bigint: true });
      return `${st.ino}:${st.size}:${st.mtimeNs}`;
    } catch {
      return undefined;
    }
  }

  header(): string {
    if (this.path === undefined) return this.#header;
    const stamp = this.#stat();
    if (stamp !== undefined && stamp !== this.#stamp) {
      try {
        this.#header = `Bearer ${tokenFromFile(this.path)}`;
        this.#stamp = stamp;
      } catch {
        // Half-written or emptied: the token in use stays until the file settles.
      }
    }
    return this.#header;
  }
}

function tokenSource(options: ConnectOptions): TokenSource | undefined {
  if (options.apiToken !== undefined) text(options.apiToken, "apiToken");
  if (options.apiTokenFile !== undefined) text(options.apiTokenFile, "apiTokenFile");
  if (options.apiToken !== undefined && options.apiTokenFile !== undefined) {
    throw new TypeError("give apiToken or apiTokenFile, not both");
  }
  if (options.apiToken !== undefined) return new TokenSource(options.apiToken, undefined);
  const path = options.apiTokenFile ?? (process.env[TOKEN_FILE_ENV] || undefined);
  return path === undefined ? undefined : new TokenSource(undefined, path);
}

function pem(value: string | Uint8Array | undefined, what: string, marker: string): Buffer | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string" && !(value instanceof Uint8Array)) {
    throw new TypeError(`${what}: a path or the PEM as bytes, not ${typeOf(value)}`);
  }
  const data = typeof value === "string" ? readBounded(value, 1024 * 1024, what) : Buffer.from(value);
  if (!data.includes(marker)) throw new TypeError(`${what}: holds no PEM ${marker.includes("KEY") ? "private key" : "certificate"}`);
  return data;
}

/** The TLS options of the HTTP/2 session, or undefined for plaintext; throws on a bad option. */
function tlsOptions(address: Address, options: ConnectOptions): Record<string, unknown> | undefined {
  const asked = [options.tlsCa, options.tlsCert, options.tlsKey, options.tlsServerName].some((v) => v !== undefined);
  if (!asked && !address.baseUrl.startsWith("https:")) return undefined;
  if (address.socketPath !== undefined) {
    throw new TypeError(
      "TLS (tlsCa, tlsCert, tlsKey, tlsServerName) needs a TCP address: Baton serves its Unix socket in the clear, confined by the file's permissions",
    );
  }
  if ((options.tlsCert === undefined) !== (options.tlsKey === undefined)) {
    throw new TypeError("tlsCert and tlsKey go together (a client certificate and its key)");
  }
  const tls: Record<string, unknown> = {};
  const ca = pem(options.tlsCa, "tlsCa", "-----BEGIN CERTIFICATE-----");
  if (ca !== undefined) tls.ca = ca;
  const cert = pem(options.tlsCert, "tlsCert", "-----BEGIN CERTIFICATE-----");
  if (cert !== undefined) tls.cert = cert;
  const key = pem(options.tlsKey, "tlsKey", "PRIVATE KEY-----");
  if (key !== undefined) tls.key = key;
  if (options.tlsServerName !== undefined) tls.servername = text(options.tlsServerName, "tlsServerName");
  return tls;
}

/** Options of lock(), tryLock(), withLock(). */
export interface LockOptions {
  /** The lease's ttl in ms, renewed every third of it (at least 100); default 10 s. */
  ttlMs?: number;
  /** How long to wait in ms; undefined (or Infinity) waits as long as it takes, 0 tries once. */
  waitMs?: number;
  /** Re-enter as this owner (must be unique per holder). */
  owner?: string;
  /** Wait in arrival order. */
  fair?: boolean;
  /** A reader's lock: shared with other shared holders. */
  shared?: boolean;
  /** Give up waiting when this aborts. */
  signal?: AbortSignal;
}

/** Options of semaphore(), trySemaphore(), withSemaphore(). */
export interface SemaphoreOptions extends Omit<LockOptions, "shared"> {
  /** The most permits in use at once. */
  limit: number;
  /** Permits to take; default 1. */
  permits?: number;
}

/** Options of campaign() and withLeadership(). */
export interface CampaignOptions {
  /** What others see of this candidate once it leads (text is sent as UTF-8; up to 4096 bytes). */
  value?: string | Uint8Array;
  /** The leadership's ttl in ms, renewed every third of it (at least 100); default 10 s. */
  ttlMs?: number;
  /** How long to wait to be elected in ms; undefined (or Infinity) waits as long as it takes. */
  waitMs?: number;
  /** Give up waiting when this aborts. */
  signal?: AbortSignal;
}

/** An election's leader as others see it. */
export interface Leader {
  /** Strictly increases with every new leader of the election. */
  term: bigint;
  /** What it campaigned with, or proclaimed last. */
  value: Uint8Array;
  /** The value as text (invalid UTF-8 replaced). */
  text: string;
  /** Changes of the value in this term (0n right after the election). */
  valueRevision: bigint;
  /** Time left on its lease when Redis answered (it is renewed while it leads). */
  remainingMs?: number;
}

/** Who leads an election (`leader` undefined when nobody does). */
export interface ElectionState {
  leader?: Leader;
  /** The leader's term; when nobody leads, the last one issued (0n: none). */
  lastTerm: bigint;
  /** Candidates waiting (leader() only; undefined from observe()). */
  candidates?: number;
}

function electionState(r: ElectionServiceLeaderResponse | ElectionServiceObserveResponse): ElectionState {
  const l = r.leader;
  return {
    leader: l && {
      term: l.term,
      value: l.value,
      text: new TextDecoder().decode(l.value),
      valueRevision: l.valueRevision,
      remainingMs: ms(l.remainingTtl),
    },
    lastTerm: r.lastTerm,
    candidates: "candidates" in r ? r.candidates : undefined,
  };
}

function electionEvent(event: ElectionServiceCampaignResponse): HoldEvent {
  switch (event.event.case) {
    case "elected": {
      const e = event.event.value;
      return { case: "acquired", value: { name: e.name, token: e.token, fencingToken: e.term, owner: "", expiresAt: e.expiresAt } };
    }
    default:
      return event.event as HoldEvent;
  }
}

/** A hold obtained with acquireLock (not kept alive): release or refresh it by its token. */
export interface LockGrant {
  name: string;
  token: string;
  fencingToken: bigint;
  remainingMs: number;
  expiresAt: Date;
  holdCount: number;
  owner: string;
  shared: boolean;
}

/** Permits obtained with acquirePermits (not kept alive). */
export interface PermitGrant {
  name: string;
  token: string;
  fencingToken: bigint;
  remainingMs: number;
  expiresAt: Date;
  permits: number;
  limit: number;
  owner: string;
}

/** A snapshot of one lock. */
export interface LockState {
  held: boolean;
  mode: "exclusive" | "shared" | "";
  owner: string;
  remainingMs?: number;
  holdCount: number;
  fencingToken: bigint;
  waiters: number;
  queued: number;
  sharedHolders: number;
}

/** A snapshot of one semaphore. */
export interface SemaphoreState {
  limit: number;
  permitsInUse: number;
  holderCount: number;
  holders: { owner: string; permits: number; limit: number; remainingMs?: number; fencingToken: bigint }[];
  waiters: number;
  fencingToken: bigint;
}

/** The answer of a rate limit check. */
export interface RateLimitDecision {
  allowed: boolean;
  limit: bigint;
  remaining: bigint;
  retryAfterMs: number;
  resetAfterMs: number;
  decidedBy: "redis" | "fail_open" | "fail_closed";
}

/** A term to add: a display text, or one with a score (added when `increment`) and payload. */
export type Term = string | { display: string; score?: number; increment?: boolean; payload?: Uint8Array };

/** How a query matches. */
export type MatchMode = "prefix" | "word_prefix" | "suffix" | "contains" | "automatic" | "fuzzy";
/** An index a dictionary can keep: "ranked" (score order), "words" (word prefix), "substring"
 * (suffix, contains, automatic; needs "words"). */
export type Feature = "ranked" | "words" | "substring";

/** One completion. */
export interface Suggestion {
  display: string;
  score: number;
  payload: Uint8Array;
  match: string;
  /** Fuzzy mode: the fewest edits that turn a prefix of the term into the query (0, 1 or 2). */
  editDistance: number;
}

/** One page of completions; `nextPageToken` asks for the next one ("" when none). */
export interface Completions {
  suggestions: Suggestion[];
  nextPageToken: string;
  /** Fuzzy mode: Baton stopped at its fixed work budget, so more matches may exist. */
  incomplete: boolean;
}

/** One item of a recent list. */
export interface RecentItem {
  display: string;
  payload: Uint8Array;
  recordedAt?: Date;
  match: string;
}

const MODES: Record<MatchMode, AutocompleteMatchMode> = {
  prefix: AutocompleteMatchMode.PREFIX,
  word_prefix: AutocompleteMatchMode.WORD_PREFIX,
  suffix: AutocompleteMatchMode.SUFFIX,
  contains: AutocompleteMatchMode.CONTAINS,
  automatic: AutocompleteMatchMode.AUTOMATIC,
  fuzzy: AutocompleteMatchMode.FUZZY,
};

const ORDERS: Record<"lexicographic" | "score", AutocompleteOrder> = {
  lexicographic: AutocompleteOrder.LEXICOGRAPHIC,
  score: AutocompleteOrder.SCORE,
};

/** The fields of one term to add (a display text, or the term's fields, checked). */
function termFields(t: unknown, field: string): { display: string; score?: number; increment?: boolean; payload?: Uint8Array } {
  if (typeof t === "string") return { display: t };
  if (t === null || typeof t !== "object") throw new TypeError(`${field}: a string or { display, score, increment, payload }, not ${t === null ? "null" : typeof t}`);
  const term = t as { display?: unknown; score?: unknown; increment?: unknown; payload?: unknown };
  if (term.score !== undefined) {
    if (typeof term.score !== "number") throw new TypeError(`${field}.score: a number, not ${typeOf(term.score)}`);
    if (!Number.isFinite(term.score)) throw badValue(`${field}.score`, term.score, "a finite number");
  }
  return {
    display: text(term.display, `${field}.display`),
    score: term.score as number | undefined,
    increment: term.increment === undefined ? undefined : flag(term.increment, `${field}.increment`),
    payload: term.payload === undefined ? undefined : bytes(term.payload, `${field}.payload`),
  };
}

const FEATURES: Record<Feature, AutocompleteFeature> = {
  ranked: AutocompleteFeature.RANKED,
  words: AutocompleteFeature.WORDS,
  substring: AutocompleteFeature.SUBSTRING,
};

function featureNames(features: AutocompleteFeature[]): Feature[] {
  return features.map((f) => AutocompleteFeature[f].toLowerCase() as Feature);
}

const ALGORITHMS = {
  gcra: RateLimitAlgorithm.GCRA,
  fixed_window: RateLimitAlgorithm.FIXED_WINDOW,
  sliding_window: RateLimitAlgorithm.SLIDING_WINDOW,
} as const;

function ms(d: Duration | undefined): number | undefined {
  return d === undefined ? undefined : durationMs(d);
}

function matchKind(kind: AutocompleteMatchKind): string {
  return kind === AutocompleteMatchKind.UNSPECIFIED ? "" : AutocompleteMatchKind[kind].toLowerCase();
}

/** Waits `delayMs`, or rejects when `signal` aborts first; leaves no listener behind. */
function sleep(delayMs: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, delayMs);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function retryDelay(err: UnavailableError): number {
  return Math.min(err.retryAfterMs ?? DEFAULT_RETRY_DELAY_MS, MAX_RETRY_DELAY_MS);
}

function lockGrant(l: LockLease): LockGrant {
  return {
    name: l.name,
    token: l.token,
    fencingToken: l.fencingToken,
    remainingMs: ms(l.remainingTtl) ?? 0,
    expiresAt: l.expiresAt ? timestampDate(l.expiresAt) : new Date(),
    holdCount: l.holdCount,
    owner: l.owner,
    shared: l.mode === LockMode.SHARED,
  };
}

function permitGrant(p: SemaphorePermit): PermitGrant {
  return {
    name: p.name,
    token: p.token,
    fencingToken: p.fencingToken,
    remainingMs: ms(p.remainingTtl) ?? 0,
    expiresAt: p.expiresAt ? timestampDate(p.expiresAt) : new Date(),
    permits: p.permits,
    limit: p.limit,
    owner: p.owner,
  };
}

/**
 * A connection to Baton. Share one per process; `close()` it when done.
 *
 * ```ts
 * const client = Baton.connect();            // BATON_ADDR, or 127.0.0.1:50051
 * await client.withLock("orders", async (lease) => {
 *   await write(lease.fencingToken, { signal: lease.signal });
 * });
 * ```
 */
export class Baton {
  /** Rate limit checks. */
  readonly rateLimit: RateLimits;
  /** Dictionaries and recent lists. */
  readonly autocomplete: Autocomplete;
  readonly #timeoutMs: number;
  readonly #sessions: Http2SessionManager;
  readonly #locks: Client<typeof LockService>;
  readonly #semaphores: Client<typeof SemaphoreService>;
  readonly #elections: Client<typeof ElectionService>;
  /** Aborted by close(): calls under way give up, later ones throw ClientClosedError. */
  readonly #closing = new AbortController();

  /** A client for `addr` (see resolveAddress); connects lazily on the first call. */
  static connect(addr?: string, options?: ConnectOptions): Baton {
    return new Baton(addr, options);
  }

  constructor(addr?: string, options?: ConnectOptions) {
    const o = optionsOf(options);
    let address = resolveAddress(addr);
    const tls = tlsOptions(address, o);
    if (tls !== undefined) address = { baseUrl: address.baseUrl.replace(/^http:/, "https:") };
    const token = tokenSource(o);
    const timeoutMs = or<unknown>(o.timeoutMs, 10_000);
    if (typeof timeoutMs !== "number") throw new TypeError(`timeoutMs: milliseconds as a number, not ${typeOf(timeoutMs)}`);
    // Finite and within setTimeout's longest delay: it is each call's deadline.
    if (!(timeoutMs > 0 && timeoutMs <= 2_147_483_647)) throw badValue("timeoutMs", timeoutMs, "a number of milliseconds above 0, at most 2147483647");
    this.#timeoutMs = timeoutMs;
    // Pings a connection with streams open after 30 s without a byte read, and drops it when a
    // ping is not answered within 10 s, as the Python package's channel does: a stream waiting on
    // a dead or frozen Baton (which sends nothing) fails then. A connection left idle for longer
    // is pinged before its next call (connect-node's pings of idle connections outlive a closed
    // connection, so they stay off). Node answers Baton's own pings.
    this.#sessions = new Http2SessionManager(
      address.baseUrl,
      { pingIntervalMs: PING_INTERVAL_MS, pingTimeoutMs: PING_TIMEOUT_MS },
      address.socketPath !== undefined
        ? { createConnection: () => net.connect(address.socketPath as string) }
        : (tls ?? {}),
    );
    // The token on every call, plain and streaming, over any transport.
    const interceptors: Interceptor[] =
      token === undefined
        ? []
        : [
            (next) => async (req) => {
              req.header.set("authorization", token.header());
              return next(req);
            },
          ];
    const transport = createGrpcTransport({ baseUrl: address.baseUrl, sessionManager: this.#sessions, interceptors });
    this.#locks = createClient(LockService, transport);
    this.#semaphores = createClient(SemaphoreService, transport);
    this.#elections = createClient(ElectionService, transport);
    this.rateLimit = new RateLimits(this, createClient(RateLimitService, transport));
    this.autocomplete = new Autocomplete(this, createClient(AutocompleteService, transport));
  }

  /**
   * Closes the connection; leases still held through it are released by Baton (and lost here,
   * `DISCONNECTED`). Calls waiting then, and every call made afterwards, throw
   * ClientClosedError.
   */
  close(): void {
    if (!this.#closing.signal.aborted) this.#closing.abort(new ClientClosedError());
    this.#sessions.abort();
  }

  /** @internal Throws ClientClosedError once close() was called. */
  usable(): void {
    if (this.#closing.signal.aborted) throw new ClientClosedError();
  }

  /** @internal The error to throw for a call's failure: ClientClosedError once closed. */
  failure(e: unknown): BatonError {
    return this.#closing.signal.aborted ? new ClientClosedError() : fromError(e);
  }

  /**
   * Takes the lock `name` and keeps it through a Hold stream until the lease is released
   * (`await using lease = await client.lock(...)`, or `lease.release()`). Throws
   * NotAcquiredError when the wait ends first.
   */
  async lock(name: string, options?: LockOptions): Promise<Lease> {
    const lease = await this.#hold(holdSpec("lock", name, options));
    if (lease === undefined) throw new Error("unreachable: a waiting hold either grants or throws");
    return lease;
  }

  /** Like lock() without waiting: the lease, or undefined when the lock is taken. */
  async tryLock(name: string, options?: Omit<LockOptions, "waitMs">): Promise<Lease | undefined> {
    try {
      return await this.#hold(holdSpec("lock", name, options, 0));
    } catch (e) {
      if (e instanceof NotAcquiredError) return undefined;
      throw e;
    }
  }

  /**
   * Runs `work` while holding the lock; `lease.signal` aborts when the lease is lost. The lock
   * is released when `work` settles; a lease lost meanwhile throws LeaseLostError.
   */
  async withLock<T>(name: string, work: (lease: Lease) => Promise<T>, options?: LockOptions): Promise<T> {
    fn(work, "work");
    return Baton.#run(await this.lock(name, options), work);
  }

  /** Takes `permits` of the semaphore `name` (at most `limit` in use), kept by a Hold stream. */
  async semaphore(name: string, options: SemaphoreOptions): Promise<Lease> {
    const lease = await this.#hold(holdSpec("semaphore", name, options));
    if (lease === undefined) throw new Error("unreachable: a waiting hold either grants or throws");
    return lease;
  }

  /** Like semaphore() without waiting: the lease, or undefined. */
  async trySemaphore(name: string, options: Omit<SemaphoreOptions, "waitMs">): Promise<Lease | undefined> {
    try {
      return await this.#hold(holdSpec("semaphore", name, options, 0));
    } catch (e) {
      if (e instanceof NotAcquiredError) return undefined;
      throw e;
    }
  }

  /** Runs `work` while holding permits (see withLock). */
  async withSemaphore<T>(name: string, work: (lease: Lease) => Promise<T>, options: SemaphoreOptions): Promise<T> {
    fn(work, "work");
    return Baton.#run(await this.semaphore(name, options), work);
  }

  /**
   * Joins the election `name` and resolves once elected, to the Leadership (kept alive by a
   * Campaign stream until `release()` or `await using` ends it, which resigns at once and
   * resolves once Baton shows the term ended; the next candidate is elected then). Candidates
   * are elected one at a time, in the order they joined. Throws NotAcquiredError when `waitMs`
   * passes first (the candidate leaves the queue; 0 gives up at once, as being elected takes a
   * round trip), UnavailableError when Baton could not be reached within it, and
   * DeadlineExceededError when Baton does not open the stream within `timeoutMs` (frozen, or a
   * listener that never answers).
   */
  async campaign(name: string, options?: CampaignOptions): Promise<Leadership> {
    text(name, "name");
    const o = optionsOf(options);
    const wait = checkWait(o.waitMs);
    const signal = signalOf(o.signal);
    const value = o.value === undefined ? new Uint8Array()
      : typeof o.value === "string" ? new TextEncoder().encode(o.value) : bytes(o.value, "value", "text or bytes (a string or a Uint8Array)");
    const request = { name, value, ttl: msDuration(or<unknown>(o.ttlMs, 10_000), "ttlMs") };
    this.usable();
    const deadline = wait === undefined ? undefined : Date.now() + wait;
    const notElected = () => new NotAcquiredError(`not elected in "${name}" within ${o.waitMs} ms`);
    let failures = 0;
    for (;;) {
      signal?.throwIfAborted();
      this.usable();
      const stream = new AbortController();
      const stop = () => stream.abort(signal?.reason);
      signal?.addEventListener("abort", stop, { once: true });
      this.#closing.signal.addEventListener("abort", stop, { once: true });
      // Campaign has no wait timeout: the client bounds the wait by closing the stream (a wait
      // longer than setTimeout's longest delay is a chain of timers).
      let timedOut = false;
      const cancelTimer = deadline === undefined ? undefined : longTimeout(() => {
        timedOut = true;
        stream.abort();
      }, deadline - Date.now());
      const opening = this.#opening(stream);
      const events = mapEvents(this.#elections.campaign(request, { signal: stream.signal, onHeader: opening.answered }), electionEvent);
      let err: BatonError;
      try {
        const first = await events.next();
        if (!timedOut && !first.done && first.value.case === "acquired") {
          const grant = first.value.value;
          return new Leadership(
            grant,
            value,
            events,
            stream,
            async (v) => {
              const reply = await this.call((o) => this.#elections.proclaim({ name, token: grant.token, value: v }, o));
              return reply.valueRevision;
            },
            () => this.#resign(name, grant.fencingToken, stream),
          );
        }
        err = new UnavailableError("the Campaign stream ended before its election");
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (opening.silent()) throw opening.error(`the Campaign of election "${name}"`);
        err = this.failure(e);
      } finally {
        cancelTimer?.();
        opening.done();
        signal?.removeEventListener("abort", stop);
        this.#closing.signal.removeEventListener("abort", stop);
      }
      stream.abort();
      if (err instanceof ClientClosedError) throw err;
      if (timedOut) throw notElected();
      failures++;
      // UNAVAILABLE (nothing joined) is retried within the wait, or RETRIES times without one.
      const over = deadline === undefined ? failures >= RETRIES : Date.now() >= deadline;
      if (!(err instanceof UnavailableError) || over) throw err;
      await sleep(retryDelay(err), signal);
      if (deadline !== undefined && Date.now() >= deadline) throw err; // no time left to be elected in
    }
  }

  /**
   * Runs `work` once elected, as the leader; `leadership.signal` aborts when the leadership is
   * lost. Resigns when `work` settles; a leadership lost meanwhile throws LeaseLostError.
   */
  async withLeadership<T>(name: string, work: (leadership: Leadership) => Promise<T>, options?: CampaignOptions): Promise<T> {
    fn(work, "work");
    const leadership = await this.campaign(name, options);
    return Baton.#run(leadership, work);
  }

  /** Who leads the election `name` now, and how many candidates wait (a snapshot). */
  async leader(name: string): Promise<ElectionState> {
    text(name, "name");
    return electionState(await this.call((o) => this.#elections.leader({ name }, o)));
  }

  /**
   * The election's state now, then every change (a new leader, a new value, no leader), as an
   * async iterable; leave the `for await` loop or abort `signal` to stop. States come in order;
   * a slow reader gets the newest. Throws UnavailableError when Baton can no longer follow the
   * election (Redis unreachable, Baton shutting down, a connection whose pings go unanswered):
   * observe again; DeadlineExceededError when Baton does not open the stream within `timeoutMs`.
   */
  async *observe(name: string, options?: { signal?: AbortSignal }): AsyncGenerator<ElectionState, void, undefined> {
    text(name, "name");
    const signal = signalOf(optionsOf(options).signal);
    this.usable();
    const stream = new AbortController();
    const stop = () => stream.abort(signal?.reason);
    signal?.throwIfAborted();
    signal?.addEventListener("abort", stop, { once: true });
    this.#closing.signal.addEventListener("abort", stop, { once: true });
    const opening = this.#opening(stream);
    try {
      for await (const state of this.#elections.observe({ name }, { signal: stream.signal, onHeader: opening.answered })) {
        yield electionState(state);
      }
    } catch (e) {
      if (signal?.aborted) return;
      if (opening.silent()) throw opening.error(`the Observe of election "${name}"`);
      throw this.failure(e);
    } finally {
      opening.done();
      signal?.removeEventListener("abort", stop);
      this.#closing.signal.removeEventListener("abort", stop);
      stream.abort();
    }
    this.usable();
    throw new UnavailableError("the Observe stream ended");
  }

  /**
   * Takes a hold that lasts `ttlMs` unless refreshed or released; undefined if not acquired. A
   * fresh idempotency key makes retries after UNAVAILABLE or a lost reply return the same hold.
   */
  async acquireLock(
    name: string,
    options: { ttlMs: number; waitMs?: number; owner?: string; fair?: boolean; shared?: boolean },
  ): Promise<LockGrant | undefined> {
    const o = optionsOf(options);
    const waitMs = acquireWait(o.waitMs);
    const request = {
      name: text(name, "name"),
      ttl: msDuration(o.ttlMs, "ttlMs"),
      waitTimeout: msDuration(waitMs, "waitMs"),
      owner: optText(o.owner, "owner"),
      fair: flag(o.fair, "fair"),
      mode: flag(o.shared, "shared") ? LockMode.SHARED : LockMode.EXCLUSIVE,
      idempotencyKey: randomUUID(),
    };
    const reply = await this.acquire((r, o) => this.#locks.acquire(r, o), request, waitMs);
    return reply.acquired && reply.lease ? lockGrant(reply.lease) : undefined;
  }

  /** Ends the hold; false when it had already expired or been released. */
  async releaseLock(grant: LockGrant): Promise<boolean> {
    const request = tokenRequest(grant);
    const reply = await this.call((o) => this.#locks.release(request, o));
    return reply.wasHeld;
  }

  /** Sets the hold's remaining ttl; throws FailedPreconditionError when it is gone. */
  async refreshLock(grant: LockGrant, ttlMs?: number): Promise<number> {
    const request = { ...tokenRequest(grant), ttl: ttlMs === undefined ? undefined : msDuration(ttlMs, "ttlMs") };
    const reply = await this.call((o) => this.#locks.refresh(request, o));
    return ms(reply.remainingTtl) ?? 0;
  }

  /** A snapshot of the lock `name`. */
  async describeLock(name: string): Promise<LockState> {
    text(name, "name");
    const r = await this.call((o) => this.#locks.describe({ name }, o));
    return {
      held: r.held,
      mode: r.mode === LockMode.EXCLUSIVE ? "exclusive" : r.mode === LockMode.SHARED ? "shared" : "",
      owner: r.owner,
      remainingMs: ms(r.remainingTtl),
      holdCount: r.holdCount,
      fencingToken: r.fencingToken,
      waiters: r.waiters,
      queued: r.queued,
      sharedHolders: r.sharedHolders,
    };
  }

  /** Takes permits without a stream; undefined if not acquired. */
  async acquirePermits(
    name: string,
    options: { limit: number; permits?: number; ttlMs: number; waitMs?: number; owner?: string; fair?: boolean },
  ): Promise<PermitGrant | undefined> {
    const o = optionsOf(options);
    const waitMs = acquireWait(o.waitMs);
    const request = {
      name: text(name, "name"),
      limit: count(o.limit, "limit"),
      permits: count(or<unknown>(o.permits, 1), "permits"),
      ttl: msDuration(o.ttlMs, "ttlMs"),
      waitTimeout: msDuration(waitMs, "waitMs"),
      owner: optText(o.owner, "owner"),
      fair: flag(o.fair, "fair"),
      idempotencyKey: randomUUID(),
    };
    const reply = await this.acquire((r, o) => this.#semaphores.acquire(r, o), request, waitMs);
    return reply.acquired && reply.permit ? permitGrant(reply.permit) : undefined;
  }

  /** Gives the permits back; false when the lease had already expired. */
  async releasePermits(grant: PermitGrant): Promise<boolean> {
    const request = tokenRequest(grant);
    const reply = await this.call((o) => this.#semaphores.release(request, o));
    return reply.wasHeld;
  }

  /** A snapshot of the semaphore `name`. */
  async describeSemaphore(name: string): Promise<SemaphoreState> {
    text(name, "name");
    const r = await this.call((o) => this.#semaphores.describe({ name }, o));
    return {
      limit: r.limit,
      permitsInUse: r.permitsInUse,
      holderCount: r.holderCount,
      holders: r.holders.map((h) => ({
        owner: h.owner,
        permits: h.permits,
        limit: h.limit,
        remainingMs: ms(h.remainingTtl),
        fencingToken: h.fencingToken,
      })),
      waiters: r.waiters,
      fencingToken: r.fencingToken,
    };
  }

  /** @internal One unary call, retried after UNAVAILABLE (every call retried is idempotent). */
  async call<T>(fn: (options: CallOptions) => Promise<T>, timeoutMs = this.#timeoutMs): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      this.usable();
      try {
        return await fn({ timeoutMs, signal: this.#closing.signal });
      } catch (e) {
        const err = this.failure(e);
        if (!(err instanceof UnavailableError) || attempt >= RETRIES) throw err;
        await sleep(retryDelay(err), this.#closing.signal).catch(() => undefined);
      }
    }
  }

  /** @internal An Acquire with an idempotency key: UNAVAILABLE and a passed deadline (whose
   * reply may be lost) are retried with the same key, which returns the same grant. */
  async acquire<Req extends { waitTimeout?: Duration }, Res>(
    fn: (request: Req, options: CallOptions) => Promise<Res>,
    request: Req,
    waitMs: number,
  ): Promise<Res> {
    let timeoutMs = waitMs + this.#timeoutMs;
    for (let attempt = 1; ; attempt++) {
      this.usable();
      try {
        return await fn(request, { timeoutMs, signal: this.#closing.signal });
      } catch (e) {
        const err = this.failure(e);
        const retriable = err instanceof UnavailableError || err instanceof DeadlineExceededError;
        if (!retriable || attempt >= RETRIES) throw err;
        if (err instanceof UnavailableError) await sleep(retryDelay(err), this.#closing.signal).catch(() => undefined);
        // The retry only looks up what the key was granted (or tries once more).
        request = { ...request, waitTimeout: durationFromMs(0) };
        timeoutMs = this.#timeoutMs;
      }
    }
  }

  static async #run<T, L extends Lease>(lease: L, work: (lease: L) => Promise<T>): Promise<T> {
    let outcome: { value: T } | { error: unknown };
    try {
      outcome = { value: await work(lease) };
    } catch (error) {
      outcome = { error };
    }
    // Closing first: it also tells a loss the blocked event loop kept its timers from telling.
    await lease.close();
    if (lease.lost) throw lease.error("error" in outcome ? outcome.error : undefined);
    if ("error" in outcome) throw outcome.error;
    return outcome.value;
  }

  /**
   * Bounds the opening of a stream: Baton sends a Hold's or a Campaign's response headers as soon
   * as it has the call (before any wait), so headers missing `timeoutMs` after (a frozen Baton
   * whose kernel still accepts connections, a listener that never answers) give the attempt up.
   */
  #opening(stream: AbortController) {
    let answered = false;
    let silent = false;
    const timeoutMs = this.#timeoutMs;
    const timer = setTimeout(() => {
      if (answered) return;
      silent = true;
      stream.abort();
    }, timeoutMs);
    return {
      answered: () => {
        answered = true;
        clearTimeout(timer);
      },
      silent: () => silent,
      done: () => clearTimeout(timer),
      error: (what: string) =>
        new DeadlineExceededError(`Baton did not open ${what} within ${timeoutMs} ms (the client's timeout)`, Code.DeadlineExceeded),
    };
  }

  /**
   * Resigns the leadership of `term`: closes its Campaign stream (Baton resigns for it at once),
   * then follows the election until Baton shows another term or nobody leading, at most
   * `timeoutMs` (Election has no Resign call: the stream's close is the resignation).
   */
  async #resign(name: string, term: bigint, stream: AbortController): Promise<void> {
    stream.abort();
    const bound = AbortSignal.timeout(this.#timeoutMs);
    for await (const state of this.observe(name, { signal: bound })) {
      if (state.leader === undefined || state.leader.term !== term) return;
    }
  }

  #open(spec: HoldSpec, waitMs: number, signal: AbortSignal, onHeader: () => void): AsyncIterator<HoldEvent> {
    const common = {
      name: spec.name,
      ttl: spec.ttl,
      waitTimeout: msDuration(waitMs, "waitMs"),
      owner: spec.owner,
      fair: spec.fair,
    };
    if (spec.kind === "lock") {
      const stream = this.#locks.hold(
        { ...common, mode: spec.shared ? LockMode.SHARED : LockMode.EXCLUSIVE },
        { signal, onHeader },
      );
      return mapEvents(stream, (event): HoldEvent => {
        switch (event.event.case) {
          case "acquired": {
            const l = event.event.value;
            return {
              case: "acquired",
              value: {
                name: l.name, token: l.token, fencingToken: l.fencingToken, owner: l.owner,
                expiresAt: l.expiresAt, shared: l.mode === LockMode.SHARED,
              },
            };
          }
          case "notAcquired":
            return { case: "notAcquired", value: { holderRemainingMs: ms(event.event.value.holderRemainingTtl) } };
          default:
            return event.event as HoldEvent;
        }
      });
    }
    const stream = this.#semaphores.hold(
      { ...common, limit: spec.limit, permits: spec.permits },
      { signal, onHeader },
    );
    return mapEvents(stream, (event): HoldEvent => {
      switch (event.event.case) {
        case "acquired": {
          const p = event.event.value;
          return {
            case: "acquired",
            value: {
              name: p.name, token: p.token, fencingToken: p.fencingToken, owner: p.owner,
              expiresAt: p.expiresAt, permits: p.permits,
            },
          };
        }
        case "notAcquired":
          return {
            case: "notAcquired",
            value: { holderRemainingMs: ms(event.event.value.earliestExpiry), available: event.event.value.available },
          };
        default:
          return event.event as HoldEvent;
      }
    });
  }

  /** Opens Hold streams until one grants the lease (a wait longer than Baton's longest is made
   * of several; UNAVAILABLE before the grant, when nothing is held, is retried). */
  async #hold(spec: HoldSpec): Promise<Lease | undefined> {
    const { kind, name, signal } = spec;
    this.usable();
    const deadline = spec.wait === undefined ? undefined : Date.now() + spec.wait;
    let failures = 0;
    for (;;) {
      signal?.throwIfAborted();
      this.usable();
      const left = deadline === undefined ? MAX_WAIT_MS : Math.max(0, deadline - Date.now());
      const stream = new AbortController();
      const stop = () => stream.abort(signal?.reason);
      signal?.addEventListener("abort", stop, { once: true });
      this.#closing.signal.addEventListener("abort", stop, { once: true });
      const asked = Math.min(left, MAX_WAIT_MS);
      const opening = this.#opening(stream);
      const events = this.#open(spec, asked, stream.signal, opening.answered);
      // Baton answers by the end of the wait; one that has not `timeoutMs` after (frozen) is
      // given up: closing the stream withdraws the request.
      let gaveUp = false;
      const timer = setTimeout(() => {
        gaveUp = true;
        stream.abort();
      }, asked + this.#timeoutMs);
      const late = () =>
        new DeadlineExceededError(
          `Baton did not answer the Hold of ${kind} "${name}" within ${asked + this.#timeoutMs} ms (its wait and the client's timeout)`,
          Code.DeadlineExceeded,
        );
      let err: BatonError;
      try {
        const first = await events.next();
        if (gaveUp) {
          stream.abort();
          throw late();
        }
        if (first.done) {
          err = new UnavailableError("the Hold stream ended before its first event");
        } else if (first.value.case === "acquired") {
          const grant = first.value.value;
          return new Lease(kind, grant, events, stream, (g: Grant) => this.#releaseGrant(kind, g));
        } else if (first.value.case === "notAcquired") {
          stream.abort();
          if (deadline === undefined || left > MAX_WAIT_MS) continue;
          throw new NotAcquiredError(
            `${kind} "${name}" not acquired within ${spec.waitMs} ms`,
            first.value.value.holderRemainingMs,
            first.value.value.available,
          );
        } else {
          err = new BatonError("the Hold stream did not start with a grant");
        }
      } catch (e) {
        if (e instanceof NotAcquiredError || e instanceof DeadlineExceededError) throw e;
        if (signal?.aborted) throw signal.reason;
        if (opening.silent()) throw opening.error(`the Hold of ${kind} "${name}"`);
        if (gaveUp) throw late();
        err = this.failure(e);
      } finally {
        clearTimeout(timer);
        opening.done();
        // Every way out of this attempt (granted, retried, given up) drops the listener: the
        // caller's signal only ever bounds the wait.
        signal?.removeEventListener("abort", stop);
        this.#closing.signal.removeEventListener("abort", stop);
      }
      stream.abort();
      if (err instanceof ClientClosedError) throw err;
      failures++;
      const over = deadline === undefined || Date.now() >= deadline;
      if (!(err instanceof UnavailableError) || (failures >= RETRIES && over)) throw err;
      await sleep(retryDelay(err), signal);
    }
  }

  async #releaseGrant(kind: "lock" | "semaphore", grant: Grant): Promise<void> {
    this.usable();
    const request = { name: grant.name, token: grant.token };
    if (kind === "lock") await this.#locks.release(request, { timeoutMs: this.#timeoutMs });
    else await this.#semaphores.release(request, { timeoutMs: this.#timeoutMs });
  }
}

/** A Hold's request, its options checked. */
interface HoldSpec {
  kind: "lock" | "semaphore";
  name: string;
  ttl: Duration;
  owner: string;
  fair: boolean;
  shared: boolean;
  limit: number;
  permits: number;
  /** The wait in ms, undefined for no end; `waitMs` as given, for messages. */
  wait: number | undefined;
  waitMs: unknown;
  signal?: AbortSignal;
}

/** Checks the arguments of lock() or semaphore() (`waitMs` forced by the try* forms). */
function holdSpec(kind: "lock" | "semaphore", name: unknown, options: object | undefined, waitMs?: number): HoldSpec {
  const o = optionsOf(options) as Partial<LockOptions & SemaphoreOptions>;
  const given = waitMs === undefined ? o.waitMs : waitMs;
  return {
    kind,
    name: text(name, "name"),
    ttl: msDuration(or<unknown>(o.ttlMs, 10_000), "ttlMs"),
    owner: optText(o.owner, "owner"),
    fair: flag(o.fair, "fair"),
    shared: kind === "lock" ? flag(o.shared, "shared") : false,
    limit: kind === "semaphore" ? count(o.limit, "limit") : 0,
    permits: kind === "semaphore" ? count(or<unknown>(o.permits, 1), "permits") : 0,
    wait: checkWait(given),
    waitMs: given,
    signal: signalOf(o.signal),
  };
}

/** The name and token of a grant, checked. */
function tokenRequest(grant: unknown): { name: string; token: string } {
  if (typeof grant !== "object" || grant === null) throw new TypeError(`grant: a grant (from acquireLock or acquirePermits), not ${typeOf(grant)}`);
  const g = grant as { name?: unknown; token?: unknown };
  return { name: text(g.name, "grant.name"), token: text(g.token, "grant.token") };
}

function mapEvents<T>(stream: AsyncIterable<T>, map: (event: T) => HoldEvent): AsyncIterator<HoldEvent> {
  const it = stream[Symbol.asyncIterator]();
  return {
    async next() {
      const r = await it.next();
      return r.done ? { done: true, value: undefined } : { done: false, value: map(r.value) };
    },
  };
}

/** Rate limit checks (`client.rateLimit`). */
export class RateLimits {
  /** @internal */
  constructor(private readonly client: Baton, private readonly stub: Client<typeof RateLimitService>) {}

  /** Counts `cost` (default 1; 0 peeks) against `limit` per `periodMs` on `key`. */
  async check(
    key: string,
    options: { limit: number | bigint; periodMs: number; cost?: number | bigint; algorithm?: keyof typeof ALGORITHMS; burst?: number | bigint },
  ): Promise<RateLimitDecision> {
    const o = optionsOf(options);
    const request = {
      key: text(key, "key"),
      limit: count64(o.limit, "limit"),
      period: msDuration(o.periodMs, "periodMs"),
      cost: o.cost === undefined ? undefined : count64(o.cost, "cost"),
      algorithm: choice(ALGORITHMS, or<unknown>(o.algorithm, "gcra"), "algorithm"),
      burst: count64(or<unknown>(o.burst, 0), "burst"),
    };
    const r = await this.client.call((o) => this.stub.check(request, o));
    const decidedBy = r.decidedBy === RateLimitDecidedBy.FAIL_OPEN ? "fail_open"
      : r.decidedBy === RateLimitDecidedBy.FAIL_CLOSED ? "fail_closed" : "redis";
    return {
      allowed: r.allowed,
      limit: r.limit,
      remaining: r.remaining,
      retryAfterMs: ms(r.retryAfter) ?? 0,
      resetAfterMs: ms(r.resetAfter) ?? 0,
      decidedBy,
    };
  }
}

/** Dictionaries and recent lists (`client.autocomplete`). */
export class Autocomplete {
  /** @internal */
  constructor(private readonly client: Baton, private readonly stub: Client<typeof AutocompleteService>) {}

  /** Adds or updates terms (one term, or an array of them); a request id (made up when not
   * given) makes retries apply once. */
  async add(dictionary: string, terms: Term | Term[], requestId?: string) {
    const list = Array.isArray(terms) ? terms : [terms];
    const request = {
      dictionary: text(dictionary, "dictionary"),
      requestId: requestId === undefined ? randomUUID() : text(requestId, "requestId"),
      terms: list.map((t, i) => create(AutocompleteTermSchema, termFields(t, `terms[${i}]`))),
    };
    const r = await this.client.call((o) => this.stub.add(request, o));
    return { added: r.added, updated: r.updated, scores: r.scores, termCount: r.termCount };
  }

  /** Removes terms by display text (one, or an array); returns how many were there. */
  async remove(dictionary: string, displays: string | string[]): Promise<number> {
    const request = { dictionary: text(dictionary, "dictionary"), displays: texts(displays, "displays") };
    return (await this.client.call((o) => this.stub.remove(request, o))).removed;
  }

  /** How many terms the dictionary has. */
  async size(dictionary: string): Promise<bigint> {
    text(dictionary, "dictionary");
    return (await this.client.call((o) => this.stub.describe({ dictionary }, o))).termCount;
  }

  /** Declares the indexes the dictionary keeps, and so the modes it serves (lexicographic prefix
   * and fuzzy completion always); a dictionary that never called this has every feature. On a
   * dictionary with terms, features added are built (and dropped ones deleted) in the background,
   * each served once built (FailedPrecondition while a change to other features is under way).
   * Returns the features it serves now. */
  async configure(dictionary: string, features: Feature[]): Promise<Feature[]> {
    text(dictionary, "dictionary");
    if (!Array.isArray(features)) throw new TypeError(`features: an array, not ${typeOf(features)}`);
    const request = { dictionary, features: features.map((f) => choice(FEATURES, f, "features")) };
    return featureNames((await this.client.call((o) => this.stub.configure(request, o))).features);
  }

  /** The dictionary's features (every one unless `configure` said otherwise). */
  async features(dictionary: string): Promise<Feature[]> {
    text(dictionary, "dictionary");
    return featureNames((await this.client.call((o) => this.stub.describe({ dictionary }, o))).features);
  }

  /** One page of terms matching `query`. In "fuzzy" mode (typos; one page) `maxEdits` (0 to 2)
   * lowers the edits the query's length allows. */
  async complete(
    dictionary: string,
    query: string,
    options?: { limit?: number; mode?: MatchMode; order?: "lexicographic" | "score"; pageToken?: string; maxEdits?: number },
  ): Promise<Completions> {
    const o = optionsOf(options);
    const maxEdits: unknown = o.maxEdits;
    if (maxEdits !== undefined) {
      if (typeof maxEdits !== "number") throw new TypeError(`maxEdits: a number, not ${typeOf(maxEdits)}`);
      if (!(Number.isInteger(maxEdits) && maxEdits >= 0 && maxEdits <= 2)) throw badValue("maxEdits", maxEdits, "0, 1 or 2");
    }
    const request = {
      dictionary: text(dictionary, "dictionary"),
      query: text(query, "query"),
      limit: count(or<unknown>(o.limit, 10), "limit"),
      mode: choice(MODES, or<unknown>(o.mode, "prefix"), "mode"),
      order: choice(ORDERS, or<unknown>(o.order, "lexicographic"), "order"),
      pageToken: optText(o.pageToken, "pageToken"),
      maxEdits: maxEdits as number | undefined,
    };
    const r = await this.client.call((o) => this.stub.complete(request, o));
    return {
      suggestions: r.suggestions.map((s) => ({
        display: s.display,
        score: s.score,
        payload: s.payload,
        match: matchKind(s.matchKind),
        editDistance: s.editDistance,
      })),
      nextPageToken: r.nextPageToken,
      incomplete: r.incomplete,
    };
  }

  /** Moves `display` to the front of the recent list `list`. */
  async recordRecent(list: string, display: string, options?: { payload?: Uint8Array; maxItems?: number; ttlMs?: number }) {
    const o = optionsOf(options);
    const request = {
      list: text(list, "list"),
      display: text(display, "display"),
      payload: o.payload === undefined ? undefined : bytes(o.payload, "payload"),
      maxItems: count(or<unknown>(o.maxItems, 0), "maxItems"),
      ttl: o.ttlMs === undefined ? undefined : msDuration(o.ttlMs, "ttlMs"),
    };
    const r = await this.client.call((o) => this.stub.recordRecent(request, o));
    return { size: r.size, evicted: r.evicted, recordedAt: r.recordedAt ? timestampDate(r.recordedAt) : undefined };
  }

  /** Removes items from a recent list (one display, or an array); returns how many were there. */
  async removeRecent(list: string, displays: string | string[]): Promise<number> {
    const request = { list: text(list, "list"), displays: texts(displays, "displays") };
    return (await this.client.call((o) => this.stub.removeRecent(request, o))).removed;
  }

  /** One page of the recent list, most recent first. */
  async recent(list: string, options?: { limit?: number; pageToken?: string }) {
    const o = optionsOf(options);
    const request = { list: text(list, "list"), limit: count(or<unknown>(o.limit, 0), "limit"), pageToken: optText(o.pageToken, "pageToken") };
    const r = await this.client.call((o) => this.stub.listRecent(request, o));
    return { items: r.items.map(recentItem), nextPageToken: r.nextPageToken };
  }

  /** One page of the recent list's items matching `query` (every mode but "fuzzy", which is for dictionaries). */
  async completeRecent(list: string, query: string, options?: { limit?: number; mode?: Exclude<MatchMode, "fuzzy">; pageToken?: string }) {
    const o = optionsOf(options);
    const request = {
      list: text(list, "list"),
      query: text(query, "query"),
      limit: count(or<unknown>(o.limit, 10), "limit"),
      mode: choice(MODES, or<unknown>(o.mode, "prefix"), "mode"),
      pageToken: optText(o.pageToken, "pageToken"),
    };
    const r = await this.client.call((o) => this.stub.completeRecent(request, o));
    return { items: r.items.map(recentItem), nextPageToken: r.nextPageToken };
  }
}

function recentItem(i: { display: string; payload: Uint8Array; recordedAt?: { seconds: bigint; nanos: number }; matchKind: AutocompleteMatchKind }): RecentItem {
  return {
    display: i.display,
    payload: i.payload,
    recordedAt: i.recordedAt ? timestampDate(i.recordedAt as never) : undefined,
    match: matchKind(i.matchKind),
  };
}
