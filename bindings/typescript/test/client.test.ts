import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it, type TestContext } from 'node:test';

import { ServerError, type Connection, type Subscription } from '../src/client.js';
import { connect, type NodeConnectOptions } from '../src/node.js';
import { Message } from '../src/message.js';
import { startBroker, type Broker } from './broker.js';

let broker: Broker | string = 'the broker has not started';
const open: Connection[] = [];

before(async () => {
  broker = await startBroker();
});

after(async () => {
  for (const c of open) await c.close().catch(() => undefined);
  if (typeof broker !== 'string') await broker.remove();
});

/** a connection to the test broker, or undefined after skipping the test when there is none */
async function dial(t: TestContext, options: Partial<NodeConnectOptions> = {}): Promise<Connection | undefined> {
  if (typeof broker === 'string') {
    t.skip(broker);
    return undefined;
  }
  const c = await connect({ host: broker.host, port: broker.port, ...options });
  open.push(c);
  return c;
}

function queue(): string {
  return `/queue/ts-${randomBytes(4).toString('hex')}`;
}

async function expect(sub: Subscription): Promise<Message> {
  const m = await sub.receive(5000);
  assert.ok(m, `nothing received on ${sub.destination}`);
  return m;
}

/** the texts waiting on a queue, read by a fresh connection */
async function drain(t: TestContext, destination: string): Promise<string[]> {
  const c = (await dial(t))!;
  const sub = await c.subscribe(destination);
  const out: string[] = [];
  for (let m = await sub.receive(5000); m; m = await sub.receive(500)) out.push(m.text);
  await c.close();
  return out;
}

