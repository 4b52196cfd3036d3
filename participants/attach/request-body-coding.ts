import { promisify } from "node:util";
import { brotliDecompress, gunzip, inflate, inflateRaw } from "node:zlib";
import { CheckpointError } from "../../protocol/index.js";

/**
 * The most codings a request body may carry: each is decoded up to the body limit, so a long list of
 * them (`gzip, gzip, …`, as many as 16 KiB of headers hold) would cost that many full decodes.
 */
const MAX_CODINGS = 4;

type Decoder = (coded: Buffer, options: { maxOutputLength: number }) => Promise<Buffer>;

const gunzipped: Decoder = promisify(gunzip);
const inflated: Decoder = promisify(inflate);
const rawInflated: Decoder = promisify(inflateRaw);

/** The content codings a generation body is read through (RFC 9110 §8.4.1; `x-gzip` is gzip): the refusal of another one lists them. */
export const DECODED_CODINGS = "gzip, deflate, br";

/** How each coding of DECODED_CODINGS (and `x-gzip`) is undone. */
const DECODERS: Record<string, Decoder> = {
  gzip: gunzipped,
  "x-gzip": gunzipped,
  // HTTP's deflate is the zlib format, yet some clients send raw deflate (as browsers, urllib3 reads both).
  // Broken either way, the zlib reading's error is told, unless the raw one ran past the limit.
  deflate: (coded, options) =>
    inflated(coded, options).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "Z_DATA_ERROR") throw error;
      return rawInflated(coded, options).catch((raw: NodeJS.ErrnoException) => Promise.reject(raw.code === "ERR_BUFFER_TOO_LARGE" ? raw : error));
    }),
  br: promisify(brotliDecompress),
};

/**
 * A generation request's body decoded from `codings` (`requestBodyCodings`: its `Content-Encoding`'s, then its
 * transfer codings other than `chunked`, in the order applied), last applied first, so that it can be
 * parsed. Every step's output is bounded by `limit` (the body limit), so a small coded body that
 * decodes to gigabytes is refused `payload_too_large` before it is all in memory; a coding it does not
 * know is `unsupported_content_coding` (415, RFC 9110 §15.5.16), bytes not valid in theirs are
 * `invalid_request`, each naming the coding. Decoded off the event loop (zlib's thread pool).
 */
export async function decodedRequestBody(body: Buffer, codings: string, limit: number): Promise<Buffer> {
  const applied = codings.split(", ");
  if (applied.length > MAX_CODINGS) throw new CheckpointError("invalid_request", `the request body carries ${applied.length} content codings (${codings.slice(0, 200)}); at most ${MAX_CODINGS} are decoded`);
  const unknown = applied.find((coding) => !Object.hasOwn(DECODERS, coding));
  if (unknown !== undefined) {
    throw new CheckpointError("unsupported_content_coding", `the request body's coding ${JSON.stringify(unknown.slice(0, 100))} (Content-Encoding, or Transfer-Encoding other than chunked) cannot be decoded (${DECODED_CODINGS} can): send it uncompressed or in one of those`);
  }
  let decoded = body;
  for (const coding of applied.reverse()) {
    try {
      decoded = await DECODERS[coding]!(decoded, { maxOutputLength: limit });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE") throw new CheckpointError("payload_too_large", `decoded request body larger than ${limit} bytes (Content-Encoding ${codings.slice(0, 200)})`);
      throw new CheckpointError("invalid_request", `the request body is not valid ${coding}: ${(error as Error).message}`);
    }
  }
  return decoded;
}
