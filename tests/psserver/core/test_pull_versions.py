"""Pull versions: one per clock and form, shared; versions in flight; freezing before an update, or
for a large shard letting the replies finish first."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core import pull_versions
from psserver.core.pull_versions import PullResult, PullVersions
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.serialized_pull import SerializedPull
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.rpc.pull_encoding import PULL_RESPONSE

LAYOUT = Layout.from_named_shapes([("w", (2, 3)), ("b", (2,))])


class RecordingEncoder:
    """A PullEncoder whose messages are the chunk's values as text (enough to read them back)."""

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes:
        values = torch.frombuffer(bytearray(chunk.data), dtype=torch.float32).tolist()
        return f"{clock}:{chunk.offset}:{values}".encode()


ENCODER = RecordingEncoder()


def test_the_in_process_form_is_a_list_of_payloads_and_cached_per_clock() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=2)
    source = torch.arange(4, dtype=torch.float32)
    result = versions.encode(source, 0, codec.FLOAT32, None)
    assert [p.offset for p in result.chunks] == [0, 2] and result.data_bytes == 16 and result.messages == ()
    versions.keep(result, current=True)
    assert versions.cached(0, codec.FLOAT32, None) is result
    assert versions.cached(0, codec.FLOAT32, ENCODER) is None
    assert versions.cached(1, codec.FLOAT32, None) is None
    assert versions.cached(0, codec.FLOAT32, None) is None  # older clocks were dropped


def test_a_serialised_version_uses_the_injected_encoder() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=2)
    result = versions.encode(torch.arange(4, dtype=torch.float32), 3, codec.FLOAT32, ENCODER)
    assert isinstance(result.messages, SerializedPull) and result.encoder is ENCODER
    assert list(result.messages) == [b"3:0:[0.0, 1.0]", b"3:2:[2.0, 3.0]"]


def test_begin_reads_the_live_parameters_only_for_a_serialised_form_without_a_snapshot() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=2)
    params, snapshot = torch.zeros(4), torch.ones(4)
    assert versions.begin(0, codec.FLOAT32, ENCODER, params, snapshot) is snapshot
    copy = versions.begin(0, codec.FLOAT32, None, params, None)
    assert isinstance(copy, torch.Tensor) and copy is not params and torch.equal(copy, params)
    live = versions.begin(0, codec.FLOAT32, ENCODER, params, None)
    assert isinstance(live, PullResult) and isinstance(live.messages, SerializedPull)
    assert live.messages.reads(params) and versions.cached(0, codec.FLOAT32, ENCODER) is live


def test_freezing_before_an_update_finishes_the_versions_being_sent_and_drops_the_cache() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=2)
    params = torch.zeros(4)
    being_sent = versions.begin(0, codec.FLOAT32, ENCODER, params, None)
    assert isinstance(being_sent, PullResult) and isinstance(being_sent.messages, SerializedPull)
    versions.freeze_before_update(params)
    params.fill_(7.0)
    assert being_sent.messages.frozen_bytes == 16 and versions.cached(0, codec.FLOAT32, ENCODER) is None
    assert list(being_sent.messages) == [b"0:0:[0.0, 0.0]", b"0:2:[0.0, 0.0]"]


def test_at_the_limit_a_pull_may_share_the_newest_version_in_flight() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=2)
    held = [versions.encode(torch.zeros(4), clock, codec.FLOAT32, ENCODER) for clock in (0, 1)]
    versions.keep(held[0], current=False)
    versions.keep(held[1], current=False)
    assert versions.newest_in_flight(codec.FLOAT32, ENCODER, share=True, kept=None) is held[1]
    assert versions.newest_in_flight(codec.FLOAT32, ENCODER, share=False, kept=None) is None
    assert versions.newest_in_flight(codec.FLOAT32, None, share=True, kept=None) is None
    assert versions.newest_in_flight(codec.BFLOAT16, ENCODER, share=True, kept=None) is None
    assert versions.newest_in_flight(codec.FLOAT32, ENCODER, share=True, kept=lambda clock: clock == 0) is None
    del held[1]  # sent: below the limit again
    assert versions.newest_in_flight(codec.FLOAT32, ENCODER, share=True, kept=None) is None


