import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

/** The id of a coordinator configured without `coordinator_id`: `<host>-<pid>-<random>`. */
export function newCoordinatorId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
}
