// A private redis-server and real Baton processes for the package's tests. Baton is the binary
// in BATON_BIN (scripts/client-tests.sh builds it); everything is stopped by pid.

import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Baton, type ConnectOptions } from "../src/index.js";

const HERE = fileURLToPath(new URL(".", import.meta.url));
export const REPO = resolve(HERE, "..", "..", "..", "..");

/** A TCP port free on 127.0.0.1 right now. */
export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = net.createServer();
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => ok(port));
    });
    server.on("error", fail);
  });
}

/** Polls `check` until it returns true; fails naming `what` after `timeoutMs`. */
export async function waitUntil(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what} (last error: ${String(last)})`);
}

/** Whether every thread of process `pid` is stopped (or the process is gone). */
function stopped(pid: number): boolean {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return true;
  }
  return tasks.every((task) => {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${task}/stat`, "utf8");
      // The state follows the command's closing parenthesis: T or t once stopped.
      const state = stat.slice(stat.lastIndexOf(")") + 1).trim()[0];
      return "TtZX".includes(state);
    } catch {
      return true;
    }
  });
}

/** Runs one redis-cli command against the test Redis; its output lines. */
export function redisCli(port: number, ...args: string[]): string[] {
  return execFileSync("redis-cli", ["-p", String(port), ...args], { encoding: "utf8", timeout: 10_000 })
    .split("\n")
    .filter((l) => l.length > 0);
}

export const workdir = mkdtempSync(join(tmpdir(), "baton-node-client-"));
// The servers' logs and sockets go when the tests pass; after a failure they stay for reading.
process.on("exit", (code) => {
  if (code === 0) {
    rmSync(workdir, { recursive: true, force: true });
  } else {
    console.error(`the test servers' logs are in ${workdir}`);
  }
});

/** redis-server on a free port, no persistence. */
export class Redis {
  proc!: ChildProcess;
  port!: number;

  static async start(): Promise<Redis> {
    const r = new Redis();
    r.port = await freePort();
    r.proc = spawn("redis-server", ["--port", String(r.port), "--bind", "127.0.0.1", "--save", "",
      "--appendonly", "no", "--dir", workdir, "--logfile", join(workdir, `redis-${r.port}.log`)], { stdio: "ignore" });
    await waitUntil("redis-server to answer PING", () => redisCli(r.port, "PING")[0] === "PONG");
    return r;
  }

  /** Deletes every key under `prefix`: the leases there are gone, as after data loss. */
  deleteKeys(prefix: string): string[] {
    const keys = redisCli(this.port, "--scan", "--pattern", `${prefix}*`);
    if (keys.length > 0) redisCli(this.port, "DEL", ...keys);
    return keys;
  }

  stop(): void {
    this.proc.kill("SIGKILL");
  }
}

/** The baton binary over TCP and a Unix socket, ready once it answers. */
export class BatonServer {
  proc!: ChildProcess;
  port!: number;
  socket!: string;
  prefix = `node-${randomUUID().slice(0, 8)}:`;

  /**
   * Starts one with `extra` arguments of `baton serve` (TLS, an API token); ready once it answers
   * a call over its socket (plaintext whatever `extra` asks of TCP) made with `ready`'s options.
   */
  static async start(redis: Redis, extra: string[] = [], ready: ConnectOptions = {}): Promise<BatonServer> {
    const b = new BatonServer();
    b.port = await freePort();
    b.socket = join(workdir, `baton-${b.port}.sock`);
    const log = openSync(join(workdir, `baton-${b.port}.log`), "w");
    const binary = process.env.BATON_BIN || join(REPO, "target", "debug", "baton");
    b.proc = spawn(binary, ["serve", "--listen", b.tcp, "--socket", b.socket,
      "--redis-url", `redis://127.0.0.1:${redis.port}`, "--key-prefix", b.prefix, ...extra], { stdio: ["ignore", log, log] });
    const client = Baton.connect(b.unix, { timeoutMs: 1000, ...ready });
    try {
      await waitUntil("Baton to answer", async () => {
        await client.describeLock("ready");
        return true;
      });
    } finally {
      client.close();
    }
    return b;
  }

  get tcp(): string {
    return `127.0.0.1:${this.port}`;
  }

  get unix(): string {
    return `unix://${this.socket}`;
  }

  /** SIGSTOP, returning once every thread has stopped: `kill` only queues the signal, and until
   * each thread has taken it one can still answer a request sent after the `kill`. */
  freeze(): void {
    const pid = this.proc.pid as number;
    process.kill(pid, "SIGSTOP");
    const deadline = Date.now() + 30_000;
    const pause = new Int32Array(new SharedArrayBuffer(4));
    while (!stopped(pid)) {
      if (Date.now() > deadline) throw new Error(`Baton ${pid} did not stop within 30 s of SIGSTOP`);
      Atomics.wait(pause, 0, 0, 1);
    }
  }

  thaw(): void {
    process.kill(this.proc.pid as number, "SIGCONT");
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null) return;
    this.thaw();
    const exited = new Promise((r) => this.proc.once("exit", r));
    this.proc.kill("SIGTERM");
    await exited;
  }
}

/** A second process using the package (test/holder.js), with `args`; its stdin is a pipe (a
 * line there ends a campaign). */
export function spawnHolder(...args: string[]): ChildProcess {
  return spawn(process.execPath, [join(HERE, "holder.js"), ...args], { stdio: ["pipe", "pipe", "pipe"] });
}

/** A lock or semaphore name no other test uses. */
export function uniqueName(): string {
  return `t-${randomUUID().slice(0, 10)}`;
}
