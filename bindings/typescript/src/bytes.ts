/**
 * Byte helpers that work the same in browsers and Node: UTF-8 through TextEncoder/TextDecoder, Latin-1 and
 * base64 by hand (no Buffer, which browsers do not have).
 */
const encoder = new TextEncoder();
const utf8Lenient = new TextDecoder('utf-8');
const utf8Strict = new TextDecoder('utf-8', { fatal: true });

export function utf8Encode(text: string): Uint8Array {
  return encoder.encode(text);
}

/** UTF-8 to text; invalid sequences become U+FFFD. */
export function utf8Decode(data: Uint8Array): string {
  return utf8Lenient.decode(data);
}

/** UTF-8 to text, or undefined when the bytes are not valid UTF-8. */
export function utf8DecodeStrict(data: Uint8Array): string | undefined {
  try {
    return utf8Strict.decode(data);
  } catch {
    return undefined;
  }
}

/** Each byte as the code point of the same value (ISO-8859-1). */
export function latin1Decode(data: Uint8Array): string {
  let out = '';
  for (let i = 0; i < data.length; i += 8192) {
    out += String.fromCharCode(...data.subarray(i, i + 8192));
  }
  return out;
}

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const LOOKUP = new Int16Array(128).fill(-1);
for (let i = 0; i < ALPHABET.length; i++) LOOKUP[ALPHABET.charCodeAt(i)] = i;

/** Standard base64 with padding (RFC 4648 §4). */
export function base64Encode(data: Uint8Array): string {
  let out = '';
  let i = 0;
  for (; i + 2 < data.length; i += 3) {
    const n = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
    out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63] + ALPHABET[(n >> 6) & 63] + ALPHABET[n & 63];
  }
  if (i < data.length) {
    const n = (data[i] << 16) | ((i + 1 < data.length ? data[i + 1] : 0) << 8);
    out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63];
    out += i + 1 < data.length ? ALPHABET[(n >> 6) & 63] + '=' : '==';
  }
  return out;
}

/** Decodes standard base64 (padding optional, no whitespace); throws on any other character. */
export function base64Decode(text: string): Uint8Array {
  const clean = text.endsWith('==') ? text.slice(0, -2) : text.endsWith('=') ? text.slice(0, -1) : text;
  if (clean.length % 4 === 1) throw new Error('invalid base64 length');
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let acc = 0;
  let j = 0;
  for (let i = 0; i < clean.length; i++) {
    const c = clean.charCodeAt(i);
    const v = c < 128 ? LOOKUP[c] : -1;
    if (v < 0) throw new Error(`invalid base64 character at ${i}`);
    acc = (acc << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[j++] = (acc >> bits) & 0xff;
    }
  }
  return out.subarray(0, j);
}
