import { describe, expect, it } from "vitest";
import { answerRepresentationRefusal, bodyCodings, callerHeaders, framingHeaders, namedRepresentationHeader, requestBodyCodings, upstreamHeaders as upstreamHeadersOf } from "../../../participants/attach/hop-headers.js";
import { parseListen, parseUpstream } from "../../../participants/attach/upstream-url.js";
import { proxiedLocation } from "../../../participants/attach/redirect-location.js";
import { climbsAboveRoot } from "../../../participants/attach/canonical-route.js";
import { isCompleteEvent, lastEventStart, mayEndStream } from "../../../participants/attach/sse-events.js";
import { UsageTail } from "../../../participants/attach/usage-tail.js";
import { mulberry32 } from "../../support/seeded-random.js";

describe("usage tail", () => {
  it("reads usage from the final SSE chunk, split across network chunks, keeping only the tail", () => {
    const tail = new UsageTail(256);
    for (let i = 0; i < 200; i++) tail.push(Buffer.from(`data: {"choices":[{"delta":{"content":"tok${i}"}}]}\n\n`));
    const last = 'data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":200,"total_tokens":220}}\n\ndata: [DONE]\n\n';
    tail.push(Buffer.from(last.slice(0, 30)));
    tail.push(Buffer.from(last.slice(30)));
    expect(tail.usage()).toEqual({ prompt_tokens: 20, completion_tokens: 200, total_tokens: 220 });
  });

  it("reads chat and responses/messages usage names from a whole JSON body, and null when absent", () => {
    const chat = new UsageTail();
    chat.push(Buffer.from('{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'));
    expect(chat.usage()).toEqual({ prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
    const messages = new UsageTail();
    messages.push(Buffer.from('{"type":"message","usage":{"input_tokens":5,"output_tokens":6}}'));
    expect(messages.usage()).toEqual({ prompt_tokens: 5, completion_tokens: 6, total_tokens: 11 });
    const none = new UsageTail();
    none.push(Buffer.from("data: [DONE]\n\n"));
    expect(none.usage()).toBeNull();
  });
});

describe("usage tail of streamed responses and messages", () => {
  it("reads response.usage from the responses API's completed event", () => {
    const tail = new UsageTail();
    tail.push(Buffer.from('event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'));
    tail.push(Buffer.from('event: response.completed\ndata: {"type":"response.completed","response":{"id":"r","usage":{"input_tokens":9,"output_tokens":2,"total_tokens":11}}}\n\n'));
    expect(tail.usage()).toEqual({ prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 });
  });

  it("reads response.usage from a completed event longer than the tail (it carries the whole output), split across chunks", () => {
    const tail = new UsageTail();
    const text = `say \\"usage\\":{\\"input_tokens\\":1,\\"output_tokens\\":1} ${"lorem ".repeat(5000)}`;
    const event = `event: response.completed\ndata: {"type":"response.completed","response":{"id":"r","output":[{"type":"message","content":[{"type":"output_text","text":"${text}"}]}],"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":2000,"total_tokens":2009}},"sequence_number":9}\n\n`;
    const bytes = Buffer.from(event);
    for (let at = 0; at < bytes.length; at += 4096) tail.push(bytes.subarray(at, at + 4096));
    expect(tail.usage()).toEqual({ prompt_tokens: 9, completion_tokens: 2000, total_tokens: 2009 });
  });

  it("takes output tokens from the last message_delta and input tokens from message_start", () => {
    const tail = new UsageTail();
    tail.push(Buffer.from('event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":12,"output_tokens":1}}}\n\n'));
    tail.push(Buffer.from('event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"}}\n\n'));
    tail.push(Buffer.from('event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'));
    expect(tail.usage()).toEqual({ prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 });
  });

  it("looks past the last KiB when the input tokens are further back in the tail", () => {
    const tail = new UsageTail();
    tail.push(Buffer.from('event: message_start\ndata: {"type":"message_start","message":{"id":"m","usage":{"input_tokens":33,"output_tokens":1}}}\n\n'));
    for (let i = 0; i < 60; i++) tail.push(Buffer.from(`event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"t${i}"}}\n\n`));
    tail.push(Buffer.from('event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":60}}\n\n'));
    expect(tail.usage()).toEqual({ prompt_tokens: 33, completion_tokens: 60, total_tokens: 93 });
  });
});

describe("usage tail, a stream that ends in an error event", () => {
  const endsInError = (...parts: string[]) => {
    const tail = new UsageTail();
    for (const part of parts) tail.push(Buffer.from(part));
    return tail.endsInError();
  };
  it("is one whose last event before [DONE] is an error (vLLM, Responses, Messages)", () => {
    expect(endsInError('data: {"choices":[]}\n\n', 'data: {"error":{"message":"engine dead"}}\n\ndata: [DONE]\n\n')).toBe(true);
    expect(endsInError('data: {"object":"error","message":"x","code":500}\r\n\r\ndata: [DONE]\r\n\r\n')).toBe(true);
    expect(endsInError('event: response.failed\ndata: {"type":"response.failed","response":{"status":"failed"}}\n\n')).toBe(true);
    expect(endsInError('event: error\ndata: {"type":"error","code":"server_error","message":"x"}\n\n')).toBe(true);
    expect(endsInError('event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n', ": keep-alive\n\n")).toBe(true);
  });
  it("is one whose error event is longer than the tail, split across chunks, a blank line spanning two (judged by its head)", () => {
    const text = "x".repeat(8 * 1024);
    const long = (first: string) => [first, ...Array.from({ length: 8 }, () => text), '"}]}}\r\n\r\n'];
    expect(endsInError('data: {"choices":[]}\r\n\r', ...long('\nevent: response.failed\r\ndata: {"type":"response.failed","response":{"output":[{"text":"'))).toBe(true);
    expect(endsInError('data: {"choices":[]}\n', ...long('\ndata: {"error":{"message":"'), "data: [DONE]\n\n")).toBe(true);
    expect(endsInError(...long('data: {"type":"response.failed","response":{"output":[{"text":"'))).toBe(true);
    expect(endsInError('data: {"error":{"message":"x"}}\n\n', ...long('event: response.completed\ndata: {"type":"response.completed","response":{"output":[{"text":"'))).toBe(false);
    expect(endsInError(...long('data: {"choices":[{"delta":{"content":"'), "data: [DONE]\n\n")).toBe(false);
  });
  it("is judged from the newest KiB when the last event is in it, from the whole tail when it began before", () => {
    const tokens = Array.from({ length: 80 }, (_, i) => `data: {"choices":[{"delta":{"content":"t${i}"}}]}\n\n`);
    expect(endsInError(...tokens, 'data: {"error":{"message":"engine dead"}}\n\n', "data: [DONE]\n\n")).toBe(true);
    expect(endsInError(...tokens, 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":80}}\n\n', "data: [DONE]\n\n")).toBe(false);
    // The error event (2 KiB, in 1-byte-short pieces) begins before the newest KiB: read from the whole tail.
    const big = `data: {"error":{"message":"${"x".repeat(2048)}"}}\n\n`;
    const pieces = Array.from({ length: Math.ceil(big.length / 100) }, (_, i) => big.slice(i * 100, (i + 1) * 100));
    expect(endsInError(...tokens, ...pieces, "data: [DONE]\n\n")).toBe(true);
    // A blank line split over two chunks at the window's edge still separates the events.
    expect(endsInError(...tokens, 'data: {"error":{"message":"y"}}\n', "\n", ...Array.from({ length: 12 }, () => ": keep-alive\n\n"), "data: [DONE]\n\n")).toBe(true);
    expect(endsInError(...tokens, ...Array.from({ length: 12 }, () => ": keep-alive\n\n"), "data: [DONE]\n\n")).toBe(false);
    // An error event whose `event:` line lies before the newest KiB and one of its data lines in it.
    expect(endsInError(...tokens, "event: error\n", `data: ${"a".repeat(1500)}\n`, "data: {}\n\n", "data: [DONE]\n\n")).toBe(true);
    // The newest KiB begins with the blank line ending the error event: nothing in it decides.
    expect(endsInError(...tokens, 'data: {"error":{"message":"z"}}', `\n\n${": keep-alive\n\n".repeat(80)}data: [DONE]\n\n`)).toBe(true);
  });
  it("is judged by its head when it is longer than the tail, whatever the chunking (one byte at a time, LF or CRLF)", () => {
    const bytewise = (limit: number, text: string) => {
      const tail = new UsageTail(limit);
      for (const byte of Buffer.from(text)) tail.push(Buffer.from([byte]));
      return tail.endsInError();
    };
    const long = "x".repeat(300);
    expect(bytewise(64, `data: {"choices":[]}\n\nevent: error\ndata: {"type":"error","message":"${long}"}\n\n`)).toBe(true);
    expect(bytewise(64, `data: {"choices":[]}\r\n\r\ndata: {"error":{"message":"${long}"}}\r\n\r\ndata: [DONE]\r\n\r\n`)).toBe(true);
    expect(bytewise(64, `data: {"error":{"message":"x"}}\n\ndata: {"choices":[{"delta":{"content":"${long}"}}]}\n\ndata: [DONE]\n\n`)).toBe(false);
    expect(bytewise(64, `data: {"type":"response.failed","response":{"output":"${long}"}}\n\n`)).toBe(true);
  });
  it("reads events whose lines end in a bare CR (SSE allows CR, LF and CRLF): an error event before [DONE] is one", () => {
    expect(endsInError('data: {"choices":[]}\r\r', 'data: {"error":{"message":"engine dead"}}\r\rdata: [DONE]\r\r')).toBe(true);
    expect(endsInError('event: response.created\rdata: {"type":"response.created"}\r\r', 'event: error\rdata: {"type":"error","message":"x"}\r\r')).toBe(true);
    expect(endsInError('data: {"error":{"message":"x"}}\r\r', 'data: {"choices":[]}\r\rdata: [DONE]\r\r')).toBe(false);
    // Longer than the tail, one byte at a time: judged by its head, found after a bare-CR blank line.
    const tail = new UsageTail(64);
    for (const byte of Buffer.from(`data: {"choices":[]}\r\revent: error\rdata: {"type":"error","message":"${"x".repeat(300)}"}\r\rdata: [DONE]\r\r`)) tail.push(Buffer.from([byte]));
    expect(tail.endsInError()).toBe(true);
    const usage = new UsageTail();
    usage.push(Buffer.from('data: {"choices":[]}\r\rdata: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\r\rdata: [DONE]\r\r'));
    expect(usage.usage()).toEqual({ prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 });
  });
  it("is judged whole when the tail begins inside the blank line before it (its first newline dropped), LF, CRLF or CR", () => {
    // The event before is longer than the kept head: judged by that event's head, the error went unseen.
    const before = (nl: string) => `data: {"choices":[{"delta":{"content":"${"a".repeat(1000)}"}}]}${nl}${nl}`;
    const error = (nl: string) => `event: error${nl}data: {"type":"error","message":"${"x".repeat(100)}"}${nl}${nl}`;
    for (const [nl, cut] of [["\n", 1], ["\r\n", 1], ["\r\n", 2], ["\r", 1]] as const) {
      const text = before(nl) + error(nl);
      const at = before(nl).length - cut;
      const tail = new UsageTail(64); // the error event alone fills it: the first chunk leaves
      tail.push(Buffer.from(text.slice(0, at)));
      tail.push(Buffer.from(text.slice(at)));
      expect({ nl, cut, error: tail.endsInError() }).toEqual({ nl, cut, error: true });
      // The event whose blank line is cut is still judged (by its head) when nothing after it decides.
      const after = `: ${"k".repeat(60)}${nl}${nl}data: [DONE]${nl}${nl}`; // one long comment: the tail keeps four event heads
      for (const [last, failed] of [[error(nl), true], [before(nl), false]] as const) {
        const cutTail = new UsageTail(64);
        const at2 = last.length - cut;
        cutTail.push(Buffer.from(last.slice(0, at2)));
        cutTail.push(Buffer.from(last.slice(at2) + after));
        expect({ nl, cut, last: last.slice(0, 12), error: cutTail.endsInError() }).toEqual({ nl, cut, last: last.slice(0, 12), error: failed });
      }
    }
  });
  it("gives the answer of the whole stream in one chunk, whatever the chunking (seeded random streams and chunkings)", () => {
    const random = mulberry32(0x5eed);
    const pick = <T,>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
    const LIMIT = 256;
    // Around the tail's and the kept head's sizes, and multi-byte characters a chunk may split.
    const filler = () => pick(["", "é", "x".repeat(200), "€".repeat(90), "y".repeat(LIMIT - 40 + Math.floor(random() * 80)), "z".repeat(600)]);
    const events = (nl: string) => [
      () => `data: {"choices":[{"delta":{"content":"${filler()}"}}]}`,
      () => `data: {"error":{"message":"${filler()}"}}`,
      () => `data: {"object":"error","message":"${filler()}"}`,
      () => `event: error${nl}data: {"type":"error","message":"${filler()}"}`,
      () => `event: response.failed${nl}data: {"type":"response.failed","response":{"output":"${filler()}"}}`,
      () => `event: response.completed${nl}data: {"type":"response.completed","response":{"output":"${filler()}"}}`,
    ];
    const verdict = (chunks: Buffer[]) => {
      const tail = new UsageTail(LIMIT);
      for (const chunk of chunks) tail.push(chunk);
      return tail.endsInError();
    };
    for (let round = 0; round < 300; round++) {
      const nl = pick(["\n", "\r\n", "\r"]);
      const kinds = events(nl);
      let text = "";
      for (let i = Math.floor(random() * 4); i >= 0; i--) text += `${pick(kinds)()}${nl}${nl}`;
      // At most two events that decide nothing after the last one (the tail keeps the heads of four).
      text += pick(["", `data: [DONE]${nl}${nl}`, `: keep-alive${nl}${nl}data: [DONE]${nl}${nl}`]);
      const bytes = Buffer.from(text);
      const chunks: Buffer[] = [];
      const most = pick([1, 3, 40, 400]);
      for (let at = 0; at < bytes.length; ) {
        const size = Math.floor(random() * (most + 1)); // empty chunks too
        chunks.push(bytes.subarray(at, at + size));
        at += size;
      }
      expect({ round, text, error: verdict(chunks) }).toEqual({ round, text, error: verdict([bytes]) });
    }
  });
  it("is judged by its head when it is longer than the tail, however many comments, blank lines and [DONE] follow", () => {
    const failed = `event: response.failed\ndata: {"type":"response.failed","o":"${"w".repeat(20_000)}"}\n\n`;
    const after = ": keep-alive\n\n\n\n: keep-alive\n\ndata: [DONE]\n\n\n\n";
    const pieces = (text: string) => Array.from({ length: Math.ceil(text.length / 100) }, (_, i) => text.slice(i * 100, (i + 1) * 100));
    expect(endsInError(...pieces(failed + after))).toBe(true);
    expect(endsInError(failed + after)).toBe(true);
    const completed = failed.replaceAll("response.failed", "response.completed");
    expect(endsInError(...pieces(completed + after))).toBe(false);
  });
  it("is not a completed stream, a usage chunk with error null, or a JSON body naming an error", () => {
    expect(endsInError('data: {"choices":[],"error":null,"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n')).toBe(false);
    expect(endsInError('data: {"error":{"message":"early"}}\n\ndata: {"choices":[{"delta":{"content":"ok"}}]}\n\ndata: [DONE]\n\n')).toBe(false);
    expect(endsInError('event: response.completed\ndata: {"type":"response.completed"}\n\n')).toBe(false);
    expect(endsInError('{"error":{"message":"x"}}')).toBe(false);
    expect(endsInError("")).toBe(false);
  });
});

describe("a stream's last event (withheld until the ledger row is written)", () => {
  const start = (text: string) => lastEventStart(Buffer.from(text));
  it("begins after the last blank line followed by an event line, with LF or CRLF line ends", () => {
    expect(start("data: a\n\ndata: [DONE]\n\n")).toBe(9);
    expect(start("data: a\n\ndata: [DO")).toBe(9);
    expect(start("data: a\r\n\r\nevent: x\r\ndata: b\r\n\r\n")).toBe(11);
    expect(start("data: a\n\n\n\ndata: b\n")).toBe(11);
    // Lines may end in a bare CR too (the SSE spec): each event leaves as it comes, not held to the end.
    expect(start('data: {"a":1}\r\rdata: {"a":2}\r\r')).toBe(15);
  });
  it("is the whole buffer when it holds one event, complete or not", () => {
    expect(start("data: [DONE]\n\n")).toBe(0);
    expect(start("data: a\n\n\n")).toBe(0);
    expect(start("data: a\ndata: b")).toBe(0);
    expect(start("")).toBe(0);
  });
  it("is complete once its blank line came", () => {
    expect(isCompleteEvent(Buffer.from("data: a\n\n"))).toBe(true);
    expect(isCompleteEvent(Buffer.from("event: x\r\ndata: a\r\n\r\n"))).toBe(true);
    expect(isCompleteEvent(Buffer.from("event: x\rdata: a\r\r"))).toBe(true);
    expect(isCompleteEvent(Buffer.from("data: a\n"))).toBe(false);
    expect(isCompleteEvent(Buffer.from("data: a\r"))).toBe(false);
    expect(isCompleteEvent(Buffer.from("\n\n"))).toBe(false);
  });
  it("may end the stream when it is [DONE], a completion or an error event", () => {
    const may = (text: string) => mayEndStream(Buffer.from(text));
    expect(may("data: [DONE]\n\n")).toBe(true);
    expect(may('data: {"error":{"message":"engine dead"}}\n\n')).toBe(true);
    expect(may('event: response.completed\ndata: {"type":"response.completed"}\n\n')).toBe(true);
    expect(may('event: error\ndata: {"type":"error","message":"x"}\n\n')).toBe(true);
    expect(may('event: message_stop\ndata: {"type":"message_stop"}\n\n')).toBe(true);
    expect(may('data: {"choices":[{"delta":{"content":"the \\"error\\" word"}}]}\n\n')).toBe(false);
    expect(may('event: message_start\ndata: {"type":"message_start"}\n\n')).toBe(false);
  });
});

describe("upstream and listen flags", () => {
  it("reduce the upstream base URL to its root", () => {
    expect(parseUpstream("http://127.0.0.1:8000/v1").root).toBe("http://127.0.0.1:8000");
    expect(parseUpstream("http://127.0.0.1:8000/").root).toBe("http://127.0.0.1:8000");
    expect(parseUpstream("https://h/openai/v1/").root).toBe("https://h/openai");
    expect(() => parseUpstream("ftp://h")).toThrow(/http/);
    expect(() => parseUpstream("http://h/v1?x=1")).toThrow(/query/);
    expect(() => parseUpstream("not a url")).toThrow(/not a URL/);
  });

  it("refuse an upstream naming a generation endpoint instead of the base URL (every call would 404 upstream)", () => {
    for (const endpoint of ["http://h/v1/chat/completions", "http://h:8000/v1/chat/completions/", "https://h/openai/v1/responses", "http://h/v1/messages", "http://h/V1/Chat/Completions", "http://h/v1/completions"]) {
      expect(() => parseUpstream(endpoint), endpoint).toThrow(/^invalid_request: --upstream names an endpoint .* not the server's base URL/);
    }
    expect(() => parseUpstream("http://h/v1/chat/completions")).toThrow("use http://h/v1");
    expect(parseUpstream("https://h/completions-gateway/v1").root).toBe("https://h/completions-gateway");
  });

  it("parse host:port with IPv6 brackets and port 0", () => {
    expect(parseListen("127.0.0.1:0")).toEqual({ host: "127.0.0.1", port: 0 });
    expect(parseListen("[::1]:9000")).toEqual({ host: "::1", port: 9000 });
    expect(() => parseListen("9000")).toThrow(/host:port/);
    expect(() => parseListen("h:70000")).toThrow(/0..65535/);
  });
});

describe("hop-by-hop headers", () => {
  const upstreamHeaders = (raw: string[], host: string, options?: { identity?: boolean }) => upstreamHeadersOf(raw, framingHeaders(raw), host, options);
  const codingsOf = (raw: string[]) => requestBodyCodings(framingHeaders(raw));

  it("drops the headers a caller's Connection names, and Proxy-Authorization, from the upstream request", () => {
    const raw = ["Host", "proxy:1", "Connection", "keep-alive, X-Session-Secret", "connection", " Upgrade-Insecure ", "X-Session-Secret", "s3cret",
      "Upgrade-Insecure", "1", "Proxy-Authorization", "Basic cHJveHk6cGFzcw==", "Authorization", "Bearer k", "Content-Type", "application/json"];
    expect(upstreamHeaders(raw, "upstream:2")).toEqual(["host", "upstream:2", "authorization", "Bearer k", "content-type", "application/json"]);
  });

  it("drops a caller's x-ng-* headers in any spelling of their separators (a WSGI upstream reads x_ng_capture_key as x-ng-capture-key)", () => {
    const raw = ["X-NG-Capture-Key", "a", "x_ng_capture_key", "b", "X_Ng_Model_Call_Id", "c", "x-ng_parent_call_id", "d", "x_ng-continuation", "e",
      "x_ngx", "kept", "xng_y", "kept", "Content-Type", "application/json"];
    expect(upstreamHeaders(raw, "upstream:2")).toEqual(["host", "upstream:2", "x_ngx", "kept", "xng_y", "kept", "content-type", "application/json"]);
  });

  // A WSGI upstream reads `transfer_encoding` as Transfer-Encoding (HTTP_TRANSFER_ENCODING): it went upstream.
  it("drops a caller's underscore spellings of hop-by-hop headers, of those its Connection names, and of Content-Encoding", () => {
    const raw = ["Transfer_Encoding", "chunked", "content_length", "5", "Proxy_Authorization", "Basic eDp5", "Connection", "X_Secret", "x-secret", "s",
      "content_encoding", "gzip", "accept_encoding", "br", "x_kept", "1", "Content-Encoding", "gzip"];
    expect(upstreamHeaders(raw, "upstream:2")).toEqual(["host", "upstream:2", "accept_encoding", "br", "x_kept", "1", "content-encoding", "gzip"]);
    expect(upstreamHeaders(raw, "upstream:2", { identity: true })).toEqual(["host", "upstream:2", "x_kept", "1", "content-encoding", "gzip", "accept-encoding", "identity"]);
  });

  it("reads a request's body codings from its raw headers, in the order applied", () => {
    expect(codingsOf(["Content-Type", "application/json"])).toBeUndefined();
    expect(codingsOf(["Transfer-Encoding", "chunked", "Content-Encoding", "identity"])).toBeUndefined();
    expect(codingsOf(["Content-Encoding", "GZIP"])).toBe("gzip");
    expect(codingsOf(["Transfer-Encoding", "gzip, chunked", "Content-Encoding", "br", "content-encoding", "x-gzip"])).toBe("br, x-gzip, gzip");
  });

  it("names the header describing the body that a request's Connection names, in any spelling, and none for other options", () => {
    expect(namedRepresentationHeader(framingHeaders(["Connection", "keep-alive, CONTENT-ENCODING"]))).toBe("Content-Encoding");
    expect(namedRepresentationHeader(framingHeaders(["Connection", "close", "connection", "content_type"]))).toBe("Content-Type");
    expect(namedRepresentationHeader(framingHeaders(["Connection", "keep-alive, x-hop, content-length", "Content-Encoding", "gzip"]))).toBeUndefined();
    expect(namedRepresentationHeader(framingHeaders(["Content-Encoding", "gzip"]))).toBeUndefined();
  });

  it("refuses an answer whose Connection names a header describing its body upstream_failed naming it, and no other", () => {
    expect(answerRepresentationRefusal({ connection: "keep-alive, Content-Encoding", "content-encoding": "gzip" })).toMatchObject({ code: "upstream_failed", message: expect.stringContaining("names Content-Encoding") });
    expect(answerRepresentationRefusal({ connection: "CONTENT-TYPE" })).toMatchObject({ code: "upstream_failed", message: expect.stringContaining("names Content-Type") });
    expect(answerRepresentationRefusal({ connection: "keep-alive, x-hop", "content-encoding": "gzip" })).toBeUndefined();
    expect(answerRepresentationRefusal({ "content-encoding": "gzip" })).toBeUndefined();
  });

  it("names a body's transfer codings other than chunked in its Content-Encoding, after the content codings, both ways", () => {
    const raw = ["Content-Encoding", "br", "Transfer-Encoding", "GZIP, chunked", "Content-Type", "text/plain"];
    expect(upstreamHeaders(raw, "upstream:2")).toEqual(["host", "upstream:2", "content-type", "text/plain", "content-encoding", "br, gzip"]);
    expect(upstreamHeaders(["Transfer-Encoding", "chunked", "Content-Encoding", "br"], "upstream:2")).toEqual(["host", "upstream:2", "content-encoding", "br"]);
    expect(callerHeaders({ "transfer-encoding": "deflate, gzip, chunked", "content-type": "text/plain" })).toEqual({ "content-type": "text/plain", "content-encoding": "deflate, gzip" });
    expect(callerHeaders({ "transfer-encoding": "gzip, chunked", "content-encoding": "br" })).toEqual({ "content-encoding": "br, gzip" });
    expect(callerHeaders({ "transfer-encoding": "chunked", "content-encoding": "br" })).toEqual({ "content-encoding": "br" });
  });

  // RFC 2616's `identity` transfer coding (older servers send `Transfer-Encoding: identity`, Node's parser
  // takes `identity, chunked`) means no coding: it was named `Content-Encoding: identity`, no content coding.
  it("names no Content-Encoding for an identity transfer coding", () => {
    expect(upstreamHeaders(["Transfer-Encoding", "identity, chunked", "Content-Type", "application/json"], "upstream:2", { identity: true })).toEqual([
      "host", "upstream:2", "content-type", "application/json", "accept-encoding", "identity",
    ]);
    expect(upstreamHeaders(["Transfer-Encoding", "Identity, gzip, chunked"], "upstream:2")).toEqual(["host", "upstream:2", "content-encoding", "gzip"]);
    expect(callerHeaders({ "transfer-encoding": "identity", "content-type": "text/plain" })).toEqual({ "content-type": "text/plain" });
    expect(callerHeaders({ "transfer-encoding": "identity", "content-encoding": "gzip" })).toEqual({ "content-encoding": "gzip" });
  });

  // `chunked, gzip`: the framing is not the last coding, so no parser removes it and the body (read to
  // the connection's close) still carries it. It was named `Content-Encoding: gzip` all the same.
  it("names no Content-Encoding for an answer whose chunked is not its last coding, not even its own, and says so", () => {
    const heard: string[] = [];
    const onUnframed = (transfer: string) => heard.push(transfer);
    expect(callerHeaders({ "transfer-encoding": "chunked, gzip", "content-type": "text/plain" }, undefined, onUnframed)).toEqual({ "content-type": "text/plain" });
    expect(callerHeaders({ "transfer-encoding": "gzip, chunked, br", "content-encoding": "deflate" }, undefined, onUnframed)).toEqual({});
    expect(heard).toEqual(["chunked, gzip", "gzip, chunked, br"]);
    // chunked last, or absent: the other codings are the body's, named as before, and nothing is heard.
    expect(callerHeaders({ "transfer-encoding": "gzip", "content-type": "text/plain" }, undefined, onUnframed)).toEqual({ "content-type": "text/plain", "content-encoding": "gzip" });
    expect(callerHeaders({ "transfer-encoding": "identity, chunked", "content-encoding": "br" }, undefined, onUnframed)).toEqual({ "content-encoding": "br" });
    expect(heard).toHaveLength(2);
  });

  it("reads the codings an answer's body carries past its chunked framing (identity none)", () => {
    expect(bodyCodings({ "content-type": "application/json" })).toBeUndefined();
    expect(bodyCodings({ "transfer-encoding": "chunked", "content-encoding": "identity" })).toBeUndefined();
    expect(bodyCodings({ "content-encoding": "GZIP" })).toBe("gzip");
    expect(bodyCodings({ "transfer-encoding": "gzip, chunked", "content-encoding": "br" })).toBe("br, gzip");
  });

  it("drops the headers the upstream's Connection names, and Proxy-Authenticate, from the caller's response (content-length kept)", () => {
    const headers = {
      connection: "close, x-backend-hop",
      "x-backend-hop": "internal",
      "proxy-authenticate": 'Basic realm="upstream"',
      "content-type": "application/json",
      "content-length": "12",
      "x-request-id": "r1",
    };
    expect(callerHeaders(headers)).toEqual({ "content-type": "application/json", "content-length": "12", "x-request-id": "r1" });
  });
});

describe("an upstream redirect's Location", () => {
  const base = parseUpstream("http://gpu-1:8000/serve/v1").url;
  it("on the upstream's origin under its base path: the same route on the proxy, behind the rollout prefix", () => {
    expect(proxiedLocation("http://gpu-1:8000/serve/v1/chat/completions?a=1#f", base, "/ng-rollout/r1")).toBe("/ng-rollout/r1/v1/chat/completions?a=1#f");
    expect(proxiedLocation("HTTP://GPU-1:8000/serve/v1/models", base, "")).toBe("/v1/models");
    expect(proxiedLocation("//gpu-1:8000/serve/v1/models", base, "")).toBe("/v1/models");
    expect(proxiedLocation("/serve/v1/models", base, "/ng-rollout/r1")).toBe("/ng-rollout/r1/v1/models");
    expect(proxiedLocation("http://gpu-1:8000/serve", base, "")).toBe("/");
    expect(proxiedLocation("http://127.0.0.1:80/v1/models", parseUpstream("http://127.0.0.1/v1").url, "")).toBe("/v1/models");
  });
  it("anything else is left as sent", () => {
    for (const location of ["http://gpu-2:8000/serve/v1/models", "https://gpu-1:8000/serve/v1/models", "http://gpu-1:8001/serve/v1/models", "http://gpu-1:8000/other/v1/models", "/servex/v1", "/other", "models", "../v1/models", "?page=2", "http://[bad"]) {
      expect(proxiedLocation(location, base, "/ng-rollout/r1")).toBe(location);
    }
  });
});

describe("a route's dot segments", () => {
  it("climbing above its root, in any spelling an upstream may decode", () => {
    for (const route of ["/..", "/../x", "/v1/../../x", "/%2E%2E/x", "/v1/..%2F..%2Fx", "/v1\\..\\..\\x", "/./../x", "//../x", "/../%zz"]) expect([route, climbsAboveRoot(route)]).toEqual([route, true]);
  });
  it("staying within it, or no dot segments at all", () => {
    for (const route of ["/", "/v1/chat/completions", "/v1/x/../chat/completions", "/v1/./models", "/..x/y", "/x../y", "/.../y", "/v1/%2e%2ex", "/x/%zz/.."]) expect([route, climbsAboveRoot(route)]).toEqual([route, false]);
  });
});
