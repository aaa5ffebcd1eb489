// The Node client against a live Baton, over TCP and the Unix socket.

import { after, before, describe, test } from "node:test";
import * as assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { getEventListeners } from "node:events";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import {
  Baton,
  ClientClosedError,
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  Leadership,
  LeaseLostError,
  NotAcquiredError,
  UnavailableError,
  type Lease,
} from "../src/index.js";
import { BatonServer, Redis, spawnHolder, uniqueName, waitUntil, workdir } from "./harness.js";

let redis: Redis;
let server: BatonServer;

before(async () => {
  redis = await Redis.start();
  server = await BatonServer.start(redis);
});

after(async () => {
  await server.stop();
  redis.stop();
});

/** Waits until `signal` aborts; its reason. */
function aborted(signal: AbortSignal, timeoutMs: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return resolve(signal.reason);
    const timer = setTimeout(() => reject(new Error(`not aborted within ${timeoutMs} ms`)), timeoutMs);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(signal.reason);
    }, { once: true });
  });
}

for (const transport of ["tcp", "unix"] as const) {
  describe(`over ${transport}`, () => {
    test("a lock held with `await using` is free once the scope ends", async () => {
      const client = Baton.connect(server[transport]);
      const name = uniqueName();
      {
        await using lease = await client.lock(name, { ttlMs: 2000, owner: "me" });
        const state = await client.describeLock(name);
        assert.equal(state.held, true);
        assert.equal(state.owner, "me");
        assert.equal(state.fencingToken, lease.fencingToken);
        assert.equal(typeof lease.fencingToken, "bigint");
        assert.ok(lease.held && lease.remainingMs > 0 && lease.remainingMs <= 2000);
      }
      assert.equal((await client.describeLock(name)).held, false);
      client.close();
    });

    test("semaphore permits stop at the limit", async () => {
      const client = Baton.connect(server[transport]);
      const name = uniqueName();
      await client.withSemaphore(name, async (lease) => {
        assert.equal(lease.permits, 2);
        assert.equal(await client.trySemaphore(name, { limit: 3, permits: 2 }), undefined);
        assert.equal((await client.describeSemaphore(name)).permitsInUse, 2);
      }, { limit: 3, permits: 2 });
      const all = await client.trySemaphore(name, { limit: 3, permits: 3 });
      assert.ok(all);
      await all.release();
      client.close();
    });

    test("autocomplete and rate limits are plain calls", async () => {
      const client = Baton.connect(server[transport]);
      const name = uniqueName();
      const added = await client.autocomplete.add(name, ["Straße", { display: "Stroud", score: 5 }, "Zoë"]);
      assert.equal(added.added, 3);
      const page = await client.autocomplete.complete(name, "STRA");
      assert.deepEqual(page.suggestions.map((s) => s.display), ["Straße"]);
      assert.equal(page.suggestions[0].match, "prefix");
      assert.equal(await client.autocomplete.size(name), 3n);
      // Typos: "stre" is one substitution from "stra..." and "stro...".
      const fuzzy = await client.autocomplete.complete(name, "stre", { mode: "fuzzy" });
      assert.deepEqual(fuzzy.suggestions.map((s) => [s.display, s.match, s.editDistance]), [
        ["Straße", "fuzzy", 1],
        ["Stroud", "fuzzy", 1],
      ]);
      assert.equal(fuzzy.incomplete, false);
      const byScore = await client.autocomplete.complete(name, "stre", { mode: "fuzzy", order: "score" });
      assert.deepEqual(byScore.suggestions.map((s) => s.display), ["Stroud", "Straße"]);
      assert.deepEqual((await client.autocomplete.complete(name, "stre", { mode: "fuzzy", maxEdits: 0 })).suggestions, []);
      await assert.rejects(client.autocomplete.complete(name, "stre", { mode: "fuzzy", maxEdits: 3 }),
        (e: unknown) => e instanceof InvalidArgumentError && e.field === "maxEdits");
      await assert.rejects(client.autocomplete.complete(name, "stre", { mode: "fuzzy", maxEdits: "1" as unknown as number }), TypeError);
      await assert.rejects(client.autocomplete.complete(name, "stra", { maxEdits: 1 }), /max_edits/);
      const first = await client.autocomplete.complete(name, "str", { limit: 1 });
      assert.deepEqual(first.suggestions.map((s) => s.display), ["Straße"]);
      const second = await client.autocomplete.complete(name, "str", { limit: 1, pageToken: first.nextPageToken });
      assert.deepEqual(second.suggestions.map((s) => s.display), ["Stroud"]);
      await client.autocomplete.recordRecent(name, "alice");
      await client.autocomplete.recordRecent(name, "bob");
      assert.deepEqual((await client.autocomplete.recent(name)).items.map((i) => i.display), ["bob", "alice"]);
      // Features: the default is every one; a dictionary declared with fewer refuses the others.
      const declared = uniqueName();
      assert.deepEqual(await client.autocomplete.features(declared), ["ranked", "words", "substring"]);
      assert.deepEqual(await client.autocomplete.configure(declared, ["words"]), ["words"]);
      await client.autocomplete.add(declared, ["Anna Smith"]);
      const words = await client.autocomplete.complete(declared, "smi", { mode: "word_prefix" });
      assert.deepEqual(words.suggestions.map((s) => s.display), ["Anna Smith"]);
      await assert.rejects(client.autocomplete.complete(declared, "an", { order: "score" }), /AUTOCOMPLETE_FEATURE_RANKED/);
      // RANKED added to a dictionary with terms is built in the background, served once built.
      const served = await client.autocomplete.configure(declared, ["ranked", "words"]);
      assert.ok(["words", "ranked,words"].includes(served.join(",")), served.join(","));
      const answers = [];
      for (let i = 0; i < 3; i++) answers.push(await client.rateLimit.check(name, { limit: 2, periodMs: 60_000 }));
      assert.deepEqual(answers.map((a) => a.allowed), [true, true, false]);
      assert.ok(answers[2].retryAfterMs > 0);
      client.close();
    });
  });
}

