/**
 * @pymq/client: a thin TypeScript client for the pymq broker.
 *
 * - `connect`, `Connection`, `Subscription`, `Transaction`, `ServerError`: the client (./client)
 * - `Message`: JMS messages with typed properties, decoded like the Python SDK (./message)
 * - `FrameScanner`, `encodeFrame`: the sans-IO STOMP codec (./frame)
 * - `murmur3`, `groupHash`, `GroupRouter`: group routing shared with every pymq engine (./routing)
 */
export {
  connect, Connection, ConnectionClosed, DEFAULT_PREFETCH, ServerError, Subscription, Transaction,
} from './client';
export type { AckMode, ConnectOptions, SubscribeOptions } from './client';
export { encodeFrame, escape, FrameError, FrameScanner, header, unescape } from './frame';
export type { Frame, FrameErrorCode, Header } from './frame';
export {
  BYTES_TYPE, DEFAULT_PRIORITY, MAP_TYPE, Message, MessageFormatError, TEXT_TYPE,
} from './message';
export type { MapValue, MessageKind, PropertyType, PropertyValue } from './message';
export { GroupRouter, groupHash, murmur3, NoDestinationError, sortDestinations } from './routing';
export type { RoutingStrategy } from './routing';
