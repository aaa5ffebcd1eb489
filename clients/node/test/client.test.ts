// The Node client against a live Baton, over TCP and the Unix socket.

import { after, before, describe, test } from "node:test";
import * as assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import {
  Baton,
  InvalidArgumentError,
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
      await client.autocomplete.recordRecent(name, "alice");
      await client.autocomplete.recordRecent(name, "bob");
      assert.deepEqual((await client.autocomplete.recent(name)).items.map((i) => i.display), ["bob", "alice"]);
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
  }, { ttlMs: 600 }).then(() => undefined, (e: unknown) => e);
  assert.ok(reachedEnd);
  assert.ok(error instanceof LeaseLostError, String(error));
  assert.equal(error.reason, "NOT_HELD");
  client.close();
});

test("a lost lease makes release() (and `await using`) throw", async () => {
  const client = Baton.connect(server.unix);
  const name = uniqueName();
  const lease = await client.lock(name, { ttlMs: 600 });
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
