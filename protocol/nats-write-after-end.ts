import { NodeTransport } from "@nats-io/transport-node/lib/node_transport.js";

/**
 * nats.js 3.4's Node transport writes to a socket it has already ended: when the server closes the
 * connection (nats-server stopping), its 'end' handler ends the socket, and a frame flushed in the
 * same moment is written after that. Node answers a write after end with an 'error' event on the
 * next tick, by which time the transport's 'close' handling may have removed every listener: an
 * uncaught ERR_STREAM_WRITE_AFTER_END then ends the whole process (a coordinator, a participant, the
 * collector) instead of the reconnect the lost server should cause. Such a frame could never be
 * sent; it is dropped, as frames sent once the transport is closed already are. Installed once, on
 * the class, by importing this module (protocol/index.ts does), for every connection in the process.
 */
type Send = (this: NodeTransport, frame: Uint8Array) => Promise<void>;
const prototype = NodeTransport.prototype as unknown as { _send: Send; writeAfterEndGuarded?: true };

if (!prototype.writeAfterEndGuarded) {
  const send = prototype._send;
  prototype._send = function (this: NodeTransport, frame: Uint8Array): Promise<void> {
    const socket = this.socket as NodeTransport["socket"] | undefined;
    if (socket && (socket.writableEnded || socket.destroyed)) return Promise.resolve();
    return send.call(this, frame);
  };
  prototype.writeAfterEndGuarded = true;
}
