/**
 * pymq's STOMP 1.0/1.1/1.2 frame codec: a sans-IO {@link FrameScanner} that takes bytes in any split and
 * returns whole frames, and {@link encodeFrame}, which writes one frame.
 *
 * Rules: spec/stomp.md §2; vectors: spec/vectors/frames.json, shared with the Python reference
 * (pymq/protocol/_scanner_py.py).  EOLs between frames are heart-beats; lines end in LF or CRLF; a header
 * splits at its first colon and is never trimmed; the first of a repeated header wins; from 1.1 on names
 * and values are unescaped (\r \n \c \\, anything else is a bad-escape error) except in CONNECT, STOMP and
 * CONNECTED; a body is content-length bytes followed by NUL, or runs to the first NUL.
 * Nothing here touches a socket.
 */

export type Header = [name: string, value: string];

/** One STOMP frame; `headers` holds each name once (its first occurrence) in arrival order. */
export interface Frame {
  command: string;
  headers: Header[];
  body: Uint8Array;
}

/** The value of a header, or undefined. */
export function header(frame: Frame, name: string): string | undefined {
  for (const [n, v] of frame.headers) if (n === name) return v;
  return undefined;
}

export const DEFAULT_MAX_FRAME_SIZE = 4 * 1024 * 1024;
export const DEFAULT_MAX_HEADERS = 1000;

/** Wire error codes of spec/stomp.md §6 the codec raises (Python classes in parentheses). */
export type FrameErrorCode =
  | 'malformed-frame' // MalformedFrame
  | 'bad-escape' // BadEscape
  | 'frame-too-large' // FrameTooLarge
  | 'invalid-header'; // InvalidHeader

export class FrameError extends Error {
  constructor(
    readonly code: FrameErrorCode,
    message: string,
    readonly size?: number,
    readonly limit?: number,
  ) {
    super(message);
    this.name = 'FrameError';
  }
}

function tooLarge(size: number, limit: number): FrameError {
  return new FrameError('frame-too-large', `frame of ${size} bytes exceeds the limit of ${limit} bytes`, size, limit);
}

/** CONNECT, STOMP and CONNECTED headers are never escaped (the 1.2 rule, kept for every version). */
function unescapedCommand(command: string): boolean {
  return command === 'CONNECT' || command === 'STOMP' || command === 'CONNECTED';
}

/** STOMP header escaping; `version` 1.1 has no `\\r` escape, so a CR travels raw (spec/stomp.md §2). */
export function escape(text: string, version = '1.2'): string {
  const pattern = version === '1.1' ? /[\\\n:]/g : /[\\\n:\r]/g;
  return text.replace(pattern, (c) => (c === '\\' ? '\\\\' : c === '\n' ? '\\n' : c === ':' ? '\\c' : '\\r'));
}

const UNESCAPES: Record<string, string> = { r: '\r', n: '\n', c: ':', '\\': '\\' };

export function unescape(text: string): string {
  if (!text.includes('\\')) return text;
  let out = '';
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c !== '\\') {
      out += c;
      continue;
    }
    if (i + 1 >= text.length) throw new FrameError('bad-escape', 'header ends with a lone backslash');
    const rep = UNESCAPES[text[i + 1]];
    if (rep === undefined) throw new FrameError('bad-escape', `undefined escape sequence '\\${text[i + 1]}' in header`);
    out += rep;
    i++;
  }
  return out;
}

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Encode one frame.  A content-length in `headers` is ignored; one is added when the body is not empty.
 * With 1.0, and for CONNECT/STOMP/CONNECTED, headers go unescaped: a name or value that cannot (a LF, or
 * a ':' in a name) is an invalid-header error rather than a corrupted stream.
 */
