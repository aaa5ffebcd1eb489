// A lease held through a Hold stream (a leadership through a Campaign stream), kept alive in the
// background.

import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { LeaseLostError } from "./errors.js";
import { LeaseLostReason } from "./gen/baton/v1/lease_pb.js";

/** A Hold stream's events, the same for locks and semaphores. */
export type HoldEvent =
  | { case: "acquired"; value: Grant }
  | { case: "notAcquired"; value: { holderRemainingMs?: number; available?: number } }
  | { case: "renewed"; value: { expiresAt?: Timestamp } }
  | { case: "lost"; value: { reason: LeaseLostReason; message: string } }
  | { case: undefined; value?: undefined };

/** What a grant says about the lease. */
export interface Grant {
  name: string;
  token: string;
  fencingToken: bigint;
  owner: string;
  expiresAt?: Timestamp;
  permits?: number;
  shared?: boolean;
}

/** How a Lease ends its hold: Release by token, or a leadership's resignation, confirmed by Baton
 * (errors ignored by the caller). */
export type Releaser = (grant: Grant) => Promise<void>;

/**
 * A lock or permits held through a Hold stream.
 *
 * `signal` aborts (with a LeaseLostError as its reason) when Baton reports the lease lost, when
 * the stream breaks, or when the newest `expiresAt` passes on the local clock with no newer
 * renewal: a frozen or partitioned Baton sends nothing at all. Pass it to the work the lease
 * protects. `release()` (or `await using`) ends the lease at once, and throws LeaseLostError if
 * it was lost meanwhile, so a loss is never silently ignored. Once `release()` was called the
 * lease is no longer `held`, `signal` is aborted (reason `RELEASED`, unless it was lost before)
 * and `check()` throws.
 */
export class Lease implements AsyncDisposable {
  /** The lock's or semaphore's name. */
  readonly name: string;
  /** Strictly increases per name: pass it with every write the lease protects (a bigint). */
  readonly fencingToken: bigint;
  /** The owner the lease belongs to ("" when anonymous). */
  readonly owner: string;
  /** Permits held (semaphores; 0 for locks). */
  readonly permits: number;
  /** True for a shared lock lease. */
  readonly shared: boolean;
  /** Why the lease was lost, once it was (see LeaseLostError.reason). */
  lostReason?: string;
  /** Baton's words about the loss. */
  lostMessage = "";

  #expiresAtMs: number;
  #lost = new AbortController();
  #stream: AbortController;
  #timer?: NodeJS.Timeout;
  #closed = false;
  /** Lost by the local clock outside the timer: released by `close()` all the same. */
  #expiredUntold = false;
  #grant: Grant;
  #release: Releaser;

  /** @internal Built by the client once the stream's first event granted the lease. */
  constructor(
    readonly kind: "lock" | "semaphore" | "election",
    grant: Grant,
    events: AsyncIterator<HoldEvent>,
    stream: AbortController,
    release: Releaser,
  ) {
    this.name = grant.name;
    this.fencingToken = grant.fencingToken;
    this.owner = grant.owner;
    this.permits = grant.permits ?? 0;
    this.shared = grant.shared ?? false;
    this.#grant = grant;
    this.#stream = stream;
    this.#release = release;
    this.#expiresAtMs = grant.expiresAt ? timestampMs(grant.expiresAt) : Date.now();
    this.#arm();
    void this.#read(events);
  }

  /** Aborted when the lease is lost, or released (`release()` aborts it before Baton is told);
   * its reason is the LeaseLostError. Read after `expiresAt` passed, it is aborted already, even
   * when the event loop was too busy to run the expiry timer (work that blocked it, a frozen
   * process). */
  get signal(): AbortSignal {
    this.#expireIfDue();
    return this.#lost.signal;
  }

  /** True once the lease is lost (and from `expiresAt` on, as `signal` says); a lease released
   * while it was held is not lost (but no longer `held`). */
  get lost(): boolean {
    this.#expireIfDue();
    return this.lostReason !== undefined;
  }

