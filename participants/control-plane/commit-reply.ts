import { MAX_CONTROL_MESSAGE_BYTES, canonicalDigest, type CommitReply } from "../../protocol/index.js";

/**
 * The commit reply as it can travel in `budget` bytes (one control message, or a server's lower
 * max_payload): with its episode list when the whole reply fits, else with the list left out (its
 * count and canonical digest instead), for the coordinator to read from the records just
 * committed. Tens of thousands of exported episodes (thousands, under a lowered max_payload) would
 * otherwise make the commit answer reply_too_large after its records were written, and the
 * checkpoint could never be published.
 */
export function fitCommitReply(reply: CommitReply, budget = MAX_CONTROL_MESSAGE_BYTES): CommitReply {
  if (reply.episode_ids === null || Buffer.byteLength(JSON.stringify(reply)) <= budget) return reply;
  const ids = reply.episode_ids;
  return { ...reply, episode_ids: null, episode_count: ids.length, episode_ids_sha256: canonicalDigest(ids) };
}
