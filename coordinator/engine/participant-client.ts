import { context as otelContext, trace, SpanStatusCode, type Context } from "@opentelemetry/api";
import {
  CONTROL_MESSAGES,
  CheckpointError,
  ErrorReplySchema,
  describeZodError,
  encodeMessage,
  foreignRefusal,
  participantSubject,
  protocolVersionMismatch,
  schemaVersionMismatch,
  toCheckpointError,
  type ErrorCode,
  type Kind,
  type Op,
  type ReplyOf,
  type RequestOf,
} from "../../protocol/index.js";
import { Cancellation } from "./cancellation.js";
import type { Clock } from "./clock.js";
import { coordinatorTelemetry, SPAN_ATTR } from "../telemetry/coordinator-telemetry.js";
import { probePresence } from "./presence-probe.js";
import { NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport } from "./transport.js";

const RETRY_PAUSE_MS = 50;

/** A participant as the coordinator addresses it. */
export interface ParticipantRef {
  kind: Kind;
  instance: string;
}

export type Outcome<O extends Op> =
  | { ok: true; participant: ParticipantRef; reply: ReplyOf<O> }
  | { ok: false; participant: ParticipantRef; code: ErrorCode; detail: string };

/** How one call is traced and when it gives up early. */
export interface CallOptions {
  /** The span the call's span is a child of (default: the active context). */
  parent?: Context;
  /** Checked before every try; throwing (e.g. `not_leader`) ends the call with that code. */
  guard?: () => void;
  /** Cancelled: the call stops waiting (no further try) and fails with the reason's code. */
  cancellation?: Cancellation;
  /**
   * Probe the participant while a try waits (`presenceProbeMs`): for a request only the addressed
   * process can answer (a guarded op naming its incarnation). One any process may answer (restore,
   * retire, forget) waits out its try instead: a replacement the supervisor is still starting may
   * answer it.
   */
  probePresence?: boolean;
}

export interface ParticipantClientOptions {
  transport: ParticipantTransport;
  deployment: string;
  token: string;
  clock: Clock;
  /** Added to the remaining time for the reply in flight. */
  slackMs: number;
  /** Upper bound of one try; a timed-out try is retried idempotently while the deadline allows. */
  attemptTimeoutMs?: number;
  /**
   * Period of the presence probes sent while a try of a call with `probePresence` waits (see
   * presence-probe.ts): one on a process gone from NATS ends after `ABSENT_PROBES` of them, not at
   * its timeout. Unset or 0: no probes.
   */
  presenceProbeMs?: number;
}

/**
 * One directed request per participant, so every outcome is attributable:
 *   no responders → `unreachable` at once (never retried), unless an earlier try timed out: that
 *     try may have acted (a reply lost in a NATS restart, the participant not resubscribed yet),
 *     so the outcome stays unknown;
 *   timeout → outcome unknown, retried with the same body while the deadline allows; so is a
 *     probed try whose process the presence probes found gone from NATS, before its timer;
 *   error reply → its catalog code; anything unparseable → `internal_error`.
 * The request timeout is the time left until the deadline plus slack.
 */
export class ParticipantClient {
  constructor(private readonly options: ParticipantClientOptions) {}

  /** What each try waits past the deadline (request_slack_ms). */
  get slackMs(): number {
    return this.options.slackMs;
  }