describe('client against a real pymq-server', () => {
  it('negotiates a version and refuses bad credentials', async (t) => {
    const c = await dial(t);
    if (!c) return;
    assert.equal(c.version, '1.2');
    assert.ok(c.session);
    const old = (await dial(t, { version: '1.1' }))!;
    assert.equal(old.version, '1.1');
    await assert.rejects(dial(t, { passcode: 'wrong' }),
      (err: unknown) => err instanceof ServerError && err.code === 'authentication-failed');
  });

  for (const version of ['1.1', '1.2']) {
    it(`carries the JMS headers and typed properties (STOMP ${version})`, async (t) => {
      const c = await dial(t, { version });
      if (!c) return;
      const dest = queue();
      const m = Message.text('héllo');
      m.correlationId = 'corr:1\nx';
      m.replyTo = '/queue/replies';
      m.type = 'order';
      m.priority = 7;
      m.expires = Date.now() + 3600_000;
      m.groupId = 'g-1';
      m.setProperty('count', 42).setProperty('ratio', 0.25).setProperty('whole', 3, 'float')
        .setProperty('flag', true).setProperty('label', 'a:b\\c').setProperty('JMSXGroupSeq', 1);
      await c.send(dest, m);
      assert.match(m.id ?? '', /^ID:/);
      const got = await expect(await c.subscribe(dest));
      assert.equal(got.kind, 'text');
      assert.equal(got.text, 'héllo');
      assert.equal(got.id, m.id);
      assert.deepEqual(
        [got.correlationId, got.replyTo, got.type, got.priority, got.expires, got.persistent, got.timestamp],
        [m.correlationId, m.replyTo, 'order', 7, m.expires, true, m.timestamp]);
      assert.equal(got.destination, dest);
      assert.equal(got.groupId, 'g-1');
      assert.equal(got.deliveryCount, 1);
      assert.equal(got.redelivered, false);
      assert.ok(got.sequence !== undefined);
      const sent = { count: 42, ratio: 0.25, whole: 3, flag: true, label: 'a:b\\c', JMSXGroupSeq: 1, JMSXGroupID: 'g-1' };
      // the broker may add properties of its own (JMSXGroupFirstForConsumer on a group's first message)
      assert.deepEqual(Object.fromEntries(Object.keys(sent).map((k) => [k, got.getProperty(k)])), sent);
      assert.equal(got.propertyType('whole'), 'float');
      assert.equal(got.propertyType('count'), 'int');
    });
  }

  it('sends bytes, map and non-persistent messages', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    const payload = new Uint8Array(randomBytes(300_000));
    payload[0] = 0;
    await c.send(dest, Message.bytes(payload));
    await c.send(dest, Message.map({ sku: 'A-1', qty: 3, blob: new Uint8Array([0, 1]) }));
    const fleeting = Message.text('fleeting');
    fleeting.persistent = false;
    await c.send(dest, fleeting);
    const sub = await c.subscribe(dest);
    const b = await expect(sub);
    assert.equal(b.kind, 'bytes');
    assert.deepEqual(b.body, payload);
    const map = await expect(sub);
    assert.equal(map.kind, 'map');
    assert.deepEqual(map.map, { sku: 'A-1', qty: 3, blob: new Uint8Array([0, 1]) });
    const last = await expect(sub);
    assert.equal(last.text, 'fleeting');
    assert.equal(last.persistent, false);
  });

  for (const version of ['1.1', '1.2']) {
    it(`acks, nacks and redelivers with client-individual acks (STOMP ${version})`, async (t) => {
      const c = await dial(t, { version });
      if (!c) return;
      const dest = queue();
      for (const text of ['m0', 'm1', 'm2']) await c.send(dest, Message.text(text));
      const sub = await c.subscribe(dest, { ack: 'client-individual' });
      const [m0, m1, m2] = [await expect(sub), await expect(sub), await expect(sub)];
      assert.deepEqual([m0.text, m1.text, m2.text], ['m0', 'm1', 'm2']);
      m1.ack();
      m0.nack();
      const again = await expect(sub);
      assert.deepEqual([again.text, again.redelivered, again.deliveryCount], ['m0', true, 2]);
      again.ack();
      await c.close(); // m2 was never acked: it goes back to the queue
      assert.deepEqual(await drain(t, dest), ['m2']);
    });
  }

  it('auto-acks what receive() returned, and only that', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    await c.send(dest, Message.text('taken'));
    await c.send(dest, Message.text('delivered, not received'));
    const sub = await c.subscribe(dest);
    const m = await expect(sub);
    assert.equal(m.text, 'taken');
    assert.throws(() => m.ack());
    await c.close();
    assert.deepEqual(await drain(t, dest), ['delivered, not received']);
  });

  it('acks cumulatively in client mode', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    for (const text of ['a', 'b', 'c']) await c.send(dest, Message.text(text));
    const sub = await c.subscribe(dest, { ack: 'client' });
    await expect(sub);
    const b = await expect(sub);
    await expect(sub);
    b.ack();
    await c.close();
    assert.deepEqual(await drain(t, dest), ['c']);
  });

  it('limits outstanding messages with prefetch', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    await c.send(dest, Message.text('one'));
    await c.send(dest, Message.text('two'));
    const sub = await c.subscribe(dest, { ack: 'client-individual', prefetch: 1 });
    const first = await expect(sub);
    assert.equal(await sub.receive(500), null);
    first.ack();
    assert.equal((await expect(sub)).text, 'two');
  });

  it('commits and aborts transactions of sends and acks', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    const sub = await c.subscribe(dest, { ack: 'client-individual' });
    const tx = await c.begin();
    await tx.send(dest, Message.text('t1'));
    await tx.send(dest, Message.text('t2'));
    assert.equal(await sub.receive(300), null);
    await tx.commit();
    const [t1, t2] = [await expect(sub), await expect(sub)];
    assert.deepEqual([t1.text, t2.text], ['t1', 't2']);
    const aborted = await c.begin();
    await aborted.send(dest, Message.text('never'));
    aborted.ack(t1); // discarded with the transaction: t1 stays outstanding
    await aborted.abort();
    const committed = await c.begin();
    committed.ack(t2);
    await committed.commit();
    assert.equal(await sub.receive(300), null);
    await c.close();
    assert.deepEqual(await drain(t, dest), ['t1']);
  });

  it('fans out topics and applies selectors to typed properties', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const topic = queue().replace('/queue/', '/topic/');
    const all = await c.subscribe(topic);
    const big = await c.subscribe(topic, { selector: 'qty > 10' });
    for (const qty of [5, 20]) await c.send(topic, Message.text('qty').setProperty('qty', qty));
    assert.deepEqual([(await expect(all)).getProperty('qty'), (await expect(all)).getProperty('qty')], [5, 20]);
    assert.equal((await expect(big)).getProperty('qty'), 20);
    assert.equal(await big.receive(300), null);
  });

  it('stalls neither sends nor close with a subscription nobody reads', async (t) => {
    const c = await dial(t);
    if (!c) return;
    const dest = queue();
    await c.subscribe(dest, { prefetch: 2 }); // credit 2: the broker holds the rest
    for (let i = 0; i < 10; i++) await c.send(dest, Message.text('unread')); // each waits for a receipt
    await c.close(); // rejects if the DISCONNECT receipt never gets through
    assert.ok(c.error);
  });

  it('reports ERROR frames as ServerError and ends the connection', async (t) => {
    const c = await dial(t);
    if (!c) return;
    await assert.rejects(c.subscribe(queue(), { selector: 'qty >' }),
      (err: unknown) => err instanceof ServerError && err.code === 'invalid-selector');
    await assert.rejects(c.send(queue(), Message.text('x')), ServerError);
    const c2 = (await dial(t))!;
    await assert.rejects(c2.send('/bad/x', Message.text('x')), (err: unknown) =>
      err instanceof ServerError && err.code === 'invalid-destination' && err.fields.destination === '/bad/x');
  });
});
