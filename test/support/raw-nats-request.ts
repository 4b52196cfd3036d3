import { connect as tcpConnect } from "node:net";

/**
 * Sends one request with `headerBlock` as its NATS header block over the raw client protocol and
 * resolves the reply's payload: nats.js refuses to build some header blocks (a name with a space)
 * that any client on the bus can still send this way.
 */
export async function rawRequestWithHeaders(natsUrl: string, subject: string, headerBlock: string, payload: string, timeoutMs = 5_000): Promise<string> {
  const { hostname, port } = new URL(natsUrl);
  const socket = tcpConnect(Number(port), hostname);
  let received = "";
  const replied = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no reply; got ${JSON.stringify(received)}`)), timeoutMs);
    socket.on("data", (chunk) => {
      received += chunk.toString("utf8");
      const at = received.indexOf("MSG _INBOX.raw ");
      if (at === -1) return;
      const lines = received.slice(at).split("\r\n");
      if (lines.length < 3) return;
      clearTimeout(timer);
      resolve(lines[1]!);
    });
    socket.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
  socket.write(`CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1}\r\nSUB _INBOX.raw 1\r\n`);
  socket.write(`HPUB ${subject} _INBOX.raw ${headerBlock.length} ${headerBlock.length + payload.length}\r\n${headerBlock}${payload}\r\n`);
  try {
    return await replied;
  } finally {
    socket.destroy();
  }
}
