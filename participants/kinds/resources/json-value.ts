/** A JSON value, as records carry it (the protocol's type). */
export type { JsonValue } from "../../../protocol/json-value.js";
