import { CheckpointError } from "./errors.js";

/** What readCappedText needs of a fetch response: the global fetch's and undici's both fit. */
export interface BodyStream {
  body: { getReader(): { read(): Promise<{ done: boolean; value?: Uint8Array }>; cancel(): Promise<void> } } | null;
}

/**
 * Reads a fetch response's body as text, refusing (`payload_too_large`) once it passes `maxBytes`
 * and cancelling the rest (which closes the connection): a peer must not be able to grow this
 * process without bound by answering with an endless body. No I/O of its own: it reads the stream
 * it is given, so both sides use it.
 */
export async function readCappedText(response: BodyStream, maxBytes: number, what: string): Promise<string> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done || !value) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw new CheckpointError("payload_too_large", `${what}: the reply passed ${maxBytes} bytes`);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}
