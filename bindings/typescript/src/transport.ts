/**
 * What the client needs from a byte stream, so that the same client runs over TCP and TLS in Node
 * (./node) and over WebSocket in browsers and Node (./websocket).  A Connector opens one stream and
 * reports what arrives on it; the client never touches a socket itself.
 */

/** An open byte stream to a broker. */
export interface Transport {
  /** Queue bytes for sending (a whole frame, or a heart-beat EOL). */
  write(data: Uint8Array): void;
  /** Close the stream; `closed` is reported afterwards. */
  close(): void;
  /** Stop (and resume) reading, when the stream supports backpressure (TCP does, WebSocket does not). */
  pause?(): void;
  resume?(): void;
}

/** What a transport reports: bytes as they arrive, and its end (with the cause, unless closed on purpose). */
export interface TransportEvents {
  data(chunk: Uint8Array): void;
  closed(error?: Error): void;
}

/** Opens a stream; resolves once it is ready to carry CONNECT, rejects when it cannot be opened. */
export type Connector = (events: TransportEvents) => Promise<Transport>;
