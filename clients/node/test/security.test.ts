// The Node client against a Baton that requires an API token, and one serving mutual TLS
// (docs/security.md, "Clients"). Certificates are made here with the `openssl` command.

import { after, before, describe, test } from "node:test";
import * as assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { Baton, UnauthenticatedError, UnavailableError } from "../src/index.js";
import { BatonServer, Redis, uniqueName, workdir } from "./harness.js";

const TOKEN = "node-token-7e2a9c4f1b3d5e60";
const OTHER = "node-token-other-3b5d7f9a1c2e4a68";

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { stdio: "ignore" });
}

/** A self-signed CA in DIR/NAME.{crt,key}. */
function makeCa(dir: string, name: string): string {
  const crt = join(dir, `${name}.crt`);
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-keyout", join(dir, `${name}.key`), "-out", crt, "-subj", `/CN=${name}`, "-days", "2");
  return crt;
}

/** A certificate for localhost and 127.0.0.1 signed by `ca`, for `usage`: [cert, key] paths. */
function makeLeaf(dir: string, name: string, ca: string, usage: string): [string, string] {
  const [crt, key, csr, ext] = ["crt", "key", "csr", "ext"].map((x) => join(dir, `${name}.${x}`));
  writeFileSync(ext, `basicConstraints=CA:FALSE\nextendedKeyUsage=${usage}\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n`);
  openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
    "-out", csr, "-subj", `/CN=${name}`);
  openssl("x509", "-req", "-in", csr, "-CA", join(dir, `${ca}.crt`), "-CAkey", join(dir, `${ca}.key`),
    "-set_serial", String(Date.now()), "-out", crt, "-days", "2", "-extfile", ext);
  return [crt, key];
}

async function rejectsWith(p: Promise<unknown>, kind: Function, says: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof kind, `${String(e)} is not a ${kind.name}`);
    assert.match((e as Error).message, says);
    return true;
  });
}

const dir = mkdtempSync(join(workdir, "security-"));
let redis: Redis;

before(async () => {
  redis = await Redis.start();
});

after(() => redis.stop());