export function encodeFrame(command: string, headers: Iterable<Header>, body: Uint8Array = new Uint8Array(0),
  version = '1.2'): Uint8Array {
  const raw = version === '1.0' || unescapedCommand(command);
  let text = command + '\n';
  for (const [name, value] of headers) {
    if (name === 'content-length') continue;
    if (raw) {
      if (name.includes('\n') || value.includes('\n') || name.includes(':')) {
        throw new FrameError('invalid-header',
          `header '${name}' cannot be sent unescaped in a ${command} frame (STOMP ${version})`);
      }
      text += `${name}:${value}\n`;
    } else {
      text += `${escape(name, version)}:${escape(value, version)}\n`;
    }
  }
  if (body.length > 0) text += `content-length:${body.length}\n`;
  text += '\n';
  const head = utf8.encode(text);
  const out = new Uint8Array(head.length + body.length + 1);
  out.set(head, 0);
  out.set(body, head.length);
  return out; // the last byte is already 0
}

interface Pending {
  command: string;
  headers: Header[];
  length: number; // content-length, or -1
  bodyStart: number; // relative to pos
}

/**
 * Incremental STOMP frame parser.  `feed()` bytes as they arrive; it returns the complete frames found so
 * far and keeps at most one partial frame.  After an error it stays failed.  It returns right after a
 * CONNECT, STOMP or CONNECTED frame and keeps later bytes: they must be parsed with the version that
 * frame negotiates.  Set `version`, then call `feed()` with no data to go on.
 */
export class FrameScanner {
  maxFrameSize: number;
  maxHeaders: number;
  /** drives unescaping: "1.0" does none */
  version: string;

  private buf = new Uint8Array(0);
  private len = 0; // bytes of buf in use
  private pos = 0; // start of the frame being scanned
  private scan = 0; // where to resume looking for the header end or the NUL
  private failed: FrameError | null = null;
  private pending: Pending | null = null;

  constructor(options: { version?: string; maxFrameSize?: number; maxHeaders?: number } = {}) {
    this.version = options.version ?? '1.0';
    this.maxFrameSize = options.maxFrameSize ?? DEFAULT_MAX_FRAME_SIZE;
    this.maxHeaders = options.maxHeaders ?? DEFAULT_MAX_HEADERS;
  }

  /** Bytes held for a frame that has not completed yet. */
  get buffered(): number {
    return this.len - this.pos;
  }

  feed(data: Uint8Array = new Uint8Array(0)): Frame[] {
    if (this.failed) throw this.failed;
    this.append(data);
    const frames: Frame[] = [];
    try {
      for (;;) {
        const frame = this.next();
        if (frame === null) break;
        frames.push(frame);
        if (unescapedCommand(frame.command)) break; // later bytes wait for the negotiated version
      }
    } catch (err) {
      if (err instanceof FrameError) {
        this.failed = err;
        this.buf = new Uint8Array(0);
        this.len = this.pos = this.scan = 0;
        this.pending = null;
      }
      throw err;
    }
    if (this.pos > 0) {
      // compact once per feed, not once per frame
      this.buf.copyWithin(0, this.pos, this.len);
      this.len -= this.pos;
      this.scan -= this.pos;
      this.pos = 0;
    }
    return frames;
  }

