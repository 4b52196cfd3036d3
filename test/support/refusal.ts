import { CheckpointError } from "../../protocol/index.js";

/** The catalog error `work` refuses with; fails the test when it succeeds or throws anything else. */
export async function refusalOf(work: Promise<unknown> | (() => Promise<unknown> | unknown)): Promise<CheckpointError> {
  try {
    await (typeof work === "function" ? work() : work);
  } catch (error) {
    if (error instanceof CheckpointError) return error;
    throw error;
  }
  throw new Error("expected a refusal");
}

/** The catalog code `work` refuses with. */
export async function refusalCode(work: Promise<unknown> | (() => Promise<unknown> | unknown)): Promise<string> {
  return (await refusalOf(work)).code;
}

/** The catalog error a synchronous `work` refuses with; fails the test when it returns or throws anything else. */
export function refusalOfSync(work: () => unknown): CheckpointError {
  try {
    work();
  } catch (error) {
    if (error instanceof CheckpointError) return error;
    throw error;
  }
  throw new Error("expected a refusal");
}
