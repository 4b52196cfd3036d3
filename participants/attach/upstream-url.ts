import { redactUrl } from "../../protocol/index.js";
import { GENERATION_ROUTES } from "../kinds/model/conversation-digest.js";

/** Endpoints an `--upstream` may name by mistake for its base URL: the generation routes, and legacy completions. */
const ENDPOINTS = [...GENERATION_ROUTES, "/v1/completions"];

/**
 * Where the proxy forwards: the upstream's OpenAI base URL (`http://host:8000/v1` or
 * `http://host:8000`) reduced to its root, so `/v1/chat/completions` after the rollout prefix maps
 * onto the upstream's own `/v1/chat/completions`.
 */
export interface Upstream {
  /** Origin + base path without a trailing `/v1` (also the generation-cut root). */
  root: string;
  url: URL;
}

export function parseUpstream(raw: string): Upstream {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    // Not the raw value: its userinfo may be a password (`scheme://user:pass@host`), its query a key.
    throw new Error(`--upstream is not a URL: ${redactUrl(raw)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new Error("--upstream must be an http(s) URL");
  if (url.search || url.hash) throw new Error("--upstream may not carry a query or fragment");
  // Refused rather than dropped: the proxy would never send them (callers' own Authorization headers go through).
  if (url.username || url.password) throw new Error("--upstream may not carry credentials (user:pass@): the proxy forwards each caller's Authorization header instead");
  const path = url.pathname.replace(/\/+$/, "");
  // A full endpoint (`…/v1/chat/completions`) would have every call forwarded to `…/v1/chat/completions/v1/chat/completions`: a 404 each.
  const endpoint = ENDPOINTS.find((route) => path.toLowerCase().endsWith(route));
  if (endpoint) {
    const base = `${url.origin}${path.slice(0, path.length - endpoint.length)}/v1`;
    throw new Error(`invalid_request: --upstream names an endpoint (${endpoint}), not the server's base URL: use ${base}`);
  }
  const root = `${url.origin}${path.replace(/\/v1$/, "")}`;
  return { root, url: new URL(root) };
}

/** `host:port` of --listen; the port may be 0 (any free port). */
export function parseListen(raw: string): { host: string; port: number } {
  const match = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(raw);
  if (!match) throw new Error(`--listen must be host:port (got ${raw})`);
  const port = Number(match[2]);
  if (port > 65535) throw new Error("--listen port must be 0..65535");
  return { host: match[1]!.replace(/^\[|\]$/g, ""), port };
}
