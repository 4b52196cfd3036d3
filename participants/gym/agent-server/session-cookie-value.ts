import { z } from "zod";

/**
 * The resources session cookie an agent session carries, sent on every tool call as
 * `cookie: ng_session=<value>`: an RFC 6265 cookie-value, cookie-octets (no CTL, whitespace,
 * DQUOTE, comma, semicolon or backslash), optionally between two DQUOTEs, so it can neither break
 * that header nor add cookies.
 */
export const SessionCookieValueSchema = z
  .string()
  .max(200)
  .regex(
    /^("?)[\x21\x23-\x2B\x2D-\x3A\x3C-\x5B\x5D-\x7E]*\1$/,
    "cookie must be an RFC 6265 cookie-value: cookie-octets (no control characters, whitespace, DQUOTE, comma, semicolon or backslash), optionally quoted",
  );
