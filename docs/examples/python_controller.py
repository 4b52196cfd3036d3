#!/usr/bin/env python3
"""A training controller driving gym-ckpt's coordinator over its HTTP/JSON API (docs/api.md §3).

Standard library only (Python 3.9+): copy GymCkptClient into your trainer. main() is a toy training
loop: on start it restores the latest published checkpoint, if any, then checkpoints after every
step the fine-grained way (prepare -> flush -> commit -> publish -> resume), one JSON line per step.

    python3 python_controller.py --url http://127.0.0.1:8480 --steps 3 --rollouts r1,r2
"""
import argparse
import errno
import http.client
import json
import os
import secrets
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


# Connection errors that prove the request never left (as the TypeScript client's never-sent.ts).
NOT_SENT = (ConnectionRefusedError, socket.gaierror)
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would send the token on to whatever host a Location names,
    and a POST on as a GET without its body (an ingress sending http:// to https://, say)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises the 3xx as an HTTPError, handled below


_OPENER = urllib.request.build_opener(_NoRedirect)


class GymCkptError(Exception):
    """A refusal: `code` is from the error catalog (docs/errors.md); a refused op changed nothing."""

    def __init__(self, code, detail, status=None):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail, self.status = code, detail, status


class GymCkptClient:
    """One method per op. Ops that take a deadline get one (`timeout_s` from now) unless given."""

    def __init__(self, url, token, timeout_s=60.0, leader_wait_s=10.0):
        if not url.startswith(("http://", "https://")):
            raise GymCkptError("invalid_request", "the coordinator's URL must start with http:// or https://")
        self.url, self.token = url.rstrip("/"), token
        self.timeout_s, self.leader_wait_s = timeout_s, leader_wait_s

    def _call(self, method, path, body=None, deadline_ts=None):
        # not_leader promises nothing ran (no coordinator leads yet, or none listens): safe to send
        # again, for a bounded time. Nothing else is retried here: an outcome_unknown op may have run,
        # so the caller retries it with the same checkpoint id and arguments when it wants to.
        give_up = time.monotonic() + self.leader_wait_s
        while True:
            try:
                return self._send(method, path, body, deadline_ts)
            except GymCkptError as error:
                if error.code != "not_leader" or time.monotonic() >= give_up:
                    raise
                time.sleep(0.1)

    def _send(self, method, path, body, deadline_ts):
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        headers = {"authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["content-type"] = "application/json"
        # Wait for the reply until the op's deadline plus 10 s of slack, as the TypeScript client does.
        timeout = (deadline_ts - time.time() if deadline_ts else self.timeout_s) + 10
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            try:
                response = _OPENER.open(request, timeout=max(timeout, 1))
            except urllib.error.HTTPError as error:  # any status but 2xx: its body may be a refusal
                response = error
            with response:
                status, text = response.status, response.read()
        except ValueError:  # urllib refused the URL or a header before sending (not echoed: the token)
            raise GymCkptError("invalid_request", f"cannot send {path}: a bad URL, or a token that is not one line of printable characters") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, NOT_SENT) or getattr(error.reason, "errno", None) in UNREACHABLE:
                # No connection was made (nobody listens, unknown host, no route): nothing was sent.
                raise GymCkptError("not_leader", f"cannot reach the coordinator at {self.url}: {error.reason}") from None
            raise GymCkptError("outcome_unknown", f"{path} failed while sending: {error.reason}; retry with the same arguments") from None
        except (OSError, http.client.HTTPException) as error:
            # A reset, timeout or cut-off body after the request left: the op may have run.
            raise GymCkptError("outcome_unknown", f"no reply from {path}: {error!r}; retry with the same arguments") from None
        if 300 <= status < 400:
            # Something in front of the coordinator (which never redirects) answered: nothing ran.
            where = response.headers.get("Location", "nowhere")
            raise GymCkptError("invalid_request", f"{path} answered a redirect (HTTP {status}) to {where}, which is not followed; nothing ran: give the coordinator's own URL", status)
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        refusal = value.get("error") if isinstance(value, dict) and set(value) == {"error"} else None
        if isinstance(refusal, dict) and isinstance(refusal.get("code"), str):
            raise GymCkptError(refusal["code"], str(refusal.get("detail", "")), status)
        if status in (502, 503, 504):
            # Not the API's own body: a proxy in front of the coordinator answered, the op may still run.
            raise GymCkptError("outcome_unknown", f"{path} answered HTTP {status} by something in front of the coordinator", status)
        if status != 200 or not isinstance(value, dict):
            raise GymCkptError("internal_error", f"{path} answered HTTP {status} with a body that is not the API's", status)
        return value

    def _op(self, op, **body):
        if "deadline_ts" in body and body["deadline_ts"] is None:
            body["deadline_ts"] = time.time() + self.timeout_s
        return self._call("POST", f"/v1/{op}", body, body.get("deadline_ts"))

    def prepare(self, checkpoint_id, deadline_ts=None):
        return self._op("prepare", checkpoint_id=checkpoint_id, deadline_ts=deadline_ts)

    def commit(self, checkpoint_id, episode_ids, deadline_ts=None):
        return self._op("commit", checkpoint_id=checkpoint_id, episode_ids=episode_ids, deadline_ts=deadline_ts)

    def publish(self, checkpoint_id, inline_state):
        return self._op("publish", checkpoint_id=checkpoint_id, controller_state={"inline": inline_state})

    def resume(self, checkpoint_id, deadline_ts=None):
        return self._op("resume", checkpoint_id=checkpoint_id, deadline_ts=deadline_ts)

    def restore(self, checkpoint_id, episode_ids, deadline_ts=None):
        return self._op("restore", checkpoint_id=checkpoint_id, episode_ids=episode_ids, deadline_ts=deadline_ts)

    def retire(self, episode_ids, deadline_ts=None):
        return self._op("retire", episode_ids=episode_ids, deadline_ts=deadline_ts)

    def list(self):
        return self._call("GET", "/v1/checkpoints")

    def get(self, checkpoint_id):
        return self._call("GET", "/v1/checkpoints/" + urllib.parse.quote(checkpoint_id, safe=""))


# ---- the example training loop --------------------------------------------------------------


def emit(**fields):
    print(json.dumps(fields), flush=True)


def next_attempt(episode, n):
    return {"rollout_id": episode["rollout_id"], "attempt": episode["attempt"] + n}


def start(client, state):
    """Continue from the latest published checkpoint, if there is one (docs/api.md, `restore`)."""
    listing = client.list()
    # Checkpoints whose checkpoint.json cannot be read are not listed: named for the operator
    # (gym-ckpt verify <id>); an older LATEST may still be fine.
    for broken in listing.get("damaged", []):
        emit(event="damaged_checkpoint", checkpoint_id=broken["checkpoint_id"], code=broken["code"], detail=broken["detail"])
    latest = listing["latest"]
    if latest is None:
        damaged = listing.get("latest_error")
        if damaged:
            # LATEST cannot be read, or names a checkpoint that is damaged or gone: our state is in an
            # older one. Starting fresh would lose it, and our next publication would move LATEST past
            # it, so stop: an operator picks the one to restore (gym-ckpt ls, gym-ckpt verify).
            raise GymCkptError(damaged["code"], f"LATEST is damaged ({damaged['detail']}): not starting fresh; restore an older checkpoint")
        return emit(event="fresh_start")
    manifest = client.get(latest)["manifest"]
    # We published our state inline, and the commit scope: the episodes we had in flight. A LATEST
    # without it is another controller's (`gym-ckpt checkpoint`, `collect`'s collection.json): its
    # episodes are not ours to continue, so start fresh, as `gym-ckpt collect` does.
    inline = (manifest.get("controller_state") or {}).get("inline")
    if not isinstance(inline, dict) or "step" not in inline:
        return emit(event="fresh_start", not_ours=latest)
    state.update(inline)
    scope = manifest["scope"] or []
    try:
        reply = client.restore(latest, scope)  # only fresh Gym processes take it: a whole-job restart
    except GymCkptError as error:
        # stale_checkpoint: the Gym servers already resumed from it (only the trainer restarted);
        # restore_failed: not installed everywhere, attempt+1 retired and everyone resumed. Either
        # way the source attempts may still run somewhere: retire attempt+1 everywhere (a retire
        # fences every attempt up to the one named) and start those rollouts over as attempt+2.
        if error.code not in ("stale_checkpoint", "restore_failed"):
            raise
        if scope:
            client.retire([next_attempt(e, 1) for e in scope])
        state["in_flight"] = [next_attempt(e, 2) for e in scope]
        return emit(event="restarted_from_input", checkpoint_id=latest, step=state["step"], code=error.code)
    # Every restored episode continues as its next attempt: the Gym holds its state under that key.
    state["in_flight"] = [next_attempt(e, 1) for e in scope]
    # The participants stay parked ("restored") until this resume; they run attempt+1 from then on.
    client.resume(latest)
    restored = {f"{p['kind']}/{p['instance']}": p["restored"] for p in reply["participants"]}
    emit(event="restored", checkpoint_id=latest, step=state["step"], restored=restored)


def checkpoint(client, checkpoint_id, state):
    """prepare -> flush -> commit -> publish -> resume; returns the publish reply, or None when not prepared."""
    deadline_ts = time.time() + 60
    settled = False
    try:
        if not client.prepare(checkpoint_id, deadline_ts)["prepared"]:
            settled = True
            return None  # a stage could not reach a safe boundary in time: try again next step
        # Every rollout is parked at a safe boundary: flush the trainer's own state now. Ours is small
        # JSON, sent inline; write a large one into the checkpoint directory and publish {file, sha256}.
        client.commit(checkpoint_id, state["in_flight"], deadline_ts)
        published = client.publish(checkpoint_id, state)
        settled = True
        return published
    finally:
        # Whatever happened after prepare (a refusal, an exception of our own), let the rollouts go
        # on: a participant left parked refuses every later prepare until its lease expires. Resume
        # before commit aborts; after a failed publish it abandons the checkpoint; after it, goes on.
        try:
            client.resume(checkpoint_id)  # a deadline of its own: a slow publish may have used up the step's
        except GymCkptError as error:
            if settled:
                raise
            # Keep the first failure as the news; the participants resume when their leases expire.
            print(f"warning resume {checkpoint_id}: {error.code}: {error.detail}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8480", help="the coordinator's HTTP API")
    parser.add_argument("--token", default=os.environ.get("GYM_CKPT_CONTROLLER_TOKEN"), help="controller token (default: $GYM_CKPT_CONTROLLER_TOKEN)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rollouts", default="", help="stand-in for the rollouts your trainer dispatched (comma-separated ids, attempt 0)")
    args = parser.parse_args()
    if not args.token:
        parser.error("--token or GYM_CKPT_CONTROLLER_TOKEN is required")
    ids = [r for r in args.rollouts.split(",") if r]
    state = {"step": 0, "loss": 1.0, "in_flight": [{"rollout_id": r, "attempt": 0} for r in ids]}
    run = secrets.token_hex(3)  # an aborted id is fenced at the participants: a rerun takes new ids
    try:
        client = GymCkptClient(args.url, args.token)
        start(client, state)
        for _ in range(args.steps):
            state["step"] += 1
            state["loss"] = round(state["loss"] * 0.9, 6)  # the "training step"
            checkpoint_id = f"step-{state['step']:06d}-{run}"
            published = checkpoint(client, checkpoint_id, state)
            emit(step=state["step"], checkpoint_id=checkpoint_id if published else None, loss=state["loss"], in_flight=len(state["in_flight"]))
    except GymCkptError as error:
        print(f"error {error.code}: {error.detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