  async call<O extends Op>(
    participant: ParticipantRef,
    op: O,
    request: RequestOf<O>,
    deadlineMs: number,
    { parent, guard, cancellation, probePresence = false }: CallOptions = {},
  ): Promise<Outcome<O>> {
    const { clock } = this.options;
    const subject = participantSubject(this.options.deployment, participant.kind, participant.instance, op);
    const body = encodeMessage(request);
    const tracer = coordinatorTelemetry().tracer;
    const span = tracer.startSpan(
      `checkpoint.participant.${op}`,
      { attributes: { [SPAN_ATTR.kind]: participant.kind, [SPAN_ATTR.instance]: participant.instance, [SPAN_ATTR.op]: op } },
      parent ?? otelContext.active(),
    );
    const ctx = trace.setSpan(parent ?? otelContext.active(), span);
    const started = clock.monotonic(); // durations: a wall-clock step must not skew them
    let outcome: Outcome<O>;
    try {
      outcome = await this.attempt(participant, op, subject, body, deadlineMs, ctx, guard, cancellation, probePresence);
    } catch (error) {
      const refusal = toCheckpointError(error);
      outcome = { ok: false, participant, code: refusal.code, detail: refusal.message };
    }
    const result = outcome.ok ? "ok" : outcome.code;
    coordinatorTelemetry().requestDuration.record((clock.monotonic() - started) / 1000, { op, kind: participant.kind, outcome: result });
    if (!outcome.ok) {
      span.setAttribute(SPAN_ATTR.code, outcome.code);
      span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.detail });
    }
    span.end();
    return outcome;
  }

  private async attempt<O extends Op>(
    participant: ParticipantRef,
    op: O,
    subject: string,
    body: string,
    deadlineMs: number,
    ctx: Context,
    guard: (() => void) | undefined,
    cancellation: Cancellation | undefined,
    probe: boolean,
  ): Promise<Outcome<O>> {
    const { clock, transport, slackMs, token } = this.options;
    let unknown: RequestTimeoutFailure | undefined; // why the last try's outcome is unknown
    for (let tries = 1; ; tries++) {
      guard?.();
      if (cancellation?.reason) throw cancellation.reason;
      const remaining = deadlineMs - clock.now();
      let timeoutMs = Math.max(remaining, 0) + slackMs;
      if (this.options.attemptTimeoutMs !== undefined) timeoutMs = Math.min(timeoutMs, this.options.attemptTimeoutMs);
      let text: string;
      const watch = this.watchTry(participant, probe, cancellation);
      try {
        // Stamped by the clock the deadline came from: a participant compares the two clocks with it.
        text = await transport.request(subject, body, { timeoutMs, token, context: ctx, sentAtMs: clock.now(), ...(watch.cancellation && { cancellation: watch.cancellation }) });
      } catch (error) {
        if (error instanceof NoRespondersFailure) {
          // Unreachable says nothing was done there; after a try with an unknown outcome that is not known.
          if (unknown) {
            return {
              ok: false,
              participant,
              code: "outcome_unknown",
              detail: `${participant.kind}/${participant.instance}: ${op}: ${unknown.message}, then ${error.message} (the earlier try may have acted)`,
            };
          }
          return { ok: false, participant, code: "unreachable", detail: `${participant.kind}/${participant.instance}: ${error.message}` };
        }
        if (error instanceof RequestTimeoutFailure) {
          unknown = error;
          const left = deadlineMs - clock.now();
          if (left > 0) {
            // Unknown outcome: retry the same body (idempotent per checkpoint_id and op) after a short pause.
            await clock.sleep(Math.min(RETRY_PAUSE_MS * tries, left));
            continue;
          }
          return {
            ok: false,
            participant,
            code: "outcome_unknown",
            detail: `${participant.kind}/${participant.instance}: ${op} timed out after ${tries} ${tries === 1 ? "try" : "tries"}`,
          };
        }
        throw error;
      } finally {
        watch.stop();
      }
      return parseReply(participant, op, text);
    }
  }

  /** What may end one try before its timer: the call's cancellation and, when probed, the participant's process found gone from NATS. */
  private watchTry(participant: ParticipantRef, probe: boolean, cancellation: Cancellation | undefined): { cancellation: Cancellation | undefined; stop: () => void } {
    const everyMs = this.options.presenceProbeMs;
    if (!everyMs || !probe) return { cancellation, stop: () => undefined };
    const ended = new Cancellation();
    // The call's cancellation reaches this try through `ended`: one listener each.
    const unlink = cancellation?.onCancel((reason) => ended.interrupt(reason));
    const statusSubject = participantSubject(this.options.deployment, participant.kind, participant.instance, "status");
    const who = `${participant.kind}/${participant.instance}`;
    const { transport, clock, token } = this.options;
    const stopProbes = probePresence(statusSubject, who, { transport, clock, token, everyMs }, (failure) => ended.interrupt(failure));
    return {
      cancellation: ended,
      stop: () => {
        stopProbes();
        unlink?.();
      },
    };
  }
}

