/**
 * A thin pymq client over one TCP connection (Node's net): connect, send with the JMS headers and typed
 * properties, subscribe with ack modes and prefetch, ack/nack, receipts, transactions.
 *
 * The socket's 'data' events feed the sans-IO FrameScanner; RECEIPTs settle the promise of the frame that
 * asked for them, MESSAGEs go to their Subscription's queue.  Every subscription uses broker credit
 * (prefetch-count, 1000 by default), so its queue never holds more and a slow reader never stalls the
 * connection's receipts: 'auto' is JMS AUTO_ACKNOWLEDGE, a client-individual subscription acknowledged as
 * receive() returns each message (as the Python SDK does), not STOMP's ack:auto, which has no credit.
 * Should a broker ever overrun the credit, the socket is paused and TCP pushes back.
 * An ERROR frame ends the connection (the broker closes it after every ERROR):
 * every pending and later call rejects with that {@link ServerError}.  Every wait has a timeout.
 * Heart-beats are not negotiated (0,0).
 */
import * as net from 'node:net';

import { encodeFrame, FrameScanner, header, type Frame, type Header } from './frame';
import { Message } from './message';

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
    this.body = Buffer.from(frame.body).toString('utf-8');
  }
}

/** The connection ended (closed by us, by the broker, or lost). */
export class ConnectionClosed extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConnectionClosed';
  }
}

export interface ConnectOptions {
  host?: string;
  port: number;
  login?: string;
  passcode?: string;
  /** JMS client id: scopes durable subscriptions */
  clientId?: string;
  /** the one STOMP version to accept; default "1.1,1.2" */
  version?: string;
  /** connect and receipt waits (ms); default 10000 */
  timeoutMs?: number;
  /** persistent sends resolve without waiting for the broker's receipt */
  asyncSend?: boolean;
}

/** auto: receive() acknowledges each message it returns; client: ack() covers every earlier message of
 *  the subscription too; client-individual: one message at a time */
export type AckMode = 'auto' | 'client' | 'client-individual';

export const DEFAULT_PREFETCH = 1000;

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
  timer: NodeJS.Timeout;
}

/** Connect and complete the STOMP handshake. */
export function connect(options: ConnectOptions): Promise<Connection> {
  return Connection.open(options);
}

export class Connection {
  /** the negotiated STOMP version */
  version = '1.2';
  /** the broker's id for this connection */
  session = '';
  /** why the connection ended; undefined while it is open */
  error?: Error;

  private readonly scanner = new FrameScanner({ version: '1.0', maxFrameSize: 64 * 1024 * 1024 });
  private readonly receipts = new Map<string, Waiter>();
  private readonly subscriptions = new Map<string, Subscription>();
  private nextId = 0;
  private connected?: Waiter;

  private constructor(private readonly socket: net.Socket, readonly options: ConnectOptions) {}

  /** @internal */
  static open(options: ConnectOptions): Promise<Connection> {
    const timeoutMs = options.timeoutMs ?? 10000;
    return new Promise((resolve, reject) => {
      const socket = net.connect({ host: options.host ?? '127.0.0.1', port: options.port });
      socket.setNoDelay(true);
      const conn = new Connection(socket, options);
      conn.connected = {
        resolve: (frame) => {
          conn.version = header(frame, 'version') ?? '1.0';
          conn.session = header(frame, 'session') ?? '';
          conn.scanner.version = conn.version;
          resolve(conn);
          conn.onData(new Uint8Array(0)); // frames pipelined after CONNECTED
        },
        reject,
        timer: setTimeout(() => conn.fail(new ConnectionClosed(`no CONNECTED within ${timeoutMs} ms`)), timeoutMs),
      };
      socket.on('data', (chunk) => conn.onData(chunk));
      socket.on('error', (err) => conn.fail(new ConnectionClosed(`connection lost: ${err.message}`)));
      socket.on('close', () => conn.fail(new ConnectionClosed('the broker closed the connection')));
      socket.once('connect', () => {
        const headers: Header[] = [
          ['accept-version', options.version ?? '1.1,1.2'], ['host', '/'],
          ['login', options.login ?? 'guest'], ['passcode', options.passcode ?? 'guest'], ['heart-beat', '0,0'],
        ];
        if (options.clientId) headers.push(['client-id', options.clientId]);
        socket.write(encodeFrame('CONNECT', headers, undefined, '1.2'));
      });
    });
  }

