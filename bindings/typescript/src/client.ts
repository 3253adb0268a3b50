/**
 * The pymq client, independent of the transport: it runs over TCP/TLS in Node (./node) and over WebSocket
 * in browsers and Node (./websocket), through the Connector interface of ./transport.  No Node API is used
 * here.
 *
 * A Connection is a logical connection to a broker; underneath, one STOMP connection at a time (a link)
 * carries it.  The link's bytes feed the sans-IO FrameScanner; RECEIPTs settle the promise of the frame that
 * asked for them, MESSAGEs go to their Subscription's queue.  Every subscription uses broker credit
 * (prefetch-count, 1000 by default), so its queue never holds more and a slow reader never stalls the
 * connection's receipts: 'auto' is JMS AUTO_ACKNOWLEDGE, a client-individual subscription acknowledged as
 * receive() returns each message (as the Python SDK does), not STOMP's ack:auto, which has no credit.
 * Every wait has a timeout.
 *
 * Heart-beats are negotiated as STOMP 1.2 says (`heartBeat`, 10 s both ways by default): an EOL goes out when
 * nothing else was written for the negotiated interval, and the broker is declared dead after twice its
 * interval without traffic.
 *
 * With a failover group (`brokers`, or a failover URL in ./node; spec/ha.md §4) or `reconnect`, a lost link
 * (transport error, close, missed heart-beats) is replaced with backoff, every subscription is made again
 * with the same id and headers, and the SENDs without their receipt go again with their pymq-dedup-id, before
 * anything uses the new link.  What is lost and what is not: unacknowledged messages go back to their queue
 * when the link dies and the broker redelivers them (redelivered, deliveryCount up), so delivery is at least
 * once; messages buffered but not yet received are dropped here for the same reason, and ack()/nack() of a
 * message from the old link throws StaleMessageError; a transaction that did something is rolled back by the
 * broker (its commit() rejects with TransactionLostError; one whose receipt was lost, TransactionInDoubtError);
 * temporary queues and topics keep their global names (a reconnection offers the broker's re-claim token,
 * spec/ha.md §4.7; onStatus('open', TemporariesRenamedError) when they could not), what a temporary queue held
 * is lost with a broker that died; a non-durable topic subscription misses what was published while it
 * was away (a durable one, with a clientId, does not).  Calls made while
 * reconnecting wait for the new link (within timeoutMs).  An ERROR frame is final: the broker refused
 * something and would refuse it again.
 */
import { utf8Decode } from './bytes.js';
import { encodeFrame, FrameScanner, header, type Frame, type Header } from './frame.js';
import { attemptTimeout, DEFAULT_FAILOVER_OPTIONS, jitteredDelayBefore, vhostAt, type FailoverOptions } from './failover.js';
import { Message } from './message.js';
import type { Connector, Transport } from './transport.js';

/** An ERROR frame from the broker (spec/stomp.md §6). */
export class ServerError extends Error {
  /** pymq-code, e.g. "invalid-destination" */
  readonly code: string;
  /** pymq-field-* headers without the prefix */
  readonly fields: Record<string, string>;
  readonly body: string;

  constructor(frame: Frame) {
    const message = header(frame, 'message') ?? 'broker error';
    const code = header(frame, 'pymq-code') ?? '';
    super(code ? `${code}: ${message}` : message);
    this.name = 'ServerError';
    this.code = code;
    this.fields = {};
    for (const [k, v] of frame.headers) if (k.startsWith('pymq-field-')) this.fields[k.slice(11)] = v;
    this.body = utf8Decode(frame.body);
  }
}

/** The connection ended (closed by us, by the broker, or lost). */
export class ConnectionClosed extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConnectionClosed';
  }
}

/**
 * The link to the broker was lost: a request in flight when it happened (a send whose receipt never came:
 * the message may or may not have reached the broker), or the final error without reconnection.
 */
export class DisconnectedError extends ConnectionClosed {
  readonly reason: Error;

  constructor(reason: Error) {
    super(`disconnected from the broker: ${reason.message}`);
    this.name = 'DisconnectedError';
    this.reason = reason;
  }
}

/** ack()/nack() of a message that came on a link since replaced: the broker already redelivers it. */
export class StaleMessageError extends Error {
  constructor() {
    super('the message came on an earlier connection; the broker redelivers it');
    this.name = 'StaleMessageError';
  }
}

/**
 * commit() of a transaction that had sent or acknowledged something when its link was lost: the broker
 * aborted it (JMS's TransactionRolledBackException).
 */
export class TransactionLostError extends Error {
  constructor() {
    super("the transaction's connection was lost; the broker aborted it");
    this.name = 'TransactionLostError';
  }
}

/**
 * commit() whose RECEIPT was lost with the link: the broker applied the transaction whole or not at all,
 * and which is not known; the COMMIT is never sent again (spec/ha.md §4.5).
 */
export class TransactionInDoubtError extends Error {
  constructor(readonly reason: Error) {
    super(`the connection was lost before the COMMIT's receipt; the outcome is unknown: ${reason.message}`);
    this.name = 'TransactionInDoubtError';
  }
}

