"""Drive a hetps server with a scripted scenario, speaking only the .proto (no psproto/psworker/torch).

Run as ``python proto_scenario_client.py STUBS_DIR HOST:PORT SCENARIO.json RESULT.json``.
The scenario names tensors, initial values and a list of steps ``["pull", w]`` or
``["push", w, kind, values]``; the result lists the parameters and reply after every push.
"""

import hashlib
import json
import struct
import sys

sys.path.insert(0, sys.argv[1])

import grpc
import ps_pb2
import ps_pb2_grpc


def floats(values):
    return struct.pack(f"<{len(values)}f", *values)


def main() -> None:
    with open(sys.argv[3]) as source:
        scenario = json.load(source)
    shapes = scenario["tensors"]
    text = ";".join(f"{name}:{','.join(map(str, shape))}" for name, shape in shapes)
    layout_hash = hashlib.sha256(f"{text}|1".encode()).hexdigest()
    layout = ps_pb2.Layout(tensors=[ps_pb2.TensorSpec(name=n, shape=s) for n, s in shapes], num_shards=1)
    total = len(scenario["initial"])
    results = []
    with grpc.insecure_channel(sys.argv[2]) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        ids, clocks, push_ids = [], [], []
        for index in range(scenario["workers"]):
            joined = stub.Join(ps_pb2.JoinRequest(worker_name=f"w{index}", layout=layout, layout_hash=layout_hash))
            ids.append(joined.worker_id)
            clocks.append(0)
            push_ids.append(0)
        header = ps_pb2.InitHeader(worker_id=ids[0], layout_hash=layout_hash)
        chunk = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_FLOAT32, data=floats(scenario["initial"]))
        stub.Init(iter([ps_pb2.InitRequest(header=header), ps_pb2.InitRequest(chunk=chunk)]))

        def pull(worker):
            values = [0.0] * total
            for message in stub.Pull(ps_pb2.PullRequest(worker_id=ids[worker])):
                data = message.chunk.data
                values[message.chunk.offset : message.chunk.offset + len(data) // 4] = struct.unpack(
                    f"<{len(data) // 4}f", data
                )
                clocks[worker] = message.clock
            return values

        for step in scenario["steps"]:
            worker = step[1]
            if step[0] == "pull":
                pull(worker)
                continue
            kind = {"gradient": ps_pb2.PAYLOAD_KIND_GRADIENT, "delta": ps_pb2.PAYLOAD_KIND_DELTA}[step[2]]
            push_ids[worker] += 1
            push_header = ps_pb2.PushHeader(
                worker_id=ids[worker],
                push_id=push_ids[worker],
                base_clock=clocks[worker],
                kind=kind,
                layout_hash=layout_hash,
            )
            chunk = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_FLOAT32, data=floats(step[3]))
            reply = stub.Push(iter([ps_pb2.PushRequest(header=push_header), ps_pb2.PushRequest(chunk=chunk)]))
            # An observer reads the parameters without moving anyone's pull clock.
            results.append(
                {
                    "clock": reply.clock,
                    "staleness": reply.staleness,
                    "telemetry": dict(reply.telemetry),
                    "params": observe(stub, layout, layout_hash, total),
                }
            )
    forbidden = [m for m in sys.modules if m.split(".")[0] in {"psproto", "psworker", "psserver", "torch"}]
    assert not forbidden, forbidden
    with open(sys.argv[4], "w") as out:
        json.dump(results, out)


_observer = {}


def observe(stub, layout, layout_hash, total):
    if "id" not in _observer:
        _observer["id"] = stub.Join(
            ps_pb2.JoinRequest(
                worker_name="observer", role=ps_pb2.ROLE_OBSERVER, layout=layout, layout_hash=layout_hash
            )
        ).worker_id
    values = [0.0] * total
    for message in stub.Pull(ps_pb2.PullRequest(worker_id=_observer["id"])):
        data = message.chunk.data
        values[message.chunk.offset : message.chunk.offset + len(data) // 4] = struct.unpack(
            f"<{len(data) // 4}f", data
        )
    return values


if __name__ == "__main__":
    main()