  private get timeoutMs(): number {
    return this.options.timeoutMs ?? 10000;
  }

  private id(prefix: string): string {
    return `${prefix}${++this.nextId}`;
  }

  private onData(chunk: Uint8Array): void {
    if (this.error) return;
    let frames: Frame[];
    try {
      frames = this.scanner.feed(chunk);
    } catch (err) {
      this.fail(new ConnectionClosed(`the broker sent a malformed frame: ${(err as Error).message}`));
      return;
    }
    for (const frame of frames) this.dispatch(frame);
  }

  private dispatch(frame: Frame): void {
    switch (frame.command) {
      case 'CONNECTED': {
        const w = this.connected;
        this.connected = undefined;
        if (w) {
          clearTimeout(w.timer);
          w.resolve(frame);
        }
        return;
      }
      case 'RECEIPT': {
        const id = header(frame, 'receipt-id') ?? '';
        const w = this.receipts.get(id);
        if (w) {
          this.receipts.delete(id);
          clearTimeout(w.timer);
          w.resolve(frame);
        }
        return;
      }
      case 'MESSAGE': {
        const sub = this.subscriptions.get(header(frame, 'subscription') ?? '');
        if (sub) sub._deliver(frame);
        return;
      }
      case 'ERROR':
        this.fail(new ServerError(frame));
    }
  }

  /** @internal end the connection: every waiter and later call gets `err` */
  fail(err: Error): void {
    if (this.error) return;
    this.error = err;
    const waiters = [...this.receipts.values()];
    this.receipts.clear();
    if (this.connected) waiters.push(this.connected);
    this.connected = undefined;
    for (const w of waiters) {
      clearTimeout(w.timer);
      w.reject(err);
    }
    for (const sub of this.subscriptions.values()) sub._wake();
    this.socket.destroy();
  }

  /** @internal */
  _write(command: string, headers: Header[], body?: Uint8Array): void {
    if (this.error) throw this.error;
    this.socket.write(encodeFrame(command, headers, body, this.version));
  }

  /** @internal send a frame with a receipt and wait for the RECEIPT (it confirms every earlier frame) */
  _request(command: string, headers: Header[], body?: Uint8Array): Promise<Frame> {
    if (this.error) return Promise.reject(this.error);
    const id = this.id('r-');
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.receipts.delete(id);
        reject(new Error(`no RECEIPT for ${command} within ${this.timeoutMs} ms`));
      }, this.timeoutMs);
      this.receipts.set(id, { resolve, reject, timer });
      try {
        this._write(command, [...headers, ['receipt', id]], body);
      } catch (err) {
        this.receipts.delete(id);
        clearTimeout(timer);
        reject(err as Error);
      }
    });
  }

  /** @internal */
  _pause(paused: boolean): void {
    if (paused) this.socket.pause();
    else this.socket.resume();
  }

  /**
   * Send `message` to `destination` ("/queue/x", "/topic/x", "/temp-queue/x").  A persistent message
   * resolves once the broker's receipt says it is durable, and gets its id (unless asyncSend).
   */
  async send(destination: string, message: Message, transaction?: string): Promise<void> {
    if (!Number.isInteger(message.priority) || message.priority < 0 || message.priority > 9) {
      throw new RangeError(`priority must be an integer between 0 and 9, got ${message.priority}`);
    }
    if (!message.timestamp) message.timestamp = Date.now();
    message.destination = destination;
    const headers: Header[] = [['destination', destination], ...message.sendHeaders()];
    if (transaction) {
      this._write('SEND', [...headers, ['transaction', transaction]], message.body);
    } else if (!message.persistent || this.options.asyncSend) {
      this._write('SEND', headers, message.body);
    } else {
      const receipt = await this._request('SEND', headers, message.body);
      message.id = header(receipt, 'message-id');
    }
  }

  /** Subscribe and wait for the broker to confirm (a bad selector or destination rejects here). */
  async subscribe(destination: string, options: SubscribeOptions = {}): Promise<Subscription> {
    const ack = options.ack ?? 'auto';
    const prefetch = options.prefetch || DEFAULT_PREFETCH;
    const sub = new Subscription(this, this.id('sub-'), destination, ack, prefetch);
    // credit needs acks: an 'auto' subscription is client-individual on the wire, receive() acks
    const headers: Header[] = [['destination', destination], ['id', sub.id],
      ['ack', ack === 'auto' ? 'client-individual' : ack], ['prefetch-count', String(prefetch)]];
    if (options.selector) headers.push(['selector', options.selector]);
    if (options.durableName) headers.push(['durable-subscription-name', options.durableName]);
    if (options.noLocal) headers.push(['no-local', 'true']);
    headers.push(...(options.headers ?? []));
    this.subscriptions.set(sub.id, sub);
    try {
      await this._request('SUBSCRIBE', headers);
    } catch (err) {
      this.subscriptions.delete(sub.id);
      throw err;
    }
    return sub;
  }

  /** @internal */
  _forget(sub: Subscription): void {
    this.subscriptions.delete(sub.id);
  }

  /** Start a transaction. */
  begin(): Transaction {
    const tx = new Transaction(this, this.id('tx-'));
    this._write('BEGIN', [['transaction', tx.id]]);
    return tx;
  }

  /** DISCONNECT, wait for its receipt (every earlier frame is processed), close the socket. */
  async close(): Promise<void> {
    if (this.error) return;
    // a subscription nobody reads may have paused the socket: end them all so the RECEIPT gets through
    // (unacknowledged messages go back to their queues on the broker anyway)
    for (const sub of this.subscriptions.values()) sub._end();
    this.socket.resume();
    try {
      await this._request('DISCONNECT', []);
    } finally {
      this.fail(new ConnectionClosed('connection closed'));
    }
  }
}

