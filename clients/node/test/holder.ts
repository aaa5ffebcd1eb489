// A second process using the package, for the tests that need two.
//
//   holder.js ADDR append NAME FILE   5 rounds: take the lock, append "start PID", wait 0.3 s,
//                                     append "end PID", release
//   holder.js ADDR hold NAME          take the lock, print HELD, wait to be killed
//   holder.js ADDR campaign NAME VALUE  campaign with VALUE, print "LEADER TERM" once elected,
//                                     resign when a line comes on stdin

import { appendFileSync } from "node:fs";
import { once } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import { Baton } from "../src/index.js";

// FILE for append, VALUE for campaign.
const [addr, what, name, file] = process.argv.slice(2);
const client = Baton.connect(addr);
if (what === "append") {
  for (let i = 0; i < 5; i++) {
    await client.withLock(name, async () => {
      appendFileSync(file, `start ${process.pid}\n`);
      await sleep(300);
      appendFileSync(file, `end ${process.pid}\n`);
    }, { ttlMs: 5000 });
  }
  client.close();
} else if (what === "campaign") {
  await client.withLeadership(name, async (leadership) => {
    console.log(`LEADER ${leadership.term}`);
    await once(process.stdin, "data");
  }, { value: file, ttlMs: 5000 });
  process.stdin.destroy();
  client.close();
} else {
  const lease = await client.lock(name, { ttlMs: 30_000 });
  console.log(`HELD ${lease.fencingToken}`);
  await sleep(600_000);
}