test("renewals keep a lease past several ttls", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  await client.withLock(name, async (lease) => {
    const first = lease.expiresAt.getTime();
    await sleep(2500);
    lease.check();
    assert.ok(lease.expiresAt.getTime() > first);
    // A 1 s ttl renewed every third of it: wide enough for a loaded machine (0.3 s was not).
  }, { ttlMs: 1000 });
  client.close();
});

test("tryLock gives undefined while someone else holds the lock; lock() throws NotAcquiredError", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  await client.withLock(name, async () => {
    assert.equal(await client.tryLock(name), undefined);
    await assert.rejects(client.lock(name, { waitMs: 200 }), NotAcquiredError);
  });
  client.close();
});

test("two processes appending under one lock never interleave", async () => {
  const name = uniqueName();
  const file = join(workdir, `${name}.log`);
  const holders = [0, 1].map(() => spawnHolder(server.tcp, "append", name, file));
  const codes = await Promise.all(holders.map((h) => new Promise((r) => h.on("exit", r))));
  assert.deepEqual(codes, [0, 0]);
  const lines = readFileSync(file, "utf8").trim().split("\n");
  assert.equal(lines.length, 20);
  for (let i = 0; i < lines.length; i += 2) {
    const pid = lines[i].replace(/^start /, "");
    assert.equal(lines[i + 1], `end ${pid}`, lines.join("\n"));
  }
});

