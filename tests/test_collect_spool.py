"""The durable spool: records read back as written, a torn tail cut at open, retries recognised by hash,
segments deleted once loaded, backpressure by unloaded bytes and by free disk."""

from __future__ import annotations

import threading

import pytest

from agentobs.collect.spool import HEADER, Spool, SpoolFull, seg_name
from agentobs.errors import StoreError


def _all(sp: Spool):
    return sp.read_from(0, 0, max_records=10**6, max_bytes=1 << 40)


def test_records_read_back_in_order_across_segments(tmp_path):
    sp = Spool(tmp_path, segment_bytes=100)  # every group of 2 x 60-byte bodies fills a segment
    bodies = [bytes([i]) * 60 for i in range(6)]
    for b in bodies:
        assert sp.append(b, "protobuf", "http") is True
    recs = _all(sp)
    assert [sp.read(r) for r in recs] == bodies
    assert len({r.seq for r in recs}) >= 3  # rotated (the grouping of concurrent appends may vary)
    # limits: at most 2 records, then from the second one's end on
    first = sp.read_from(0, 0, max_records=2, max_bytes=1 << 20)
    assert [sp.read(r) for r in first] == bodies[:2]
    rest = sp.read_from(first[-1].seq, first[-1].end, max_records=100, max_bytes=1 << 20)
    assert [sp.read(r) for r in rest] == bodies[2:]
    sp.close()


def test_reopen_keeps_records_and_cuts_a_torn_tail(tmp_path):
    sp = Spool(tmp_path)
    sp.append(b"a" * 10, "json", "grpc")
    sp.append(b"b" * 10)
    seq = _all(sp)[0].seq
    sp.close()
    path = tmp_path / seg_name(seq)
    whole = path.stat().st_size
    assert whole == 2 * (HEADER.size + 10)
    with open(path, "ab") as f:  # a crash in the middle of the next group: half a header, never acknowledged
        f.write(b"AOS1\x05\x00")
    sp = Spool(tmp_path)
    recs = _all(sp)
    assert [(sp.read(r), r.fmt, r.transport) for r in recs] == [(b"a" * 10, "json", "grpc"),
                                                                 (b"b" * 10, "protobuf", "other")]
    assert path.stat().st_size == whole  # cut back to the last whole record
    # the hashes came back with the records: a retry of a spooled body is not written again
    assert sp.append(b"a" * 10) is False
    assert len(_all(sp)) == 2
    sp.close()


def test_a_corrupt_record_ends_the_segment(tmp_path):
    sp = Spool(tmp_path)
    sp.append(b"x" * 20)
    sp.append(b"y" * 20)
    seq = _all(sp)[0].seq
    sp.close()
    path = tmp_path / seg_name(seq)
    data = bytearray(path.read_bytes())
    data[HEADER.size + 20 + HEADER.size + 3] ^= 0xFF  # a bit flipped in the second body: its CRC fails
    path.write_bytes(bytes(data))
    sp = Spool(tmp_path)
    assert [sp.read(r) for r in _all(sp)] == [b"x" * 20]
    sp.close()


def test_concurrent_identical_appends_write_one_copy(tmp_path):
    sp = Spool(tmp_path)
    results = []
    ts = [threading.Thread(target=lambda: results.append(sp.append(b"same body"))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert len(_all(sp)) == 1
    sp.close()


def test_loaded_segments_are_deleted_and_unloaded_bytes_drive_admission(tmp_path):
    sp = Spool(tmp_path, segment_bytes=50, max_unloaded_bytes=150)
    for i in range(3):  # a record is 30 header + 40 body bytes: 0, 70 and 140 unloaded when each is admitted
        sp.append(bytes([i]) * 40)
    recs = _all(sp)
    assert sp.unloaded_bytes() == 3 * (HEADER.size + 40)  # 210 > 150: the 4th new body is refused
    with pytest.raises(SpoolFull, match="210 bytes not yet loaded"):
        sp.append(b"x" * 40)
    assert sp.append(bytes([0]) * 40) is False  # a retry of a spooled body is acknowledged even when full
    sp.mark_loaded(recs[1].seq, recs[1].end)
    assert sp.unloaded_bytes() == HEADER.size + 40
    assert sp.append(b"x" * 40) is True
    # the segments of the first two records are gone from disk; the third's stays
    on_disk = sorted(p.name for p in tmp_path.glob("*.seg"))
    assert seg_name(recs[0].seq) not in on_disk and seg_name(recs[2].seq) in on_disk
    sp.close()


def test_free_disk_drives_admission(tmp_path):
    sp = Spool(tmp_path, min_free_bytes=1 << 62)  # more than any disk has free
    with pytest.raises(SpoolFull, match="free on the spool's disk"):
        sp.append(b"x")
    sp.close()


def test_a_closed_spool_refuses(tmp_path):
    sp = Spool(tmp_path)
    sp.close()
    with pytest.raises(StoreError, match="spool is closed"):
        sp.append(b"late")
