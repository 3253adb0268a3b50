/**
 * JMS messages as pymq carries them over STOMP (spec/stomp.md §4 and §7), decoded exactly like the Python
 * SDK's from_frame (vectors: spec/vectors/messages.json).
 *
 * The body type travels in content-type; property types travel in `pymq-types: name=i,other=f,flag=b`
 * because STOMP headers are strings.  JavaScript has one number type, so a property keeps its type next to
 * its value: setProperty infers it (boolean → bool, string → string, bigint or an integral number → int,
 * any other number → float) unless told, and received properties carry the sender's type.  Integers that
 * do not fit a double exactly come back as bigint.
 */
import { base64Decode, base64Encode, latin1Decode, utf8Decode, utf8DecodeStrict, utf8Encode } from './bytes.js';
import { type Frame, type Header } from './frame.js';

export const TEXT_TYPE = 'text/plain;charset=utf-8';
export const BYTES_TYPE = 'application/octet-stream';
export const MAP_TYPE = 'application/x-pymq-map+json';
export const DEFAULT_PRIORITY = 4;

export type MessageKind = 'text' | 'bytes' | 'map';
export type PropertyType = 'string' | 'int' | 'float' | 'bool';
export type PropertyValue = string | number | bigint | boolean;
export type MapValue = string | number | boolean | null | Uint8Array;

/** JMS header fields and protocol machinery: never properties (as in the Python SDK). */
const RESERVED = new Set([
  'destination', 'message-id', 'subscription', 'ack', 'receipt', 'transaction', 'content-length',
  'content-type', 'persistent', 'priority', 'expires', 'expiration', 'timestamp', 'correlation-id',
  'reply-to', 'type', 'redelivered', 'pymq-types', 'pymq-seq', 'transformation', 'browser', 'pymq-dedup-id', 'pymq-jms-types',
]);
const TYPE_CODES: Record<PropertyType, string> = { string: '', int: 'i', float: 'f', bool: 'b' };

function isUtf8(data: Uint8Array): boolean {
  return utf8DecodeStrict(data) !== undefined;
}

/** Python's int(): optional sign and surrounding blanks, digits only. */
function parseIntLike(text: string): bigint | undefined {
  const t = text.trim();
  return /^[+-]?\d+$/.test(t) ? BigInt(t) : undefined;
}

function toNumberOrBig(v: bigint): number | bigint {
  return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
}

function intOr(text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback;
  const v = parseIntLike(text);
  return v === undefined ? fallback : Number(v);
}

/** Python's float(): decimal or exponent notation, inf/infinity/nan, surrounding blanks. */
function parseFloatLike(text: string): number | undefined {
  const t = text.trim().toLowerCase();
  if (/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/.test(t)) return Number(t);
  const m = /^([+-]?)(inf|infinity|nan)$/.exec(t);
  if (!m) return undefined;
  if (m[2] === 'nan') return NaN;
  return m[1] === '-' ? -Infinity : Infinity;
}

function typedValue(value: string, code: string): [PropertyType, PropertyValue] {
  if (code === 'i') {
    const v = parseIntLike(value);
    if (v !== undefined) return ['int', toNumberOrBig(v)];
  } else if (code === 'f') {
    const v = parseFloatLike(value);
    if (v !== undefined) return ['float', v];
  } else if (code === 'b') {
    return ['bool', value === 'true'];
  }
  return ['string', value];
}

function charsetOf(contentType: string): string {
  for (const part of contentType.split(';').slice(1)) {
    const [k, v] = part.trim().split('=', 2);
    if (k.toLowerCase() === 'charset' && v) return v.replace(/^"|"$/g, '').toLowerCase();
  }
  return 'utf-8';
}

function formatFloat(v: number): string {
  // any text that reads back to the same double is fine for pymq-types "f"; String() is the shortest
  return String(v);
}

export class MessageFormatError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MessageFormatError';
  }
}

/**
 * A JMS message.  Build one with {@link Message.text}, {@link Message.bytes} or {@link Message.map}.
 * Received messages also carry the broker's fields (id, redelivered, deliveryCount, sequence) and the raw
 * frame headers.
 */
export class Message {
  /** the body's MIME type; "" sends none */
  contentType: string;
  body: Uint8Array;
  id?: string;
  destination?: string;
  correlationId?: string;
  replyTo?: string;
  type?: string;
  /**
   * pymq-dedup-id (spec/stomp.md §9): the broker drops a second message with the same id on the same
   * destination within its window.  A reconnecting connection gives every send one when it has none.
   */
  dedupId?: string;
  persistent = true;
  priority = DEFAULT_PRIORITY;
  /** absolute expiry, ms since the epoch; 0 = never */
  expires = 0;
  /** ms since the epoch; send sets it when 0 */
  timestamp = 0;
  redelivered = false;
  deliveryCount = 1;
  /** pymq-seq: per-destination sequence number, when the broker sent one */
  sequence?: number;
  /** the MESSAGE frame's headers, as received */
  headers: Header[] = [];

