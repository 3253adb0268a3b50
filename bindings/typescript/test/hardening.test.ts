/**
 * What keeps a connection alive, tested against real brokers and faults made here: broker restarts (same
 * port, same data directory) and cut connections with reconnection, heart-beats both ways with a broker
 * configured for short intervals, a scripted server that goes silent, TLS through a terminating proxy with a
 * CA made here (openssl), STOMP over WebSocket through a bridge (the `ws` package) in Node and in headless
 * Chromium (the system's, driven by playwright-core).  No timing is asserted: tests wait for events.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, it, type TestContext } from 'node:test';
import * as tls from 'node:tls';

import { WebSocket as NodeWebSocket, WebSocketServer } from 'ws';

import {
  connect, DisconnectedError, HeartBeatError, Message, StaleMessageError, TransactionLostError,
  type Connection, type NodeConnectOptions, type Status, type Subscription, type WebSocketConstructor,
} from '../src/node.js';
import { brokerConfig, freePort, inCi, ownBroker, startBroker, type Broker } from './broker.js';

let shared: Broker | string = 'the broker has not started';
const cleanups: Array<() => Promise<void> | void> = [];

before(async () => {
  shared = await startBroker();
});

after(async () => {
  for (const c of cleanups.reverse()) await c();
  if (typeof shared !== 'string') await shared.remove();
});

function unavailable(t: TestContext, reason: string): undefined {
  if (inCi()) throw new Error(`${reason} (CI is set: a missing tool is a failure)`);
  t.skip(reason);
  return undefined;
}

async function own(t: TestContext, extra: string[] = []): Promise<Broker | undefined> {
  const b = await ownBroker(extra);
  if (typeof b === 'string') return unavailable(t, b);
  cleanups.push(() => b.remove());
  return b;
}

function sharedBroker(t: TestContext): Broker | undefined {
  return typeof shared === 'string' ? unavailable(t, shared) : shared;
}

async function dial(options: NodeConnectOptions): Promise<Connection> {
  const c = await connect(options);
  cleanups.push(() => c.close().catch(() => undefined));
  return c;
}

function queue(): string {
  return `/queue/ts-hard-${randomBytes(4).toString('hex')}`;
}

async function expect(sub: Subscription): Promise<Message> {
  const m = await sub.receive(10000);
  assert.ok(m, `nothing received on ${sub.destination}`);
  return m;
}

/** Records statuses; until(status, n) resolves at the n-th report of status. */
function statusLog() {
  const seen: Status[] = [];
  let wake: () => void = () => undefined;
  return {
    seen,
    record: (s: Status) => {
      seen.push(s);
      wake();
    },
    async until(status: Status, n: number, withinMs = 20000): Promise<void> {
      const deadline = Date.now() + withinMs;
      while (seen.filter((s) => s === status).length < n) {
        if (Date.now() > deadline) throw new Error(`status ${status} #${n} never came; saw ${seen}`);
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, 100);
        });
      }
    },
  };
}

async function roundTrip(c: Connection, text = 'still up'): Promise<void> {
  const dest = queue();
  const sub = await c.subscribe(dest);
  await c.send(dest, Message.text(text));
  assert.equal((await expect(sub)).text, text);
  await sub.unsubscribe();
}

/** Forwards to a broker; cut() drops every live connection (new ones are let through). */
function cutProxy(target: { host: string; port: number }): Promise<{ port: number; cut(): void }> {
  const live = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    live.add(client);
    live.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      live.delete(client);
      live.delete(upstream);
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
  });
  cleanups.push(() => new Promise<void>((resolve) => {
    for (const s of live) s.destroy();
    server.close(() => resolve());
  }));
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    port: (server.address() as net.AddressInfo).port,
    cut: () => {
      for (const s of live) s.destroy();
      live.clear();
    },
  })));
}

