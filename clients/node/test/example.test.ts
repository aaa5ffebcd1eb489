// The repository's example session (examples/node/lock_session.mjs) runs as its comments say.

import { after, before, test } from "node:test";
import * as assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { BatonServer, Redis, REPO } from "./harness.js";

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

for (const transport of ["tcp", "unix"] as const) {
  test(`the example session, given BATON_ADDR (${transport}), prints each step with b woken after a`, async () => {
    const script = join(REPO, "examples", "node", "lock_session.mjs");
    const addr = transport === "tcp" ? server.tcp : server.unix;
    const { stdout } = await promisify(execFile)(process.execPath, [script], {
      env: { ...process.env, BATON_ADDR: addr },
      timeout: 60_000,
    });
    const lines = stdout.trim().split("\n");
    assert.match(lines[0], /^a: holds 'reports' with fencing token \d+$/);
    assert.equal(lines[1], "describe: held=true owner=session-a waiters=1");
    const aToken = BigInt(lines[0].split(" ").at(-1) as string);
    const [bToken, shownA] = lines[2].split("fencing token ")[1].split(" > ").map(BigInt);
    assert.equal(shownA, aToken);
    assert.ok(bToken > aToken, lines[2]);
    assert.equal(lines[3], "rate limit 2/min, three calls: [true,true,false]");
    assert.equal(lines[4], `complete 'STRA': ["Straße"]`);
    assert.match(lines[5], /^bad ttl: InvalidArgumentError on field 'ttl'/);
  });
}
