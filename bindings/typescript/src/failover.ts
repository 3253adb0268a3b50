/**
 * Failover URLs (spec/ha.md §4.1-4.2, vectors spec/vectors/failover_urls.json): ActiveMQ's
 * `failover:(stomp://a:61613,stomp://b:61613)?initialReconnectDelay=100&randomize=false`, `failover:` without
 * parentheses, or a plain comma list `stomp://a:61613,stomp://b:61613` name a group of brokers; a connection
 * made with one follows whichever broker of the group is live.  No Node API: the WHATWG URL reads members.
 */

/** One member of a group: where it is and its own credentials (undefined when the URL has none). */
export interface BrokerAddress {
  host: string;
  port: number;
  tls: boolean;
  username?: string;
  password?: string;
  /** the URL's path: the broker's virtual host (spec/stomp.md §1) */
  vhost?: string;
}

const VHOST = /^[A-Za-z0-9_-]{1,64}$/;

/** A STOMP URL's path ("/shop") read as the virtual host it names (undefined for none or "/"). */
export function vhostOfPath(pathname: string, raw: string): string | undefined {
  let name: string;
  try {
    name = decodeURIComponent(pathname.replace(/^\//, ''));
  } catch {
    name = pathname;
  }
  if (!name) return undefined;
  if (!VHOST.test(name)) {
    throw new Error(`a STOMP URL's path is a virtual host name (letters, digits, '_', '-'), not "${pathname}": ${redacted(raw)}`);
  }
  return name;
}

/**
 * The virtual host a connection enters at a member (spec/stomp.md §1, vectors spec/vectors/failover_urls.json
 * "vhosts"): the member's own URL path, else the connection's `vhost` setting, else undefined (the broker's
 * default vhost "/").
 */
export function vhostAt(member: { vhost?: string }, setting?: string): string | undefined {
  return member.vhost || setting?.replace(/^\//, '') || undefined;
}

/** The options of spec/ha.md §4.2, by ActiveMQ's names (delays in ms). */
export interface FailoverOptions {
  initialReconnectDelay: number;
  maxReconnectDelay: number;
  useExponentialBackOff: boolean;
  backOffMultiplier: number;
  /** each wait is scaled by a uniform factor in [1 - jitter, 1 + jitter] */
  jitter: number;
  /** attempts after a loss before giving up; -1 forever, 0 none */
  maxReconnectAttempts: number;
  /** extra passes over the list at the first connect; -1 until one answers */
  startupMaxReconnectAttempts: number;
  /** shuffle the list before each pass */
  randomize: boolean;
  /** how long a call waits while reconnecting (ms); -1 until the attempts are spent */
  timeout: number;
  /**
   * how long one attempt may take to open its link (transport, CONNECTED), in ms, within the connection's
   * timeoutMs; 0: that alone.  A stopped broker's port still accepts TCP connections: without it an
   * attempt there would wait the whole timeoutMs before the next broker is tried.
   */
  connectionTimeout: number;
}

export const DEFAULT_FAILOVER_OPTIONS: Readonly<FailoverOptions> = Object.freeze({
  initialReconnectDelay: 100, maxReconnectDelay: 5000, useExponentialBackOff: true, backOffMultiplier: 2,
  jitter: 0.2, maxReconnectAttempts: -1, startupMaxReconnectAttempts: 0, randomize: false, timeout: -1,
  connectionTimeout: 3000,
});

/** The time one attempt of a group may take to open its link: connectionTimeout within timeoutMs. */
export function attemptTimeout(options: FailoverOptions, timeoutMs: number): number {
  return options.connectionTimeout > 0 ? Math.min(timeoutMs, options.connectionTimeout) : timeoutMs;
}

export interface BrokerGroup {
  brokers: BrokerAddress[];
  options: FailoverOptions;
  /** false for a single URL: a lost connection is final */
  failover: boolean;
}

export type FailoverUrlErrorKind = 'empty' | 'unbalanced' | 'unknown-option' | 'duplicate-option' | 'bad-value'
  | 'vm-in-group' | 'nested-failover' | 'bad-broker-url';

/** A broker URL refused when it is read; `kind` names why.  The message never holds a password. */
export class FailoverUrlError extends Error {
  constructor(readonly kind: FailoverUrlErrorKind, message: string) {
    super(`bad broker URL (${kind}): ${message}`);
    this.name = 'FailoverUrlError';
  }
}

const redacted = (u: string): string => u.replace(/(:\/\/[^:/@,()?]*:)[^@,()?/]*@/g, '$1***@');

/**
 * The wait (ms, before jitter) before attempt `n` (from 1) after a loss: 0 for the first, then the initial
 * delay times the multiplier to the power n - 2 (just the initial delay without exponential back-off), never
 * more than the maximum.
 */
export function delayBefore(o: FailoverOptions, n: number): number {
  if (n <= 1) return 0;
  const d = o.useExponentialBackOff ? o.initialReconnectDelay * o.backOffMultiplier ** (n - 2) : o.initialReconnectDelay;
  return Math.min(d, o.maxReconnectDelay);
}

/** delayBefore scaled by a uniform factor in [1 - jitter, 1 + jitter], capped again. */
export function jitteredDelayBefore(o: FailoverOptions, n: number, random: () => number = Math.random): number {
  return Math.min(delayBefore(o, n) * (1 - o.jitter + 2 * o.jitter * random()), o.maxReconnectDelay);
}

const PLAIN = ['stomp', 'tcp'];
const SECURE = ['stomp+ssl', 'stomp+tls', 'stomps', 'ssl', 'tls'];

/** One complete broker URL (stomp://, stomp+ssl://, ...); throws an Error naming what is wrong. */
export function parseBrokerAddress(raw: string): BrokerAddress {
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new Error(`not a broker URL: ${redacted(raw)}`);
  }
  const scheme = u.protocol.replace(/:$/, '').toLowerCase();
  const tls = SECURE.includes(scheme);
  if (!tls && !PLAIN.includes(scheme)) throw new Error(`unsupported URL ${redacted(raw)}: use stomp:// or stomp+ssl://`);
  if (!raw.slice(scheme.length + 1).startsWith('//')) throw new Error(`not host:port in ${redacted(raw)}`);
  const vhost = vhostOfPath(u.pathname, raw);
  if (u.search) throw new Error(`a broker URL in a group takes no options (${redacted(raw)})`);
  const host = u.hostname.replace(/^\[|\]$/g, '') || '127.0.0.1';
  const port = u.port ? Number(u.port) : tls ? 61614 : 61613;
  const out: BrokerAddress = { host, port, tls };
  if (vhost) out.vhost = vhost;
  const authority = raw.slice(raw.indexOf('//') + 2).split(/[/?#]/, 1)[0];
  const at = authority.lastIndexOf('@');
  if (at >= 0) {
    const info = authority.slice(0, at);
    const colon = info.indexOf(':');
    out.username = decodeURIComponent(colon < 0 ? info : info.slice(0, colon));
    if (colon >= 0) out.password = decodeURIComponent(info.slice(colon + 1));
  }
  return out;
}

/** Reads a broker URL: one broker, or a group (spec/ha.md §4.1). */
export function parseBrokerURL(raw: string): BrokerGroup {
  const text = raw.trim();
  if (text.slice(0, 9).toLowerCase() === 'failover:') {
    const rest = text.slice(9).trimStart();
    if (rest.startsWith('(')) {
      const close = rest.lastIndexOf(')');
      if (close < 0) throw new FailoverUrlError('unbalanced', `no ')' closes the broker list of ${redacted(raw)}`);
      const inner = rest.slice(1, close);
      const tail = rest.slice(close + 1).trim();
      if (tail && !tail.startsWith('?')) {
        throw new FailoverUrlError('unbalanced', `unexpected text after the broker list of ${redacted(raw)}; options follow a '?'`);
      }
      const options = tail ? parseOptions(raw, tail.slice(1)) : { ...DEFAULT_FAILOVER_OPTIONS };
      return { brokers: members(raw, inner), options, failover: true };
    }
    return { brokers: members(raw, rest), options: { ...DEFAULT_FAILOVER_OPTIONS }, failover: true };
  }
  if (text.includes(',')) return { brokers: members(raw, text), options: { ...DEFAULT_FAILOVER_OPTIONS }, failover: true };
  if (!text) throw new FailoverUrlError('empty', 'the broker URL is empty');
  try {
    return { brokers: [parseBrokerAddress(text)], options: { ...DEFAULT_FAILOVER_OPTIONS }, failover: false };
  } catch (err) {
    throw new FailoverUrlError('bad-broker-url', (err as Error).message);
  }
}

function members(raw: string, inner: string): BrokerAddress[] {
  if (/[()]/.test(inner)) {
    throw new FailoverUrlError('unbalanced', `parentheses inside the broker list of ${redacted(raw)} (percent-encode them)`);
  }
  const parts = inner.split(',').map((p) => p.trim());
  if (parts.length === 1 && !parts[0]) throw new FailoverUrlError('empty', `no broker URL in ${redacted(raw)}`);
  return parts.map((part) => {
    const lower = part.toLowerCase();
    if (!part) throw new FailoverUrlError('empty', `an empty broker URL in the list of ${redacted(raw)}`);
    if (lower.startsWith('failover:')) throw new FailoverUrlError('nested-failover', `a failover URL inside the group ${redacted(raw)}`);
    if (lower.startsWith('vm:')) throw new FailoverUrlError('vm-in-group', `vm:// cannot be part of a group of brokers (${redacted(raw)})`);
    try {
      return parseBrokerAddress(part);
    } catch (err) {
      throw new FailoverUrlError('bad-broker-url', `in the group ${redacted(raw)}: ${(err as Error).message}`);
    }
  });
}

const WHOLE_MIN: Record<string, number> = {
  initialReconnectDelay: 0, maxReconnectDelay: 0, maxReconnectAttempts: -1, startupMaxReconnectAttempts: -1, timeout: -1,
  connectionTimeout: 0,
};
const DECIMAL_RANGE: Record<string, [number, number]> = { backOffMultiplier: [1, 1000], jitter: [0, 1] };
const BOOLEANS = ['useExponentialBackOff', 'randomize'];

function parseOptions(raw: string, query: string): FailoverOptions {
  const out: FailoverOptions = { ...DEFAULT_FAILOVER_OPTIONS };
  const seen = new Set<string>();
  for (const pair of query.split('&')) {
    const eq = pair.indexOf('=');
    let key: string;
    let value: string;
    try {
      key = decodeURIComponent((eq < 0 ? pair : pair.slice(0, eq)).replace(/\+/g, ' '));
      value = eq < 0 ? '' : decodeURIComponent(pair.slice(eq + 1).replace(/\+/g, ' '));
    } catch {
      throw new FailoverUrlError('bad-value', `bad percent-encoding in the options of ${redacted(raw)}`);
    }
    if (!(key in out)) {
      throw new FailoverUrlError('unknown-option', `unknown failover option "${key}" in ${redacted(raw)} (spec/ha.md section 4.2)`);
    }
    if (eq < 0) throw new FailoverUrlError('bad-value', `failover option "${key}" without a value in ${redacted(raw)}`);
    if (seen.has(key)) throw new FailoverUrlError('duplicate-option', `failover option "${key}" given twice in ${redacted(raw)}`);
    seen.add(key);
    const o = out as unknown as Record<string, number | boolean>;
    if (BOOLEANS.includes(key)) {
      const v = value.toLowerCase();
      if (v !== 'true' && v !== 'false') throw new FailoverUrlError('bad-value', `${key}="${value}": expected true or false`);
      o[key] = v === 'true';
    } else if (key in DECIMAL_RANGE) {
      const [min, max] = DECIMAL_RANGE[key];
      const v = Number(value);
      if (!/^[0-9]+(\.[0-9]+)?$/.test(value) || v < min || v > max) {
        throw new FailoverUrlError('bad-value', `${key}="${value}": expected a decimal number from ${min} to ${max}`);
      }
      o[key] = v;
    } else {
      const min = WHOLE_MIN[key];
      const v = Number(value);
      if (!/^-?[0-9]{1,12}$/.test(value) || v < min || v > 2 ** 31 - 1) {
        throw new FailoverUrlError('bad-value', `${key}="${value}": expected a whole number from ${min} to ${2 ** 31 - 1}`);
      }
      o[key] = v;
    }
  }
  return out;
}
