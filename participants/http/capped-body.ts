import { CheckpointError } from "../../protocol/index.js";

/**
 * Reads a fetch response's body as text, refusing (`payload_too_large`) once it passes `maxBytes`
 * and cancelling the rest: a peer we do not run (a judge endpoint) must not be able to grow this
 * process without bound by answering with an endless body.
 */
export async function readCappedText(response: Response, maxBytes: number, what: string): Promise<string> {
  if (!response.body) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw new CheckpointError("payload_too_large", `${what}: the reply passed ${maxBytes} bytes`);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}
