// A Baton that stops answering while calls wait on it: frozen (SIGSTOP) after the streams were
// opened, or a listener that accepts connections and never answers. Waiting calls without a
// `waitMs` must fail within the connection's ping interval and ping timeout (30 s and 10 s) and
// the client's timeout, not wait forever. In a file of its own: `node --test` runs it alongside
// the other files.

import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import * as net from "node:net";
import { Baton, BatonError, DeadlineExceededError, UnavailableError } from "../src/index.js";
import { BatonServer, Redis, uniqueName, waitUntil } from "./harness.js";

let redis: Redis;

before(async () => {
  redis = await Redis.start();
});

after(() => {
  redis.stop();
});

/** How `promise` settles within `limitMs`: its error (or "resolved"), and when; "pending" if not. */
async function settle(promise: Promise<unknown>, limitMs: number): Promise<{ outcome: unknown; ms: number }> {
  const started = Date.now();
  let timer: NodeJS.Timeout | undefined;
  const pending = new Promise((resolve) => {
    timer = setTimeout(() => resolve("pending"), limitMs);
  });
  const outcome = await Promise.race([promise.then(() => "resolved", (e: unknown) => e), pending]);
  clearTimeout(timer);
  return { outcome, ms: Date.now() - started };
}

test("a listener that never answers fails lock, semaphore, campaign without waitMs and observe after the timeout", async () => {
  const sockets: net.Socket[] = [];
  const listener = net.createServer((s) => {
    sockets.push(s);
    s.on("error", () => undefined);
  });
  await new Promise<void>((resolve) => listener.listen(0, "127.0.0.1", resolve));
  const port = (listener.address() as net.AddressInfo).port;
  const client = Baton.connect(`127.0.0.1:${port}`, { timeoutMs: 1000 });
  try {
    const results = await Promise.all([
      settle(client.lock("x"), 20_000),
      settle(client.semaphore("x", { limit: 1 }), 20_000),
      settle(client.campaign("x"), 20_000),
      settle(client.observe("x").next(), 20_000),
    ]);
    for (const [i, { outcome, ms }] of results.entries()) {
      assert.ok(outcome instanceof DeadlineExceededError, `call ${i}: ${String(outcome)} after ${ms} ms`);
      assert.match(outcome.message, /did not open/);
      // The 1 s timeout; a wide margin for a busy machine (the pings would take 40 s).
      assert.ok(ms < 10_000, `call ${i} gave up after ${ms} ms`);
    }
  } finally {
    client.close();
    listener.close();
    for (const s of sockets) s.destroy();
  }
});

test("a Baton frozen while lock and campaign wait fails them within the pings and the timeout", async () => {
  const own = await BatonServer.start(redis);
  const client = Baton.connect(own.tcp, { timeoutMs: 2000 });
  const name = uniqueName();
  try {
    await client.lock(name, { ttlMs: 60_000 });
    await client.campaign(name, { ttlMs: 60_000 });
    const waiting = [client.lock(name), client.campaign(name)];
    await waitUntil("both to wait at Baton", async () => {
      const [lock, election] = await Promise.all([client.describeLock(name), client.leader(name)]);
      return lock.waiters === 1 && election.candidates === 1;
    });
    own.freeze();
    // A ping 30 s after the last byte read, 10 s to answer it, then a new connection the frozen
    // process's kernel accepts but nobody answers: 2 s. Before, they waited forever.
    const results = await Promise.all(waiting.map((p) => settle(p, 80_000)));
    for (const [i, { outcome, ms }] of results.entries()) {
      assert.ok(
        outcome instanceof DeadlineExceededError || outcome instanceof UnavailableError,
        `call ${i}: ${String(outcome)} after ${ms} ms`,
      );
      assert.ok(outcome instanceof BatonError && ms < 70_000, `call ${i} gave up after ${ms} ms`);
    }
  } finally {
    client.close();
    await own.stop();
  }
});