/**
 * The error `onStatus('open', error)` gets after a reconnection whose link did not re-claim the lost link's
 * temporary names (spec/ha.md §4.7): the connection's temporary queues and topics have new global names, so a
 * reply addressed to an old one (a `reply-to` sent before the loss) does not reach them; the application may
 * ask again.  `reason` is the broker's `pymq-reclaim-refused`, or why nothing was offered.
 */
export class TemporariesRenamedError extends Error {
  constructor(readonly reason: string) {
    super(`the temporary destinations have new global names after the reconnection: ${reason}`);
    this.name = 'TemporariesRenamedError';
  }
}

/** A member of a failover group: how to reach it, and its own credentials (connect()'s win). */
export interface BrokerMember {
  connector: Connector;
  login?: string;
  passcode?: string;
  /** the broker's virtual host at this member (its URL's path); it wins over ClientOptions.vhost (vhostAt) */
  vhost?: string;
}

/** How many SENDs of a reconnecting connection may wait for their receipt; send() waits while that many do. */
export const SEND_WINDOW = 1000;

/** The broker went silent for longer than twice its negotiated heart-beat interval. */
export class HeartBeatError extends Error {
  constructor(silentMs: number, everyMs: number) {
    super(`no heart-beat from the broker for ${silentMs} ms (one expected every ${everyMs} ms)`);
    this.name = 'HeartBeatError';
  }
}

export type Status = 'connecting' | 'open' | 'reconnecting' | 'closed';

export interface ReconnectOptions {
  /** first wait after a loss (ms); default 100 */
  initialDelayMs?: number;
  /** longest wait between attempts (ms); default 10000 */
  maxDelayMs?: number;
  /** growth of the wait per failed attempt; default 2 (±20 % jitter) */
  multiplier?: number;
  /** attempts per loss before giving up (the connection then ends); 0 or absent = forever */
  maxAttempts?: number;
}

export interface ClientOptions {
  /** how to reach the broker (./node: tcp(), ./websocket: webSocket()); or `brokers` */
  connector?: Connector;
  /** the members of a failover group (spec/ha.md §4), tried in turn; ./node makes them from a failover URL */
  brokers?: BrokerMember[];
  /** failover options (spec/ha.md §4.2, ActiveMQ's names); with `brokers`, or from a failover URL */
  failover?: Partial<FailoverOptions>;
  login?: string;
  passcode?: string;
  /** JMS client id: scopes durable subscriptions */
  clientId?: string;
  /**
   * the broker's virtual host (spec/stomp.md §1), sent as `host:/<vhost>` to every broker whose URL has no
   * path: ./node reads a URL's path (`stomp://host:61613/shop`, also a failover member's), which wins for its
   * broker (vhostAt).  Absent: the broker's default vhost "/".
   */
  vhost?: string;
  /** the one STOMP version to accept; default "1.1,1.2" */
  version?: string;
  /** connect, receipt and reconnection waits (ms); default 10000 */
  timeoutMs?: number;
  /** persistent sends resolve without waiting for the broker's receipt */
  asyncSend?: boolean;
  /** heart-beats this side offers (ms; 0 = none); default 10000 both ways; false turns them off */
  heartBeat?: { sendMs: number; receiveMs: number } | false;
  /** replace a lost link with backoff and subscribe again; default off */
  reconnect?: boolean | ReconnectOptions;
  /**
   * told of every change of status, with the cause for 'reconnecting' and 'closed', and a
   * TemporariesRenamedError with an 'open' after a reconnection that kept no temporary names
   */
  onStatus?: (status: Status, error?: Error) => void;
}

/** auto: receive() acknowledges each message it returns; client: ack() covers every earlier message of
 *  the subscription too; client-individual: one message at a time */
export type AckMode = 'auto' | 'client' | 'client-individual';

export const DEFAULT_PREFETCH = 1000;
export const DEFAULT_HEART_BEAT = { sendMs: 10000, receiveMs: 10000 };
/** the broker is declared dead after this many of its intervals without traffic (as the broker does) */
const HEART_BEAT_GRACE = 2;

export interface SubscribeOptions {
  ack?: AckMode;
  /** most unacknowledged messages outstanding (prefetch-count); 0 or absent = DEFAULT_PREFETCH */
  prefetch?: number;
  selector?: string;
  /** durable topic subscription name */
  durableName?: string;
  noLocal?: boolean;
  headers?: Header[];
}

interface Waiter {
  resolve: (frame: Frame) => void;
  reject: (err: Error) => void;
  timer?: ReturnType<typeof setTimeout>;
}

function parseHeartBeat(value: string | undefined): [number, number] {
  const m = /^\s*(\d+)\s*,\s*(\d+)\s*$/.exec(value ?? '');
  return m ? [Math.min(Number(m[1]), 2 ** 31), Math.min(Number(m[2]), 2 ** 31)] : [0, 0];
}

/** One STOMP connection over one transport; fails exactly once. */
class Link {
  version = '1.0';
  session = '';
  /** CONNECTED's pymq-reclaimed ("true": the lost link's temporary names are this link's) and pymq-reclaim-refused */
  reclaimed?: string;
  reclaimRefused?: string;
  sendEveryMs = 0;
  expectEveryMs = 0;
  transport?: Transport;
  error?: Error;
  lastRead = Date.now();
  lastWrite = Date.now();
  readonly receipts = new Map<string, Waiter>();
  private readonly scanner = new FrameScanner({ version: '1.0', maxFrameSize: 64 * 1024 * 1024 });
  private connected?: Waiter;
  private beat?: ReturnType<typeof setInterval>;

