/**
 * One rollout record: the JSON form of a finished trace, one per line in a record file. The
 * schemas live in the protocol (`protocol/rollout-records.ts`) so writers outside participants
 * (the collector) encode the same lines; replay keeps its historical names.
 */
export {
  TraceContentSchema as ContentSchema,
  TraceToolCallSchema as ToolCallSchema,
  TraceMessageSchema as MessageSchema,
  TraceNodeSchema as MessageNodeSchema,
  TracePromptSchema as PromptSchema,
  TraceTaskSchema as RecordTaskSchema,
  TraceRecordSchema,
} from "../../protocol/index.js";
export type {
  TraceContent as Content,
  TraceToolCall as ToolCall,
  TraceMessage as Message,
  TraceNode as MessageNode,
  TracePrompt as Prompt,
  TraceTask as RecordTask,
  TraceRecord,
} from "../../protocol/index.js";
