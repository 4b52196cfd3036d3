/**
 * JSON.stringify, throwing `tooLong()` when the JSON would be longer than the longest string V8
 * makes (a huge record, reply or body, which may grow when written again: `9E20` is 21 digits): V8
 * throws a bare RangeError there, which would read as `internal_error`, so callers refuse that value
 * in their own terms (`payload_too_large`, `invalid_request`). Any other error (a stack overflow,
 * also a RangeError; a BigInt) is thrown as it is.
 */
export function jsonTextWithin(value: unknown, tooLong: () => Error, space?: number): string {
  try {
    return JSON.stringify(value, null, space);
  } catch (error) {
    if (error instanceof RangeError && /string length|string longer/i.test(error.message)) throw tooLong();
    throw error;
  }
}
