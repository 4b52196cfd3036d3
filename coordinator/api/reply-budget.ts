import {
  CheckpointError,
  MAX_CONTROL_MESSAGE_BYTES,
  canonicalDigest,
  encodeReply,
  type ControllerOp,
  type CtlReplyOf,
} from "../../protocol/index.js";

/**
 * Fits a controller reply into one NATS message (docs/api.md, "Reply size"). Lists grow with the
 * scope times the participants holding it (a commit of 6,800 episodes held by four participants
 * is 1.06 MB), so past the budget the reply leaves some out, in a shape its strict schema
 * describes: first samples and details whose counts stay (blockers, error details), then complete
 * lists, largest first, each replaced by null with its length and digest beside it. What stays too
 * large after that (thousands of participants) is still `reply_too_large`.
 */

/** Error details past the budget keep this many characters. */
const CUT_DETAIL_CHARS = 200;

type Json = Record<string, unknown>;

/** One thing the reply can do without: its bytes now, and the bytes of what replaces it. */
interface Slot {
  /** 0: samples and details (their counts stay); 1: complete lists. */
  tier: 0 | 1;
  bytes: number;
  replacement: number;
  leaveOut(): void;
}

/** The 64 hex digits of a digest, in quotes. */
const SHA_VALUE_BYTES = 66;

const jsonBytes = (value: unknown): number => Buffer.byteLength(JSON.stringify(value));

/** A complete list: null, plus `countKey` (when given) and `shaKey` appended to its object. */
function listSlot(owner: Json, key: string, countKey: string | null, shaKey: string): Slot | undefined {
  const value = owner[key];
  if (value === null || value === undefined) return undefined;
  const count = Array.isArray(value) ? value.length : 0;
  return {
    tier: 1,
    bytes: jsonBytes(value),
    // null, then `,"<sha key>":"<digest>"` and `,"<count key>":<count>` appended to the object
    replacement: 4 + Buffer.byteLength(`,"${shaKey}":`) + SHA_VALUE_BYTES + (countKey === null ? 0 : Buffer.byteLength(`,"${countKey}":${count}`)),
    leaveOut() {
      owner[key] = null;
      if (countKey !== null) owner[countKey] = count;
      owner[shaKey] = canonicalDigest(value);
    },
  };
}

/** A sample whose full count is reported beside it: emptied. */
function sampleSlot(owner: Json, key: string): Slot | undefined {
  const value = owner[key];
  if (!Array.isArray(value) || value.length === 0) return undefined;
  return {
    tier: 0,
    bytes: jsonBytes(value),
    replacement: 2,
    leaveOut() {
      owner[key] = [];
    },
  };
}

/** A `{code, detail}` error's detail: cut, saying how long it was. */
function detailSlot(error: unknown): Slot | undefined {
  const owner = error as Json | null;
  const detail = owner?.detail;
  if (typeof detail !== "string" || detail.length <= CUT_DETAIL_CHARS) return undefined;
  const cut = `${detail.slice(0, CUT_DETAIL_CHARS)}… (${detail.length} characters)`;
  return {
    tier: 0,
    bytes: jsonBytes(detail),
    replacement: jsonBytes(cut),
    leaveOut() {
      owner!.detail = cut;
    },
  };
}

function participantEntrySlots(entry: Json): (Slot | undefined)[] {
  return [listSlot(entry, "episode_ids", "episode_count", "episode_ids_sha256"), listSlot(entry, "extras", null, "extras_sha256")];
}

