import type { LoopDriver, LoopState } from "../../participants/gym/agent-server/tool-calling-agent.js";

/** A turn-loop driver that runs every model and tool call at once and keeps each boundary in `boundaries`. */
export function recordingDriver(boundaries: LoopState[]): LoopDriver {
  return {
    signal: new AbortController().signal,
    boundary: async (s) => void boundaries.push(s),
    model: (c) => c(),
    tool: (c) => c(),
    park: async () => undefined,
  };
}