  constructor(private readonly conn: Connection, readonly gen: number) {}

  /** Opens the transport, sends CONNECT and waits for CONNECTED (an ERROR answer rejects with it). */
  async open(member: BrokerMember, options: ClientOptions, timeoutMs: number): Promise<void> {
    const connected = new Promise<Frame>((resolve, reject) => {
      this.connected = { resolve, reject };
    });
    connected.catch(() => undefined); // observed below; avoids an unhandled rejection if open() throws first
    const timer = setTimeout(() => this.fail(new ConnectionClosed(`no CONNECTED within ${timeoutMs} ms`)), timeoutMs);
    try {
      this.transport = await member.connector({
        data: (chunk) => this.onData(chunk),
        closed: (error) => this.fail(error ?? new ConnectionClosed('the broker closed the connection')),
      });
      if (this.error) throw this.error;
      const hb = options.heartBeat === false ? { sendMs: 0, receiveMs: 0 } : options.heartBeat ?? DEFAULT_HEART_BEAT;
      const headers: Header[] = [
        ['accept-version', options.version ?? '1.1,1.2'], ['host', `/${vhostAt(member, options.vhost) ?? ''}`],
        ['login', options.login ?? member.login ?? 'guest'],
        ['passcode', options.login !== undefined ? options.passcode ?? 'guest' : member.passcode ?? options.passcode ?? 'guest'],
        ['heart-beat', `${hb.sendMs},${hb.receiveMs}`],
      ];
      if (options.clientId) headers.push(['client-id', options.clientId]);
      const token = this.conn._reclaimOffer();
      if (token) headers.push(['pymq-reclaim', token]); // the lost link's temporaries keep their names (spec/ha.md §4.7)
      this.transport.write(encodeFrame('CONNECT', headers, undefined, '1.2'));
      const frame = await connected;
      this.version = header(frame, 'version') ?? '1.0';
      this.session = header(frame, 'session') ?? '';
      this.reclaimed = header(frame, 'pymq-reclaimed');
      this.reclaimRefused = header(frame, 'pymq-reclaim-refused');
      this.conn._keepReclaimToken(header(frame, 'pymq-reclaim-token'));
      const [cx, cy] = parseHeartBeat(header(frame, 'heart-beat'));
      this.sendEveryMs = hb.sendMs > 0 && cy > 0 ? Math.max(hb.sendMs, cy) : 0;
      this.expectEveryMs = hb.receiveMs > 0 && cx > 0 ? Math.max(hb.receiveMs, cx) : 0;
      this.scanner.version = this.version;
    } catch (err) {
      this.fail(err as Error);
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Starts reading pipelined frames and the heart-beat timer (once the link is about to be used). */
  start(): void {
    this.onData(new Uint8Array(0)); // frames pipelined after CONNECTED
    if (this.sendEveryMs > 0 || this.expectEveryMs > 0) {
      const every = Math.min(this.sendEveryMs || Infinity, this.expectEveryMs || Infinity);
      this.beat = setInterval(() => this.tick(), Math.max(10, Math.floor(every / 4)));
    }
  }

  private tick(): void {
    const now = Date.now();
    if (this.expectEveryMs > 0 && now - this.lastRead > HEART_BEAT_GRACE * this.expectEveryMs) {
      this.fail(new HeartBeatError(now - this.lastRead, this.expectEveryMs));
      return;
    }
    if (this.sendEveryMs > 0 && now - this.lastWrite >= (this.sendEveryMs * 3) / 4) {
      this.writeRaw(new Uint8Array([10]));
      this.conn.stats.heartBeatsSent++;
    }
  }

  private onData(chunk: Uint8Array): void {
    if (this.error) return;
    if (chunk.length > 0) {
      this.lastRead = Date.now();
      if (chunk.every((b) => b === 10 || b === 13)) this.conn.stats.heartBeatsReceived++;
    }
    let frames: Frame[];
    try {
      frames = this.scanner.feed(chunk);
    } catch (err) {
      this.fail(new ConnectionClosed(`the broker sent a malformed frame: ${(err as Error).message}`));
      return;
    }
    for (const frame of frames) {
      this.dispatch(frame);
      if (this.error) return;
    }
  }

  private dispatch(frame: Frame): void {
    switch (frame.command) {
      case 'CONNECTED': {
        const w = this.connected;
        this.connected = undefined;
        w?.resolve(frame);
        return;
      }
      case 'RECEIPT': {
        const id = header(frame, 'receipt-id') ?? '';
        const w = this.receipts.get(id);
        if (w) {
          this.receipts.delete(id);
          if (w.timer) clearTimeout(w.timer);
          w.resolve(frame);
        }
        return;
      }
      case 'MESSAGE':
        this.conn._deliver(this, frame);
        return;
      case 'ERROR':
        this.fail(new ServerError(frame));
    }
  }

  /** The error a request waiting on this failed link gets. */
  lostError(): Error {
    const err = this.error ?? new ConnectionClosed('connection closed');
    return err instanceof ServerError || err instanceof ConnectionClosed ? err : new DisconnectedError(err);
  }

  fail(err: Error): void {
    if (this.error) return;
    this.error = err;
    if (this.beat) clearInterval(this.beat);
    const lost = this.lostError();
    for (const w of this.receipts.values()) {
      if (w.timer) clearTimeout(w.timer);
      w.reject(lost);
    }
    this.receipts.clear();
    this.connected?.reject(err);
    this.connected = undefined;
    try {
      this.transport?.close();
    } catch {
      // closing a transport that is already gone
    }
    this.conn._linkLost(this, err);
  }

  private writeRaw(data: Uint8Array): void {
    try {
      this.transport!.write(data);
      this.lastWrite = Date.now();
    } catch (err) {
      this.fail(err as Error);
      throw this.lostError();
    }
  }

  write(command: string, headers: Header[], body?: Uint8Array): void {
    if (this.error) throw this.lostError();
    this.writeRaw(encodeFrame(command, headers, body, this.version));
  }

  request(id: string, command: string, headers: Header[], body: Uint8Array | undefined, timeoutMs: number): Promise<Frame> {
    if (this.error) return Promise.reject(this.lostError());
    return new Promise((resolve, reject) => {
      const timer = timeoutMs > 0 ? setTimeout(() => {
        this.receipts.delete(id);
        reject(new Error(`no RECEIPT for ${command} within ${timeoutMs} ms`));
      }, timeoutMs) : undefined;
      this.receipts.set(id, { resolve, reject, timer });
      try {
        this.write(command, [...headers, ['receipt', id]], body);
      } catch (err) {
        this.receipts.delete(id);
        clearTimeout(timer);
        reject(err as Error);
      }
    });
  }

  pause(paused: boolean): void {
    if (paused) this.transport?.pause?.();
    else this.transport?.resume?.();
  }
}

/** Connect and complete the STOMP handshake. */
export function connect(options: ClientOptions): Promise<Connection> {
  return Connection.open(options);
}

export class Connection {
  /** where the connection is in its life */
  status: Status = 'connecting';
  /** why the connection ended for good; undefined while it is open or reconnecting */
  error?: Error;
  /** what happened so far */
  readonly stats = { reconnects: 0, heartBeatsSent: 0, heartBeatsReceived: 0 };

  private link?: Link;
  private nextId = 0;
  private closing = false;
  private readonly subscriptions = new Map<string, Subscription>();
  private readyWaiters: Array<() => void> = [];
  // failover (spec/ha.md §4): the group, the back-off, and the SENDs without their receipt
  private readonly members: BrokerMember[];
  private readonly fo?: FailoverOptions;
  private memberIndex = 0;
  private order: number[] = [];
  private readonly connectionId = Math.random().toString(36).slice(2, 10) + Date.now().toString(36);
  private sendNumber = 0;
  private readonly window: PendingSend[] = [];
  private windowWaiters: Array<() => void> = [];
  /** the last CONNECTED's pymq-reclaim-token, offered by a reconnection (spec/ha.md §4.7); a secret: never logged */
  private reclaimToken?: string;

  private constructor(readonly options: ClientOptions) {
    if (options.brokers?.length) this.members = options.brokers;
    else if (options.connector) this.members = [{ connector: options.connector }];
    else throw new Error('connect() needs a connector or brokers');
    if (options.brokers?.length || options.failover) {
      this.fo = { ...DEFAULT_FAILOVER_OPTIONS, ...options.failover };
    } else if (options.reconnect) {
      const r: ReconnectOptions = typeof options.reconnect === 'object' ? options.reconnect : {};
      this.fo = {
        ...DEFAULT_FAILOVER_OPTIONS, initialReconnectDelay: r.initialDelayMs ?? 100, maxReconnectDelay: r.maxDelayMs ?? 10000,
        backOffMultiplier: r.multiplier && r.multiplier >= 1 ? r.multiplier : 2,
        maxReconnectAttempts: r.maxAttempts ? r.maxAttempts : -1, timeout: this.timeoutMs,
        connectionTimeout: 0, // one broker: its attempts have the whole timeoutMs, as before
      };
    }
  }

  /** @internal */
  static async open(options: ClientOptions): Promise<Connection> {
    const conn = new Connection(options);
    const fo = conn.fo;
    if (!fo || !options.brokers?.length) {
      const link = new Link(conn, 1);
      await link.open(conn.members[0], options, conn.timeoutMs);
      conn.publish(link);
      return conn;
    }
    // the first connect: (1 + startupMaxReconnectAttempts) passes over the list, the back-off between attempts
    let last: Error = new Error('no attempt');
    let attempt = 0;
    for (let pass = 0; fo.startupMaxReconnectAttempts < 0 || pass <= fo.startupMaxReconnectAttempts; pass++) {
      for (let k = 0; k < conn.members.length; k++) {
        attempt++;
        await sleep(jitteredDelayBefore(fo, attempt));
        const i = conn.nextMember(-1);
        const link = new Link(conn, 1);
        try {
          await link.open(conn.members[i], options, attemptTimeout(fo, conn.timeoutMs));
        } catch (err) {
          if (err instanceof ServerError) throw err; // refused, not unreachable
          last = err as Error;
          continue;
        }
        conn.memberIndex = i;
        conn.publish(link);
        return conn;
      }
    }
    throw last;
  }

  /** The member of the next attempt: the list in order (or shuffled per pass), after `after` (-1: the first). */
  private nextMember(after: number): number {
    if (this.order.length === 0) {
      const n = this.members.length;
      for (let k = 1; k <= n; k++) this.order.push((((after + k) % n) + n) % n);
      if (this.fo?.randomize) {
        for (let i = n - 1; i > 0; i--) {
          const j = Math.floor(Math.random() * (i + 1));
          [this.order[i], this.order[j]] = [this.order[j], this.order[i]];
        }
      }
    }
    return this.order.shift()!;
  }

  /** the negotiated STOMP version of the link in use */
  get version(): string {
    return this.link?.version ?? '';
  }

  /** the broker's id for the link in use */
  get session(): string {
    return this.link?.session ?? '';
  }

  /** the negotiated heart-beat intervals of the link in use (ms): this side sends every send, expects every receive */
  get heartBeats(): { sendMs: number; receiveMs: number } {
    return { sendMs: this.link?.sendEveryMs ?? 0, receiveMs: this.link?.expectEveryMs ?? 0 };
  }

  private get timeoutMs(): number {
    return this.options.timeoutMs ?? 10000;
  }

  /** @internal the token a reconnecting connection offers in its CONNECT (undefined without failover) */
  _reclaimOffer(): string | undefined {
    return this.fo ? this.reclaimToken : undefined;
  }

  /** @internal a CONNECTED's token (none from a broker with temporary_reclaim_ms: 0 forgets the last) */
  _keepReclaimToken(token: string | undefined): void {
    this.reclaimToken = token || undefined;
  }

  private id(prefix: string): string {
    return `${prefix}${++this.nextId}`;
  }

  private setStatus(status: Status, error?: Error): void {
    this.status = status;
    this.options.onStatus?.(status, error);
  }

  private publish(link: Link): void {
    this.link = link;
    link.start();
    this.setStatus('open');
    const waiters = this.readyWaiters;
    this.readyWaiters = [];
    for (const w of waiters) w();
  }

  /**
   * The link in use, waiting for a new one while reconnecting: within timeoutMs, or the failover timeout
   * (-1: until the attempts are spent).
   */
  private async current(): Promise<Link> {
    const limit = this.fo ? this.fo.timeout : this.timeoutMs;
    for (;;) {
      if (this.error) throw this.error;
      if (this.link && !this.link.error) return this.link;
      await new Promise<void>((resolve, reject) => {
        const timer = limit >= 0 ? setTimeout(() => {
          this.readyWaiters = this.readyWaiters.filter((w) => w !== wake);
          reject(new DisconnectedError(new Error(`no connection to the broker within ${limit} ms`)));
        }, limit) : undefined;
        const wake = () => {
          if (timer) clearTimeout(timer);
          resolve();
        };
        this.readyWaiters.push(wake);
      });
    }
  }

  /** The link in use, or undefined while reconnecting (no waiting). */
  _linkNow(): Link | undefined {
    return this.link && !this.link.error ? this.link : undefined;
  }

  /** @internal a link ended: reconnect, or end the connection */
  _linkLost(link: Link, err: Error): void {
    if (this.link !== link) return; // a link that never went into use
    this.link = undefined;
    for (const sub of this.subscriptions.values()) sub._linkLost();
    const final = this.closing || !this.fo || this.fo.maxReconnectAttempts === 0 || err instanceof ServerError
      || this.error !== undefined;
    if (final) {
      this.end(this.closing ? new ConnectionClosed('connection closed') : err instanceof ServerError ? err : new DisconnectedError(err));
      return;
    }
    this.setStatus('reconnecting', err);
    void this.reconnect(link.gen + 1);
  }

  /** Ends the connection for good. */
  private end(err: Error): void {
    if (this.error) return;
    this.error = err;
    const link = this.link;
    this.link = undefined;
    link?.fail(err);
    for (const sub of this.subscriptions.values()) sub._wake();
    const waiters = this.readyWaiters;
    this.readyWaiters = [];
    for (const w of waiters) w(); // they see the error
    for (const p of this.window.splice(0)) p.reject(err);
    this.wakeWindow();
    this.setStatus('closed', err);
  }

  /**
   * Replaces the lost link with the back-off of spec/ha.md §4.2, trying the members after the lost one, and
   * makes the connection whole on the new link (subscriptions, then the unreceipted SENDs in order) before
   * anything uses it.
   */
  private async reconnect(gen: number): Promise<void> {
    const fo = this.fo!;
    let last: Error = new Error('no attempt');
    this.order = [];
    let after = this.memberIndex;
    let attempt = 0;
    for (; fo.maxReconnectAttempts < 0 || attempt < fo.maxReconnectAttempts; attempt++) {
      await sleep(jitteredDelayBefore(fo, attempt + 1));
      if (this.error) return;
      const i = this.nextMember(after);
      const link = new Link(this, gen);
      try {
        await link.open(this.members[i], this.options, attemptTimeout(fo, this.timeoutMs));
        link.start(); // reads the receipts of the subscriptions made again below
        for (const sub of this.subscriptions.values()) {
          await link.request(this.id('r-'), 'SUBSCRIBE', sub._headers, undefined, this.timeoutMs);
        }
      } catch (err) {
        link.fail(err as Error);
        last = err as Error;
        // refused, not unreachable: trying again meets the same answer; except a client id (or durable
        // subscription) the broker still holds for the lost link it has not seen die yet (a half-open TCP
        // connection ends at its heart-beat deadline): that passes, so it is tried again
        if (err instanceof ServerError && err.code !== 'illegal-state') {
          this.end(err);
          return;
        }
        after = i;
        continue;
      }
      if (this.error) {
        link.fail(this.error);
        return;
      }
      this.stats.reconnects++;
      this.memberIndex = i;
      this.link = link;
      for (const p of this.window) this.transmit(p, link); // again, in order, with their dedup ids
      this.setStatus('open', link.reclaimed === 'true' ? undefined : new TemporariesRenamedError(link.reclaimRefused
        ?? 'no re-claim was offered or answered (a broker with temporary_reclaim_ms: 0 gives no token)'));
      const waiters = this.readyWaiters;
      this.readyWaiters = [];
      for (const w of waiters) w();
      return;
    }
    this.end(new DisconnectedError(new Error(`gave up after ${attempt} attempts: ${last.message}`)));
  }

  /** Writes a SEND of the window on `link`; its receipt settles it, a loss leaves it for the next link. */
  private transmit(p: PendingSend, link: Link): void {
    p.sent = true;
    link.request(this.id('r-'), 'SEND', p.headers, p.body, 0).then((frame) => {
      this.settle(p);
      p.resolve(frame);
    }, (err: Error) => {
      if (err instanceof DisconnectedError && !this.error) return; // goes again on the next link
      this.settle(p);
      p.reject(err);
    });
  }

  private settle(p: PendingSend): void {
    const i = this.window.indexOf(p);
    if (i >= 0) this.window.splice(i, 1);
    this.wakeWindow();
  }

  private wakeWindow(): void {
    const waiters = this.windowWaiters;
    this.windowWaiters = [];
    for (const w of waiters) w();
  }

  /**
   * A SEND through the window (spec/ha.md §4.4): it carries a pymq-dedup-id (the message's dedupId, else
   * `<connection>:<n>`) and asks for a receipt; after a reconnect it goes again with the same id and the
   * broker drops a copy it already has.  Resolves with the RECEIPT.
   */
  private async sendReliably(headers: Header[], message: Message): Promise<Frame> {
    if (!message.dedupId) {
      message.dedupId = `${this.connectionId}:${++this.sendNumber}`;
      headers.push(['pymq-dedup-id', message.dedupId]);
    }
    while (this.window.length >= SEND_WINDOW) {
      if (this.error) throw this.error;
      await new Promise<void>((resolve) => this.windowWaiters.push(resolve));
    }
    if (this.error) throw this.error;
    return new Promise<Frame>((resolve, reject) => {
      const p: PendingSend = { headers, body: message.body, resolve, reject, sent: false };
      this.window.push(p);
      const link = this._linkNow();
      if (link) {
        this.transmit(p, link);
      } else if (this.fo!.timeout >= 0) {
        // reconnecting: a SEND that has not left within the failover timeout is withdrawn and says so
        const limit = this.fo!.timeout;
        setTimeout(() => {
          if (p.sent || !this.window.includes(p)) return;
          this.settle(p);
          reject(new DisconnectedError(new Error(`no connection to the broker within ${limit} ms`)));
        }, limit);
      }
    });
  }

  /** @internal a MESSAGE frame for a subscription */
  _deliver(link: Link, frame: Frame): void {
    const sub = this.subscriptions.get(header(frame, 'subscription') ?? '');
    if (sub) sub._deliver(link, frame);
  }

  /** @internal send a frame without a receipt on the link in use (waits while reconnecting) */
  async _write(command: string, headers: Header[], body?: Uint8Array): Promise<void> {
    (await this.current()).write(command, headers, body);
  }

  /** @internal waits while reconnecting */
  async _ready(): Promise<void> {
    await this.current();
  }

  /** @internal a request on a given link (a transaction's) */
  _requestOn(link: Link, command: string, headers: Header[]): Promise<Frame> {
    return link.request(this.id('r-'), command, headers, undefined, this.timeoutMs);
  }

  /** @internal send a frame with a receipt and wait for the RECEIPT (it confirms every earlier frame) */
  async _request(command: string, headers: Header[], body?: Uint8Array): Promise<Frame> {
    const link = await this.current();
    return link.request(this.id('r-'), command, headers, body, this.timeoutMs);
  }

  /** @internal */
  _pause(paused: boolean): void {
    this.link?.pause(paused);
  }

  /**
   * Send `message` to `destination` ("/queue/x", "/topic/x", "/temp-queue/x").  A persistent message
   * resolves once the broker's receipt says it is durable, and gets its id (unless asyncSend).
   */
  async send(destination: string, message: Message, transaction?: Transaction): Promise<void> {
    if (!Number.isInteger(message.priority) || message.priority < 0 || message.priority > 9) {
      throw new RangeError(`priority must be an integer between 0 and 9, got ${message.priority}`);
    }
    if (!message.timestamp) message.timestamp = Date.now();
    message.destination = destination;
    const headers: Header[] = [['destination', destination], ...message.sendHeaders()];
    if (transaction) {
      await this.current();
      transaction._link().write('SEND', [...headers, ['transaction', transaction.id]], message.body);
      transaction._did();
    } else if (this.fo) {
      const receipt = this.sendReliably(headers, message);
      if (!message.persistent || this.options.asyncSend) {
        receipt.catch(() => undefined); // nobody waits: a final failure ends the connection anyway
        return;
      }
      message.id = header(await receipt, 'message-id');
    } else if (!message.persistent || this.options.asyncSend) {
      await this._write('SEND', headers, message.body);
    } else {
      const receipt = await this._request('SEND', headers, message.body);
      message.id = header(receipt, 'message-id');
    }
  }

  /** Subscribe and wait for the broker to confirm (a bad selector or destination rejects here). */
  async subscribe(destination: string, options: SubscribeOptions = {}): Promise<Subscription> {
    const ack = options.ack ?? 'auto';
    const prefetch = options.prefetch || DEFAULT_PREFETCH;
    const id = this.id('sub-');
    // credit needs acks: an 'auto' subscription is client-individual on the wire, receive() acks
    const headers: Header[] = [['destination', destination], ['id', id],
      ['ack', ack === 'auto' ? 'client-individual' : ack], ['prefetch-count', String(prefetch)]];
    if (options.selector) headers.push(['selector', options.selector]);
    if (options.durableName) headers.push(['durable-subscription-name', options.durableName]);
    if (options.noLocal) headers.push(['no-local', 'true']);
    headers.push(...(options.headers ?? []));
    const sub = new Subscription(this, id, destination, ack, prefetch, headers);
    this.subscriptions.set(id, sub);
    try {
      await this._request('SUBSCRIBE', headers);
    } catch (err) {
      this.subscriptions.delete(id);
      sub._end();
      throw err;
    }
    return sub;
  }

  /** @internal */
  _forget(sub: Subscription): boolean {
    this.subscriptions.delete(sub.id);
    return this.link !== undefined && !this.link.error;
  }

  /** Start a transaction (on the link in use; waits while reconnecting). */
  async begin(): Promise<Transaction> {
    const link = await this.current();
    const tx = new Transaction(this, this.id('tx-'), link);
    link.write('BEGIN', [['transaction', tx.id]]);
    return tx;
  }

  /** DISCONNECT, wait for its receipt (every earlier frame is processed), close the transport. */
  async close(): Promise<void> {
    if (this.error) return;
    this.closing = true;
    // a subscription nobody reads may have paused the transport: end them all so the RECEIPT gets through
    // (unacknowledged messages go back to their queues on the broker anyway)
    for (const sub of this.subscriptions.values()) sub._end();
    const link = this.link;
    this._pause(false);
    try {
      if (link && !link.error) await link.request(this.id('r-'), 'DISCONNECT', [], undefined, this.timeoutMs);
    } finally {
      this.end(new ConnectionClosed('connection closed'));
    }
  }
}

/** The messages of one SUBSCRIBE.  After a reconnect it is subscribed again with the same id and headers. */
export class Subscription {
  private readonly queue: Message[] = [];
  /** the ACK an 'auto' subscription sends when receive() hands a message over */
  private readonly autoAcks = new WeakMap<Message, () => void>();
  private readonly links = new WeakMap<Message, Link>();
  private waiters: Array<() => void> = [];
  private ended = false;
  private paused = false;

  /** @internal */
  constructor(
    private readonly conn: Connection,
    readonly id: string,
    readonly destination: string,
    readonly ack: AckMode,
    private readonly capacity: number,
    /** @internal the SUBSCRIBE headers, for subscribing again after a reconnect */
    readonly _headers: Header[],
  ) {}

  /** @internal */
  _deliver(link: Link, frame: Frame): void {
    if (this.ended) return;
    const m = Message.fromFrame(frame);
    const ackId = header(frame, 'ack');
    const messageId = header(frame, 'message-id') ?? '';
    const acknowledge = (command: 'ACK' | 'NACK', transaction?: string) => {
      if (this.conn.error) throw this.conn.error;
      if (link.error) throw new StaleMessageError(); // its link died: the broker took it back
      if (command === 'NACK' && link.version === '1.0') throw new Error('STOMP 1.0 has no NACK');
      const h: Header[] = link.version === '1.2' && ackId !== undefined
        ? [['id', ackId]] : [['message-id', messageId], ['subscription', this.id]];
      if (transaction) h.push(['transaction', transaction]);
      link.write(command, h);
    };
    this.links.set(m, link);
    if (this.ack === 'auto') this.autoAcks.set(m, () => acknowledge('ACK'));
    else m._ack = acknowledge;
    this.queue.push(m);
    if (this.queue.length > this.capacity && !this.paused) {
      this.paused = true;
      this.conn._pause(true);
    }
    this._wake();
  }

  /** @internal the link died: what it delivered and nobody received comes again from the broker */
  _linkLost(): void {
    this.queue.length = 0;
    this.paused = false;
  }

  /** @internal */
  _wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }

  /**
   * The next message, or null when none arrives within `timeoutMs`.  Rejects with the connection's error
   * once it has ended.  While the connection is reconnecting it waits.
   */
  async receive(timeoutMs = 10000): Promise<Message | null> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this.queue.shift();
      if (m) {
        if (this.paused && this.queue.length < this.capacity / 2) {
          this.paused = false;
          this.conn._pause(false);
        }
        if (this.links.get(m)?.error) continue; // its link died: the broker redelivers it
        const autoAck = this.autoAcks.get(m);
        if (autoAck) {
          try {
            autoAck();
          } catch (err) {
            if (err instanceof StaleMessageError) continue;
            throw err;
          }
        }
        return m;
      }
      if (this.conn.error) throw this.conn.error;
      if (this.ended) throw new Error(`subscription ${this.id} was unsubscribed`);
      const left = deadline - Date.now();
      if (left <= 0) return null;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          this.waiters = this.waiters.filter((w) => w !== wake);
          resolve();
        }, left);
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        this.waiters.push(wake);
      });
    }
  }

  /** The messages as an async iterator, until the subscription or the connection ends. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Message, void, undefined> {
    for (;;) {
      let m: Message | null;
      try {
        m = await this.receive(60_000);
      } catch {
        return;
      }
      if (m) yield m;
    }
  }

  /** @internal stop queueing: drop what was not received and release a paused transport */
  _end(): void {
    this.ended = true;
    this.queue.length = 0;
    if (this.paused) {
      this.paused = false;
      this.conn._pause(false);
    }
    this._wake();
  }

  /** End the subscription; messages not yet received are dropped (unacknowledged ones go back to the queue). */
  async unsubscribe(): Promise<void> {
    this._end();
    if (!this.conn._forget(this)) return; // reconnecting: it will not be subscribed again
    await this.conn._request('UNSUBSCRIBE', [['id', this.id]]);
  }
}

