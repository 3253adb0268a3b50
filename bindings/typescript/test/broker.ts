/**
 * The integration tests run against a real pymq-server started here on a free port with a private data
 * directory:
 *
 *   PYMQ_BROKER_ADDR  use a broker that is already running (host:port) instead
 *   PYMQ_SERVER       the command that runs the broker (default: pymq-server from PATH), e.g.
 *                     "python3 -m pymq_server"; it gets --host 127.0.0.1 --port 0 --data-dir <tmp>
 *
 * Tests that restart a broker (same port, same data directory) or configure one start their own with
 * ownBroker().  Without a broker the tests skip, except when CI is set, where they fail.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import type { TestContext } from 'node:test';

export interface Broker {
  host: string;
  port: number;
  /** the broker's other listeners as it announced them: tls (host:port), websocket (a ws:// or wss:// URL) */
  listeners: Record<string, string>;
  /** stop with SIGTERM (a clean stop that keeps persistent messages) */
  stop(): Promise<void>;
  /** start again on the same port over the same data directory */
  start(): Promise<void>;
  /** stop and remove the data directory */
  remove(): Promise<void>;
  /** SIGKILL: the process closes nothing */
  kill(): Promise<void>;
  /** the data directory (another broker may take it over) */
  dataDir: string;
}

function killChild(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise<void>((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}

export function inCi(): boolean {
  const ci = (process.env.CI ?? '').trim().toLowerCase();
  return ci !== '' && ci !== '0' && ci !== 'false' && ci !== 'no';
}

function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    const candidate = path.join(dir, name);
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

function serverCommand(): string[] | string {
  const command = (process.env.PYMQ_SERVER ?? '').split(/\s+/).filter(Boolean);
  if (command.length === 0) {
    const found = onPath('pymq-server');
    if (found) command.push(found);
  }
  if (command.length === 0) {
    const reason = 'no broker: set PYMQ_BROKER_ADDR or PYMQ_SERVER, or put pymq-server on PATH';
    if (inCi()) throw new Error(`${reason} (CI is set: a missing broker is a failure)`);
    return reason;
  }
  return command;
}

function run(command: string[], port: number, dataDir: string, extra: string[],
  listeners: Record<string, string> = {}): Promise<{ child: ChildProcess; port: number }> {
  const child: ChildProcess = spawn(command[0],
    [...command.slice(1), '--host', '127.0.0.1', '--port', String(port), '--data-dir', dataDir, ...extra],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command.join(' ')} did not report its port within 60 s\n${log}`)), 60000);
    child.stderr!.setEncoding('utf-8');
    child.stderr!.on('data', (text: string) => {
      log += text;
      for (const other of log.matchAll(/pymq-server (tls|websocket) listening on (\S+)/g)) listeners[other[1]] = other[2];
      const m = /pymq-server listening on [^\s:]+:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]) });
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${command.join(' ')} exited (${code}) before listening:\n${log}`));
    });
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

