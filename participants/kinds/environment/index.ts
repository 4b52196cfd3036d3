/** Environment participant SDK: the step tracker, restorable episodes and the kind adapter. */
export { AdmissionGate } from "./admission-gate.js";
export { EpisodeSteps } from "./episode-steps.js";
export type { Boundary, EpisodeState, ExportableEpisode, RunOptions, StepEpisode, StepMode } from "./episode-steps.js";
export { RestorableEpisodes } from "./restorable-episodes.js";
export type { BeginOptions, EpisodeSnapshot } from "./restorable-episodes.js";
export { BoundarySchema, EnvironmentRecordSchema } from "./environment-record.js";
export type { EnvironmentRecord } from "./environment-record.js";
export { EnvironmentKind } from "./environment-kind.js";
