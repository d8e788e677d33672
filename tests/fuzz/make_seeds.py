#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/):
valid inputs of each kind, from which the fuzzers mutate. The few messages
and the shard are encoded here by hand (protobuf's wire format, the shard
format of server/checkpoint/shard_format.h), so any python3 runs it.

    python3 tests/fuzz/make_seeds.py
"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(v):
    v &= (1 << 64) - 1
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7F) | 0x80])
        v >>= 7
    return out + bytes([v])


def field(n, wire, payload):
    tag = varint((n << 3) | wire)
    if wire == 0:
        return tag + varint(payload)
    if wire == 1:
        return tag + struct.pack("<q", payload)
    if wire == 5:
        return tag + struct.pack("<f", payload)
    return tag + varint(len(payload)) + payload


def s(n, text):
    return field(n, 2, text.encode() if isinstance(text, str) else text)


def key_data(variable, partition=0, version=0, dtype=1, data=b"", ids=None, pull_dtype=0):
    m = s(1, variable) + field(2, 0, partition) + field(3, 0, version) + field(4, 0, dtype)
    if data:
        m += s(5, data)
    if pull_dtype:
        m += field(8, 0, pull_dtype)
    if ids:
        m += s(10, b"".join(struct.pack("<q", i) for i in ids))
    return m


def floats(values):
    return b"".join(struct.pack("<f", v) for v in values)


def push(keys, rank=0, push_id=1):
    return field(1, 0, rank) + field(2, 0, push_id) + b"".join(s(3, k) for k in keys)


def pull(keys, rank=0):
    return field(1, 0, rank) + b"".join(s(2, k) for k in keys)