describe("API token", () => {
  let server: BatonServer;
  const tokens = join(dir, "tokens");

  before(async () => {
    writeFileSync(tokens, `${TOKEN}\n${OTHER}\n`);
    server = await BatonServer.start(redis, ["--api-token-file", tokens], { apiToken: TOKEN });
  });

  after(async () => server.stop());

  test("calls without the token are refused, with it they get in, over TCP and the socket", async () => {
    const file = join(dir, "token");
    writeFileSync(file, `\n  ${OTHER}\nignored\n`);
    for (const addr of [server.tcp, server.unix]) {
      const name = uniqueName();
      const bare = Baton.connect(addr);
      await rejectsWith(bare.describeLock(name), UnauthenticatedError, /requires an API token/);
      bare.close();
      const wrong = Baton.connect(addr, { apiToken: "not-the-token" });
      await rejectsWith(wrong.describeLock(name), UnauthenticatedError, /not valid/);
      wrong.close();
      for (const options of [{ apiToken: TOKEN }, { apiTokenFile: file }]) {
        const client = Baton.connect(addr, options);
        try {
          const lease = await client.lock(name, { ttlMs: 2000 });
          assert.equal((await client.describeLock(name)).fencingToken, lease.fencingToken);
          await lease.release();
          assert.equal((await client.describeLock(name)).held, false);
        } finally {
          client.close();
        }
      }
    }
  });

  test("the token file is read again when it changes", async () => {
    const file = join(dir, `rotating-${randomUUID()}`);
    writeFileSync(file, `${TOKEN}\n`);
    const client = Baton.connect(server.tcp, { apiTokenFile: file });
    try {
      const name = uniqueName();
      await client.describeLock(name);
      writeFileSync(file, "wrong-token-000000000000\n");
      await rejectsWith(client.describeLock(name), UnauthenticatedError, /not valid/);
      writeFileSync(file, `${OTHER}\n`);
      await client.describeLock(name);
      writeFileSync(file, "\n");
      await client.describeLock(name); // emptied: the last token read stays
    } finally {
      client.close();
    }
  });

  test("BATON_API_TOKEN_FILE is used when no token is given", async () => {
    const file = join(dir, "env-token");
    writeFileSync(file, `${TOKEN}\n`);
    // A process of its own, as an app in a pod the Helm chart set up.
    const script = `import { Baton } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
const c = Baton.connect(process.argv[1]);
const s = await c.describeLock("env");
console.log("HELD=" + s.held);
c.close();`;
    const out = await new Promise<string>((resolve, reject) => {
      const child = spawn(process.execPath, ["--input-type=module", "-e", script, server.unix], {
        env: { ...process.env, BATON_API_TOKEN_FILE: file },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let text = "";
      child.stdout.on("data", (d) => (text += d));
      child.stderr.on("data", (d) => (text += d));
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      child.on("exit", (code) => {
        clearTimeout(timer);
        code === 0 ? resolve(text) : reject(new Error(`exit ${code}: ${text}`));
      });
    });
    assert.match(out, /HELD=false/);
  });

  test("bad token options are refused at once", () => {
    assert.throws(() => Baton.connect(server.tcp, { apiTokenFile: join(dir, "missing") }), /cannot read/);
    writeFileSync(join(dir, "empty"), "\n \n");
    assert.throws(() => Baton.connect(server.tcp, { apiTokenFile: join(dir, "empty") }), /holds no token/);
    assert.throws(() => Baton.connect(server.tcp, { apiToken: "a", apiTokenFile: "x" }), /not both/);
    assert.throws(() => Baton.connect(server.tcp, { apiToken: "two words" }), /visible ASCII/);
  });
});

describe("mutual TLS", () => {
  let server: BatonServer;
  let ca: string, other: string, cert: string, key: string;

  before(async () => {
    ca = makeCa(dir, "ca");
    other = makeCa(dir, "other");
    const [serverCert, serverKey] = makeLeaf(dir, "server", "ca", "serverAuth");
    [cert, key] = makeLeaf(dir, "client", "ca", "clientAuth");
    server = await BatonServer.start(redis, ["--tls-cert", serverCert, "--tls-key", serverKey, "--tls-client-ca", ca]);
  });

  after(async () => server.stop());

  test("with the CA and a client certificate calls and a Hold stream get in", async () => {
    for (const [addr, extra] of [
      [server.tcp, {}],
      [`https://${server.tcp}`, {}],
      [server.tcp, { tlsServerName: "localhost" }],
      [server.tcp, { tlsCa: readFileSync(ca) }],
    ] as const) {
      const client = Baton.connect(addr, { tlsCa: ca, tlsCert: cert, tlsKey: key, ...extra });
      try {
        const name = uniqueName();
        const lease = await client.lock(name, { ttlMs: 2000 });
        assert.equal((await client.describeLock(name)).fencingToken, lease.fencingToken);
        await lease.release();
      } finally {
        client.close();
      }
    }
  });

  test("without a certificate Unauthenticated says why; another CA cannot connect", async () => {
    const bare = Baton.connect(server.tcp, { tlsCa: ca });
    await rejectsWith(bare.describeLock("x"), UnauthenticatedError, /presented none/);
    bare.close();
    const stranger = Baton.connect(server.tcp, { tlsCa: other, tlsCert: cert, tlsKey: key, timeoutMs: 3000 });
    // Node's TLS refuses Baton's certificate before any call is made: Unavailable, as gRPC has
    // it, with Node's reason.
    await rejectsWith(
      stranger.describeLock("x"),
      UnavailableError,
      /refused Baton's TLS certificate \(UNABLE_TO_VERIFY_LEAF_SIGNATURE\): unable to verify the first certificate/,
    );
    stranger.close();
    // The right CA, but a certificate for another name than the one asked for.
    const misnamed = Baton.connect(server.tcp, { tlsCa: ca, tlsCert: cert, tlsKey: key, tlsServerName: "elsewhere.example", timeoutMs: 3000 });
    await rejectsWith(misnamed.describeLock("x"), UnavailableError, /refused Baton's TLS certificate \(ERR_TLS_CERT_ALTNAME_INVALID\)/);
    misnamed.close();
  });

  test("bad TLS options are refused at once", () => {
    assert.throws(() => Baton.connect(server.unix, { tlsCa: ca }), /needs a TCP address/);
    assert.throws(() => Baton.connect(server.tcp, { tlsCa: ca, tlsCert: cert }), /go together/);
    assert.throws(() => Baton.connect(server.tcp, { tlsCa: join(dir, "ca.key") }), /holds no PEM certificate/);
  });
});
