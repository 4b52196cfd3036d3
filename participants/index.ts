/** Participant SDK: the kind-agnostic control plane, storage, and the kind adapters. */
export { ParticipantControlPlane } from "./control-plane/control-plane.js";
export type { ControlPlaneOptions } from "./control-plane/control-plane.js";
export type { ParticipantKind, ParticipantContext, KindReadiness, CloseAdmissionOptions } from "./control-plane/participant-kind.js";
export { startParticipant } from "./control-plane/start-participant.js";
export type { StartParticipantOptions, ParticipantHandle } from "./control-plane/start-participant.js";
export { ControlEndpoint } from "./control-plane/nats-endpoint.js";
export { MembershipAnnouncer } from "./control-plane/membership-announcer.js";
export { systemClock, ManualClock } from "./control-plane/clock.js";
export type { Clock } from "./control-plane/clock.js";
export { FsCheckpointStorage, participantDir, readParticipantManifest, scanRecordLines } from "./storage/fs-storage.js";
export type { CheckpointStorage, ParticipantTarget, PinnedManifest, PinnedParticipant, WrittenParticipant, ReadParticipant } from "./storage/checkpoint-storage.js";
export { WriteGate } from "./storage/write-gate.js";
export { writeFileAtomic, fsyncDir } from "./storage/fs-durable.js";
export { ScriptableKind, ScriptRecordSchema } from "./testing/scriptable-kind.js";
export type { ScriptRecord } from "./testing/scriptable-kind.js";
// The reference Gym's launcher (it starts the servers as processes from dist/).
export { launchGym, GYM_PROCESSES } from "./gym/gym-launcher.js";
export type { GymLaunchOptions, Gym, GymProcess, GymProcessName } from "./gym/gym-launcher.js";
// The kind adapters (the model kind is what the attach proxy runs), verifiers and replay, one
// namespace each (their own index files list what they export).
export * as environment from "./kinds/environment/index.js";
export * as agent from "./kinds/agent/index.js";
export * as model from "./kinds/model/index.js";
export * as resources from "./kinds/resources/index.js";
export * as verifiers from "./verifiers/index.js";
export * as replay from "./replay/index.js";
