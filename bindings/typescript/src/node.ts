/**
 * The Node entry point (`@pymq/client/node`): everything of the core, plus TCP and TLS transports and a
 * connect() that takes a host and port or a URL.
 *
 *   stomp://host:port (tcp:// alike)                  plain TCP
 *   stomp+ssl://host:port (ssl://, tls://, stomps://)  TLS with Node's tls (options.tls for CA, certificates)
 *   ws://, wss://                                      STOMP over WebSocket (options.WebSocket: e.g. `ws`)
 *   failover:(stomp://a:61613,stomp://b:61613)?opts    a group of brokers to fail over between (spec/ha.md §4);
 *   stomp://a:61613,stomp://b:61613                    a plain list takes the default failover options
 */
import * as net from 'node:net';
import * as tls from 'node:tls';

import { connect as connectWith, type BrokerMember, type ClientOptions, type Connection } from './client.js';
import { parseBrokerURL, vhostAt, vhostOfPath } from './failover.js';
import type { Connector, Transport } from './transport.js';
import { webSocket, type WebSocketConstructor } from './websocket.js';

export * from './index.js';

export interface TcpOptions {
  host?: string;
  port?: number;
  /** true, or Node's tls.ConnectionOptions (ca, cert, key, servername, rejectUnauthorized ...) */
  tls?: boolean | tls.ConnectionOptions;
}

/** A Connector over TCP, or TLS with `tls` (the server name defaults to the host). */
export function tcp(options: TcpOptions): Connector {
  const host = options.host ?? '127.0.0.1';
  const port = options.port ?? 61613;
  return (events) => new Promise<Transport>((resolve, reject) => {
    let ready = false;
    const useTls = options.tls !== undefined && options.tls !== false;
    const socket: net.Socket = useTls
      ? tls.connect({ host, port, servername: net.isIP(host) ? undefined : host,
        ...(typeof options.tls === 'object' ? options.tls : {}) })
      : net.connect({ host, port });
    socket.setNoDelay(true);
    socket.once(useTls ? 'secureConnect' : 'connect', () => {
      ready = true;
      resolve({
        write: (data) => {
          socket.write(data);
        },
        close: () => socket.destroy(),
        pause: () => socket.pause(),
        resume: () => socket.resume(),
      });
    });
    socket.on('data', (chunk: Uint8Array) => events.data(chunk));
    let failure: Error | undefined;
    socket.on('error', (err) => {
      failure = err;
      if (!ready) reject(new Error(`cannot connect to ${host}:${port}: ${err.message}`));
    });
    socket.on('close', () => {
      if (ready) events.closed(failure ? new Error(`connection lost: ${failure.message}`) : new Error('the broker closed the connection'));
      else reject(failure ?? new Error(`cannot connect to ${host}:${port}`));
    });
  });
}

export interface NodeConnectOptions extends Omit<ClientOptions, 'connector'> {
  /** a Connector of your own (a proxy, a tunnel): wins over url and host/port */
  connector?: Connector;
  /** stomp://, stomp+ssl://, ws:// or wss:// (see the module documentation) */
  url?: string;
  host?: string;
  port?: number;
  tls?: boolean | tls.ConnectionOptions;
  /** for ws:// and wss:// URLs: the WebSocket class (Node 20 has none built in) */
  WebSocket?: WebSocketConstructor;
}

/** The Connector a URL or host/port describes. */
export function connectorFor(options: NodeConnectOptions): Connector {
  if (options.connector) return options.connector;
  if (options.url) {
    const u = new URL(options.url);
    const scheme = u.protocol.replace(/:$/, '');
    if (scheme === 'ws' || scheme === 'wss') return webSocket(options.url, { WebSocket: options.WebSocket });
    const secure = ['stomp+ssl', 'stomp+tls', 'ssl', 'tls', 'stomps'].includes(scheme);
    if (!secure && scheme !== 'stomp' && scheme !== 'tcp') {
      throw new Error(`unsupported URL ${options.url}: use stomp://, stomp+ssl://, ws:// or wss://`);
    }
    return tcp({ host: u.hostname.replace(/^\[|\]$/g, ''), port: u.port ? Number(u.port) : 61613,
      tls: secure ? options.tls ?? true : undefined });
  }
  return tcp({ host: options.host, port: options.port, tls: options.tls });
}

/** Whether `url` names a group of brokers (a failover URL or a comma list). */
export function isGroupURL(url: string): boolean {
  const t = url.trim();
  return t.includes(',') || t.slice(0, 9).toLowerCase() === 'failover:';
}

/** Connect (TCP, TLS or WebSocket; a failover URL: the first broker of the group that answers). */
export function connect(options: NodeConnectOptions): Promise<Connection> {
  if (!options.connector && options.url && isGroupURL(options.url)) {
    const group = parseBrokerURL(options.url);
    const brokers: BrokerMember[] = group.brokers.map((b) => ({
      connector: tcp({ host: b.host, port: b.port, tls: b.tls ? options.tls ?? true : undefined }),
      login: b.username, passcode: b.password, vhost: b.vhost,
    }));
    return connectWith({ ...options, brokers, failover: { ...group.options, ...options.failover } });
  }
  let vhost = options.vhost;
  if (options.url && !options.connector && /^(stomp|tcp|stomp\+ssl|stomp\+tls|ssl|tls|stomps):/i.test(options.url)) {
    vhost = vhostAt({ vhost: vhostOfPath(new URL(options.url).pathname, options.url) }, vhost); // the path wins
  }
  return connectWith({ ...options, vhost, connector: connectorFor(options) });
}
