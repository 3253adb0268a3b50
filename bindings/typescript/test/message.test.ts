import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Message, MessageFormatError } from '../src/message.js';
import { fromHex, loadVectors, toHex } from './vectors.js';

function jsonView(v: unknown): unknown {
  return v instanceof Uint8Array ? { $bytes: Buffer.from(v).toString('base64') } : v;
}

describe('messages.json: MESSAGE frames decode as in the Python SDK', () => {
  const v = loadVectors('messages.json');
  assert.ok(v.cases.length > 0);
  for (const c of v.cases) {
    it(c.name, () => {
      const m = Message.fromFrame({ command: 'MESSAGE', headers: c.headers, body: fromHex(c.body_hex) });
      const e = c.expect;
      assert.equal(m.kind, e.kind);
      if (e.kind === 'text') assert.equal(m.text, e.text);
      if (e.kind === 'bytes') assert.equal(toHex(m.body), e.bytes_hex);
      if (e.kind === 'map') {
        assert.deepEqual(Object.fromEntries(Object.entries(m.map).map(([k, x]) => [k, jsonView(x)])), e.map);
      }
      assert.deepEqual({
        message_id: m.id ?? null, destination: m.destination ?? null, persistent: m.persistent,
        priority: m.priority, timestamp: m.timestamp, expires: m.expires,
        correlation_id: m.correlationId ?? null, reply_to: m.replyTo ?? null, type: m.type ?? null,
        redelivered: m.redelivered, delivery_count: m.deliveryCount, sequence: m.sequence ?? null,
        group_id: m.groupId ?? null,
      }, {
        message_id: e.message_id, destination: e.destination, persistent: e.persistent, priority: e.priority,
        timestamp: e.timestamp, expires: e.expires, correlation_id: e.correlation_id, reply_to: e.reply_to,
        type: e.type, redelivered: e.redelivered, delivery_count: e.delivery_count, sequence: e.sequence,
        group_id: e.group_id,
      });
      const props = Object.fromEntries(m.propertyNames().map((name) => [name, {
        type: m.propertyType(name), value: m.getProperty(name),
      }]));
      assert.deepEqual(props, e.properties);
    });
  }
});

describe('Message', () => {
  it('infers property types and refuses bad names and values', () => {
    const m = Message.text('x').setProperty('i', 42).setProperty('f', 0.5).setProperty('whole', 3, 'float')
      .setProperty('b', true).setProperty('s', 'a:b').setProperty('big', 2n ** 60n);
    assert.deepEqual(m.propertyNames().map((n) => m.propertyType(n)), ['int', 'float', 'float', 'bool', 'string', 'int']);
    for (const bad of ['', 'a,b', 'a=b', 'destination', 'priority']) {
      assert.throws(() => m.setProperty(bad, 'x'), MessageFormatError);
    }
    assert.throws(() => m.setProperty('n', NaN), MessageFormatError);
    assert.throws(() => m.setProperty('n', 'x', 'int'), MessageFormatError);
    const h = Object.fromEntries(m.sendHeaders());
    assert.equal(h['pymq-types'], 'i=i,f=f,whole=f,b=b,big=i');
    assert.equal(h.big, '1152921504606846976');
  });

  it('sends what it decodes', () => {
    const m = Message.map({ sku: 'A-1', qty: 3, blob: new Uint8Array([0, 255]), nothing: null });
    m.correlationId = 'c';
    m.setProperty('n', 7).setProperty('r', 1.5);
    m.groupId = 'g';
    const back = Message.fromFrame({ command: 'MESSAGE', headers: m.sendHeaders(), body: m.body });
    assert.equal(back.kind, 'map');
    assert.deepEqual(back.map, { sku: 'A-1', qty: 3, blob: new Uint8Array([0, 255]), nothing: null });
    assert.deepEqual(back.properties, { n: 7, r: 1.5, JMSXGroupID: 'g' });
    assert.equal(back.propertyType('r'), 'float');
    assert.equal(back.correlationId, 'c');
    assert.equal(back.groupId, 'g');
  });
});

describe('reserved headers', () => {
  it('pymq-dedup-id is a header, not a property (as in the Python SDK)', () => {
    const m = Message.fromFrame({ command: 'MESSAGE', headers: [['pymq-dedup-id', 'd-1'], ['kept', 'yes']], body: new Uint8Array(0) });
    assert.equal(m.getProperty('pymq-dedup-id'), undefined);
    assert.equal(m.getProperty('kept'), 'yes');
  });
});
