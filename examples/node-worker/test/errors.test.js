'use strict';
// Unit tests of reading a refusal's reason from its trailers, and what the worker does about it.
const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const errors = require('../errors');
const { noAnswer, notPrimary, refused, statusBytes } = require('./refusals');

// What a hetps server (Python: psproto.errors.rich_status) sends for
// rich_status(NOT_FOUND, Reason.UNKNOWN_WORKER, "worker 7 is not joined", {"worker_id": "7"}).
const FROM_PYTHON = Buffer.from(
  '08051216776f726b65722037206973206e6f74206a6f696e65641a530a28747970652e676f6f676c65617069732e636f6d2f676f6f676c652e7270632e4572726f72496e666f12270a0e554e4b4e4f574e5f574f524b4552120568657470731a0e0a09776f726b65725f6964120137',
  'hex',
);

test('the reason of a refusal a Python server sent', () => {
  const error = refused(FROM_PYTHON);
  assert.equal(errors.reasonOf(error), 'UNKNOWN_WORKER');
  assert.deepEqual(errors.errorInfo(error), { reason: 'UNKNOWN_WORKER', domain: 'hetps', metadata: { worker_id: '7' } });
});

test('encoded here, decoded here', () => {
  const bytes = statusBytes([{ reason: 'FUTURE_CLOCK', domain: 'hetps', metadata: { clock: '12' } }]);
  assert.deepEqual(errors.errorInfoFromStatusBytes(bytes), { reason: 'FUTURE_CLOCK', domain: 'hetps', metadata: { clock: '12' } });
});

test('another domain, garbage and no details give no reason', () => {
  assert.equal(errors.reasonOf(refused(statusBytes([{ reason: 'UNKNOWN_WORKER', domain: 'example.com' }]))), null);
  assert.equal(errors.reasonOf(refused(Buffer.from([0xff, 0xff, 0xff]))), null);
  assert.equal(errors.reasonOf(refused()), null);
  assert.equal(errors.reasonOf(new Error('no metadata at all')), null);
  assert.equal(errors.reasonOf(undefined), null);
});

test('the hetps detail is found among others', () => {
  const bytes = statusBytes([
    { reason: 'SOMETHING', domain: 'example.com' },
    { reason: 'PUSH_STALLED', domain: 'hetps' },
  ]);
  assert.equal(errors.reasonOf(refused(bytes)), 'PUSH_STALLED');
});

test('each reason decides what the worker does; unknown reasons and none end it', () => {
  const { Action, actionFor } = errors;
  assert.equal(actionFor('NOT_PRIMARY'), Action.FOLLOW);
  assert.equal(actionFor('UNKNOWN_WORKER'), Action.REJOIN);
  assert.equal(actionFor('FUTURE_CLOCK'), Action.REBASE);
  for (const reason of ['PUSH_STALLED', 'NAME_IN_USE', 'DRAINING']) assert.equal(actionFor(reason), Action.RETRY);
  for (const reason of ['BAD_REQUEST', 'LAYOUT_MISMATCH', 'NON_FINITE', 'LIMIT_REACHED', 'UNAUTHENTICATED', 'A_NEW_ONE', null]) {
    assert.equal(actionFor(reason), Action.GIVE_UP, reason);
  }
  assert.equal(actionFor('toString'), Action.GIVE_UP); // not fooled by Object's own properties
});

const SET = ['10.0.0.1:1', '10.0.0.2:1', '10.0.0.3:1'];

test('NOT_PRIMARY is followed, on a single server as on a set', () => {
  assert.equal(errors.actionFor('NOT_PRIMARY'), errors.Action.FOLLOW);
  assert.equal(errors.recoveryFor(notPrimary(SET[1]), 1), errors.Action.FOLLOW);
  assert.equal(errors.recoveryFor(notPrimary(SET[1]), 3), errors.Action.FOLLOW);
});

test('a call without an answer goes to the next replica of a set, and ends a single-server worker as before', () => {
  assert.equal(errors.recoveryFor(noAnswer(), 2), errors.Action.FOLLOW);
  const deadline = Object.assign(new Error('deadline'), { code: grpc.status.DEADLINE_EXCEEDED });
  assert.equal(errors.recoveryFor(deadline, 2), errors.Action.FOLLOW);
  assert.equal(errors.recoveryFor(noAnswer(), 1), errors.Action.GIVE_UP);
  // Another status without a reason is no sign of a replica down.
  assert.equal(errors.recoveryFor(Object.assign(new Error('bad'), { code: grpc.status.INVALID_ARGUMENT }), 2), errors.Action.GIVE_UP);
  // A reason decides whatever the code: DRAINING is retried where it is.
  const draining = Object.assign(refused(statusBytes([{ reason: 'DRAINING', domain: 'hetps' }])), { code: grpc.status.UNAVAILABLE });
  assert.equal(errors.recoveryFor(draining, 2), errors.Action.RETRY);
});

test('a followed call goes to the named primary, else to the next replica round the set', () => {
  assert.equal(errors.nextAddress(notPrimary(SET[2]), SET, SET[0]), SET[2]);
  assert.equal(errors.nextAddress(notPrimary('psserver-1.psserver:50051'), SET, SET[0]), 'psserver-1.psserver:50051');
  // An election (no primary yet), no metadata, or a replica naming itself: the next replica.
  for (const error of [notPrimary(''), notPrimary(undefined), notPrimary(SET[1])]) {
    assert.equal(errors.nextAddress(error, SET, SET[1]), SET[2]);
  }
  assert.equal(errors.nextAddress(noAnswer(), SET, SET[2]), SET[0]);
  assert.equal(errors.nextReplica(SET, 'elsewhere:1'), SET[0]);
});