def calls(*records):
    return b"".join(bytes([kind]) + struct.pack("<I", len(body)) + body for kind, body in records)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def shard(records):
    """records: (variable, partition, weights, slots, row_ids, row_stats)."""
    header = b"PSRTSHRD" + struct.pack("<II", 2, 0)
    out = header
    for variable, partition, weights, slots, ids, stats in records:
        body = struct.pack("<I", len(variable)) + variable.encode() + struct.pack("<I", partition)
        body += struct.pack("<qqqd", 0, len(weights), 3, 0.1) + struct.pack("<I", 4) + b"adam"
        body += struct.pack("<I", 1) + struct.pack("<q", 3) + floats(weights)
        body += struct.pack("<I", len(slots)) + b"".join(floats(x) for x in slots)
        body += struct.pack("<Q", len(ids)) + b"".join(struct.pack("<q", i) for i in ids + stats)
        framed = struct.pack("<Q", len(body)) + body
        out += framed + struct.pack("<I", crc32c(framed))
    trailer = b"PSRTTRLR" + struct.pack("<Q", len(records))
    return out + trailer + struct.pack("<I", crc32c(trailer, crc32c(header)))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    w_push = key_data("w", data=floats([0.5] * 16))
    t_push = key_data("t", data=floats([0.25] * 8), ids=[3, 1 << 40])
    sgd = s(1, "sgd") + field(2, 1, struct.unpack("<q", struct.pack("<d", 0.1))[0])
    spec = s(1, "v") + field(3, 0, 1) + field(4, 0, 8) + field(6, 0, 8) + s(7, sgd) + s(8, floats([1.0] * 8))
    # store: kinds 0 register, 1 push, 2 pull, 3 push-pull, 4 lr, 5 replicate, 6 seed, 7 snapshot, 8 members
    write("store", "register_push_pull", calls((0, field(1, 0, 0) + s(2, spec)), (1, push([w_push])),
                                              (2, pull([key_data("w", version=1)]))))
    write("store", "table_rows", calls((1, push([t_push])), (2, pull([key_data("t", ids=[3, 7, 1 << 40])])),
                                       (7, field(4, 0, 1))))
    write("store", "push_pull_and_lr", calls((3, s(1, push([w_push, t_push]))), (4, field(2, 1, 0) + s(3, "w")),
                                             (8, field(1, 0, 2) + field(2, 0, 1))))
    write("store", "fp16_push", calls((1, push([key_data("w", dtype=2, data=b"\x00\x3c" * 16)])),
                                      (7, field(4, 0, 0x7FFFFFFFFFFFFFFF))))
    # service: kinds 0 register, 1 push, 2 pull, 3 push-pull, 4 lr, 5 stats, 6 save shard, 7 attach,
    # 8 replicate, 9 seed; + 10: without the token, + 20: another job's
    w_spec = s(1, "w") + field(3, 0, 1) + field(4, 0, 16) + field(6, 0, 16) + s(7, sgd)
    write("service", "data_path", calls((0, field(1, 0, 1) + s(2, w_spec)), (1, push([w_push])),
                                        (2, pull([key_data("w", version=1)])), (3, s(1, push([w_push])))))
    write("service", "control", calls((4, field(2, 1, 0) + s(3, "w")), (5, b""),
                                      (6, s(1, "file:///tmp/x") + s(2, "step-1") + s(3, "step-1/shard"))))
    write("service", "no_token", calls((11, push([w_push])), (22, pull([key_data("w")])), (19, b"\x0a\xff\xff\x03")))
    # coordinator: kinds 0 register, 1 barrier, 2 heartbeat, 3 report exit, 4 status, 5 checkpoint
    server0 = field(1, 0, 2) + field(2, 0, 0)  # ProcessId{role=server, index=0}
    worker0 = field(1, 0, 3) + field(2, 0, 0)
    write("coordinator", "register_heartbeat", calls((0, s(1, server0) + s(2, "host-a") + s(3, "127.0.0.1:1")),
                                                     (2, s(1, server0)), (4, b"")))
    write("coordinator", "worker_barrier_exit", calls((0, s(1, worker0) + s(2, "host-a")), (1, s(1, worker0)),
                                                      (3, s(1, worker0) + field(2, 0, 1)), (5, b"")))
    # wire: a PushRequest, a PullRequest, a response
    write("wire", "push", push([w_push, t_push]))
    write("wire", "pull", pull([key_data("w", version=3, dtype=2), key_data("t", ids=[1, 2])]))
    write("wire", "push_pull", s(1, push([w_push])))
    # shard: a version 2 shard with a dense key and a table's rows
    write("shard", "dense_and_table.psrt", shard([
        ("w", 0, [1.0, 2.0, 3.0, 4.0], [[0.0] * 4, [0.5] * 4], [], []),
        ("t", 1, [0.25] * 8, [[0.0] * 8, [0.1] * 8], [7, -3], [3, 1, 2, 2, 0, 1])]))
    # manifest
    manifest = {"format_version": 1, "name": "step-000000000002", "step": 2, "mode": "sync", "num_servers": 1,
                "partition_bytes": 4096, "shards": [{"path": "step-000000000002/shard-00000-of-00001.psrt",
                                                     "bytes": 100, "crc32c": 1, "num_records": 2}],
                "variables": [{"name": "w", "shape": [4], "dtype": "DTYPE_FLOAT32", "optimizer": {"name": "sgd"}},
                              {"name": "t", "shape": [0, 4], "dtype": "DTYPE_FLOAT32",
                               "optimizer": {"name": "adam"}, "table": {"dim": 4, "num_shards": 1}}],
                "keys": [{"variable": "w", "num_elements": 4, "version": 2, "shard": 0},
                         {"variable": "t", "num_elements": 8, "rows": 2, "version": 2, "shard": 0}]}
    write("manifest", "two_variables.json", json.dumps(manifest))
    # config: distribution JSON; flags; the cluster (NUL-separated)
    write("config", "distribution.json", json.dumps({"parameter_server": {
        "enabled": True, "mode": "ssp", "staleness": 2, "replicas": 1, "on_failure": "recover",
        "checkpoint": {"uri": "s3://bucket/prefix", "every_steps": 50}, "limits": {"max_variables": 10},
        "elastic": {"min_workers": 1, "max_workers": 4}}}))
    write("config", "flags", "--name=x\n--steps=5\n--port\n80\n--lr=1e-3\n--verbose")
    write("config", "sagemaker", "\0\0[\"algo-1\",\"algo-2\"]\0algo-2\0")
    write("config", "tf_config", "\0\0\0\0" + json.dumps({"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"],
                                                                      "ps": ["h2:2222"]},
                                                          "task": {"type": "worker", "index": 0}}))
    # s3: a ListObjectsV2 page, an error, a request to sign
    write("s3", "list_page.xml", "<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a/b&amp;c</Key>"
                                 "<Size>12</Size><ETag>\"x\"</ETag></Contents>"
                                 "<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>")
    write("s3", "error.xml", "<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>")
    write("s3", "request", "GET\0bucket.s3.us-east-1.amazonaws.com\0dir/key with space\0prefix\0a/b\0range\0"
                           "bytes=0-9\0list-type\x002")


if __name__ == "__main__":
    main()
