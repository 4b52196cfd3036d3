import { randomBytes } from "node:crypto";
import { CheckpointError } from "../../../protocol/index.js";
import { SESSION_COOKIE } from "./resources-modes.js";
import { SessionIdSchema } from "./resources-session-record.js";

/** A fresh unguessable session id (22 base64url characters). */
export function newSessionId(): string {
  return randomBytes(16).toString("base64url");
}

/** The `ng_session` cookie of a request, validated; undefined when absent. */
export function readSessionCookie(header: string | string[] | undefined): string | undefined {
  if (header === undefined) return undefined;
  const joined = Array.isArray(header) ? header.join("; ") : header;
  if (joined.length > 8192) throw new CheckpointError("invalid_request", "cookie header too large");
  for (const part of joined.split(";")) {
    const eq = part.indexOf("=");
    if (eq === -1 || part.slice(0, eq).trim() !== SESSION_COOKIE) continue;
    const value = part.slice(eq + 1).trim();
    const parsed = SessionIdSchema.safeParse(value);
    if (!parsed.success) throw new CheckpointError("invalid_request", `malformed ${SESSION_COOKIE} cookie`);
    return parsed.data;
  }
  return undefined;
}

export function sessionCookieHeader(sessionId: string): string {
  return `${SESSION_COOKIE}=${sessionId}; Path=/; HttpOnly; SameSite=Strict`;
}
