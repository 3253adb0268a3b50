import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { encodeFrame, FrameError, FrameScanner, type Frame } from '../src/frame.js';
import { fromHex, loadVectors, toHex } from './vectors.js';

const VECTORS = loadVectors('frames.json');

/** the Python error classes the vectors name, as this binding's wire codes */
const CLASS_CODES: Record<string, string> = {
  MalformedFrame: 'malformed-frame', BadEscape: 'bad-escape', FrameTooLarge: 'frame-too-large',
  InvalidHeader: 'invalid-header',
};

/** a small seeded generator (mulberry32) so random splits are reproducible */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function splits(n: number, mode: string, seed: number): number[] {
  if (mode === 'whole') return [];
  if (mode === 'bytewise') return new Array(n).fill(1);
  const rand = rng(seed);
  const out: number[] = [];
  for (let left = n; left > 0;) {
    const k = 1 + Math.floor(rand() * left);
    out.push(k);
    left -= k;
  }
  return out;
}

/** feed in chunks, then drain what a negotiating frame kept back, as a connection does */
function feedAll(scanner: FrameScanner, data: Uint8Array, chunks: number[]): Frame[] {
  const out: Frame[] = [];
  let pos = 0;
  for (const size of chunks) {
    out.push(...scanner.feed(data.subarray(pos, pos + size)));
    pos += size;
  }
  out.push(...scanner.feed(data.subarray(pos)));
  for (;;) {
    const more = scanner.feed();
    if (more.length === 0) return out;
    out.push(...more);
  }
}

describe('frames.json parse vectors', () => {
  assert.ok(VECTORS.parse.length > 0);
  for (const c of VECTORS.parse) {
    ['whole', 'bytewise', 'random', 'random', 'random'].forEach((mode, i) => {
      it(`${c.name} (${mode}${mode === 'random' ? i : ''})`, () => {
        const data = fromHex(c.input_hex);
        const scanner = new FrameScanner({
          version: c.version, maxFrameSize: c.max_frame_size, maxHeaders: c.max_headers,
        });
        const chunks = splits(data.length, mode, i);
        if (c.error) {
          assert.throws(() => feedAll(scanner, data, chunks), (err: unknown) => {
            assert.ok(err instanceof FrameError, String(err));
            assert.equal(err.code, CLASS_CODES[c.error.class]);
            assert.ok(err.message.includes(c.error.contains), err.message);
            return true;
          });
          assert.throws(() => scanner.feed(new TextEncoder().encode('SEND\n\n\0')), FrameError);
          return;
        }
        const got = feedAll(scanner, data, chunks).map((f) => [f.command, f.headers, toHex(f.body)]);
        const want = c.frames.map((f: { command: string; headers: string[][]; body_hex: string }) =>
          [f.command, f.headers, f.body_hex]);
        assert.deepEqual(got, want);
        if (c.buffered !== undefined) assert.equal(scanner.buffered, c.buffered);
      });
    });
  }
});

describe('frames.json encode vectors', () => {
  for (const c of VECTORS.encode) {
    it(c.name, () => {
      const encode = () => encodeFrame(c.command, c.headers, fromHex(c.body_hex), c.version);
      if (c.error) {
        assert.throws(encode, (err: unknown) => err instanceof FrameError
          && err.code === CLASS_CODES[c.error.class] && err.message.includes(c.error.contains));
      } else {
        assert.equal(toHex(encode()), c.bytes_hex);
      }
    });
  }
});

describe('scanner', () => {
  it('pauses after CONNECT until fed again', () => {
    const scanner = new FrameScanner({ version: '1.0' });
    const first = scanner.feed(new TextEncoder().encode('CONNECT\naccept-version:1.2\n\n\0SEND\ndestination:/q\nk:a\\cb\n\n\0'));
    assert.deepEqual(first.map((f) => f.command), ['CONNECT']);
    scanner.version = '1.2';
    assert.deepEqual(scanner.feed()[0].headers, [['destination', '/q'], ['k', 'a:b']]);
  });

  it('round-trips a 1 MiB binary body with escaped headers in 7001-byte pieces', () => {
    const body = new Uint8Array(1 << 20).map((_, i) => i & 0xff);
    const headers: [string, string][] = [['destination', '/queue/a:b'], ['k\nx', 'v:\\\r\n']];
    const data = encodeFrame('SEND', headers, body);
    const scanner = new FrameScanner({ version: '1.2' });
    const frames: Frame[] = [];
    for (let i = 0; i < data.length; i += 7001) frames.push(...scanner.feed(data.subarray(i, i + 7001)));
    assert.equal(frames.length, 1);
    assert.deepEqual(frames[0].headers.slice(0, 2), headers);
    assert.deepEqual(frames[0].body, body);
    assert.equal(scanner.buffered, 0);
  });

  it('parses many small frames from one read', () => {
    const one = encodeFrame('SEND', [['destination', '/queue/a']], new TextEncoder().encode('xxxxxxxxxx'));
    const data = new Uint8Array(one.length * 5000 + 7);
    for (let i = 0; i < 5000; i++) data.set(one, i * one.length);
    data.set(one.subarray(0, 7), one.length * 5000);
    const scanner = new FrameScanner({ version: '1.2' });
    assert.equal(scanner.feed(data).length, 5000);
    assert.equal(scanner.buffered, 7);
  });
});
