/**
 * Group affinity (seed 003) exactly as every other pymq engine and binding computes it: spec/routing.md
 * §1–2, vectors spec/vectors/murmur3.json and group_routing.json.
 *
 * The hash is MurmurHash3 x86_32 (u32 arithmetic through Math.imul and `>>> 0`); groupHash(key) is
 * murmur3(UTF-8 bytes of key, 0).  Destinations are made distinct and sorted by their UTF-8 bytes, which
 * is code-point order and NOT JavaScript's string order (UTF-16 units) for characters above U+FFFF.
 * "modulo" routes to sorted[groupHash mod N]; "rendezvous" (the default) to the destination d with the
 * highest murmur3(key, seed = groupHash(d)), the first in sorted order on equal scores.
 */

const encoder = new TextEncoder();

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function utf8(text: string): Uint8Array {
  if (LONE_SURROGATE.test(text)) throw new RangeError('a key or destination holding a lone surrogate cannot be routed');
  return encoder.encode(text);
}

function rotl32(x: number, r: number): number {
  return (x << r) | (x >>> (32 - r));
}

/** MurmurHash3_x86_32 of `data` with `seed`, as an unsigned 32-bit integer. */
export function murmur3(data: Uint8Array, seed = 0): number {
  const c1 = 0xcc9e2d51;
  const c2 = 0x1b873593;
  let h = seed >>> 0;
  const n = data.length;
  const blocks = n - (n % 4);
  for (let i = 0; i < blocks; i += 4) {
    let k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24);
    k = Math.imul(k, c1);
    k = rotl32(k, 15);
    k = Math.imul(k, c2);
    h ^= k;
    h = rotl32(h, 13);
    h = (Math.imul(h, 5) + 0xe6546b64) | 0;
  }
  let k = 0;
  switch (n % 4) {
    case 3:
      k ^= data[blocks + 2] << 16;
    // falls through
    case 2:
      k ^= data[blocks + 1] << 8;
    // falls through
    case 1:
      k ^= data[blocks];
      k = Math.imul(k, c1);
      k = rotl32(k, 15);
      k = Math.imul(k, c2);
      h ^= k;
  }
  h ^= n;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The routing layer's one hash: murmur3(UTF-8(key), 0). */
export function groupHash(key: string): number {
  return murmur3(utf8(key), 0);
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

export class NoDestinationError extends Error {
  constructor() {
    super('no valid destination to route to');
    this.name = 'NoDestinationError';
  }
}

/** The canonical destination list: distinct names, ascending by UTF-8 bytes. */
export function sortDestinations(destinations: Iterable<string>): string[] {
  const distinct = [...new Set(destinations)];
  if (distinct.length === 0) throw new NoDestinationError();
  const keyed = distinct.map((d) => [utf8(d), d] as const);
  keyed.sort((x, y) => compareBytes(x[0], y[0]));
  return keyed.map(([, d]) => d);
}

export type RoutingStrategy = 'rendezvous' | 'modulo';

/** Routes keys (group ids, message ids, correlation ids) over a fixed destination set; immutable. */
export class GroupRouter {
  readonly destinations: readonly string[];
  readonly strategy: RoutingStrategy;
  private readonly seeds: number[];

  constructor(destinations: Iterable<string>, strategy: RoutingStrategy = 'rendezvous') {
    if (strategy !== 'rendezvous' && strategy !== 'modulo') {
      throw new RangeError(`unknown group routing strategy '${strategy}'; expected rendezvous or modulo`);
    }
    this.strategy = strategy;
    this.destinations = Object.freeze(sortDestinations(destinations));
    this.seeds = this.destinations.map(groupHash); // once per membership change
  }

  /** Rendezvous score of `key` at every destination, in `destinations` order. */
  scores(key: string): number[] {
    const k = utf8(key);
    return this.seeds.map((seed) => murmur3(k, seed));
  }

  /** Position in `destinations` of key's destination. */
  index(key: string): number {
    if (this.strategy === 'modulo') return groupHash(key) % this.destinations.length;
    const scores = this.scores(key);
    let best = 0;
    for (let i = 1; i < scores.length; i++) if (scores[i] > scores[best]) best = i; // ties: first wins
    return best;
  }

  route(key: string): string {
    return this.destinations[this.index(key)];
  }

  /** Every destination in key's order of preference; the first is route(key). */
  ranking(key: string): string[] {
    if (this.strategy === 'modulo') {
      const start = this.index(key);
      return [...this.destinations.slice(start), ...this.destinations.slice(0, start)];
    }
    const scores = this.scores(key);
    return this.destinations
      .map((d, i) => [d, i] as const)
      .sort((a, b) => scores[b[1]] - scores[a[1]] || a[1] - b[1])
      .map(([d]) => d);
  }

  /** A router over a new destination set, same strategy. */
  withDestinations(destinations: Iterable<string>): GroupRouter {
    return new GroupRouter(destinations, this.strategy);
  }
}

/** Which id a destination routes its messages on (spec/routing.md §2.3); 'group' is the default. */
export type RoutingKey = 'group' | 'correlation-id' | 'message-id';

const ROUTING_KEYS: readonly string[] = ['group', 'correlation-id', 'message-id'];

/**
 * The key a message with these STOMP headers routes on under `routingKey`, and where it came from; null for
 * an unkeyed message (not hash-routed).  A grouped message routes on its group whatever the setting (group
 * order is a contract, the other ids only an affinity); "present" means the header exists, even empty.
 * An unknown setting throws (names are exact and lower case).
 */
export function routingKeyOf(routingKey: string, headers: Record<string, string>):
  { key: string; source: RoutingKey } | null {
  if (!ROUTING_KEYS.includes(routingKey)) {
    throw new RangeError(`unknown routing_key '${routingKey}'; expected group, correlation-id or message-id`);
  }
  const has = (name: string) => Object.prototype.hasOwnProperty.call(headers, name);
  if (has('JMSXGroupID')) return { key: headers.JMSXGroupID, source: 'group' };
  if (routingKey === 'correlation-id' && has('correlation-id')) return { key: headers['correlation-id'], source: 'correlation-id' };
  if (routingKey === 'message-id' && has('message-id')) return { key: headers['message-id'], source: 'message-id' };
  return null;
}
