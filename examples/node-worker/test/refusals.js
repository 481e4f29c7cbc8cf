'use strict';
// Refused calls as @grpc/grpc-js reports them, made without a server, for the unit tests.
const grpc = require('@grpc/grpc-js');
const errors = require('../errors');

function statusBytes(infos) {
  const { Status, ErrorInfo } = errors.rpcTypes();
  const details = infos.map((info) => ({
    type_url: 'type.googleapis.com/google.rpc.ErrorInfo',
    value: ErrorInfo.encode(ErrorInfo.create(info)).finish(),
  }));
  return Buffer.from(Status.encode(Status.create({ code: 9, message: 'refused', details })).finish());
}

// A refused call as @grpc/grpc-js reports it: code, details and the trailers as metadata.
function refused(...trailers) {
  const metadata = new grpc.Metadata();
  for (const value of trailers) metadata.add(errors.DETAILS_KEY, value);
  return Object.assign(new Error('refused'), { code: grpc.status.NOT_FOUND, details: 'refused', metadata });
}

// A refusal as a replica that is not its shard's primary sends it (psserver: NOT_PRIMARY, UNAVAILABLE).
function notPrimary(primary) {
  const metadata = primary === undefined ? {} : { primary, epoch: primary ? '3' : '' };
  const error = refused(statusBytes([{ reason: 'NOT_PRIMARY', domain: 'hetps', metadata }]));
  return Object.assign(error, { code: grpc.status.UNAVAILABLE });
}

// A call that got no answer: no server at the address, no reason.
const noAnswer = () => Object.assign(new Error('no connection'), { code: grpc.status.UNAVAILABLE, details: 'No connection established' });

module.exports = { noAnswer, notPrimary, refused, statusBytes };
