// A short Baton session with the Node package (clients/node).
//
// Build the package, then run this against a serving Baton (BATON_ADDR, or 127.0.0.1:50051):
//
//     (cd clients/node && npm install && npm run build)
//     node examples/node/lock_session.mjs
//
// Caller a holds a lock (a Hold stream keeps it alive); caller b waits for it and is woken the
// moment a releases it, with a higher fencing token; then a rate limit, a completion, and the
// error a bad ttl gets. In an application, import from "@baton/client" instead of the path.

import { Baton, InvalidArgumentError } from "../../clients/node/dist/src/index.js";

const client = Baton.connect();

const a = await client.lock("reports", { ttlMs: 3000, owner: "session-a" });
console.log(`a: holds 'reports' with fencing token ${a.fencingToken}`);

const b = client.withLock("reports", async (lease) => ({ at: performance.now(), fencingToken: lease.fencingToken }),
  { ttlMs: 10_000, waitMs: 10_000, owner: "session-b" });
const deadline = Date.now() + 5000;
while ((await client.describeLock("reports")).waiters === 0 && Date.now() < deadline) {
  await new Promise((r) => setTimeout(r, 50));
}
const state = await client.describeLock("reports");
console.log(`describe: held=${state.held} owner=${state.owner} waiters=${state.waiters}`);

a.check(); // throws LeaseLostError if the lease was lost
const releasedAt = performance.now();
await a.release();
const got = await b;
console.log(`b: acquired ${(got.at - releasedAt).toFixed(1)} ms after a released, ` +
  `fencing token ${got.fencingToken} > ${a.fencingToken}`);

const key = `session:api:${process.pid}`;
const answers = [];
for (let i = 0; i < 3; i++) answers.push((await client.rateLimit.check(key, { limit: 2, periodMs: 60_000 })).allowed);
console.log(`rate limit 2/min, three calls: ${JSON.stringify(answers)}`);

await client.autocomplete.add("session:cities", ["Straße", "Stroud", "Zürich"]);
const page = await client.autocomplete.complete("session:cities", "STRA");
console.log(`complete 'STRA': ${JSON.stringify(page.suggestions.map((s) => s.display))}`);

try {
  await client.acquireLock("reports", { ttlMs: 5 });
} catch (e) {
  if (!(e instanceof InvalidArgumentError)) throw e;
  console.log(`bad ttl: InvalidArgumentError on field '${e.field}': ${e.message}`);
}
client.close();
