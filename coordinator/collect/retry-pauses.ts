/** The collector's pauses before it sends something again, in seconds (tests shorten them). */
export interface RetryPauses {
  /** Between two tries of a controller op whose outcome is unknown. */
  resendS: number;
  /** Between two rounds of resends of our resumes still unanswered after every try. */
  unresumedS: number;
  /** Before the retires that failed are sent again. */
  retireS: number;
  /**
   * The first wait before the row probing a --run-url that accepts no connection (the Gym down or
   * restarting, or no file descriptor left here) is sent again (RefusalProbe); doubled per refusal
   * in a row, up to unreachableMaxS.
   */
  unreachableS: number;
  /** The longest such wait: about one connect per this many seconds while --run-url accepts none, and the most a row is sent late once it does. */
  unreachableMaxS: number;
  /** Before a row /run answered `storage_error` (the Gym's disk full or failing) is sent again. */
  storageS: number;
  /**
   * The first wait before the row probing a Gym whose admission another controller's checkpoint
   * keeps closed is sent again (RefusalProbe); doubled per refusal in a row, up to admissionClosedMaxS.
   */
  admissionClosedS: number;
  /** The longest such wait: about one /run per this many seconds while admission stays closed, and the most a row is sent late once it reopens. */
  admissionClosedMaxS: number;
  /**
   * Not a pause: how long a /run sent while rows wait for the admission probe may go unanswered to
   * count as admitted. A refusal comes at once, and an admitted /run replies only when its rollout
   * ends (minutes): the rows waiting would sit out the probe's whole rollout.
   */
  admittedAfterS: number;
  /** Not a pause: how long /run may keep answering admission_closed outside our checkpoints before it is logged. */
  admissionClosedWarnS: number;
}

export const DEFAULT_RETRY_PAUSES: RetryPauses = { resendS: 1, unresumedS: 5, retireS: 1, unreachableS: 1, unreachableMaxS: 4, storageS: 5, admissionClosedS: 0.25, admissionClosedMaxS: 4, admittedAfterS: 1, admissionClosedWarnS: 30 };
