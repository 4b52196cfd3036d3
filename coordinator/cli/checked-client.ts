import { CONTROLLER_OPS, CheckpointError, describeZodError, type ControllerOp, type CtlReplyOf, type CtlRequestInputOf } from "../../protocol/index.js";
import { ControllerClient } from "../client/controller-client.js";

/**
 * The client a CLI command talks through. Each request is checked against its op's schema before
 * anything is connected, so a bad id or scope exits 2 (`invalid_request`) whether or not NATS or
 * the HTTP API answers: with the connection first, `gym-ckpt commit ../x` said `not_leader` while
 * NATS was down and `invalid_request` once it was up. The real client is opened at the first
 * request that passes; `close` closes it if it was.
 */
export class CheckedClient extends ControllerClient {
  private opened: Promise<ControllerClient> | undefined;

  constructor(private readonly open: () => Promise<ControllerClient>) {
    super();
  }

  async call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    const checked = CONTROLLER_OPS[op].request.safeParse(request);
    if (!checked.success) throw new CheckpointError("invalid_request", describeZodError(checked.error));
    this.opened ??= this.open();
    return (await this.opened).call(op, request);
  }
}