/** What each op's reply can leave out; ops not listed have no list that grows with the scope. */
function slotsOf(op: ControllerOp, reply: Json): (Slot | undefined)[] {
  const participants = (reply.participants ?? []) as Json[];
  switch (op) {
    case "commit":
      return participants.flatMap(participantEntrySlots);
    case "get": {
      const manifest = reply.manifest as Json;
      return [
        ...(manifest.participants as Json[]).flatMap(participantEntrySlots),
        listSlot(manifest, "scope", "scope_count", "scope_sha256"),
        listSlot(manifest, "restarts", "restart_count", "restarts_sha256"),
      ];
    }
    case "prepare":
      return [
        ...participants.flatMap((p) => {
          const report = p.report as Json | null;
          return report ? [sampleSlot(report, "blockers"), listSlot(report, "restarts", "restart_count", "restarts_sha256"), detailSlot(p.error)] : [detailSlot(p.error)];
        }),
        ...(reply.blockers as Json[]).map((b) => sampleSlot(b, "blockers")),
      ];
    case "status":
      return participants.flatMap((p) => [sampleSlot(p, "blockers"), detailSlot(p.error)]);
    case "checkpoint":
      return [...(reply.resume_failures as Json[]).map(detailSlot), listSlot(reply, "restarts", "restart_count", "restarts_sha256")];
    case "restore":
      return participants.map((p) => listSlot(p, "restored", "restored_count", "restored_sha256"));
    case "retire":
      return participants.map((p) => listSlot(p, "retired", "retired_count", "retired_sha256"));
    case "forget":
      return participants.map((p) => listSlot(p, "forgotten", "forgotten_count", "forgotten_sha256"));
    case "list":
      // Never its checkpoints: the damaged ones' details are cut, then (leaveOutDamaged) their last entries.
      return ((reply.damaged ?? []) as Json[]).map(detailSlot);
    default:
      return [];
  }
}

/**
 * `reply` itself when its JSON fits `budget` bytes, else a copy with as little left out as the
 * order allows (the engine's reply, which it may keep and answer again, is not changed).
 */
export function fitControllerReply<O extends ControllerOp>(op: O, reply: CtlReplyOf<O>, budget = MAX_CONTROL_MESSAGE_BYTES): CtlReplyOf<O> {
  return fit(op, reply, JSON.stringify(reply), budget);
}

/**
 * The reply's JSON for the NATS API: fitted to one message, else `reply_too_large` (the op
 * succeeded). `budget` is the server's max_payload when a deployment configures it below 1 MiB.
 */
export function encodeControllerReply<O extends ControllerOp>(op: O, reply: CtlReplyOf<O>, budget = MAX_CONTROL_MESSAGE_BYTES): string {
  const text = JSON.stringify(reply);
  if (Buffer.byteLength(text) <= budget) return text;
  const fitted = encodeReply(fit(op, reply, text, budget), op);
  const size = Buffer.byteLength(fitted);
  if (size > budget) {
    throw new CheckpointError("reply_too_large", `${op} succeeded, but its ${size}-byte reply exceeds the NATS server's max_payload (${budget} bytes)`);
  }
  return fitted;
}

function fit<O extends ControllerOp>(op: O, reply: CtlReplyOf<O>, text: string, budget: number): CtlReplyOf<O> {
  let size = Buffer.byteLength(text);
  if (size <= budget) return reply;
  const copy = structuredClone(reply) as Json;
  const slots = slotsOf(op, copy)
    .filter((s): s is Slot => s !== undefined && s.replacement < s.bytes)
    .sort((a, b) => a.tier - b.tier || b.bytes - a.bytes);
  for (const slot of slots) {
    if (size <= budget) break;
    slot.leaveOut();
    size += slot.replacement - slot.bytes;
  }
  if (op === "list" && size > budget) leaveOutDamaged(copy, size - budget);
  return copy as CtlReplyOf<O>;
}

/**
 * `list`'s damaged checkpoints, which retention never deletes, so their number has no bound: the
 * last ones by id left out until the reply is `excess` bytes smaller, counted in `damaged_left_out`.
 * A prefix of the id order stays, so a controller knows which ones it was not told of.
 */
function leaveOutDamaged(reply: Json, excess: number): void {
  const damaged = reply.damaged as Json[] | undefined;
  if (!damaged) return;
  let kept = damaged.length;
  let saved = 0;
  // `,"damaged_left_out":<count>` is added: at most as many digits as the list's length has.
  const added = Buffer.byteLength(`,"damaged_left_out":${damaged.length}`);
  while (kept > 0 && saved < excess + added) {
    kept -= 1;
    // The entry and the comma before it (the first one has none).
    saved += jsonBytes(damaged[kept]) + (kept > 0 ? 1 : 0);
  }
  reply.damaged = damaged.slice(0, kept);
  reply.damaged_left_out = damaged.length - kept;
}
