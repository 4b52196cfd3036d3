import { CONTROLLER_OPS, CheckpointError, type ControllerOp, type CtlReplyOf, type CtlRequestInputOf } from "../../protocol/index.js";
import { httpRoute } from "../api/openapi.js";
import { ControllerClient } from "./controller-client.js";
import { decodeControllerReply, replyTimeoutMs } from "./reply-decoder.js";

export interface HttpControllerClientOptions {
  /** e.g. http://127.0.0.1:8480 */
  baseUrl: string;
  token: string;
  timeoutMs?: number;
  slackMs?: number;
}

/** The controller API over HTTP/JSON (fetch). */
export class HttpControllerClient extends ControllerClient {
  constructor(private readonly options: HttpControllerClientOptions) {
    super();
  }

  async call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    const { method, url } = httpRoute(op);
    let path = url;
    if (op === "get") path = url.replace("{checkpoint_id}", encodeURIComponent((request as { checkpoint_id: string }).checkpoint_id));
    const timeout = replyTimeoutMs(request, this.options.timeoutMs ?? 90_000, this.options.slackMs ?? 10_000);
    let response: Response;
    try {
      response = await fetch(new URL(path, this.options.baseUrl), {
        method,
        headers: { authorization: `Bearer ${this.options.token}`, ...(method === "POST" ? { "content-type": "application/json" } : {}) },
        ...(CONTROLLER_OPS[op].method === "POST" ? { body: JSON.stringify(request) } : {}),
        signal: AbortSignal.timeout(Math.min(Math.max(1, Math.ceil(timeout)), 2 ** 31 - 1)),
      });
    } catch (error) {
      if ((error as Error).name === "TimeoutError") throw new CheckpointError("outcome_unknown", `no reply from ${path} within ${Math.round(timeout)} ms`);
      throw new CheckpointError("not_leader", `cannot reach the coordinator at ${this.options.baseUrl}: ${(error as Error).message}`);
    }
    return decodeControllerReply(op, await response.text());
  }
}