  private readonly props = new Map<string, { type: PropertyType; value: PropertyValue }>();
  private transformation?: string;
  /** @internal how to acknowledge it (set by the subscription that received it) */
  _ack?: (command: 'ACK' | 'NACK', transaction?: string) => void;

  constructor(body: Uint8Array = new Uint8Array(0), contentType = '') {
    this.body = body;
    this.contentType = contentType;
  }

  static text(text: string): Message {
    return new Message(utf8Encode(text), TEXT_TYPE);
  }

  static bytes(data: Uint8Array): Message {
    return new Message(Uint8Array.from(data), BYTES_TYPE);
  }

  /** A MapMessage; values are strings, numbers, booleans, null or bytes ({"$bytes": base64} on the wire). */
  static map(values: Record<string, MapValue>): Message {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(values)) {
      if (v instanceof Uint8Array) out[k] = { $bytes: base64Encode(v) };
      else if (v === null || ['string', 'number', 'boolean'].includes(typeof v)) out[k] = v;
      else throw new MessageFormatError(`map value '${k}' must be a string, number, boolean, null or bytes`);
    }
    return new Message(utf8Encode(JSON.stringify(out)), MAP_TYPE);
  }

  /** The body type by spec/stomp.md §7. */
  get kind(): MessageKind {
    const base = this.contentType.split(';', 1)[0].trim().toLowerCase();
    if (base === MAP_TYPE || this.transformation === 'jms-map-json') return 'map';
    if (base.startsWith('text/') || base === 'application/json' || base === 'application/xml') return 'text';
    if (base) return 'bytes';
    return isUtf8(this.body) ? 'text' : 'bytes';
  }

  /** The body as text, decoded with the content-type's charset (UTF-8 unless it names Latin-1 or ASCII). */
  get text(): string {
    const cs = charsetOf(this.contentType);
    if (['iso-8859-1', 'latin-1', 'latin1', 'l1', 'iso8859-1', 'us-ascii', 'ascii'].includes(cs)) {
      return latin1Decode(this.body);
    }
    return utf8Decode(this.body);
  }

  /** A MapMessage body: numbers, strings, booleans, null, and Uint8Array for {"$bytes": ...}. */
  get map(): Record<string, MapValue> {
    if (this.body.length === 0) return {};
    let raw: unknown;
    try {
      const text = utf8DecodeStrict(this.body);
      if (text === undefined) throw new Error('the body is not valid UTF-8');
      raw = JSON.parse(text);
    } catch (err) {
      throw new MessageFormatError(`map message body is not valid JSON: ${(err as Error).message}`);
    }
    if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
      throw new MessageFormatError('map message body is not a JSON object');
    }
    const out: Record<string, MapValue> = {};
    for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
      if (v !== null && typeof v === 'object') {
        const b64 = (v as Record<string, unknown>).$bytes;
        if (typeof b64 !== 'string') throw new MessageFormatError(`map value '${k}' is an object other than {"$bytes": ...}`);
        try {
          out[k] = base64Decode(b64);
        } catch (err) {
          throw new MessageFormatError(`map value '${k}': ${(err as Error).message}`);
        }
      } else {
        out[k] = v as MapValue;
      }
    }
    return out;
  }

  /**
   * Set a typed property.  Names must be non-empty, not a JMS header name, and free of ',', '=' and line
   * breaks.  The type is inferred unless given (an integral number is an int: pass 'float' to send 3.0).
   */
  setProperty(name: string, value: PropertyValue, type?: PropertyType): this {
    if (!name || RESERVED.has(name)) throw new MessageFormatError(`'${name}' is a header, not a property name`);
    if (/[,=\n\r]/.test(name)) throw new MessageFormatError(`property name '${name}' must not contain ',', '=' or line breaks`);
    let t: PropertyType;
    if (typeof value === 'boolean') t = 'bool';
    else if (typeof value === 'string') t = 'string';
    else if (typeof value === 'bigint') t = 'int';
    else if (typeof value === 'number') t = Number.isInteger(value) ? 'int' : 'float';
    else throw new MessageFormatError(`property '${name}' must be a string, number, bigint or boolean`);
    if (type !== undefined) {
      const fits = type === t || (type === 'float' && t === 'int' && typeof value === 'number');
      if (!fits) throw new MessageFormatError(`property '${name}': a ${typeof value} cannot be sent as ${type}`);
      t = type;
    }
    if (typeof value === 'number' && !Number.isFinite(value)) throw new MessageFormatError(`property '${name}' must be a finite number`);
    this.props.set(name, { type: t, value });
    return this;
  }

  getProperty(name: string): PropertyValue | undefined {
    return this.props.get(name)?.value;
  }

  propertyType(name: string): PropertyType | undefined {
    return this.props.get(name)?.type;
  }

  deleteProperty(name: string): boolean {
    return this.props.delete(name);
  }

  /** Property names, in the order they were set or received. */
  propertyNames(): string[] {
    return [...this.props.keys()];
  }

  /** The properties as a plain object of values. */
  get properties(): Record<string, PropertyValue> {
    return Object.fromEntries([...this.props].map(([k, p]) => [k, p.value]));
  }

  /** JMSXGroupID: every message of a group goes to one consumer. */
  get groupId(): string | undefined {
    const v = this.getProperty('JMSXGroupID');
    return typeof v === 'string' ? v : undefined;
  }

  set groupId(group: string | undefined) {
    if (group === undefined) this.props.delete('JMSXGroupID');
    else this.setProperty('JMSXGroupID', group);
  }

  /** Acknowledge this message (client mode: and every earlier one of its subscription). */
  ack(): void {
    if (!this._ack) throw new MessageFormatError('the message was not received from a subscription');
    this._ack('ACK');
  }

  /** Give the message back for redelivery. */
  nack(): void {
    if (!this._ack) throw new MessageFormatError('the message was not received from a subscription');
    this._ack('NACK');
  }

  /** @internal The SEND headers (destination excluded), as the Python SDK writes them. */
  sendHeaders(): Header[] {
    const h: Header[] = [];
    if (this.contentType) h.push(['content-type', this.contentType]);
    h.push(['persistent', this.persistent ? 'true' : 'false']);
    if (this.priority !== DEFAULT_PRIORITY) h.push(['priority', String(this.priority)]);
    if (this.expires) h.push(['expires', String(this.expires)]);
    if (this.timestamp) h.push(['timestamp', String(this.timestamp)]);
    if (this.correlationId !== undefined) h.push(['correlation-id', this.correlationId]);
    if (this.replyTo !== undefined) h.push(['reply-to', this.replyTo]);
    if (this.type !== undefined) h.push(['type', this.type]);
    if (this.dedupId !== undefined) h.push(['pymq-dedup-id', this.dedupId]);
    const types: string[] = [];
    for (const [name, { type, value }] of this.props) {
      let text: string;
      if (type === 'bool') text = value ? 'true' : 'false';
      else if (type === 'float') text = formatFloat(Number(value));
      else text = String(value);
      h.push([name, text]);
      if (TYPE_CODES[type]) types.push(`${name}=${TYPE_CODES[type]}`);
    }
    // even empty: a message with pymq-types is typed, so the broker's selectors keep its strings strings
    // (a plain header without it compares as a number when it reads as one: spec/selector.md section 3)
    if (this.props.size) h.push(['pymq-types', types.join(',')]);
    return h;
  }

  /** Decode a MESSAGE frame exactly as the Python SDK does. */
  static fromFrame(frame: Frame): Message {
    const h = new Map<string, string>();
    for (const [k, v] of frame.headers) if (!h.has(k)) h.set(k, v);
    const m = new Message(frame.body, h.get('content-type') ?? '');
    m.headers = frame.headers;
    m.transformation = h.get('transformation');
    m.id = h.get('message-id');
    m.destination = h.get('destination');
    m.persistent = (h.get('persistent') ?? 'true').toLowerCase() !== 'false';
    m.priority = intOr(h.get('priority'), DEFAULT_PRIORITY);
    m.timestamp = intOr(h.get('timestamp'), 0);
    m.expires = intOr(h.get('expires'), 0);
    m.correlationId = h.get('correlation-id');
    m.replyTo = h.get('reply-to');
    m.type = h.get('type');
    m.dedupId = h.get('pymq-dedup-id');
    m.redelivered = (h.get('redelivered') ?? 'false').toLowerCase() === 'true';
    const seq = h.get('pymq-seq');
    if (seq && /^[0-9]+$/.test(seq)) m.sequence = Number(seq);
    const types = new Map<string, string>();
    for (const item of (h.get('pymq-types') ?? '').split(',')) {
      if (!item) continue;
      const eq = item.lastIndexOf('=');
      types.set(eq < 0 ? '' : item.slice(0, eq), item.slice(eq + 1));
    }
    for (const [name, value] of h) {
      if (RESERVED.has(name)) continue;
      const code = types.get(name);
      const [type, typed] = code ? typedValue(value, code) : ['string' as PropertyType, value];
      m.props.set(name, { type, value: typed });
    }
    const count = m.props.get('JMSXDeliveryCount');
    if (count !== undefined) {
      m.deliveryCount = typeof count.value === 'string' ? intOr(count.value, 1) : Number(count.value);
      m.props.set('JMSXDeliveryCount', { type: 'int', value: m.deliveryCount });
    }
    const groupSeq = m.props.get('JMSXGroupSeq');
    if (groupSeq !== undefined && groupSeq.type === 'string') {
      m.props.set('JMSXGroupSeq', { type: 'int', value: intOr(String(groupSeq.value), 0) });
    }
    return m;
  }
}
