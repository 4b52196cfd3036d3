import { timerDelay } from "../../protocol/index.js";

/** Resolves after `seconds`; unref'd, so a pause alone never keeps the collector's process alive. */
export function delay(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, timerDelay(seconds * 1000)).unref());
}
