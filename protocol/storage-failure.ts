/**
 * Which thrown errors are the deployment's storage refusing (a full disk, a read-only or missing
 * mount, permissions, EIO, no file descriptors left): `toCheckpointError` answers those
 * `storage_error` rather than `internal_error` ("report a bug"), since the operator must fix the
 * disk or mount. Pure: it only reads the error.
 */

/** errno names that say the filesystem refused, not that gym-ckpt misbehaved. */
const STORAGE_CODES: ReadonlySet<string> = new Set([
  "ENOSPC",
  "EDQUOT",
  "EFBIG",
  "EIO",
  "EROFS",
  "EACCES",
  "EPERM",
  "ENOENT",
  "ENOTDIR",
  "ENAMETOOLONG",
  "EMFILE",
  "ENFILE",
  "ESTALE",
]);

/**
 * Node's `syscall` names of file-system calls. A socket's errors (connect, listen, getaddrinfo,
 * spawn, kill) may carry the same errno names (EACCES on listen, ENOENT on spawn or a unix socket's
 * connect) and stay what they were.
 */
const FS_SYSCALLS: ReadonlySet<string> = new Set([
  "open",
  "close",
  "read",
  "readv",
  "write",
  "writev",
  "fsync",
  "fdatasync",
  "ftruncate",
  "truncate",
  "mkdir",
  "mkdtemp",
  "rmdir",
  "rm",
  "unlink",
  "rename",
  "link",
  "symlink",
  "readlink",
  "realpath",
  "stat",
  "lstat",
  "fstat",
  "statfs",
  "access",
  "chmod",
  "fchmod",
  "chown",
  "fchown",
  "lchown",
  "utime",
  "futime",
  "lutime",
  "copyfile",
  "cp",
  "opendir",
  "scandir",
]);

/** A Node system error (errno name and syscall), as `fs` throws them. */
type SystemError = Error & { code: string; syscall: string; path?: unknown; dest?: unknown };

function isSystemError(error: unknown): error is SystemError {
  if (!(error instanceof Error)) return false;
  const { code, syscall } = error as Partial<SystemError>;
  return typeof code === "string" && typeof syscall === "string";
}

/** True for a file-system call the storage refused (see STORAGE_CODES); sockets and plain errors are not. */
export function isStorageFailure(error: unknown): boolean {
  return isSystemError(error) && STORAGE_CODES.has(error.code) && FS_SYSCALLS.has(error.syscall);
}

/**
 * A read the storage refused (EIO, EACCES, EMFILE...), as opposed to a file that is not there
 * (ENOENT, ENOTDIR), which callers name in their own terms (a checkpoint missing files, a state
 * file not yet written): passed on as it is, `storage_error`.
 */
export function isUnreadableStorage(error: unknown): boolean {
  return isStorageFailure(error) && (error as SystemError).code !== "ENOENT" && (error as SystemError).code !== "ENOTDIR";
}

/**
 * Node's message ("ENOSPC: no space left on device, write") with the path appended when Node
 * names one that its message leaves out: a call on a file handle (write, fsync) names none, so
 * writers attach theirs with `namePath`.
 */
export function storageFailureDetail(error: Error): string {
  const path = (error as Partial<SystemError>).path;
  return typeof path === "string" && !error.message.includes(path) ? `${error.message} '${path}'` : error.message;
}

/**
 * Gives a system error from a call on a file handle the path it was opened with (Node leaves
 * `path` unset there), so a refusal names the file; anything else is returned unchanged.
 */
export function namePath<E>(error: E, path: string): E {
  if (isSystemError(error) && error.path === undefined) error.path = path;
  return error;
}