describe('reconnection', () => {
  it('survives a broker restart: subscriptions made again, persistent messages come back', async (t) => {
    const b = await own(t);
    if (!b) return;
    const log = statusLog();
    const c = await dial({ host: b.host, port: b.port, clientId: `ts-restart-${randomBytes(3).toString('hex')}`,
      timeoutMs: 2000, reconnect: { initialDelayMs: 50, maxDelayMs: 500 }, onStatus: log.record });
    const dest = queue();
    const topic = dest.replace('/queue/', '/topic/');
    const sub = await c.subscribe(dest, { ack: 'client-individual' });
    const durable = await c.subscribe(topic, { durableName: 'audit' });
    await c.send(dest, Message.text('unacked'));
    const first = await expect(sub);

    await b.stop();
    await log.until('reconnecting', 1);
    await assert.rejects(c.send(dest, Message.text('during the outage')), DisconnectedError,
      'a send while the broker is away waits (timeoutMs), then says so');
    await b.start();
    await log.until('open', 2);
    assert.equal(c.stats.reconnects, 1);
    assert.equal(c.status, 'open');

    assert.throws(() => first.ack(), StaleMessageError);
    // a persistent message survives the restart and comes back (a restarted broker does not know it had
    // been delivered, so it is not marked redelivered: the cut-connection test checks that)
    const again = await expect(sub);
    assert.equal(again.text, 'unacked');
    again.ack();
    await c.send(dest, Message.text('after'));
    assert.equal((await expect(sub)).text, 'after');
    const other = await dial({ host: b.host, port: b.port });
    await other.send(topic, Message.text('to the durable subscription'));
    assert.equal((await expect(durable)).text, 'to the durable subscription');
    await durable.unsubscribe();
  });

  it('redelivers what was in hand when the connection is cut, marked redelivered', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    const proxy = await cutProxy(b);
    const log = statusLog();
    const c = await dial({ port: proxy.port, reconnect: { initialDelayMs: 20, maxDelayMs: 200 }, onStatus: log.record });
    const dest = queue();
    const sub = await c.subscribe(dest, { ack: 'client-individual' });
    await c.send(dest, Message.text('in hand'));
    const first = await expect(sub);
    proxy.cut();
    await log.until('open', 2);
    assert.throws(() => first.nack(), StaleMessageError);
    const again = await expect(sub);
    assert.deepEqual([again.text, again.redelivered, again.deliveryCount], ['in hand', true, 2]);
    again.ack();
  });

  it('loses open transactions with their connection', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    const proxy = await cutProxy(b);
    const log = statusLog();
    const c = await dial({ port: proxy.port, reconnect: { initialDelayMs: 20 }, onStatus: log.record });
    const dest = queue();
    const tx = await c.begin();
    await tx.send(dest, Message.text('before'));
    proxy.cut();
    await log.until('open', 2);
    await tx.send(dest, Message.text('after')); // a lost transaction goes on until its commit
    await assert.rejects(tx.commit(), TransactionLostError);
    const sub = await c.subscribe(dest);
    assert.equal(await sub.receive(500), null, 'a rolled-back transaction delivers nothing');
  });

  it('without reconnect, a lost broker ends the connection', async (t) => {
    const b = await own(t);
    if (!b) return;
    const log = statusLog();
    const c = await dial({ host: b.host, port: b.port, onStatus: log.record });
    await b.stop();
    await log.until('closed', 1);
    assert.ok(c.error instanceof DisconnectedError, String(c.error));
    await assert.rejects(c.send(queue(), Message.text('x')), DisconnectedError);
  });
});

