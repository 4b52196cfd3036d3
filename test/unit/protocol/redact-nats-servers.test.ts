import { describe, expect, it } from "vitest";
import { parseUpstream } from "../../../participants/attach/upstream-url.js";
import { redactNatsServers } from "../../../protocol/index.js";

/**
 * redactNatsServers must never print any part of a credential, whatever it holds. Credentials here
 * are built from the characters that confuse URL and list parsing (`@ , : / ? # %`, a space) and
 * marker letters that no scheme, host or "[Redacted]" holds: a marker in the output is a leak, and
 * so is anything but the expected text around "[Redacted]".
 */
const MARKERS = "QXZJKW";
const CREDENTIAL_CHARS = `@,:/?#% ${MARKERS}${MARKERS}`;
const SCHEMES = ["nats://", "tls://", "ws://", ""];
const HOSTS = ["127.0.0.1:4222", "h1", "nats-0.nats:4222", "[::1]:4222", "host/path"];

/** A small seeded generator (mulberry32): the same cases on every run. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function generator(seed: number) {
  const next = random(seed);
  const pick = <T>(items: readonly T[] | string): T => items[Math.floor(next() * items.length)] as T;
  const credential = (): string => {
    const length = 1 + Math.floor(next() * 14);
    let text = "";
    for (let i = 0; i < length; i++) text += pick(CREDENTIAL_CHARS);
    // A scheme-like run inside a password (`,nats://`) is possible too.
    if (next() < 0.2) text = text.slice(0, length >> 1) + `,${pick(SCHEMES.slice(0, 3))}` + text.slice(length >> 1);
    return text;
  };
  const userinfo = () => (next() < 0.3 ? credential() : `${credential()}:${credential()}`);
  const plain = () => `${next() < 0.3 ? " " : ""}${pick(SCHEMES)}${pick(HOSTS)}`;
  return { next, pick, credential, userinfo, plain };
}

const leaked = (text: string) => [...text].filter((c) => MARKERS.includes(c)).join("");

describe("redactNatsServers", () => {
  it("a password holding both @ and , leaks nothing (nats://user:p@ss,word@host:4222)", () => {
    const redacted = redactNatsServers("nats://user:p@ss,word@host:4222");
    expect(redacted).not.toContain("ss");
    expect(redacted).toBe("nats://[Redacted]@host:4222");
  });

  it("a password holding `,scheme://` leaks nothing (nats://user:x,nats://y@host)", () => {
    expect(redactNatsServers("nats://user:x,nats://y@host")).toBe("nats://[Redacted]@host");
    expect(redactNatsServers("nats://u:p@q,nats://r@h2,nats://h3")).toBe("nats://[Redacted]@h2,nats://h3");
  });

  it("a query or fragment, which nats.js accepts and ignores (`?token=…`), is redacted with the rest of the list after it", () => {
    // nats.js parses each entry with `new URL`, which takes `/?token=…` or `#…` without a word: the
    // query may hold a token an operator meant for it (as other clients' URLs do), printed as it was.
    expect(redactNatsServers("nats://127.0.0.1:4222/?token=QXZJKW")).toBe("nats://127.0.0.1:4222/?[Redacted]");
    expect(redactNatsServers("nats://127.0.0.1:4222?token=QXZJKW")).toBe("nats://127.0.0.1:4222?[Redacted]");
    expect(redactNatsServers("nats://h1:4222/#QXZJKW")).toBe("nats://h1:4222/#[Redacted]");
    // A comma may be part of the query (`?token=a,b`): the entries after it could be the rest of it.
    expect(redactNatsServers("nats://h1:4222?token=QX,ZJ,nats://h2:4222")).toBe("nats://h1:4222?[Redacted]");
    expect(redactNatsServers("nats://user:QXZ@h1:4222/?token=JKW")).toBe("nats://[Redacted]@h1:4222/?[Redacted]");
    // An @ inside the query (`?user=a@b&token=…`) cannot be told from the end of a password holding `?`: only the scheme is kept.
    expect(redactNatsServers("nats://h1:4222?user=a@b&token=QXZJKW")).toBe("nats://[Redacted]");
    expect(redactNatsServers("tls://u:p?QX@h1:4222,nats://h2")).toBe("tls://[Redacted]");
  });

  it("a list without @ carries no credentials and is kept as it is", () => {
    for (const servers of ["nats://127.0.0.1:4222", "nats://a:1, nats://b:2,tls://c:3", "h1:4222,h2", ""]) expect(redactNatsServers(servers)).toBe(servers);
  });

  it("generated lists: nothing of any credential in the output, only the opening scheme and what follows the last credential (unless a ? or # precedes it)", () => {
    const { next, pick, userinfo, plain } = generator(20261206);
    for (let i = 0; i < 3000; i++) {
      const before = Array.from({ length: Math.floor(next() * 3) }, plain);
      const withCredentials = Array.from({ length: 1 + Math.floor(next() * 3) }, () => `${next() < 0.3 ? " " : ""}${pick(SCHEMES)}${userinfo()}@${pick(HOSTS)}`);
      const after = Array.from({ length: Math.floor(next() * 3) }, plain);
      const servers = [...before, ...withCredentials, ...after].join(",");
      const redacted = redactNatsServers(servers);
      expect(leaked(redacted), servers).toBe("");
      // Where the last credential ends, its host and the servers after it.
      const last = withCredentials.at(-1)!;
      const tail = [last.slice(last.lastIndexOf("@")), ...after].join(",");
      const opening = /^\s*(?:nats|tls|wss?|https?):\/\//i.exec(servers)?.[0] ?? /^\s*/.exec(servers)![0];
      // A `?` or `#` before it may have opened a query that runs on past that `@`: then only the scheme is kept.
      const beforeLastAt = servers.slice(0, servers.lastIndexOf("@"));
      expect(redacted, servers).toBe(/[?#]/.test(beforeLastAt) ? `${opening}[Redacted]` : `${opening}[Redacted]${tail}`);
    }
  });

  it("--upstream's refusal of a URL that does not parse leaks nothing of its credentials either", () => {
    const { pick, userinfo } = generator(7);
    for (let i = 0; i < 1000; i++) {
      const raw = `${pick(["http://", "https://", ""])}${userinfo()}@${pick(["host:99999/v1", "h ost/v1", "[::1/v1"])}`;
      let message = "";
      try {
        parseUpstream(raw);
      } catch (error) {
        message = (error as Error).message;
      }
      expect(leaked(message), raw).toBe("");
    }
  });

  it("--upstream's refusal of a URL that does not parse leaks nothing of its query either", () => {
    expect(() => parseUpstream("http://host:99999/v1?api_key=QXZJKW")).toThrow("--upstream is not a URL: http://host:99999/v1?[Redacted]");
  });
});