/** The messages of one SUBSCRIBE. */
export class Subscription {
  private readonly queue: Message[] = [];
  /** the ACK an 'auto' subscription sends when receive() hands a message over */
  private readonly autoAcks = new WeakMap<Message, () => void>();
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
  ) {}

  /** @internal */
  _deliver(frame: Frame): void {
    if (this.ended) return;
    const m = Message.fromFrame(frame);
    const ackId = header(frame, 'ack');
    const messageId = header(frame, 'message-id') ?? '';
    const acknowledge = (command: 'ACK' | 'NACK', transaction?: string) => {
      if (command === 'NACK' && this.conn.version === '1.0') throw new Error('STOMP 1.0 has no NACK');
      const h: Header[] = this.conn.version === '1.2' && ackId !== undefined
        ? [['id', ackId]] : [['message-id', messageId], ['subscription', this.id]];
      if (transaction) h.push(['transaction', transaction]);
      this.conn._write(command, h);
    };
    if (this.ack === 'auto') this.autoAcks.set(m, () => acknowledge('ACK'));
    else m._ack = acknowledge;
    this.queue.push(m);
    if (this.queue.length > this.capacity && !this.paused) {
      this.paused = true;
      this.conn._pause(true);
    }
    this._wake();
  }

  /** @internal */
  _wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const w of waiters) w();
  }

  /**
   * The next message, or null when none arrives within `timeoutMs`.  Rejects with the connection's error
   * once it has ended and every message that had arrived was received.
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
        this.autoAcks.get(m)?.();
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

  /** @internal stop queueing: drop what was not received and release a paused socket */
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
    try {
      await this.conn._request('UNSUBSCRIBE', [['id', this.id]]);
    } finally {
      this.conn._forget(this);
    }
  }
}

/** A STOMP transaction: its sends, acks and nacks take effect together at commit, or not at all. */
export class Transaction {
  /** @internal */
  constructor(private readonly conn: Connection, readonly id: string) {}

  send(destination: string, message: Message): Promise<void> {
    return this.conn.send(destination, message, this.id);
  }

  ack(message: Message): void {
    if (!message._ack) throw new Error('only a message of a client-ack subscription can be acknowledged');
    message._ack('ACK', this.id);
  }

  nack(message: Message): void {
    if (!message._ack) throw new Error('only a message of a client-ack subscription can be acknowledged');
    message._ack('NACK', this.id);
  }

  /** Apply the transaction; resolves once the broker confirms it. */
  async commit(): Promise<void> {
    await this.conn._request('COMMIT', [['transaction', this.id]]);
  }

  /** Discard the sends; messages acked in it stay unacknowledged. */
  async abort(): Promise<void> {
    await this.conn._request('ABORT', [['transaction', this.id]]);
  }
}