/**
 * A STOMP transaction: its sends, acks and nacks take effect together at commit, or not at all.  When its
 * link is lost the broker aborts it (spec/ha.md §4.5): one that had sent or acknowledged something is then
 * rollback-only (its later calls go on, in a new transaction on the new link, and commit() aborts that and
 * throws TransactionLostError); one that had done nothing simply goes on.  A commit() whose receipt was lost
 * throws TransactionInDoubtError.
 */
export class Transaction {
  private worked = false;
  private rollbackOnly = false;

  /** @internal */
  constructor(private readonly conn: Connection, readonly id: string, private link: Link) {}

  /** @internal the transaction's link: begun again on the link in use when its own was replaced */
  _link(): Link {
    if (this.conn.error) throw this.conn.error;
    if (this.link.error) {
      const now = this.conn._linkNow();
      if (!now) throw new TransactionLostError(); // reconnecting: a send awaits the link first
      if (this.worked) this.rollbackOnly = true;
      now.write('BEGIN', [['transaction', this.id]]);
      this.link = now;
      this.worked = false;
    }
    return this.link;
  }

  /** @internal it sent or acknowledged something */
  _did(): void {
    this.worked = true;
  }

  send(destination: string, message: Message): Promise<void> {
    return this.conn.send(destination, message, this);
  }