describe('heart-beats', () => {
  it('are negotiated and flow both ways with a broker configured for 500 ms', async (t) => {
    const b = await own(t, brokerConfig('heartbeat_send_ms: 500\nheartbeat_recv_ms: 500\n'));
    if (!b) return;
    // the broker honours the client's own intervals between heartbeat_min_ms (250) and its 500 ms
    // (spec/stomp.md section 6); each side then takes the larger of each pair
    const c = await dial({ host: b.host, port: b.port, heartBeat: { sendMs: 400, receiveMs: 450 } });
    assert.deepEqual(c.heartBeats, { sendMs: 400, receiveMs: 450 }, 'the client\'s own intervals');
    const fast = await dial({ host: b.host, port: b.port, heartBeat: { sendMs: 100, receiveMs: 100 } });
    assert.deepEqual(fast.heartBeats, { sendMs: 250, receiveMs: 250 }, 'no faster than heartbeat_min_ms');
    await fast.close();
    const slow = await dial({ host: b.host, port: b.port, heartBeat: { sendMs: 2000, receiveMs: 2000 } });
    assert.deepEqual(slow.heartBeats, { sendMs: 2000, receiveMs: 2000 }, 'the larger of each pair');
    await slow.close();
    const deadline = Date.now() + 20000;
    while (c.stats.heartBeatsSent < 3 || c.stats.heartBeatsReceived < 3) {
      assert.ok(Date.now() < deadline, JSON.stringify(c.stats));
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal(c.status, 'open', 'an idle connection with heart-beats stays up');
    await roundTrip(c);
    const off = await dial({ host: b.host, port: b.port, heartBeat: false });
    assert.deepEqual(off.heartBeats, { sendMs: 0, receiveMs: 0 });
  });

  it('declare a silent broker dead', async () => {
    let beats = 0;
    const server = net.createServer((s) => {
      let connected = false;
      s.on('data', (chunk) => {
        if (!connected && chunk.includes(0)) {
          connected = true;
          s.write('CONNECTED\nversion:1.2\nheart-beat:100,100\n\n\0');
          return;
        }
        for (const byte of chunk) if (byte === 10) beats++;
      });
      s.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const log = statusLog();
    const c = await dial({ port: (server.address() as net.AddressInfo).port, onStatus: log.record,
      heartBeat: { sendMs: 100, receiveMs: 100 } });
    await log.until('closed', 1);
    assert.ok(c.error instanceof DisconnectedError && c.error.reason instanceof HeartBeatError, String(c.error));
    assert.ok(beats >= 1, `the client sent ${beats} heart-beats while idle`);
  });
});

/** A CA and a certificate for 127.0.0.1 signed by it, made with openssl; undefined without openssl. */
function certificates(): { ca: string; key: string; cert: string; keyFile: string; certFile: string } | undefined {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pymq-ts-tls-'));
  cleanups.push(() => fs.rmSync(dir, { recursive: true, force: true }));
  const f = (name: string) => path.join(dir, name);
  const openssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' });
  try {
    openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
      '-subj', '/CN=pymq test CA', '-keyout', f('ca.key'), '-out', f('ca.pem'));
    openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-subj', '/CN=127.0.0.1',
      '-keyout', f('server.key'), '-out', f('server.csr'));
    fs.writeFileSync(f('ext.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
    openssl('x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'), '-CAcreateserial',
      '-days', '1', '-extfile', f('ext.cnf'), '-out', f('server.pem'));
  } catch {
    return undefined;
  }
  return { ca: fs.readFileSync(f('ca.pem'), 'utf-8'), key: fs.readFileSync(f('server.key'), 'utf-8'),
    cert: fs.readFileSync(f('server.pem'), 'utf-8'), keyFile: f('server.key'), certFile: f('server.pem') };
}

describe('TLS', () => {
  it('connects through a TLS-terminating proxy and refuses an unknown CA', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    const certs = certificates();
    if (!certs) return unavailable(t, 'openssl is needed to make the test certificates');
    const proxy = tls.createServer({ key: certs.key, cert: certs.cert }, (client) => {
      const upstream = net.connect(b.port, b.host);
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('error', () => upstream.destroy());
      upstream.on('error', () => client.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise<void>((resolve) => proxy.close(() => resolve())));
    const port = (proxy.address() as net.AddressInfo).port;
    const c = await dial({ url: `stomp+ssl://127.0.0.1:${port}`, tls: { ca: certs.ca } });
    await roundTrip(c, 'over TLS');
    await assert.rejects(connect({ url: `stomp+ssl://127.0.0.1:${port}`, timeoutMs: 3000 }),
      /certificate|self.signed|unable to verify/i, 'the system CAs do not know the test CA');
    await assert.rejects(connect({ host: '127.0.0.1', port, tls: { ca: certs.ca, servername: 'elsewhere.example' }, timeoutMs: 3000 }),
      /altnames|does not match|hostname/i, 'a certificate for another name');
  });
});

/** A WebSocket endpoint that carries STOMP to the broker over TCP (what a broker's WebSocket port does). */
async function webSocketBridge(target: { host: string; port: number }): Promise<{ url: string; cut(): void }> {
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0,
    handleProtocols: (protocols) => (protocols.has('v12.stomp') ? 'v12.stomp' : false) });
  const live = new Set<net.Socket>();
  wss.on('connection', (ws) => {
    const upstream = net.connect(target.port, target.host);
    live.add(upstream);
    upstream.on('data', (chunk) => ws.send(chunk));
    upstream.on('close', () => ws.close());
    upstream.on('error', () => ws.close());
    ws.on('message', (data) => upstream.write(data as Buffer));
    ws.on('close', () => upstream.destroy());
  });
  await new Promise<void>((resolve) => wss.on('listening', () => resolve()));
  cleanups.push(() => new Promise<void>((resolve) => {
    for (const s of live) s.destroy();
    for (const client of wss.clients) client.terminate();
    wss.close(() => resolve());
  }));
  return {
    url: `ws://127.0.0.1:${(wss.address() as net.AddressInfo).port}/stomp`,
    cut: () => {
      for (const s of live) s.destroy();
      live.clear();
    },
  };
}

/**
 * In headless Chromium (the system's, through playwright-core): the ES-module build served over HTTP, the
 * browser's own WebSocket to wsUrl; the page and Node (over TCP to broker b) exchange messages both ways.
 */
async function inChromium(t: TestContext, b: Broker, wsUrl: string): Promise<void> {
  const executablePath = process.env.PYMQ_TEST_CHROMIUM ?? '/usr/bin/chromium';
  if (!fs.existsSync(executablePath)) return void unavailable(t, `no Chromium at ${executablePath} (apt-get install chromium)`);
  const esm = path.join(__dirname, '..', '..', 'dist', 'esm');
  if (!fs.existsSync(path.join(esm, 'index.js'))) throw new Error(`no browser build in ${esm}: npm run build`);
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost');
    if (url.pathname === '/') {
      res.writeHead(200, { 'content-type': 'text/html' })
        .end('<!doctype html><title>pymq</title><link rel="icon" href="data:,">');
      return;
    }
    const file = path.join(esm, path.normalize(url.pathname.replace(/^\/esm\//, '')));
    if (!url.pathname.startsWith('/esm/') || !file.startsWith(esm) || !fs.existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': 'text/javascript' }).end(fs.readFileSync(file));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const { chromium } = await import('playwright-core');
  const browser = await chromium.launch({ executablePath, args: ['--headless', '--no-sandbox', '--disable-gpu',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'] });
  cleanups.push(() => browser.close());
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(String(err)));
  page.on('console', (msg) => {
    if (msg.type() === 'error') errors.push(msg.text());
  });
  await page.goto(`http://127.0.0.1:${(server.address() as net.AddressInfo).port}/`);
  const dest = queue();
  // Node publishes what the browser reads (a queue keeps it until the browser subscribes), and reads
  // what the browser publishes
  const node = await dial({ host: b.host, port: b.port });
  const fromBrowser = await node.subscribe(`${dest}-back`);
  await node.send(`${dest}-node`, Message.text('from node'));
  // plain JavaScript as text: a function would be compiled to CommonJS (require) by this test's build
  const script = `(async ({ url, dest }) => {
    const pymq = await import('/esm/index.js');
    const c = await pymq.connect({ connector: pymq.webSocket(url), heartBeat: { sendMs: 1000, receiveMs: 1000 } });
    const sub = await c.subscribe(dest);
    await c.send(dest, pymq.Message.text('from the browser').setProperty('n', 7).setProperty('ratio', 0.5));
    const got = await sub.receive(10000);
    const fromNode = await (await c.subscribe(dest + '-node')).receive(10000);
    await c.send(dest + '-back', pymq.Message.map({ ok: true, blob: new Uint8Array([1, 2, 255]) }));
    const out = { text: got && got.text, n: got && got.getProperty('n'), ratio: got && got.getProperty('ratio'),
      nodeText: fromNode && fromNode.text, version: c.version, heartBeats: c.heartBeats,
      hasBuffer: 'Buffer' in globalThis };
    await c.close();
    return out;
  })(${JSON.stringify({ url: wsUrl, dest })})`;
  const result = await page.evaluate(script);
  assert.deepEqual(result, {
    text: 'from the browser', n: 7, ratio: 0.5, nodeText: 'from node', version: '1.2',
    // the browser asked 1000 ms both ways; the broker honours it (spec/stomp.md section 6)
    heartBeats: { sendMs: 1000, receiveMs: 1000 }, hasBuffer: false,
  });
  const back = await expect(fromBrowser);
  assert.deepEqual(back.map, { ok: true, blob: new Uint8Array([1, 2, 255]) });
  assert.deepEqual(errors, []);
}

describe('STOMP over WebSocket', () => {
  it('works from Node through a WebSocket bridge, and reconnects', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    const bridge = await webSocketBridge(b);
    const log = statusLog();
    const c = await dial({ url: bridge.url, WebSocket: NodeWebSocket as unknown as WebSocketConstructor,
      reconnect: { initialDelayMs: 20 }, onStatus: log.record });
    assert.equal(c.version, '1.2');
    await roundTrip(c, 'over a WebSocket');
    const dest = queue();
    const sub = await c.subscribe(dest);
    bridge.cut();
    await log.until('open', 2);
    await c.send(dest, Message.text('after the cut'));
    assert.equal((await expect(sub)).text, 'after the cut');
  });

  it('runs in headless Chromium (the browser build, the browser WebSocket)', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    await inChromium(t, b, (await webSocketBridge(b)).url);
  });
});

describe('subscriptions as async iterators', () => {
  it('yields messages until unsubscribed', async (t) => {
    const b = sharedBroker(t);
    if (!b) return;
    const c = await dial({ host: b.host, port: b.port });
    const dest = queue();
    const sub = await c.subscribe(dest);
    for (const text of ['i1', 'i2', 'i3']) await c.send(dest, Message.text(text));
    const got: string[] = [];
    for await (const m of sub) {
      got.push(m.text);
      if (got.length === 3) await sub.unsubscribe();
    }
    assert.deepEqual(got, ['i1', 'i2', 'i3']);
  });
});

/** The broker's announced listener of a kind ("tls", "websocket"), waited for (it follows the first line). */
async function listener(b: Broker, kind: string): Promise<string> {
  const deadline = Date.now() + 10000;
  while (!b.listeners[kind]) {
    if (Date.now() > deadline) throw new Error(`the broker never announced its ${kind} listener`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return b.listeners[kind];
}

describe("the broker's own TLS and WebSocket listeners", () => {
  it('serve this client over stomp+ssl:// and ws://, from Node and from Chromium', async (t) => {
    const certs = certificates();
    if (!certs) return unavailable(t, 'openssl is needed to make the test certificates');
    const tlsPort = await freePort(); // fixed, so that the restarted broker listens where the client reconnects
    const b = await own(t, brokerConfig(`tls_port: ${tlsPort}\ntls:\n  cert_file: ${certs.certFile}\n` +
      `  key_file: ${certs.keyFile}\nwebsocket:\n  port: 0\n  path: /stomp\n`));
    if (!b) return;
    const tlsAddr = await listener(b, 'tls');
    const log = statusLog();
    const overTls = await dial({ url: `stomp+ssl://${tlsAddr}`, tls: { ca: certs.ca }, onStatus: log.record,
      reconnect: { initialDelayMs: 50, maxDelayMs: 500 } });
    await roundTrip(overTls, 'over the broker TLS port');
    await assert.rejects(connect({ url: `stomp+ssl://${tlsAddr}`, timeoutMs: 3000 }), /certificate|self.signed|unable to verify/i);
    const wsUrl = await listener(b, 'websocket');
    assert.match(wsUrl, /^ws:\/\/.+\/stomp$/);
    const overWs = await dial({ url: wsUrl, WebSocket: NodeWebSocket as unknown as WebSocketConstructor });
    assert.equal(overWs.version, '1.2');
    await roundTrip(overWs, 'over the broker WebSocket');
    await inChromium(t, b, wsUrl);
    // reconnection goes through the TLS handshake again
    await b.stop();
    await b.start();
    await log.until('open', 2);
    await roundTrip(overTls, 'over TLS after a restart');
  });
});
