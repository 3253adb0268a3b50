/**
 * Failover (spec/ha.md §4): the URL grammar of spec/vectors/failover_urls.json, and real brokers — the live
 * of a real live/backup pair over one shared data directory killed with SIGKILL and its backup taking the
 * store over at the URL's second address, a proxy that drops the broker's RECEIPTs (unreceipted SENDs go again with their
 * dedup ids), and attempts that run out.  No timing is asserted: tests wait for events.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { after, describe, it } from 'node:test';

import {
  connect, delayBefore, FailoverUrlError, Message, parseBrokerURL, StaleMessageError, TransactionLostError, vhostAt,
  type Connection, type Status,
} from '../src/node.js';
import { ownBroker, startBroker, startPair, unavailable } from './broker.js';
import { loadVectors } from './vectors.js';

const cleanups: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

const queue = (): string => `/queue/ts-ha-${randomBytes(4).toString('hex')}`;

function statusLog() {
  const seen: Status[] = [];
  return {
    seen,
    record: (s: Status) => {
      seen.push(s);
    },
    async until(status: Status, n: number, withinMs = 30000): Promise<void> {
      const deadline = Date.now() + withinMs;
      while (seen.filter((s) => s === status).length < n) {
        if (Date.now() > deadline) throw new Error(`status ${status} #${n} never came; saw ${seen}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
  };
}

async function texts(c: Connection, dest: string): Promise<string[]> {
  const sub = await c.subscribe(dest);
  const out: string[] = [];
  for (let m = await sub.receive(1500); m; m = await sub.receive(500)) out.push(m.text);
  await sub.unsubscribe();
  return out;
}

describe('failover URLs (spec/vectors/failover_urls.json)', () => {
  const v = loadVectors('failover_urls.json');
  it('parses every URL of the vectors as the spec says', () => {
    for (const c of v.parse) {
      const g = parseBrokerURL(c.url);
      assert.equal(g.failover, c.failover, c.name);
      assert.deepEqual(g.brokers.map((b) => ({ host: b.host, port: b.port, tls: b.tls, username: b.username ?? null,
        password: b.password ?? null })), c.brokers, c.name);
      assert.deepEqual(g.options, c.options, c.name);
    }
  });
  it('refuses every bad URL with its kind, never showing a password', () => {
    for (const c of v.refuse) {
      assert.throws(() => parseBrokerURL(c.url), (err: unknown) => err instanceof FailoverUrlError
        && err.kind === c.error && !err.message.includes('s3cret'), `${c.name}: ${c.url}`);
    }
  });
  it('connects each member to its own path, else the vhost setting (spec/stomp.md §1)', () => {
    for (const c of v.vhosts) {
      const g = parseBrokerURL(c.url);
      assert.deepEqual(g.brokers.map((b) => ({ host: b.host, port: b.port, vhost: vhostAt(b, c.vhost ?? undefined) ?? null })),
        c.members, c.name);
    }
  });
  it('waits before each attempt as the back-off says', () => {
    for (const c of v.delays) {
      const o = parseBrokerURL(c.url).options;
      c.delays_ms.forEach((want: number, i: number) => assert.ok(Math.abs(delayBefore(o, i + 1) - want) < 1e-9, c.name));
    }
  });
});

describe('failover against real brokers', () => {
  it('follows the takeover of a real live/backup pair without application code', async (t) => {
    const pair = await startPair(cleanups);
    if (typeof pair === 'string') return unavailable(t, pair);
    const { a, b, portA, portB } = pair;
    assert.equal(b.waitedAsBackup, true, 'the second member waits as a backup');
    const log = statusLog();
    const tag = randomBytes(3).toString('hex');
    const c = await connect({ url: `failover:(stomp://127.0.0.1:${portA},stomp://127.0.0.1:${portB})?initialReconnectDelay=50&maxReconnectDelay=400`,
      clientId: `ts-ha-${tag}`, onStatus: log.record });
    cleanups.push(() => c.close().catch(() => undefined));
    const held = queue();
    const flow = queue();
    const topic = held.replace('/queue/', '/topic/');
    const sHeld = await c.subscribe(held, { ack: 'client-individual' });
    const durable = await c.subscribe(topic, { durableName: 'd', selector: 'n > 0' });
    const sharedDurable = await c.subscribe(topic, { durableName: `sd-${tag}`, headers: [['shared', 'true']] });
    const sharedPlain = await c.subscribe(topic, { headers: [['shared-subscription-name', `s-${tag}`]] });
    const sFlow = await c.subscribe(flow, { ack: 'client-individual', prefetch: 20 });
    await c.send(held, Message.text('held'));
    const first = await sHeld.receive(5000);
    assert.equal(first?.text, 'held');
    const txDest = queue();
    const tx = await c.begin();
    await tx.send(txDest, Message.text('lost with the transaction'));

    // a producer waiting for each receipt and a consumer acknowledging each message while the live dies
    const receipted: string[] = [];
    const seen: Array<[string, boolean]> = [];
    let stop = false;
    const producing = (async () => {
      for (let i = 0; !stop; i++) {
        await c.send(flow, Message.text(`flow-${i}`));
        receipted.push(`flow-${i}`);
      }
    })();
    const consuming = (async () => {
      for (;;) {
        const m = await sFlow.receive(3000);
        if (!m) {
          if (stop) return;       // quiet for 3 s after the producer stopped: all there is
          continue;
        }
        seen.push([m.text, m.redelivered]);
        try {
          m.ack();
        } catch (err) {
          if (!(err instanceof StaleMessageError)) throw err;   // of the lost link: it comes again
        }
      }
    })();
    const until = async (what: string, done: () => boolean): Promise<void> => {
      const deadline = Date.now() + 30000;
      while (!done()) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    };
    await until('the producer before the kill', () => receipted.length >= 20);

    await a.kill();
    await log.until('reconnecting', 1);
    const atKill = receipted.length;
    const during = c.send(held, Message.text('during'));
    await b.live();
    await during;
    await log.until('open', 2);
    await until('the producer after the takeover', () => receipted.length >= atKill + 20);
    stop = true;
    await producing;
    await consuming;
    const times = new Map<string, number>();
    for (const [text, redelivered] of seen) {
      times.set(text, (times.get(text) ?? 0) + 1);
      assert.ok(times.get(text) === 1 || redelivered, `${text} came again unflagged`);
    }
    for (const text of receipted) assert.ok(times.has(text), `the receipted ${text} was lost`);

    assert.throws(() => first!.ack(), StaleMessageError);
    const again = await sHeld.receive(5000);
    assert.deepEqual([again?.text, again?.redelivered], ['held', true]);
    again!.ack();
    assert.equal((await sHeld.receive(5000))?.text, 'during');
    await tx.send(txDest, Message.text('after the loss'));
    await assert.rejects(tx.commit(), TransactionLostError);
    const tx2 = await c.begin();
    await tx2.send(txDest, Message.text('committed'));
    await tx2.commit();
    assert.deepEqual(await texts(c, txDest), ['committed']);
    for (const n of [0, 1]) await c.send(topic, Message.text(`n=${n}`).setProperty('n', n));
    assert.equal((await durable.receive(5000))?.text, 'n=1');
    assert.equal(await durable.receive(500), null, 'the selector came back with the subscription');
    for (const [name, sub] of [['shared durable', sharedDurable], ['shared', sharedPlain]] as const) {
      assert.deepEqual([(await sub.receive(5000))?.text, (await sub.receive(5000))?.text], ['n=0', 'n=1'],
        `the ${name} subscription after the takeover`);
    }
  });

  it('sends whose receipt was lost go again and the broker keeps one copy', async (t) => {
    const shared = await startBroker();
    if (typeof shared === 'string') return unavailable(t, shared);
    cleanups.push(() => shared.remove());
    const live = new Set<net.Socket>();
    let accepted = 0;
    const server = net.createServer((client) => {
      const first = ++accepted === 1;
      const upstream = net.connect(shared.port, shared.host);
      live.add(client).add(upstream);
      client.pipe(upstream);
      let pending = Buffer.alloc(0);
      upstream.on('data', (chunk: Buffer) => {
        if (!first) {
          client.write(chunk);
          return;
        }
        pending = Buffer.concat([pending, chunk]);
        for (let i = pending.indexOf(0); i >= 0; i = pending.indexOf(0)) {
          const frame = pending.subarray(0, i + 1);
          pending = pending.subarray(i + 1);
          if (!frame.toString('latin1').replace(/^[\r\n]+/, '').startsWith('RECEIPT\n')) client.write(frame);
        }
      });
      const end = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', end).on('close', end);
      upstream.on('error', end).on('close', end);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const port = (server.address() as net.AddressInfo).port;
    const c = await connect({ url: `failover:(stomp://127.0.0.1:${port})?initialReconnectDelay=20` });
    cleanups.push(() => c.close().catch(() => undefined));
    const dest = queue();
    let done = false;
    const persistent = c.send(dest, Message.text('persistent')).then(() => {
      done = true;
    });
    for (let i = 1; i <= 3; i++) {
      const m = Message.text(`quick-${i}`);
      m.persistent = false;
      await c.send(dest, m);
    }
    await new Promise((resolve) => setTimeout(resolve, 300)); // the broker has them; only the receipts are missing
    assert.equal(done, false, 'a persistent send waits for its receipt');
    for (const s of live) s.destroy();
    live.clear();
    await persistent;
    assert.ok(accepted >= 2, 'the connection was made again');
    assert.deepEqual((await texts(c, dest)).sort(), ['persistent', 'quick-1', 'quick-2', 'quick-3'],
      'every SEND once: re-sent with its dedup id, the copy dropped');
  });

  it('waits for a client id the broker still holds for a half-open link', async (t) => {
    const shared = await startBroker();
    if (typeof shared === 'string') return unavailable(t, shared);
    cleanups.push(() => shared.remove());
    // a proxy whose cutClientOnly ends a connection for its client only, the broker's side left open and
    // silent (a network partition: the broker notices at its heart-beat deadline)
    const pairs: Array<[net.Socket, net.Socket]> = [];
    const halfOpen = new Set<number>();
    const server = net.createServer((client) => {
      const n = pairs.length;
      const upstream = net.connect(shared.port, shared.host);
      pairs.push([client, upstream]);
      client.on('data', (d) => upstream.write(d));
      upstream.on('data', (d) => {
        if (!client.destroyed) client.write(d);
      });
      client.on('error', () => undefined).on('close', () => {
        if (!halfOpen.has(n)) upstream.destroy();
      });
      upstream.on('error', () => undefined).on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    cleanups.push(() => new Promise<void>((resolve) => {
      for (const [a, b] of pairs) {
        a.destroy();
        b.destroy();
      }
      server.close(() => resolve());
    }));
    const port = (server.address() as net.AddressInfo).port;
    const log = statusLog();
    const c = await connect({ url: `failover:(stomp://127.0.0.1:${port})?initialReconnectDelay=20&maxReconnectDelay=100`,
      clientId: `ts-held-${randomBytes(4).toString('hex')}`, onStatus: log.record });
    cleanups.push(() => c.close().catch(() => undefined));
    const dest = queue();
    const sub = await c.subscribe(dest);
    // without a re-claim token (a broker with temporary_reclaim_ms: 0): a re-claim would make the broker end
    // the half-open link at once (spec/ha.md §4.7 rule 2)
    (c as unknown as { reclaimToken?: string }).reclaimToken = undefined;
    halfOpen.add(0);
    pairs[0][0].destroy();
    const deadline = Date.now() + 20000;
    while (pairs.length < 4 && !c.error) {
      if (Date.now() > deadline) throw new Error(`no reconnection attempts: ${pairs.length} connections`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.equal(c.error, undefined, 'a client id the broker still holds is not final');
    pairs[0][1].destroy(); // the broker sees the old link end and lets the client id go
    await log.until('open', 2);
    await c.send(dest, Message.text('back'));
    assert.equal((await sub.receive(10000))?.text, 'back');
  });

  it('gives up after maxReconnectAttempts and only then ends the connection', async (t) => {
    const b = await ownBroker();
    if (typeof b === 'string') return unavailable(t, b);
    cleanups.push(() => b.remove());
    const log = statusLog();
    const c = await connect({ url: `failover:(stomp://127.0.0.1:${b.port})?initialReconnectDelay=10&maxReconnectAttempts=3`,
      onStatus: log.record });
    await b.kill();
    await log.until('closed', 1);
    assert.deepEqual(log.seen, ['open', 'reconnecting', 'closed']);
    assert.match(c.error!.message, /3 attempts/);
    await assert.rejects(c.send(queue(), Message.text('x')));
  });

  it('passes over a broker that accepts and never answers within connectionTimeout', async (t) => {
    // connectionTimeout (spec/ha.md §4.2) bounds each attempt: a port that accepts TCP connections and never
    // answers (a SIGSTOPped live's does the same) is passed over for the next broker, at the first connect and
    // after a loss.  The connection's timeoutMs is 30 s: without the option the first connect takes it all (a
    // generous bound of 20 s fails), and the send after the loss outlives the failover timeout of 20 s.
    const shared = await startBroker();
    if (typeof shared === 'string') return unavailable(t, shared);
    cleanups.push(() => shared.remove());
    const held: net.Socket[] = [];
    const silent = net.createServer((socket) => {
      held.push(socket);
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => {
      for (const s of held) s.destroy();
      silent.close();
    });
    const silentUrl = `stomp://127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
    const real = `stomp://${shared.host}:${shared.port}`;
    const options = 'connectionTimeout=2000&initialReconnectDelay=20&maxReconnectDelay=200&timeout=20000';
    const started = Date.now();
    const first = await connect({ url: `failover:(${silentUrl},${real})?${options}`, timeoutMs: 30000 });
    assert.ok(Date.now() - started < 20000, 'the silent attempt ended after connectionTimeout');
    assert.equal(held.length, 1, 'the silent broker was tried first');
    await first.close();

    // after a loss the attempts start with the broker after the lost one: the silent one
    const links: net.Socket[] = [];
    const proxy = net.createServer((client) => {
      const upstream = net.connect(shared.port, shared.host);
      links.push(client, upstream);
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('error', () => upstream.destroy());
      upstream.on('error', () => client.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => {
      proxy.close();
    });
    const proxyUrl = `stomp://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
    const log = statusLog();
    const c = await connect({ url: `failover:(${proxyUrl},${silentUrl},${real})?${options}`, timeoutMs: 30000,
      onStatus: log.record });
    cleanups.push(() => c.close().catch(() => undefined));
    const dest = queue();
    const sub = await c.subscribe(dest);
    proxy.close();
    for (const s of links) s.destroy();
    await log.until('reconnecting', 1);
    await c.send(dest, Message.text('after')); // waits while it reconnects
    assert.equal((await sub.receive(10000))?.text, 'after');
    assert.equal(held.length, 2, 'the silent broker was tried again after the loss');
    assert.deepEqual(log.seen, ['open', 'reconnecting', 'open']);
  });
});