  ack(message: Message): void {
    if (!message._ack) throw new Error('only a message of a client-ack subscription can be acknowledged');
    this._link();
    message._ack('ACK', this.id);
    this.worked = true;
  }

  nack(message: Message): void {
    if (!message._ack) throw new Error('only a message of a client-ack subscription can be acknowledged');
    this._link();
    message._ack('NACK', this.id);
    this.worked = true;
  }

  /** Apply the transaction; resolves once the broker confirms it. */
  commit(): Promise<void> {
    return this.finish('COMMIT');
  }

  /** Discard the sends; messages acked in it stay unacknowledged. */
  abort(): Promise<void> {
    return this.finish('ABORT');
  }

  private async finish(command: string): Promise<void> {
    await this.conn._ready();
    const link = this._link();
    const lost = this.rollbackOnly;
    this.rollbackOnly = false;
    this.worked = false;
    if (lost) {
      await this.conn._requestOn(link, 'ABORT', [['transaction', this.id]]);
      if (command === 'COMMIT') throw new TransactionLostError();
      return;
    }
    try {
      await this.conn._requestOn(link, command, [['transaction', this.id]]);
    } catch (err) {
      if (command === 'COMMIT' && err instanceof DisconnectedError) throw new TransactionInDoubtError(err);
      throw err;
    }
  }
}

interface PendingSend {
  headers: Header[];
  body: Uint8Array;
  resolve: (frame: Frame) => void;
  reject: (err: Error) => void;
  sent: boolean;
}

function sleep(ms: number): Promise<void> {
  return ms > 0 ? new Promise((resolve) => setTimeout(resolve, ms)) : Promise.resolve();
}
