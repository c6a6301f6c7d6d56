#!/usr/bin/python3
"""One consumer group member: python3 group_member.py CLIENT BOOTSTRAP TOPIC GROUP UNTIL COMMIT

CLIENT is kafka-python (Debian's python3-kafka, kafka-python 2.0.2) or
confluent (Debian's python3-confluent-kafka); both only import under
/usr/bin/python3. The member joins GROUP subscribed to TOPIC (a partition
without a committed offset is read from the start), reads until it has read
the record just before UNTIL[p] of every partition p, commits exactly COMMIT
with the client's own commit call, closes the consumer (which leaves the
group) and prints every record it read, one JSON object per line:
{"Partition": p, "Offset": o, "Value": "..."}. UNTIL and COMMIT are
"p=offset,p=offset,...". Run by groups_clients_test.go, which checks the
records and the committed offsets. Exit status 1 and a message on stderr when
something fails.
"""

import json
import sys
import time

TIMEOUT = 30


def parse(spec):
    out = {}
    for part in spec.split(","):
        p, o = part.split("=")
        out[int(p)] = int(o)
    return out


def reached(nxt, until):
    return all(nxt.get(p, 0) >= u for p, u in until.items())


def kafka_python(bootstrap, topic, group, until, commit):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="compat-tests-kafka-python-group",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=250,
        session_timeout_ms=10000,
        heartbeat_interval_ms=1000,
        request_timeout_ms=TIMEOUT * 1000,
    )
    read, nxt = [], {}
    deadline = time.time() + TIMEOUT
    try:
        while not reached(nxt, until):
            if time.time() > deadline:
                raise RuntimeError("read up to %s of %s in %d s" % (nxt, until, TIMEOUT))
            for msgs in c.poll(timeout_ms=500).values():
                for m in msgs:
                    read.append((m.partition, m.offset, m.value))
                    nxt[m.partition] = max(nxt.get(m.partition, 0), m.offset + 1)
        c.commit(offsets={TopicPartition(topic, p): OffsetAndMetadata(o, "") for p, o in commit.items()})
    finally:
        c.close()  # LeaveGroup (no commit: auto commit is off)
    return read


def confluent(bootstrap, topic, group, until, commit):
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "compat-tests-confluent-python-group",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 250,
        "session.timeout.ms": 10000,
        "log_level": 3,
    })
    read, nxt = [], {}
    deadline = time.time() + TIMEOUT
    try:
        c.subscribe([topic])
        while not reached(nxt, until):
            if time.time() > deadline:
                raise RuntimeError("read up to %s of %s in %d s" % (nxt, until, TIMEOUT))
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().retriable():
                    print("consumer: %s" % m.error(), file=sys.stderr)
                    continue
                raise KafkaException(m.error())
            read.append((m.partition(), m.offset(), m.value()))
            nxt[m.partition()] = max(nxt.get(m.partition(), 0), m.offset() + 1)
        done = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in sorted(commit.items())], asynchronous=False)
        failed = [tp for tp in done if tp.error is not None]
        if failed:
            raise RuntimeError("commit: %s" % failed)
    finally:
        c.close()  # LeaveGroup (no commit: auto commit is off)
    return read


def main():
    client, bootstrap, topic, group, until, commit = sys.argv[1:]
    backend = {"kafka-python": kafka_python, "confluent": confluent}[client]
    read = backend(bootstrap, topic, group, parse(until), parse(commit))
    for p, o, v in read:
        print(json.dumps({"Partition": p, "Offset": o, "Value": None if v is None else v.decode()}))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report anything and fail
        print("FAIL %s: %s" % (type(e).__name__, e), file=sys.stderr)
        sys.exit(1)
