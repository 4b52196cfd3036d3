import { closeTaskRows, readTaskRows, type TaskRow } from "../../coordinator/collect/task-rows.js";

/** `readTaskRows`, its file closed again (rows of a regular file hold it open): for tests that look at the rows' ids only, never loading a task. */
export async function readTaskRowsClosed(...args: Parameters<typeof readTaskRows>): Promise<TaskRow[]> {
  const rows = await readTaskRows(...args);
  await closeTaskRows(rows);
  return rows;
}