function stopChild(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const kill = setTimeout(() => child.kill('SIGKILL'), 15000);
    child.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** A broker of its own (extra arguments: e.g. --config), or a reason to skip outside CI. */
export async function ownBroker(extra: string[] = []): Promise<Broker | string> {
  const command = serverCommand();
  if (typeof command === 'string') return command;
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pymq-ts-test-'));
  const listeners: Record<string, string> = {};
  let { child, port } = await run(command, 0, dataDir, extra, listeners);
  const broker: Broker = {
    host: '127.0.0.1',
    port,
    listeners,
    dataDir,
    kill: () => killChild(child),
    stop: () => stopChild(child),
    start: async () => {
      ({ child } = await run(command, port, dataDir, extra, listeners));
    },
    remove: async () => {
      await stopChild(child);
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
  return broker;
}

/** Start (or find) the shared broker; a reason to skip when there is none outside CI. */
export async function startBroker(): Promise<Broker | string> {
  const given = process.env.PYMQ_BROKER_ADDR;
  if (given) {
    const [host, port] = given.split(':');
    const none = async () => undefined;
    return { host, port: Number(port), listeners: {}, stop: none, start: none, remove: none, kill: none, dataDir: '' };
  }
  return ownBroker();
}

/** A TCP port that is free now (for listeners that must keep their port across a restart). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** Writes a broker YAML config in a temporary directory; returns its --config arguments. */
export function brokerConfig(yaml: string): string[] {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pymq-ts-config-'));
  const file = path.join(dir, 'broker.yaml');
  fs.writeFileSync(file, yaml);
  return ['--config', file];
}

/** A member of a live/backup group (spec/ha.md) over a shared data directory. */
export interface Member {
  /** the STOMP port once it is live (it listens only then) */
  live(withinMs?: number): Promise<number>;
  /** whether it announced itself a backup waiting for the store before anything else */
  waitedAsBackup: boolean;
  /** SIGKILL: the process closes nothing */
  kill(): Promise<void>;
  /** SIGSTOP / SIGCONT: a paused process holds its sockets (the kernel still accepts connections) */
  pause(): void;
  resume(): void;
}

/**
 * Starts a member of a live/backup pair on `dataDir` at `port` with the configuration file `config` (an
 * `ha:` section): every member first says it waits for the store; the first takes it and listens, a later
 * one waits as a backup until the live goes (live() resolves then).  Resolves once it said either.
 */
export async function startMember(dataDir: string, port: number, config: string): Promise<Member | string> {
  const command = serverCommand();
  if (typeof command === 'string') return command;
  const child: ChildProcess = spawn(command[0],
    [...command.slice(1), '--host', '127.0.0.1', '--port', String(port), '--data-dir', dataDir, '--config', config],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  let onLive: ((port: number) => void) | undefined;
  let livePort: number | undefined;
  const announced = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${command.join(' ')} said nothing within 60 s\n${log}`)), 60000);
    child.stderr!.setEncoding('utf-8');
    child.stderr!.on('data', (text: string) => {
      log += text;
      if (/pymq-server backup of node \S+ waiting/.test(log) || /pymq-server listening on/.test(log)) {
        clearTimeout(timer);
        resolve();
      }
      const m = /pymq-server listening on [^\s:]+:(\d+)/.exec(log);
      if (m && livePort === undefined) {
        livePort = Number(m[1]);
        onLive?.(livePort);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${command.join(' ')} exited (${code}):\n${log}`));
    });
  });
  await announced;
  return {
    waitedAsBackup: livePort === undefined,
    live: (withinMs = 60000) => new Promise<number>((resolve, reject) => {
      if (livePort !== undefined) return resolve(livePort);
      const timer = setTimeout(() => reject(new Error(`no takeover within ${withinMs} ms\n${log.slice(-3000)}`)), withinMs);
      onLive = (p) => {
        clearTimeout(timer);
        resolve(p);
      };
    }),
    kill: () => killChild(child),
    pause: () => {
      child.kill('SIGSTOP');
    },
    resume: () => {
      child.kill('SIGCONT');
    },
  };
}

/** A live/backup pair (spec/ha.md §1) of real members over one shared directory, with a 1 s lease. */
export interface Pair {
  a: Member;
  b: Member;
  portA: number;
  portB: number;
}

/**
 * Starts a live/backup pair: `a` live at `portA`, `b` waiting as its backup (it listens at `portB` once it takes
 * over); each is killed (and the directory removed) by a function pushed on `cleanups`.  A string: why the
 * members could not start.
 */
export async function startPair(cleanups: Array<() => Promise<void> | void>): Promise<Pair | string> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pymq-ts-ha-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const config = path.join(dir, 'ha.yaml');
  fs.writeFileSync(config, 'ha:\n  lease_ms: 1000\n  poll_ms: 50\nheartbeat_send_ms: 500\nheartbeat_recv_ms: 500\n');
  const shared = path.join(dir, 'shared');
  const a = await startMember(shared, 0, config);
  if (typeof a === 'string') return a;
  cleanups.push(() => a.kill());
  const portA = await a.live();
  const portB = await freePort();
  const b = await startMember(shared, portB, config);
  if (typeof b === 'string') return b;
  cleanups.push(() => b.kill());
  return { a, b, portA, portB };
}

/** A broker (or another tool) a test needs is missing: skip the test, or fail it when CI is set. */
export function unavailable(t: TestContext, reason: string): undefined {
  if (inCi()) throw new Error(`${reason} (CI is set: a missing broker is a failure)`);
  t.skip(reason);
  return undefined;
}
