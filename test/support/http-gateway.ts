import { createServer, request, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A reverse proxy on 127.0.0.1 in front of one HTTP server, or a round-robin load balancer in front
 * of several (each request to the next, on a connection of its own), answering as nginx does when it
 * cannot connect to one: 502 with an HTML body of its own. `answered` lists each request's path,
 * status and the upstream that took it.
 */
export interface HttpGateway {
  url: string;
  answered: { path: string; status: number; upstream: string }[];
  close(): Promise<void>;
}

export async function startHttpGateway(upstreams: string | string[]): Promise<HttpGateway> {
  const targets = [upstreams].flat();
  let next = 0;
  const answered: HttpGateway["answered"] = [];
  const server = createServer((req, res) => {
    const upstream = targets[next++ % targets.length]!;
    const target = new URL(upstream);
    const forwarded = request(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers, agent: false },
      (reply: IncomingMessage) => {
        answered.push({ path: req.url ?? "", status: reply.statusCode ?? 0, upstream });
        res.writeHead(reply.statusCode ?? 502, reply.headers);
        reply.pipe(res);
        reply.on("error", () => res.destroy());
      },
    );
    forwarded.on("error", () => {
      if (res.headersSent) return void res.destroy();
      answered.push({ path: req.url ?? "", status: 502, upstream });
      res.writeHead(502, { "content-type": "text/html" }).end("<html><body><h1>502 Bad Gateway</h1></body></html>");
    });
    req.pipe(forwarded);
  });
  server.keepAliveTimeout = 0;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    answered,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
