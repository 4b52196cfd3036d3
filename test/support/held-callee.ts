import { createServer, type Server, type ServerResponse } from "node:http";

/**
 * An HTTP callee on 127.0.0.1 that answers nothing itself: each request's response is handed to the
 * test once its body was read, so the test decides when (and what) it answers, e.g. after 300 s
 * of fake time. `close()` ends every connection, answered or not.
 */
export interface HeldCallee {
  url: string;
  /** The latest request's response once one arrived (the next one's when none has yet). */
  arrived(): Promise<ServerResponse>;
  close(): Promise<void>;
}

export async function startHeldCallee(): Promise<HeldCallee> {
  const responses: ServerResponse[] = [];
  const waiting: ((res: ServerResponse) => void)[] = [];
  const server: Server = createServer((request, response) => {
    request.resume();
    request.on("end", () => {
      responses.push(response);
      waiting.shift()?.(response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    arrived: () => (responses.length ? Promise.resolve(responses[responses.length - 1]!) : new Promise((resolve) => waiting.push(resolve))),
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
