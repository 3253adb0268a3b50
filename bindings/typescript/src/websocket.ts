/**
 * STOMP over WebSocket: a Connector for browsers (the global WebSocket) and for Node (pass a WebSocket
 * class, e.g. the `ws` package's, since Node 20 has none built in).  Frames go out as binary messages; text
 * and binary messages are read alike (brokers send either).  The subprotocols offered are STOMP's
 * registered ones (v12.stomp, v11.stomp, v10.stomp).
 */
import { utf8Encode } from './bytes.js';
import type { Connector, Transport } from './transport.js';

/** What this module needs of a WebSocket (the browser's, or a Node implementation's). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  send(data: Uint8Array | ArrayBuffer | string): void;
  close(code?: number, reason?: string): void;
}

export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

export interface WebSocketOptions {
  /** default ['v12.stomp', 'v11.stomp', 'v10.stomp'] */
  protocols?: string[];
  /** the WebSocket class; default globalThis.WebSocket */
  WebSocket?: WebSocketConstructor;
}

export const STOMP_SUBPROTOCOLS = ['v12.stomp', 'v11.stomp', 'v10.stomp'];

/** A Connector that opens `url` (ws:// or wss://). */
export function webSocket(url: string, options: WebSocketOptions = {}): Connector {
  return (events) => new Promise<Transport>((resolve, reject) => {
    const Ctor = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!Ctor) {
      reject(new Error('no WebSocket implementation: pass one as options.WebSocket (in Node, e.g. the ws package)'));
      return;
    }
    const ws = new Ctor(url, options.protocols ?? STOMP_SUBPROTOCOLS);
    ws.binaryType = 'arraybuffer';
    let open = false;
    let closed = false;
    ws.onopen = () => {
      open = true;
      resolve({
        write: (data) => ws.send(data),
        close: () => {
          closed = true;
          ws.close(1000, 'closing');
        },
      });
    };
    ws.onmessage = (ev) => {
      const data = ev.data;
      if (typeof data === 'string') events.data(utf8Encode(data));
      else if (data instanceof ArrayBuffer) events.data(new Uint8Array(data));
      else if (ArrayBuffer.isView(data)) events.data(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
    };
    ws.onerror = () => {
      // the close event that follows says more; before the connection opened this is a refusal
      if (!open) reject(new Error(`cannot open a WebSocket to ${url}`));
    };
    ws.onclose = (ev) => {
      if (!open) {
        reject(new Error(`cannot open a WebSocket to ${url} (close code ${ev.code})`));
        return;
      }
      events.closed(closed ? undefined : new Error(`the WebSocket closed (code ${ev.code}${ev.reason ? `: ${ev.reason}` : ''})`));
    };
  });
}
