/**
 * Temporary destinations across a takeover (spec/ha.md §4.7): the live of a real pair is killed with SIGKILL;
 * the requester's reconnection offers the re-claim token of the lost link's CONNECTED (signed with the key in
 * the shared store, so the backup verifies it), its temporary queue keeps its global name, and the reply the
 * responder sends to the old reply-to afterwards arrives; onStatus('open') comes without an error.  A second
 * requester whose token was forged (another mac for the same names) is refused: onStatus('open') gets a
 * TemporariesRenamedError ("does not verify"), and nothing was made under its old name (a SEND there is
 * refused unknown-destination).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, describe, it } from 'node:test';

import { connect, Message, ServerError, TemporariesRenamedError, type Connection, type Status } from '../src/node.js';
import { startPair, unavailable } from './broker.js';

const cleanups: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** The statuses a connection reported, each with the error onStatus got. */
function statusLog() {
  const seen: Array<[Status, Error | undefined]> = [];
  return {
    seen,
    record: (s: Status, e?: Error) => {
      seen.push([s, e]);
    },
    async until(status: Status, n: number, withinMs = 60000): Promise<Array<Error | undefined>> {
      const deadline = Date.now() + withinMs;
      for (;;) {
        const errors = seen.filter(([s]) => s === status).map(([, e]) => e);
        if (errors.length >= n) return errors;
        if (Date.now() > deadline) throw new Error(`status ${status} #${n} never came; saw ${seen.map(([s]) => s)}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
  };
}

/** Test access to a connection's private re-claim token (a secret the API never shows). */
const token = (c: Connection): { reclaimToken?: string } => c as unknown as { reclaimToken?: string };

describe('temporary names across a takeover (spec/ha.md §4.7)', () => {
  it('a reply to the old reply-to arrives after a kill -9 of the live; a forged token is refused', async (t) => {
    const pair = await startPair(cleanups);
    if (typeof pair === 'string') return unavailable(t, pair);
    const { a, b, portA, portB } = pair;
    const url = `failover:(stomp://127.0.0.1:${portA},stomp://127.0.0.1:${portB})?initialReconnectDelay=50&maxReconnectDelay=400&jitter=0`;
    const open = async () => {
      const log = statusLog();
      const c = await connect({ url, onStatus: log.record });
      cleanups.push(() => c.close().catch(() => undefined));
      return { c, log };
    };
    const requester = await open();
    const forger = await open();
    const responder = await open();
    const service = `/queue/ts-svc-${randomBytes(4).toString('hex')}`;
    const local = `/temp-queue/answers-${randomBytes(3).toString('hex')}`;
    const ask = async (c: Connection) => {
      const replies = await c.subscribe(local);
      const m = Message.text('question');
      m.replyTo = local;
      await c.send(service, m);
      return replies;
    };
    const answers = await ask(requester.c);
    const forged = await ask(forger.c);
    const requests = await responder.c.subscribe(service);
    const replyTo = [(await requests.receive(10000))?.replyTo, (await requests.receive(10000))?.replyTo];
    for (const name of replyTo) assert.match(name ?? '', /^\/temp-queue\/tmp\./, 'a global temporary name');
    assert.notEqual(replyTo[0], replyTo[1]);
    const kept = token(requester.c).reclaimToken;
    const theirs = token(forger.c).reclaimToken;
    assert.ok(kept && theirs, 'the broker gave a pymq-reclaim-token');
    token(forger.c).reclaimToken = theirs.slice(0, -1) + (theirs.endsWith('A') ? 'B' : 'A');

    await a.kill();
    await b.live();
    const rOpen = await requester.log.until('open', 2);
    const fOpen = await forger.log.until('open', 2);
    assert.equal(rOpen[1], undefined, `the requester's names were kept: ${rOpen[1]?.message}`);
    assert.ok(fOpen[1] instanceof TemporariesRenamedError && /does not verify/.test(fOpen[1].reason), String(fOpen[1]));
    assert.equal(token(requester.c).reclaimToken, kept, 'the same names: the same token for the next loss');

    await responder.c.send(replyTo[0]!, Message.text('answer'));
    assert.equal((await answers.receive(10000))?.text, 'answer', 'the reply to the old global name arrived');
    await assert.rejects(responder.c.send(replyTo[1]!, Message.text('to the forged names')),
      (err: unknown) => err instanceof ServerError && err.code === 'unknown-destination');
    assert.equal(await forged.receive(300) ?? undefined, undefined, 'nothing reached the forger');
  });
});
