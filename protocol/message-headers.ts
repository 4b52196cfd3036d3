/**
 * A NATS message's headers, or undefined when nats.js cannot decode them: `msg.headers` decodes
 * lazily and throws for a header block it cannot accept (a name with a space, say), which any
 * client on the bus can send. A request with such headers carries no token we can read, so it is
 * refused `unauthorized` like one without headers; thrown out of a subscription loop instead, it
 * ended that subscription with an unhandled rejection. Typed structurally: protocol/ does not
 * depend on the NATS client.
 */
export function decodedHeaders<H>(msg: { readonly headers?: H }): H | undefined {
  try {
    return msg.headers;
  } catch {
    return undefined;
  }
}
