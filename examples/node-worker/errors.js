'use strict';
// Why a hetps server refused a call, as data, and what this worker does about it.
//
// Every refusal carries a google.rpc.Status in its `grpc-status-details-bin` trailer whose
// details hold an Any-packed google.rpc.ErrorInfo with domain "hetps" and a reason such as
// UNKNOWN_WORKER (docs/protocol.md lists them). The worker decides on that reason only: the
// message text is for people and may change in any release.

const path = require('node:path');
const protobuf = require('protobufjs');
const { status: grpcStatus } = require('@grpc/grpc-js');

const DOMAIN = 'hetps';
const DETAILS_KEY = 'grpc-status-details-bin';
const ERROR_INFO_TYPE = 'google.rpc.ErrorInfo';
// google/rpc/status.proto and error_details.proto, vendored beside ps.proto (Apache-2.0).
const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');

let types = null;

// Status and ErrorInfo, loaded once; google/protobuf/any.proto and duration.proto come with protobufjs.
function rpcTypes() {
  if (types === null) {
    const root = new protobuf.Root();
    root.resolvePath = (origin, target) => (path.isAbsolute(target) ? target : path.join(PROTO_ROOT, target));
    root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
    types = { Status: root.lookupType('google.rpc.Status'), ErrorInfo: root.lookupType('google.rpc.ErrorInfo') };
  }
  return types;
}

// The hetps ErrorInfo ({reason, domain, metadata}) in a serialized google.rpc.Status, or null.
function errorInfoFromStatusBytes(bytes) {
  const { Status, ErrorInfo } = rpcTypes();
  let status;
  try {
    status = Status.decode(bytes);
  } catch {
    return null; // not a google.rpc.Status: treated like no details
  }
  for (const detail of status.details) {
    // type_url is "type.googleapis.com/google.rpc.ErrorInfo"; only the part after the last '/' names the type.
    if (detail.type_url.slice(detail.type_url.lastIndexOf('/') + 1) !== ERROR_INFO_TYPE) continue;
    try {
      const info = ErrorInfo.decode(detail.value);
      if (info.domain === DOMAIN) return { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
    } catch {
      // a malformed detail: look at the next one
    }
  }
  return null;
}

// The hetps ErrorInfo a failed call (a @grpc/grpc-js ServiceError) carries, or null when it has
// none: a broken connection, a deadline, a server of another kind.
function errorInfo(error) {
  const metadata = error && error.metadata;
  if (!metadata || typeof metadata.get !== 'function') return null;
  for (const value of metadata.get(DETAILS_KEY)) {
    const info = Buffer.isBuffer(value) ? errorInfoFromStatusBytes(value) : null;
    if (info !== null) return info;
  }
  return null;
}

// The reason a call was refused for ('UNKNOWN_WORKER', ...), or null.
function reasonOf(error) {
  const info = errorInfo(error);
  return info === null ? null : info.reason;
}

// What the worker does about a refusal:
//   REJOIN   join the shard again (resume = true keeps its push ids), then repeat the call
//   REBASE   the shard's clock is behind the pulled one (it restarted from an older checkpoint):
//            send the push again against the shard's clock
//   RETRY    repeat the call after a short wait
//   FOLLOW   send the same call to another replica of the shard's set (nextAddress): the primary a
//            NOT_PRIMARY refusal names, or the next replica; the new primary holds this worker's
//            record and push ids, so a push sent again there is applied once
//   GIVE_UP  stop: the request itself is wrong, or a limit or a reason this worker does not know
const Action = Object.freeze({ REJOIN: 'rejoin', REBASE: 'rebase', RETRY: 'retry', FOLLOW: 'follow', GIVE_UP: 'give-up' });

const ACTIONS = Object.freeze({
  UNKNOWN_WORKER: Action.REJOIN, // evicted, or the server restarted without this worker's record
  FUTURE_CLOCK: Action.REBASE,
  PUSH_STALLED: Action.RETRY, // cancelled and not applied
  NAME_IN_USE: Action.RETRY, // this worker's previous run still holds the name until its lease ends
  DRAINING: Action.RETRY, // the server is restarting
  NOT_PRIMARY: Action.FOLLOW, // a backup, or a deposed primary: metadata.primary names the primary
});

// Status codes of a call that got no answer (the server is down, the link went silent).
const NO_ANSWER_CODES = Object.freeze([grpcStatus.UNAVAILABLE, grpcStatus.DEADLINE_EXCEEDED]);

function actionFor(reason) {
  return (reason !== null && Object.hasOwn(ACTIONS, reason) && ACTIONS[reason]) || Action.GIVE_UP;
}

// What the worker does about a failed call to a shard served by `replicaCount` replicas: the
// reason's action; a call that got no answer from a replica of a set of several goes to the next
// replica (FOLLOW), where a single server's ends the worker as any refusal without a reason does.
function recoveryFor(error, replicaCount) {
  const reason = reasonOf(error);
  if (reason === null && replicaCount > 1 && error && NO_ANSWER_CODES.includes(error.code)) return Action.FOLLOW;
  return actionFor(reason);
}

// The replica after `current` in `replicas`, round the end; the first when `current` is not in the set.
function nextReplica(replicas, current) {
  const index = replicas.indexOf(current);
  return index < 0 ? replicas[0] : replicas[(index + 1) % replicas.length];
}

// Where a call FOLLOW sends goes: the primary a NOT_PRIMARY refusal names; the next replica when it
// names none (an election is running), names the replica that refused, or the call got no answer.
function nextAddress(error, replicas, current) {
  const info = errorInfo(error);
  const primary = info !== null && info.reason === 'NOT_PRIMARY' ? String(info.metadata.primary || '').trim() : '';
  return primary && primary !== current ? primary : nextReplica(replicas, current);
}

module.exports = {
  DOMAIN,
  DETAILS_KEY,
  Action,
  actionFor,
  errorInfo,
  errorInfoFromStatusBytes,
  nextAddress,
  nextReplica,
  reasonOf,
  recoveryFor,
  rpcTypes,
};
