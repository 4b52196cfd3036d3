/** A JSON value, as records carry it. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };
