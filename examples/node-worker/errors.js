'use strict';
// Why a hetps server refused a call, as data, and what this worker does about it.
//
// Every refusal carries a google.rpc.Status in its `grpc-status-details-bin` trailer whose
// details hold an Any-packed google.rpc.ErrorInfo with domain "hetps" and a reason such as
// UNKNOWN_WORKER (docs/protocol.md lists them). The worker decides on that reason only: the
// message text is for people and may change in any release.

const path = require('node:path');
const protobuf = require('protobufjs');

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
//   GIVE_UP  stop: the request itself is wrong, or a limit or a reason this worker does not know
const Action = Object.freeze({ REJOIN: 'rejoin', REBASE: 'rebase', RETRY: 'retry', GIVE_UP: 'give-up' });

const ACTIONS = Object.freeze({
  UNKNOWN_WORKER: Action.REJOIN, // evicted, or the server restarted without this worker's record
  FUTURE_CLOCK: Action.REBASE,
  PUSH_STALLED: Action.RETRY, // cancelled and not applied
  NAME_IN_USE: Action.RETRY, // this worker's previous run still holds the name until its lease ends
  DRAINING: Action.RETRY, // the server is restarting
});

function actionFor(reason) {
  return (reason !== null && Object.hasOwn(ACTIONS, reason) && ACTIONS[reason]) || Action.GIVE_UP;
}

module.exports = { DOMAIN, DETAILS_KEY, Action, actionFor, errorInfo, errorInfoFromStatusBytes, reasonOf, rpcTypes };
