/**
 * Virtual hosts (spec/stomp.md §1): a URL's path (single or in a failover group) or the `vhost` option
 * selects the broker's virtual host, sent as `host:/<vhost>`; the same queue name in two vhosts and in the
 * default vhost is three queues, each with only its own messages; an unknown vhost is refused at CONNECT.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, describe, it } from 'node:test';

import { ServerError, type Connection } from '../src/client.js';
import { parseBrokerAddress } from '../src/failover.js';
import { Message } from '../src/message.js';
import { connect } from '../src/node.js';
import { brokerConfig, inCi, ownBroker } from './broker.js';

const cleanups: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

async function texts(c: Connection, dest: string): Promise<string[]> {
  const sub = await c.subscribe(dest);
  const out: string[] = [];
  for (let m = await sub.receive(3000); m; m = await sub.receive(300)) out.push(m.text);
  return out;
}

describe('virtual hosts', () => {
  it('reads a vhost from a URL path and refuses a path that is not a vhost name', () => {
    assert.equal(parseBrokerAddress('stomp://a:1/shop').vhost, 'shop');
    assert.equal(parseBrokerAddress('stomp://a:1/').vhost, undefined);
    assert.throws(() => parseBrokerAddress('stomp://a:1/no/such'), /virtual host/);
  });

  it('keeps two vhosts\' same-named queues apart', async (t) => {
    const b = await ownBroker(brokerConfig('vhosts:\n  shop: ["*"]\n  books: ["*"]\n'));
    if (typeof b === 'string') {
      if (inCi()) throw new Error(`${b} (CI is set: a missing broker is a failure)`);
      return t.skip(b);
    }
    cleanups.push(() => b.remove());
    const at = `${b.host}:${b.port}`;
    const dial = async (options: Parameters<typeof connect>[0]): Promise<Connection> => {
      const c = await connect(options);
      cleanups.push(() => c.close().catch(() => undefined));
      return c;
    };
    const shop = await dial({ url: `stomp://${at}/shop` });
    const books = await dial({ url: `failover:(stomp://${at}/books)` });
    const byOption = await dial({ host: b.host, port: b.port, vhost: 'shop' });
    const plain = await dial({ url: `stomp://${at}` });
    const q = `/queue/ts-vhost-${randomBytes(4).toString('hex')}`;
    await shop.send(q, Message.text('for the shop'));
    await books.send(q, Message.text('for the books'));
    await plain.send(q, Message.text('for the default vhost'));
    assert.deepEqual(await texts(books, q), ['for the books']);
    assert.deepEqual(await texts(byOption, q), ['for the shop']);
    assert.deepEqual(await texts(plain, q), ['for the default vhost']);
    await assert.rejects(connect({ url: `stomp://${at}/nowhere` }),
      (err: unknown) => err instanceof ServerError && err.code === 'access-denied');
  });
});
