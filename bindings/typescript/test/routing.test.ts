import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { GroupRouter, groupHash, murmur3, NoDestinationError, routingKeyOf } from '../src/routing.js';
import { fromHex, loadVectors } from './vectors.js';

describe('murmur3.json', () => {
  const v = loadVectors('murmur3.json');
  it('matches every vector', () => {
    assert.ok(v.vectors.length > 0);
    for (const c of v.vectors) assert.equal(murmur3(fromHex(c.input_hex), c.seed), c.hash, c.input_hex);
  });
  it("passes SMHasher's verification", () => {
    const key = new Uint8Array(256);
    const results = new Uint8Array(1024);
    const view = new DataView(results.buffer);
    for (let i = 0; i < 256; i++) {
      key[i] = i;
      view.setUint32(i * 4, murmur3(key.subarray(0, i), 256 - i), true);
    }
    assert.equal(murmur3(results, 0), v.verification.expected);
    assert.equal(v.verification.expected, 0xb0f57ee3);
  });
});

describe('group_routing.json', () => {
  const v = loadVectors('group_routing.json');
  for (const c of v.cases) {
    it(c.name, () => {
      assert.equal(Buffer.from(c.key, 'utf-8').toString('hex'), c.key_hex);
      const modulo = new GroupRouter(c.destinations, 'modulo');
      const hrw = new GroupRouter(c.destinations);
      assert.deepEqual(modulo.destinations, c.sorted);
      assert.deepEqual(c.sorted.map(groupHash), c.destination_hashes);
      assert.equal(groupHash(c.key), c.group_hash);
      assert.equal(modulo.index(c.key), c.modulo_index);
      assert.equal(modulo.route(c.key), c.modulo);
      assert.deepEqual(hrw.scores(c.key), c.rendezvous_scores);
      assert.equal(hrw.route(c.key), c.rendezvous);
      assert.deepEqual(hrw.ranking(c.key), c.rendezvous_ranking);
      assert.equal(modulo.ranking(c.key)[0], c.modulo);
    });
  }
  it('refuses the error vectors', () => {
    assert.ok(v.errors.length > 0);
    for (const e of v.errors) assert.throws(() => new GroupRouter(e.destinations), NoDestinationError);
  });
  it('key_cases: the id a message routes on under a routing_key', () => {
    assert.ok(v.key_cases.length > 10);
    for (const c of v.key_cases) {
      const got = routingKeyOf(c.routing_key, c.headers);
      if (c.key_source === null) {
        assert.equal(got, null, c.name);
        continue;
      }
      assert.deepEqual(got, { key: c.key, source: c.key_source }, c.name);
      assert.equal(new GroupRouter(c.destinations, 'modulo').route(got!.key), c.modulo, c.name);
      assert.equal(new GroupRouter(c.destinations).route(got!.key), c.rendezvous, c.name);
    }
    for (const e of v.key_errors) assert.throws(() => routingKeyOf(e.routing_key, {}), RangeError);
  });
  it('refuses keys with lone surrogates and unknown strategies', () => {
    assert.throws(() => groupHash('a\ud800b'), RangeError);
    assert.throws(() => new GroupRouter(['a'], 'round-robin' as never), RangeError);
  });
});