test("a holder killed with SIGKILL frees its 30 s lock at once", async () => {
  const name = uniqueName();
  const holder = spawnHolder(server.unix, "hold", name);
  try {
    await new Promise<void>((resolve, reject) => {
      holder.stdout?.once("data", (d: Buffer) => (d.toString().startsWith("HELD") ? resolve() : reject(new Error(d.toString()))));
      holder.once("exit", (code) => reject(new Error(`holder exited ${code}`)));
    });
    const client = Baton.connect(server.tcp);
    assert.equal((await client.describeLock(name)).held, true);
    holder.kill("SIGKILL");
    const started = Date.now();
    await client.withLock(name, async () => undefined, { waitMs: 10_000 });
    assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms, the ttl is 30 s`);
    client.close();
  } finally {
    holder.kill("SIGKILL");
  }
});

test("a lost lease aborts the signal and withLock throws LeaseLostError", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  let reachedEnd = false;
  const error = await client.withLock(name, async (lease) => {
    assert.ok(redis.deleteKeys(`${server.prefix}{lock:${name}}`).length > 0);
    const reason = await aborted(lease.signal, 5000);
    assert.ok(reason instanceof LeaseLostError);
    assert.throws(() => lease.check(), LeaseLostError);
    reachedEnd = true;
  }, { ttlMs: 3000 }).then(() => undefined, (e: unknown) => e);
  assert.ok(reachedEnd);
  assert.ok(error instanceof LeaseLostError, String(error));
  assert.equal(error.reason, "NOT_HELD");
  client.close();
});

test("a lost lease makes release() (and `await using`) throw", async () => {
  const client = Baton.connect(server.unix);
  const name = uniqueName();
  const lease = await client.lock(name, { ttlMs: 3000 });
  redis.deleteKeys(`${server.prefix}{lock:${name}}`);
  await aborted(lease.signal, 5000);
  await assert.rejects(lease.release(), (e: unknown) => e instanceof LeaseLostError && e.reason === "NOT_HELD");
  client.close();
});

test("a frozen Baton sends nothing: the lease is lost when expiresAt passes locally", async () => {
  const own = await BatonServer.start(redis);
  const client = Baton.connect(own.tcp);
  try {
    const lease = await client.lock(uniqueName(), { ttlMs: 1000 });
    own.freeze();
    const frozen = Date.now();
    const reason = await aborted(lease.signal, 5000);
    const took = Date.now() - frozen;
    assert.ok(reason instanceof LeaseLostError && reason.reason === "EXPIRED", String(reason));
    assert.ok(took <= 1500, `lost ${took} ms after the freeze, the ttl is 1 s`);
    assert.equal(lease.held, false);
    await assert.rejects(lease.release(), LeaseLostError);
  } finally {
    client.close();
    await own.stop();
  }
});

test("Baton.connect checks timeoutMs: NaN, negative, zero and beyond setTimeout's longest delay", () => {
  for (const timeoutMs of [NaN, -1, 0, Infinity, 2 ** 31]) {
    assert.throws(() => Baton.connect(server.tcp, { timeoutMs }),
      (e: unknown) => e instanceof InvalidArgumentError && e.field === "timeoutMs", String(timeoutMs));
  }
  assert.throws(() => Baton.connect(server.tcp, { timeoutMs: "5" as unknown as number }), TypeError);
});

test("work that blocks the event loop past expiresAt is told its loss by withLock and release()", async () => {
  const client = Baton.connect(server.tcp);
  const block = (ms: number) => {
    const until = Date.now() + ms;
    while (Date.now() < until) {
      // No timer, no renewal, no lost event can run meanwhile.
    }
  };
  const name = uniqueName();
  const error = await client.withLock(name, async () => block(1500), { ttlMs: 1000 })
    .then(() => undefined, (e: unknown) => e);
  assert.ok(error instanceof LeaseLostError && error.reason === "EXPIRED", String(error));
  const lease = await client.lock(name, { ttlMs: 1000, waitMs: 5000 });
  block(1500);
  // Before any turn of the event loop: the signal handed to the next write is aborted already.
  assert.equal(lease.signal.aborted, true);
  assert.equal(lease.lost, true);
  await assert.rejects(lease.release(), (e: unknown) => e instanceof LeaseLostError && e.reason === "EXPIRED");
  assert.equal(lease.held, false);
  // Released all the same: the lock is free for the next holder at once.
  const next = await client.lock(name, { ttlMs: 1000, waitMs: 0 });
  await next.release();
  client.close();
});

test("entering a lock while Baton is frozen gives up after the wait and the client's timeout", async () => {
  const own = await BatonServer.start(redis);
  const client = Baton.connect(own.tcp, { timeoutMs: 1000 });
  try {
    own.freeze();
    const started = Date.now();
    await assert.rejects(client.lock(uniqueName(), { ttlMs: 5000, waitMs: 500 }), DeadlineExceededError);
    const took = Date.now() - started;
    // The 500 ms wait and the 1 s timeout; a margin for a busy machine.
    assert.ok(took < 5000, `gave up after ${took} ms`);
    own.thaw();
    const lease = await client.lock(uniqueName(), { ttlMs: 5000, waitMs: 5000 });
    await lease.release();
  } finally {
    own.thaw();
    client.close();
    await own.stop();
  }
});

test("aborting a waiting lock() leaves nothing held behind it", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const stop = new AbortController();
  await client.withLock(name, async () => {
    const waiting = client.lock(name, { ttlMs: 30_000, signal: stop.signal });
    await sleep(300);
    stop.abort(new Error("gave up"));
    await assert.rejects(waiting, /gave up/);
  }, { ttlMs: 30_000 });
  assert.equal((await client.describeLock(name)).held, false);
  client.close();
});

test("work that throws releases the lock at once and its error comes through", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  await assert.rejects(client.withLock(name, async () => {
    throw new Error("work failed");
  }, { ttlMs: 30_000 }), /work failed/);
  assert.equal((await client.describeLock(name)).held, false);
  client.close();
});

test("acquireLock/releaseLock with tokens, and invalid input naming the field", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const grant = await client.acquireLock(name, { ttlMs: 5000 });
  assert.ok(grant && grant.fencingToken > 0n);
  assert.equal(await client.acquireLock(name, { ttlMs: 5000 }), undefined);
  assert.equal(await client.releaseLock(grant), true);
  assert.equal(await client.releaseLock(grant), false);
  await assert.rejects(client.acquireLock(name, { ttlMs: 5 }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "ttl");
  await assert.rejects(client.acquirePermits(name, { limit: 0, ttlMs: 1000 }), (e: unknown) => e instanceof InvalidArgumentError && e.field === "limit");
  client.close();
});

test("an unreachable Baton gives UnavailableError quickly", async () => {
  const client = Baton.connect("127.0.0.1:1");
  const started = Date.now();
  await assert.rejects(client.describeLock("x"), UnavailableError);
  await assert.rejects(client.lock("x", { waitMs: 0 }), UnavailableError);
  assert.ok(Date.now() - started < 10_000);
  client.close();
});

test("the lease type is exported for annotations", () => {
  const check = (lease: Lease | undefined) => lease?.fencingToken;
  assert.equal(check(undefined), undefined);
});

/** The next line `proc` prints, within `timeoutMs`. */
function readLine(proc: ChildProcess, timeoutMs = 15_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let buffered = "";
    const timer = setTimeout(() => reject(new Error(`no line from pid ${proc.pid} within ${timeoutMs} ms`)), timeoutMs);
    const onData = (d: Buffer) => {
      buffered += d.toString();
      const end = buffered.indexOf("\n");
      if (end >= 0) {
        clearTimeout(timer);
        proc.stdout?.off("data", onData);
        resolve(buffered.slice(0, end));
      }
    };
    proc.stdout?.on("data", onData);
  });
}

describe("leader election", () => {
  test("candidates in two processes take turns, the second with a higher term", async () => {
    const name = uniqueName();
    const first = spawnHolder(server.unix, "campaign", name, "pod-a");
    let second: ChildProcess | undefined;
    const client = Baton.connect(server.tcp);
    try {
      const line = await readLine(first);
      assert.match(line, /^LEADER \d+$/);
      const aTerm = BigInt(line.split(" ")[1]);
      const state = await client.leader(name);
      assert.equal(state.leader?.text, "pod-a");
      assert.equal(state.leader?.term, aTerm);
      second = spawnHolder(server.unix, "campaign", name, "pod-b");
      await waitUntil("the second candidate to wait", async () => (await client.leader(name)).candidates === 1);
      first.stdin?.write("resign\n");
      const started = Date.now();
      const next = await readLine(second);
      assert.ok(Date.now() - started < 5000, `took ${Date.now() - started} ms after the resignation`);
      assert.ok(BigInt(next.split(" ")[1]) > aTerm, next);
      assert.equal((await client.leader(name)).leader?.text, "pod-b");
    } finally {
      first.kill("SIGKILL");
      second?.kill("SIGKILL");
      client.close();
    }
  });

  test("withLeadership runs as leader; proclaim changes the value; the end resigns at once", async () => {
    const client = Baton.connect(server.tcp);
    const name = uniqueName();
    assert.equal((await client.leader(name)).leader, undefined);
    const term = await client.withLeadership(name, async (leadership) => {
      assert.ok(leadership instanceof Leadership);
      assert.equal(leadership.term, leadership.fencingToken);
      assert.equal(leadership.text, "pod-a");
      assert.equal(await leadership.proclaim("pod-a:8080"), 1n);
      const state = await client.leader(name);
      assert.equal(state.leader?.text, "pod-a:8080");
      assert.equal(state.leader?.valueRevision, 1n);
      return leadership.term;
    }, { value: "pod-a", ttlMs: 2000 });
    // Resigning is closing the stream: Baton sees it a moment later, long before the ttl.
    await waitUntil("the resignation", async () => (await client.leader(name)).leader === undefined, 1500);
    assert.equal((await client.leader(name)).lastTerm, term);
    client.close();
  });

  test("waitMs bounds a campaign; the candidate leaves the queue", async () => {
    const client = Baton.connect(server.tcp);
    const name = uniqueName();
    await client.withLeadership(name, async () => {
      const started = Date.now();
      await assert.rejects(client.campaign(name, { value: "b", waitMs: 300 }), NotAcquiredError);
      assert.ok(Date.now() - started >= 300);
      await waitUntil("the candidate to leave", async () => (await client.leader(name)).candidates === 0);
    }, { value: "a" });
    client.close();
  });

  test("a waitMs beyond setTimeout's longest delay, or Infinity, keeps the candidate waiting", async () => {
    const client = Baton.connect(server.tcp);
    const name = uniqueName();
    await client.withLeadership(name, async () => {
      for (const waitMs of [30 * 24 * 3600 * 1000, 2 ** 31, Infinity]) {
        const started = Date.now();
        // Still waiting when the caller gives up, not NotAcquiredError at once.
        await assert.rejects(client.campaign(name, { waitMs, signal: AbortSignal.timeout(700) }), (e: unknown) => {
          assert.ok(!(e instanceof NotAcquiredError), `waitMs ${waitMs}: ${e}`);
          return true;
        });
        assert.ok(Date.now() - started >= 650, `waitMs ${waitMs} gave up after ${Date.now() - started} ms`);
      }
      await waitUntil("the candidates to leave", async () => (await client.leader(name)).candidates === 0);
    }, { value: "a" });
    client.close();
  });

  test("a lost leadership aborts the signal and withLeadership throws LeaseLostError", async () => {
    const client = Baton.connect(server.tcp);
    const name = uniqueName();
    const error = await client.withLeadership(name, async (leadership) => {
      assert.ok(redis.deleteKeys(`${server.prefix}{election:${name}}`).length > 0);
      const reason = await aborted(leadership.signal, 5000);
      assert.ok(reason instanceof LeaseLostError);
    }, { value: "a", ttlMs: 3000 }).then(() => undefined, (e: unknown) => e);
    assert.ok(error instanceof LeaseLostError, String(error));
    assert.equal(error.reason, "NOT_HELD");
    assert.match(error.message, /leadership/);
    client.close();
  });

  test("observe yields nobody, each leader, nobody again; leaving the loop ends it", async () => {
    const client = Baton.connect(server.unix);
    const name = uniqueName();
    const states = client.observe(name);
    const next = async () => {
      const r = await states.next();
      assert.ok(!r.done);
      return r.value;
    };
    assert.equal((await next()).leader, undefined);
    const terms: bigint[] = [];
    for (const value of ["pod-a", "pod-b"]) {
      const leadership = await client.campaign(name, { value, ttlMs: 2000 });
      terms.push(leadership.term);
      const led = await next();
      assert.equal(led.leader?.text, value);
      assert.equal(led.leader?.term, leadership.term);
      assert.equal(led.candidates, undefined);
      await leadership.release();
      const gone = await next();
      assert.equal(gone.leader, undefined);
      assert.equal(gone.lastTerm, leadership.term);
    }
    assert.ok(terms[1] > terms[0]);
    assert.deepEqual(await states.return(undefined), { done: true, value: undefined });
    const stop = new AbortController();
    const seen: string[] = [];
    for await (const state of client.observe(name, { signal: stop.signal })) {
      seen.push(state.leader?.text ?? "nobody");
      stop.abort();
    }
    assert.deepEqual(seen, ["nobody"]);
    client.close();
  });
});

test("a caller's signal keeps no listener once a lock, tryLock or campaign call settles", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const stop = new AbortController();
  const listeners = () => getEventListeners(stop.signal, "abort").length;
  const held = await client.lock(name, { signal: stop.signal });
  assert.equal(listeners(), 0, "after a grant");
  assert.equal(await client.tryLock(name, { signal: stop.signal }), undefined);
  await assert.rejects(client.lock(name, { waitMs: 50, signal: stop.signal }), NotAcquiredError);
  assert.equal(listeners(), 0, "after not acquired");
  await held.release();
  const leadership = await client.campaign(name, { signal: stop.signal });
  await assert.rejects(client.campaign(name, { waitMs: 50, signal: stop.signal }), NotAcquiredError);
  await leadership.release();
  assert.equal(listeners(), 0, "after campaigns");
  const unreachable = Baton.connect("127.0.0.1:1");
  await assert.rejects(unreachable.lock("x", { waitMs: 0, signal: stop.signal }), UnavailableError);
  await assert.rejects(unreachable.campaign("x", { waitMs: 300, signal: stop.signal }), UnavailableError);
  assert.equal(listeners(), 0, "after failures");
  unreachable.close();
  client.close();
});

test("fractional milliseconds are rounded up to the millisecond, as in Python", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const decision = await client.rateLimit.check(name, { limit: 5, periodMs: 1000 / 3 });
  assert.equal(decision.allowed, true);
  assert.ok((await client.autocomplete.recordRecent(name, "a", { ttlMs: 2.5 * 1000 / 3 + 1000 })).size === 1);
  const grant = await client.acquirePermits(name, { limit: 2, ttlMs: 1000 / 3 });
  assert.ok(grant && grant.remainingMs > 300 && grant.remainingMs <= 334, `${grant?.remainingMs}`);
  const lock = await client.acquireLock(name, { ttlMs: 1000.0000001, waitMs: 0.5 });
  assert.ok(lock && lock.remainingMs <= 1000, `${lock?.remainingMs}`);
  await client.withLock(name + "-held", async (lease) => assert.ok(lease.held), { ttlMs: 2000 / 3, waitMs: 1000 / 3 });
  client.close();
});

test("numbers protobuf cannot carry and wrongly typed options are refused before any call", async () => {
  // A client whose every call would fail UNAVAILABLE: each check must throw first.
  const client = Baton.connect("127.0.0.1:1");
  const invalid = (field: string) => (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError, `${field}: ${e}`);
    assert.equal(e.field, field);
    assert.ok(e.message.startsWith(`${field}: `), e.message);
    return true;
  };
  const ac = client.autocomplete;
  const rl = client.rateLimit;
  for (const periodMs of [NaN, Infinity, -5]) {
    await assert.rejects(rl.check("k", { limit: 5, periodMs }), invalid("periodMs"));
  }
  for (const limit of [5.5, NaN, -1, 2 ** 64]) await assert.rejects(rl.check("k", { limit, periodMs: 1000 }), invalid("limit"));
  await assert.rejects(rl.check("k", { limit: -1n, periodMs: 1000 }), invalid("limit"));
  await assert.rejects(rl.check("k", { limit: 5, periodMs: 1000, cost: -1 }), invalid("cost"));
  await assert.rejects(rl.check("k", { limit: 5, periodMs: 1000, burst: 0.5 }), invalid("burst"));
  await assert.rejects(rl.check("k", { limit: "5" as never, periodMs: 1000 }), /limit/);
  await assert.rejects(rl.check("k", { limit: "5" as never, periodMs: 1000 }), TypeError);
  for (const ttlMs of [NaN, Infinity, -1]) await assert.rejects(ac.recordRecent("L", "a", { ttlMs }), invalid("ttlMs"));
  for (const maxItems of [-1, 2.5, NaN, 2 ** 32 + 5]) await assert.rejects(ac.recordRecent("L", "a", { maxItems }), invalid("maxItems"));
  await assert.rejects(ac.recordRecent("L", "a", { payload: "abc" as never }), (e: unknown) => e instanceof TypeError && /^payload: /.test(e.message));
  await assert.rejects(ac.recordRecent("L", 42 as never), (e: unknown) => e instanceof TypeError && /^display: /.test(e.message));
  for (const limit of [-1, 1.5]) await assert.rejects(ac.recent("L", { limit }), invalid("limit"));
  await assert.rejects(ac.complete("D", "a", { limit: NaN }), invalid("limit"));
  await assert.rejects(ac.add("D", [{ display: "x", score: NaN }]), invalid("terms[0].score"));
  await assert.rejects(ac.add("D", [42 as never]), TypeError);
  for (const limit of [NaN, 2.5, -1]) await assert.rejects(client.trySemaphore("S", { limit }), invalid("limit"));
  await assert.rejects(client.semaphore("S", { limit: 2, permits: 1.5 }), invalid("permits"));
  await assert.rejects(client.trySemaphore("S", { limit: 2, ttlMs: NaN }), invalid("ttlMs"));
  for (const waitMs of [NaN, -1]) {
    await assert.rejects(client.semaphore("S", { limit: 2, waitMs }), invalid("waitMs"));
    await assert.rejects(client.lock("L", { waitMs }), invalid("waitMs"));
    await assert.rejects(client.campaign("E", { waitMs }), invalid("waitMs"));
    await assert.rejects(client.acquirePermits("S", { limit: 2, ttlMs: 1000, waitMs }), invalid("waitMs"));
  }
  await assert.rejects(client.acquireLock("L", { ttlMs: 1000, waitMs: Infinity }), invalid("waitMs"));
  await assert.rejects(client.acquirePermits("S", { limit: 2, ttlMs: NaN }), invalid("ttlMs"));
  await assert.rejects(client.campaign("E", { ttlMs: NaN }), invalid("ttlMs"));
  await assert.rejects(client.campaign("E", { value: 42 as never }), (e: unknown) => e instanceof TypeError && /^value: /.test(e.message));
  client.close();
});

test("an unknown algorithm, mode, order or feature throws, naming the choices", async () => {
  const client = Baton.connect("127.0.0.1:1");
  const unknown = (field: string, given: string) => (e: unknown) =>
    e instanceof InvalidArgumentError && e.field === field && e.message.startsWith(`${field}: "${given}" is not one of `);
  await assert.rejects(client.rateLimit.check("k", { limit: 5, periodMs: 1000, algorithm: "fixed-window" as never }), unknown("algorithm", "fixed-window"));
  await assert.rejects(client.autocomplete.completeRecent("L", "a", { mode: "contain" as never }), unknown("mode", "contain"));
  await assert.rejects(client.autocomplete.complete("D", "a", { mode: "Prefix" as never }), unknown("mode", "Prefix"));
  await assert.rejects(client.autocomplete.complete("D", "a", { order: "bogus" as never }), unknown("order", "bogus"));
  await assert.rejects(client.autocomplete.configure("D", ["words", "rank" as never]), unknown("features", "rank"));
  client.close();
});

test("add and remove take one term or display as well as an array", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const ac = client.autocomplete;
  assert.equal((await ac.add(name, "hello")).termCount, 1n);
  assert.equal((await ac.add(name, { display: "world", score: 2 })).termCount, 2n);
  assert.deepEqual((await ac.complete(name, "h")).suggestions.map((s) => s.display), ["hello"]);
  assert.equal(await ac.remove(name, "hello"), 1);
  await ac.recordRecent(name, "abc");
  assert.equal(await ac.removeRecent(name, "abc"), 1);
  client.close();
});

test("a released lease is no longer held: check() throws RELEASED and its signal is aborted", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const lease = await client.lock(name, { ttlMs: 5000 });
  const signal = lease.signal;
  await lease.release();
  const released = (e: unknown) => e instanceof LeaseLostError && e.reason === "RELEASED";
  const check = () => {
    assert.equal(lease.held, false);
    assert.equal(lease.lost, false, "released, not lost");
    assert.equal(signal.aborted, true);
    assert.ok(released(signal.reason), String(signal.reason));
    assert.throws(() => lease.check(), released);
  };
  check();
  // Even while someone else holds the lock, and with the lease's ttl not yet over.
  const other = await client.lock(name, { ttlMs: 5000, waitMs: 5000 });
  check();
  await other.release();
  await lease.release(); // twice: nothing more to do
  // A leadership too.
  const leadership = await client.campaign(name, { ttlMs: 5000 });
  await leadership.release();
  assert.equal(leadership.held, false);
  assert.equal(leadership.signal.aborted, true);
  assert.throws(() => leadership.check(), released);
  client.close();
});

test("a lease lost before release() keeps its loss as the reason", async () => {
  const client = Baton.connect(server.unix);
  const name = uniqueName();
  const lease = await client.lock(name, { ttlMs: 3000 });
  redis.deleteKeys(`${server.prefix}{lock:${name}}`);
  await aborted(lease.signal, 5000);
  await assert.rejects(lease.release(), (e: unknown) => e instanceof LeaseLostError && e.reason === "NOT_HELD");
  assert.equal(lease.lost, true);
  assert.throws(() => lease.check(), (e: unknown) => e instanceof LeaseLostError && e.reason === "NOT_HELD");
  client.close();
});

test("Leadership.release() resolves once Baton has ended the term", async () => {
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  for (let i = 0; i < 10; i++) {
    const leadership = await client.campaign(name, { value: "a", ttlMs: 10_000 });
    await leadership.release();
    const state = await client.leader(name);
    assert.equal(state.leader, undefined, `round ${i}: term ${leadership.term} still leads`);
    assert.equal(state.lastTerm, leadership.term);
    await assert.rejects(leadership.proclaim("late"), FailedPreconditionError);
  }
  client.close();
});

test("after close() every call throws ClientClosedError, and a waiting lock() does too", async () => {
  const holder = Baton.connect(server.tcp);
  const client = Baton.connect(server.tcp);
  const name = uniqueName();
  const held = await holder.lock(name, { ttlMs: 10_000 });
  const leading = await holder.campaign(name, { ttlMs: 10_000 });
  const waiting = client.lock(name, { ttlMs: 10_000 });
  const waitingElection = client.campaign(name);
  await waitUntil("the lock() and campaign() to wait", async () =>
    (await holder.describeLock(name)).waiters === 1 && (await holder.leader(name)).candidates === 1);
  client.close();
  const closed = (e: unknown) => e instanceof ClientClosedError && e.message === "the client is closed";
  await assert.rejects(waiting, closed);
  await assert.rejects(waitingElection, closed);
  const calls: [string, () => Promise<unknown>][] = [
    ["lock", () => client.lock(name + "-2")],
    ["tryLock", () => client.tryLock(name + "-2")],
    ["withLock", () => client.withLock(name + "-2", async () => undefined)],
    ["semaphore", () => client.semaphore(name + "-s", { limit: 1 })],
    ["campaign", () => client.campaign(name + "-c")],
    ["leader", () => client.leader(name)],
    ["observe", () => client.observe(name).next()],
    ["acquireLock", () => client.acquireLock(name + "-3", { ttlMs: 1000 })],
    ["describeLock", () => client.describeLock(name)],
    ["acquirePermits", () => client.acquirePermits(name + "-s", { limit: 1, ttlMs: 1000 })],
    ["describeSemaphore", () => client.describeSemaphore(name)],
    ["rateLimit.check", () => client.rateLimit.check(name, { limit: 5, periodMs: 1000 })],
    ["autocomplete.size", () => client.autocomplete.size(name)],
  ];
  for (const [what, call] of calls) await assert.rejects(call(), closed, what);
  // Nothing was taken through the closed client.
  assert.equal((await holder.describeLock(name + "-2")).held, false);
  assert.equal((await holder.describeLock(name + "-3")).held, false);
  assert.equal((await holder.describeSemaphore(name + "-s")).permitsInUse, 0);
  assert.equal((await holder.leader(name + "-c")).leader, undefined);
  await held.release();
  await leading.release();
  holder.close();
});

test("arguments of the wrong type throw TypeError naming them, before any call", async () => {
  // A client whose every call would fail UNAVAILABLE: each check must throw first.
  const client = Baton.connect("127.0.0.1:1");
  const typeError = (field: string) => (e: unknown) => {
    assert.ok(e instanceof TypeError, `${field}: ${e}`);
    assert.ok(e.message.startsWith(`${field}: `), e.message);
    return true;
  };
  const never = <T>(v: unknown) => v as T;
  await assert.rejects(client.lock(never(42)), typeError("name"));
  await assert.rejects(client.lock(never({})), typeError("name"));
  await assert.rejects(client.tryLock(never(undefined)), typeError("name"));
  await assert.rejects(client.lock("L", { owner: never(7) }), typeError("owner"));
  await assert.rejects(client.lock("L", { fair: never("no") }), typeError("fair"));
  await assert.rejects(client.lock("L", { shared: never(1) }), typeError("shared"));
  await assert.rejects(client.lock("L", { ttlMs: never(null) }), typeError("ttlMs"));
  await assert.rejects(client.lock("L", { waitMs: never(null) }), typeError("waitMs"));
  await assert.rejects(client.lock("L", { signal: never("stop") }), typeError("signal"));
  await assert.rejects(client.lock("L", never(5000)), typeError("options"));
  await assert.rejects(client.withLock("L", never(undefined)), typeError("work"));
  await assert.rejects(client.semaphore("S", { limit: never(null) }), typeError("limit"));
  await assert.rejects(client.semaphore("S", never(undefined)), typeError("limit"));
  await assert.rejects(client.trySemaphore("S", { limit: 1, permits: never(null) }), typeError("permits"));
  await assert.rejects(client.campaign(never(7)), typeError("name"));
  await assert.rejects(client.campaign("E", { ttlMs: never(null) }), typeError("ttlMs"));
  await assert.rejects(client.campaign("E", { value: never(null) }), typeError("value"));
  await assert.rejects(client.leader(never(null)), typeError("name"));
  await assert.rejects(client.observe(never(1)).next(), typeError("name"));
  await assert.rejects(client.acquireLock("L", never(undefined)), typeError("ttlMs"));
  await assert.rejects(client.acquireLock(never(42), { ttlMs: 1000 }), typeError("name"));
  await assert.rejects(client.acquireLock("L", { ttlMs: 1000, fair: never("yes") }), typeError("fair"));
  await assert.rejects(client.acquirePermits("S", never(undefined)), typeError("limit"));
  await assert.rejects(client.acquirePermits("S", { limit: 1, ttlMs: 1000, owner: never(1) }), typeError("owner"));
  await assert.rejects(client.releaseLock(never(undefined)), typeError("grant"));
  await assert.rejects(client.describeLock(never(42)), typeError("name"));
  await assert.rejects(client.describeSemaphore(never(42)), typeError("name"));
  await assert.rejects(client.rateLimit.check(never(1), { limit: 5, periodMs: 1000 }), typeError("key"));
  await assert.rejects(client.rateLimit.check("k", never(undefined)), typeError("limit"));
  await assert.rejects(client.rateLimit.check("k", { limit: 5, periodMs: 1000, burst: never(null) }), typeError("burst"));
  await assert.rejects(client.autocomplete.size(never(1)), typeError("dictionary"));
  await assert.rejects(client.autocomplete.complete("D", never(1)), typeError("query"));
  await assert.rejects(client.autocomplete.complete("D", "a", { limit: never(null) }), typeError("limit"));
  await assert.rejects(client.autocomplete.add("D", { display: "x", increment: never("no") }), typeError("terms[0].increment"));
  await assert.rejects(client.autocomplete.recent(never(1)), typeError("list"));
  assert.throws(() => Baton.connect(never(5)), typeError("addr"));
  assert.throws(() => Baton.connect("127.0.0.1:1", never(5)), typeError("options"));
  assert.throws(() => Baton.connect("127.0.0.1:1", { timeoutMs: never(null) }), typeError("timeoutMs"));
  client.close();
  // Options left out altogether are the defaults.
  const live = Baton.connect(server.tcp);
  const name = uniqueName();
  const lease = await live.lock(name);
  assert.equal((await live.describeLock(name)).held, true);
  await lease.release();
  assert.deepEqual((await live.autocomplete.complete(name, "a")).suggestions, []);
  assert.deepEqual((await live.autocomplete.recent(name)).items, []);
  const leadership = await live.campaign(name);
  await assert.rejects(leadership.proclaim(never(1)), typeError("value"));
  await leadership.release();
  live.close();
});
