import { CheckpointError } from "../../protocol/index.js";
import { httpUrlFlag } from "./shared.js";

/**
 * The ports WHATWG fetch blocks ("bad port", https://fetch.spec.whatwg.org/#port-blocking), as
 * undici's fetch does: a request to one fails as a network error with no socket opened.
 */
const BLOCKED_PORTS: ReadonlySet<string> = new Set([
  "1", "7", "9", "11", "13", "15", "17", "19", "20", "21", "22", "23", "25", "37", "42", "43", "53", "69", "77", "79",
  "87", "95", "101", "102", "103", "104", "109", "110", "111", "113", "115", "117", "119", "123", "135", "137",
  "139", "143", "161", "179", "389", "427", "465", "512", "513", "514", "515", "526", "530", "531", "532",
  "540", "548", "554", "556", "563", "587", "601", "636", "989", "990", "993", "995", "1719", "1720", "1723",
  "2049", "3659", "4045", "4190", "5060", "5061", "6000", "6566", "6665", "6666", "6667", "6668", "6669", "6679",
  "6697", "10080",
]);

/**
 * A URL flag fetch is called with: absolute http(s), without credentials (fetch refuses a URL that
 * carries them) and not on a port fetch blocks. Either would pass the flags and fail every call
 * later, as an obscure network error. The value is not echoed: it may carry a password.
 */
export function fetchableUrlFlag(name: string, value: string): string {
  const url = new URL(httpUrlFlag(name, value));
  if (url.username || url.password) throw new CheckpointError("invalid_request", `--${name} may not carry credentials (user:password@)`);
  if (BLOCKED_PORTS.has(url.port)) throw new CheckpointError("invalid_request", `--${name} names port ${url.port}, which fetch blocks (a WHATWG "bad port"): use another port`);
  return value;
}