  private append(data: Uint8Array): void {
    if (data.length === 0) return;
    if (this.len + data.length > this.buf.length) {
      const grown = new Uint8Array(Math.max(this.len + data.length, this.buf.length * 2, 4096));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(data, this.len);
    this.len += data.length;
  }

  private next(): Frame | null {
    const buf = this.buf;
    const n = this.len;
    const limit = this.maxFrameSize;
    let p = this.pos;
    if (this.pending === null) {
      while (p < n && (buf[p] === 10 || buf[p] === 13)) {
        // heart-beats
        if (buf[p] === 13) {
          if (p + 1 >= n) break; // a CR whose LF has not arrived yet
          if (buf[p + 1] !== 10) throw new FrameError('malformed-frame', 'stray CR before a command');
        }
        p++;
      }
      this.pos = p;
      if (this.scan < p) this.scan = p;
      if (p >= n || buf[p] === 13) return null;
      const [headLen, bodyStart] = this.headerEnd(p);
      if (headLen < 0) {
        if (n - p > limit) throw tooLarge(n - p, limit);
        return null;
      }
      if (bodyStart > limit) throw tooLarge(bodyStart, limit);
      const [command, headers, length] = this.parseHead(buf.subarray(p, p + headLen));
      this.pending = { command, headers, length, bodyStart };
      this.scan = p + bodyStart;
    }
    const pf = this.pending;
    const b = p + pf.bodyStart;
    let end: number;
    if (pf.length >= 0) {
      if (pf.bodyStart + pf.length > limit) throw tooLarge(pf.bodyStart + pf.length, limit);
      if (n < b + pf.length + 1) return null;
      if (buf[b + pf.length] !== 0) {
        throw new FrameError('malformed-frame',
          `${pf.command} frame: expected NUL after ${pf.length} body bytes (content-length)`);
      }
      end = b + pf.length;
    } else {
      const i = buf.subarray(this.scan, n).indexOf(0);
      if (i < 0) {
        if (n - p > limit) throw tooLarge(n - p, limit);
        this.scan = n;
        return null;
      }
      end = this.scan + i;
      if (end - p > limit) throw tooLarge(end - p, limit);
    }
    const body = buf.slice(b, end);
    this.pos = this.scan = end + 1;
    this.pending = null;
    return { command: pf.command, headers: pf.headers, body };
  }

  /** [length of the command and header text, offset of the body], relative to p; [-1, -1] while the blank
   *  line has not arrived.  Resumes where the last search stopped. */
  private headerEnd(p: number): [number, number] {
    const buf = this.buf;
    const n = this.len;
    let from = Math.max(this.scan - 2, p);
    for (;;) {
      const j = buf.subarray(from, n).indexOf(10);
      if (j < 0) break;
      const i = from + j;
      if (i + 1 >= n) break;
      if (buf[i + 1] === 10) return [i - p, i + 2 - p];
      if (buf[i + 1] === 13) {
        if (i + 2 >= n) break;
        if (buf[i + 2] === 10) return [i - p, i + 3 - p];
      }
      from = i + 1;
    }
    this.scan = Math.max(n - 2, p);
    return [-1, -1];
  }

  private parseHead(head: Uint8Array): [string, Header[], number] {
    if (head.indexOf(0) >= 0) throw new FrameError('malformed-frame', 'NUL inside the header block');
    let text: string;
    try {
      text = strictUtf8.decode(head);
    } catch {
      throw new FrameError('malformed-frame', 'frame header is not valid UTF-8');
    }
    const lines = text.split('\n');
    let command = lines[0];
    if (command.endsWith('\r')) command = command.slice(0, -1);
    if (!command) throw new FrameError('malformed-frame', 'empty command line');
    const escaped = this.version !== '1.0' && !unescapedCommand(command);
    if (lines.length - 1 > this.maxHeaders) {
      throw new FrameError('malformed-frame',
        `${command} frame has ${lines.length - 1} headers, more than the limit of ${this.maxHeaders}`);
    }
    const headers: Header[] = [];
    const seen = new Set<string>();
    for (let line of lines.slice(1)) {
      if (line.endsWith('\r')) line = line.slice(0, -1);
      const colon = line.indexOf(':');
      if (colon < 0) throw new FrameError('malformed-frame', `${command} frame: header line without ':'`);
      if (colon === 0) throw new FrameError('malformed-frame', `${command} frame: header with an empty name`);
      let name = line.slice(0, colon);
      let value = line.slice(colon + 1);
      if (escaped) {
        name = unescape(name);
        value = unescape(value);
      }
      if (seen.has(name)) continue;
      seen.add(name);
      headers.push([name, value]);
    }
    let length = -1;
    const cl = headers.find(([n]) => n === 'content-length');
    if (cl) {
      if (!/^[0-9]+$/.test(cl[1])) {
        throw new FrameError('invalid-header', `${command} frame: content-length '${cl[1]}' is not a non-negative integer`);
      }
      length = Number(cl[1]); // beyond 2^53 it is still far over any limit
    }
    return [command, headers, length];
  }
}
