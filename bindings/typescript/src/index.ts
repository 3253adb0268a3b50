/**
 * @pymq/client: a pymq client for browsers and Node.  This entry point uses no Node API; in Node,
 * `@pymq/client/node` adds TCP and TLS transports.
 *
 * - `connect`, `Connection`, `Subscription`, `Transaction`, `ServerError` and the connection errors: the
 *   client, over any transport (./client)
 * - `webSocket`: STOMP over WebSocket (./websocket); `Connector`, `Transport`: write your own (./transport)
 * - `Message`: JMS messages with typed properties, decoded like the Python SDK (./message)
 * - `FrameScanner`, `encodeFrame`: the sans-IO STOMP codec (./frame)
 * - `parseBrokerURL`: failover URLs and their options (./failover, spec/ha.md §4)
 * - `murmur3`, `groupHash`, `GroupRouter`, `routingKeyOf`: group routing shared with every pymq engine (./routing)
 */
export {
  connect, Connection, ConnectionClosed, DEFAULT_HEART_BEAT, DEFAULT_PREFETCH, DisconnectedError, HeartBeatError,
  SEND_WINDOW, ServerError, StaleMessageError, Subscription, TemporariesRenamedError, Transaction, TransactionInDoubtError,
  TransactionLostError,
} from './client.js';
export type { AckMode, BrokerMember, ClientOptions, ReconnectOptions, Status, SubscribeOptions } from './client.js';
export {
  attemptTimeout, DEFAULT_FAILOVER_OPTIONS, delayBefore, FailoverUrlError, jitteredDelayBefore, parseBrokerAddress, parseBrokerURL,
  vhostAt,
} from './failover.js';
export type { BrokerAddress, BrokerGroup, FailoverOptions, FailoverUrlErrorKind } from './failover.js';
export { STOMP_SUBPROTOCOLS, webSocket } from './websocket.js';
export type { WebSocketConstructor, WebSocketLike, WebSocketOptions } from './websocket.js';
export type { Connector, Transport, TransportEvents } from './transport.js';
export { encodeFrame, escape, FrameError, FrameScanner, header, unescape } from './frame.js';
export type { Frame, FrameErrorCode, Header } from './frame.js';
export {
  BYTES_TYPE, DEFAULT_PRIORITY, MAP_TYPE, Message, MessageFormatError, TEXT_TYPE,
} from './message.js';
export type { MapValue, MessageKind, PropertyType, PropertyValue } from './message.js';
export { GroupRouter, groupHash, murmur3, NoDestinationError, routingKeyOf, sortDestinations } from './routing.js';
export type { RoutingKey, RoutingStrategy } from './routing.js';