def test_no_version_keeps_its_messages_only_a_live_one_held_at_an_update_is_copied() -> None:
    versions = PullVersions(chunk_bytes=8, max_in_flight=1)
    params, snapshot = torch.zeros(4), torch.ones(4)
    made = versions.begin(0, codec.FLOAT32, ENCODER, params, snapshot)
    assert made is snapshot
    private = versions.encode(snapshot, 0, codec.FLOAT32, ENCODER)
    assert isinstance(private.messages, SerializedPull)
    assert list(private.messages) == [b"0:0:[1.0, 1.0]", b"0:2:[1.0, 1.0]"]
    live = versions.begin(1, codec.FLOAT32, ENCODER, params, None)
    assert isinstance(live, PullResult) and isinstance(live.messages, SerializedPull)
    versions.freeze_before_update(snapshot)  # another tensor than the one read: nothing is copied
    assert live.messages.frozen_bytes == 0 and private.messages.frozen_bytes == 0
    assert list(live.messages) == [b"1:0:[0.0, 0.0]", b"1:2:[0.0, 0.0]"]
    versions.freeze_before_update(params)  # its one reader read it to the end: nothing to copy
    assert live.messages.frozen_bytes == 0
    unread = versions.begin(2, codec.FLOAT32, ENCODER, params, None)
    assert isinstance(unread, PullResult) and isinstance(unread.messages, SerializedPull)
    versions.freeze_before_update(params)
    assert unread.messages.frozen_bytes == 16 and private.messages.frozen_bytes == 0


def _large_shard(monkeypatch: pytest.MonkeyPatch) -> tuple[Shard, int, int]:
    """A shard whose versions count as large (no copy at an update while replies can finish), two
    workers joined, parameters 0..7."""
    monkeypatch.setattr(pull_versions, "MAX_FROZEN_BYTES", 0)
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), chunk_bytes=8))
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    second = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = shard.begin_upload(first, LAYOUT.hash)
    for chunk in codec.encode(torch.arange(8, dtype=torch.float32)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return shard, first, second


def _push_in_background(shard: Shard, worker_id: int) -> threading.Thread:
    header = PushHeader(worker_id, 1, 0, int(PayloadKind.GRADIENT), LAYOUT.hash, {})
    thread = threading.Thread(target=shard.push, args=(header, codec.encode(torch.ones(8))))
    thread.start()
    return thread


def _values(messages: list[bytes]) -> list[float]:
    values: list[float] = []
    for data in messages:
        chunk = ps_pb2.PullResponse.FromString(data).chunk
        values += torch.frombuffer(bytearray(chunk.data), dtype=torch.float32).tolist()
    return values


def test_an_update_of_a_large_shard_waits_for_the_replies_reading_it_and_holds_new_pulls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard, first, second = _large_shard(monkeypatch)
    reply = shard.pull(first, codec.FLOAT32, encoder=PULL_RESPONSE)
    assert isinstance(reply.messages, SerializedPull)
    reader = iter(reply.messages)
    sent = [next(reader)]  # the transport has sent the first message only
    pusher = _push_in_background(shard, second)
    time.sleep(0.3)
    assert shard.clock == 0  # the update waits for the reply
    later: list[int] = []
    puller = threading.Thread(
        target=lambda: later.append(shard.pull(first, codec.FLOAT32, encoder=PULL_RESPONSE).clock)
    )
    puller.start()
    time.sleep(0.3)
    assert later == []  # a new pull waits for the update
    sent += list(reader)
    frozen = reply.messages.frozen_bytes
    del reader, reply  # sent: the transport lets go of the version
    pusher.join(5)
    puller.join(5)
    assert shard.clock == 1 and later == [1] and frozen == 0
    assert _values(sent) == [float(i) for i in range(8)]


def test_a_reply_still_held_after_the_wait_is_copied_and_the_update_goes_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    shard, first, second = _large_shard(monkeypatch)
    monkeypatch.setattr(pull_versions, "REPLY_WAIT_S", 0.3)
    reply = shard.pull(first, codec.FLOAT32, encoder=PULL_RESPONSE)
    assert isinstance(reply.messages, SerializedPull)
    _push_in_background(shard, second).join(5)
    assert shard.clock == 1 and reply.messages.frozen_bytes == 8 * 4
    assert _values(list(reply.messages)) == [float(i) for i in range(8)]