  /** Until when the lease is held for certain (Baton's clock, less a safety margin). */
  get expiresAt(): Date {
    return new Date(this.#expiresAtMs);
  }

  /** Milliseconds until `expiresAt` by the local clock (negative once passed). */
  get remainingMs(): number {
    return this.#expiresAtMs - Date.now();
  }

  /** True while the lease is neither released, lost nor past its `expiresAt` on the local clock. */
  get held(): boolean {
    return !this.#closed && !this.lost && this.remainingMs > 0;
  }

  /** Throws LeaseLostError unless the lease is still held (reason `RELEASED` once `release()` was
   * called): call it between steps of work that cannot take the `signal`. */
  check(): void {
    if (this.lost) throw this.error();
    if (this.#closed) throw this.#releasedError();
  }

  #releasedError(): LeaseLostError {
    return new LeaseLostError(`${this.describe()} was released`, "RELEASED");
  }

  /** The LeaseLostError describing the loss. */
  error(cause?: unknown): LeaseLostError {
    return new LeaseLostError(
      `${this.describe()} lost (${this.lostReason}): ${this.lostMessage}`,
      this.lostReason ?? "",
      cause === undefined ? undefined : { cause },
    );
  }

  /** @internal What the lease is, for messages. */
  protected describe(): string {
    return `${this.kind} "${this.name}"`;
  }

  /** Ends the lease at once; throws LeaseLostError if it had been lost. Safe to call twice. */
  async release(): Promise<void> {
    await this.close();
    if (this.lost) throw this.error();
  }

  /** `await using lease = await client.lock(...)`: releases when the scope ends. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  /** @internal Ends the lease without throwing: aborts `signal` (work handed it stops before
   * anyone else can hold the lease), Release by token (a leadership resigns), then closes the
   * stream. */
  async close(): Promise<void> {
    if (this.#closed) return;
    // A loss no timer could tell (work that blocked the event loop past expiresAt) is told here,
    // so that release(), `await using` and withLock() report it instead of returning quietly.
    this.#expireIfDue();
    this.#closed = true;
    clearTimeout(this.#timer);
    const stillHeld = !this.#lost.signal.aborted || this.#expiredUntold;
    if (!this.#lost.signal.aborted) this.#lost.abort(this.#releasedError());
    if (stillHeld) {
      // Released before returning, so the next holder can go ahead; closing the stream would
      // release it too, a moment later. An expired lease may still be held (its renewals only
      // went unread): it is released all the same.
      await this.#release(this.#grant).catch(() => undefined);
    }
    this.#stream.abort();
  }

  #arm(): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#expired(), Math.max(0, this.remainingMs));
    this.#timer.unref();
  }

  #expired(): void {
    if (this.#closed || this.#lost.signal.aborted) return;
    if (this.remainingMs > 0) {
      this.#arm(); // a renewal moved it meanwhile
      return;
    }
    this.#lose("EXPIRED", "no renewal arrived before the lease's expiresAt");
    this.#stream.abort();
  }

  /** Loses the lease when `expiresAt` has passed and no timer could say so yet (work that
   * blocked the event loop): the stream is left to `close()`, which releases the lease, since
   * its renewals may only have gone unread. */
  #expireIfDue(): void {
    if (this.#closed || this.#lost.signal.aborted || this.remainingMs > 0) return;
    this.#lose("EXPIRED", "no renewal arrived before the lease's expiresAt");
    this.#expiredUntold = true;
  }

  #lose(reason: string, message: string): void {
    if (this.#lost.signal.aborted || this.#closed) return;
    this.lostReason = reason;
    this.lostMessage = message;
    clearTimeout(this.#timer);
    this.#lost.abort(this.error());
  }

  async #read(events: AsyncIterator<HoldEvent>): Promise<void> {
    try {
      for (;;) {
        const next = await events.next();
        if (next.done) break;
        const event = next.value;
        if (event.case === "renewed") {
          if (event.value.expiresAt) this.#expiresAtMs = timestampMs(event.value.expiresAt);
          this.#arm();
        } else if (event.case === "lost") {
          const reason = LeaseLostReason[event.value.reason]?.replace(/^LEASE_LOST_REASON_/, "");
          this.#lose(reason ?? "UNKNOWN", event.value.message);
          return;
        }
      }
      this.#lose("DISCONNECTED", "the stream ended without a lost event");
    } catch (e) {
      this.#lose("DISCONNECTED", `the stream broke: ${e instanceof Error ? e.message : String(e)}`);
    }
  }
}

/** Changes a leader's value: the proclaimed revision. */
export type Proclaimer = (value: Uint8Array) => Promise<bigint>;

/**
 * The leadership of an election, kept alive by a Campaign stream: a Lease whose fencing token is
 * the leader's `term`. `signal`, `lost`, `check()` and `release()` (which resigns at once) work
 * as for locks.
 */
export class Leadership extends Lease {
  /** The value others see as this leader's (the last one proclaimed). */
  value: Uint8Array;
  /** How many times the value changed in this term (0n right after the election). */
  valueRevision = 0n;
  #proclaim: Proclaimer;

  /** @internal Built by the client once the candidate was elected; `resign` closes the stream
   * (which resigns) and resolves once Baton shows the term ended. */
  constructor(
    grant: Grant,
    value: Uint8Array,
    events: AsyncIterator<HoldEvent>,
    stream: AbortController,
    proclaim: Proclaimer,
    resign: Releaser,
  ) {
    super("election", grant, events, stream, resign);
    this.value = value;
    this.#proclaim = proclaim;
  }

  /** The leader's term: strictly increases with every new leader. Pass it with every write. */
  get term(): bigint {
    return this.fencingToken;
  }

  /** The value as text (invalid UTF-8 replaced). */
  get text(): string {
    return new TextDecoder().decode(this.value);
  }

  /** Changes the value others see (same term): the value's revision. Throws
   * FailedPreconditionError when the leadership has ended. */
  async proclaim(value: string | Uint8Array): Promise<bigint> {
    if (typeof value !== "string" && !(value instanceof Uint8Array)) {
      throw new TypeError(`value: text or bytes (a string or a Uint8Array), not ${value === null ? "null" : typeof value}`);
    }
    const bytes = typeof value === "string" ? new TextEncoder().encode(value) : value;
    const revision = await this.#proclaim(bytes);
    this.value = bytes;
    this.valueRevision = revision;
    return revision;
  }

  protected override describe(): string {
    return `the leadership of election "${this.name}"`;
  }
}
