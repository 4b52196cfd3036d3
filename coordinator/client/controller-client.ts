import type { ControllerOp, CtlReplyOf, CtlRequestInputOf } from "../../protocol/index.js";
import { newCheckpointId } from "../engine/checkpoint-id.js";

/**
 * The typed controller client: one method per controller op. `NatsControllerClient` and
 * `HttpControllerClient` implement `call`; replies are validated against the reply schemas and
 * refusals are thrown as `CheckpointError` with the catalog code.
 */
export abstract class ControllerClient {
  abstract call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>>;

  /** Without an id, one is chosen here, so every retry (not_leader, a lost reply) repeats the same op. */
  checkpoint(request: CtlRequestInputOf<"checkpoint"> = {}) {
    return this.call("checkpoint", { ...request, checkpoint_id: request.checkpoint_id ?? newCheckpointId() });
  }
  prepare(request: CtlRequestInputOf<"prepare">) {
    return this.call("prepare", request);
  }
  commit(request: CtlRequestInputOf<"commit">) {
    return this.call("commit", request);
  }
  publish(request: CtlRequestInputOf<"publish">) {
    return this.call("publish", request);
  }
  resume(request: CtlRequestInputOf<"resume">) {
    return this.call("resume", request);
  }
  renew(request: CtlRequestInputOf<"renew">) {
    return this.call("renew", request);
  }
  restore(request: CtlRequestInputOf<"restore">) {
    return this.call("restore", request);
  }
  retire(request: CtlRequestInputOf<"retire">) {
    return this.call("retire", request);
  }
  forget(request: CtlRequestInputOf<"forget">) {
    return this.call("forget", request);
  }
  status() {
    return this.call("status", {});
  }
  list() {
    return this.call("list", {});
  }
  get(checkpointId: string) {
    return this.call("get", { checkpoint_id: checkpointId });
  }
}