function parseReply<O extends Op>(participant: ParticipantRef, op: O, text: string): Outcome<O> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false, participant, code: "internal_error", detail: `${participant.kind}/${participant.instance}: reply is not JSON` };
  }
  // Only a body with an `error` key can be a refusal (avoids building a ZodError for every reply).
  if (value !== null && typeof value === "object" && "error" in value) {
    const refusal = ErrorReplySchema.safeParse(value);
    if (refusal.success) return { ok: false, participant, code: refusal.data.error.code, detail: refusal.data.error.detail };
    const foreign = foreignRefusal(value, `${participant.kind}/${participant.instance}`, op);
    if (foreign) return { ok: false, participant, code: foreign.code, detail: foreign.message };
  }
  // Before the schema: another version's fields would read as unrecognized keys, and its phases
  // in this version's shape would be read as if they were this version's.
  const otherVersion = protocolVersionMismatch(value, `${participant.kind}/${participant.instance}`);
  if (otherVersion) return { ok: false, participant, code: "internal_error", detail: otherVersion };
  // Likewise a commit reply's manifest of another format version (a participant built with it).
  const manifest = value !== null && typeof value === "object" ? (value as { manifest?: unknown }).manifest : undefined;
  const otherSchema = op === "commit" ? schemaVersionMismatch(manifest, `${participant.kind}/${participant.instance}'s manifest`) : undefined;
  if (otherSchema) return { ok: false, participant, code: "internal_error", detail: otherSchema };
  const parsed = CONTROL_MESSAGES[op].reply.safeParse(value);
  if (!parsed.success) {
    return {
      ok: false,
      participant,
      code: "internal_error",
      detail: `${participant.kind}/${participant.instance}: invalid ${op} reply: ${describeZodError(parsed.error)}`,
    };
  }
  return { ok: true, participant, reply: parsed.data as ReplyOf<O> };
}

type ParticipantFailure = { participant: ParticipantRef; code: ErrorCode; detail: string };

/** Failed outcomes as replies and error data list them: `{kind, instance, code, detail}`. */
export function failureRefs(failures: ParticipantFailure[]): { kind: ParticipantRef["kind"]; instance: string; code: ErrorCode; detail: string }[] {
  return failures.map((f) => ({ kind: f.participant.kind, instance: f.participant.instance, code: f.code, detail: f.detail }));
}

/**
 * How combinedFailure's detail begins: over the wire only code and detail survive, so a controller
 * tells "the op ran and failed at these participants" (a resume: the checkpoint closed anyway, they
 * resume when their lease expires) from a refusal of the op itself by this prefix.
 */
export function participantFailurePrefix(op: string): string {
  return `${op} failed on `;
}

/** One CheckpointError summarizing several failed outcomes (the first code wins). */
export function combinedFailure(op: string, failures: ParticipantFailure[]): CheckpointError {
  const first = failures[0]!;
  // Every failing participant by name and code first (the reply's detail is cut at 4096
  // characters), then what the first few said.
  const names = failures.map((f) => `${f.participant.kind}/${f.participant.instance}: ${f.code}`).join(", ");
  const details = failures
    .slice(0, 5)
    .map((f) => {
      // A transport failure's detail already names its participant (it stands alone in `failures`).
      const name = `${f.participant.kind}/${f.participant.instance}: `;
      return f.detail.startsWith(name) ? f.detail : `${name}${f.detail}`;
    })
    .join("; ");
  return new CheckpointError(first.code, `${participantFailurePrefix(op)}${failures.length} participant(s): ${names}; first details: ${details}`, {
    data: { failures: failureRefs(failures) },
  });
}
