#!/usr/bin/python3
"""Read a compacted partition: python3 compaction_read.py CLIENT BOOTSTRAP TOPIC LAST START...

CLIENT is kafka-python (Debian's python3-kafka) or confluent (Debian's
python3-confluent-kafka). For each START (an offset, or -2 for the
beginning) a new consumer is assigned partition 0 of TOPIC at START (no
group, no commits) and reads until it has read the record at offset LAST
(the partition's last record). Every record is printed as one JSON object
per line: {"s": START, "o": offset, "k": key, "v": value, "t": timestamp
in ms}, key and value null when null. Run by compaction_test.go, which
compares them with the latest value per key.

Exit status 1 with a message on stderr: anything failed.
"""

import json
import sys
import time

TIMEOUT = 20


def text(b):
    return None if b is None else b.decode("utf-8", "backslashreplace")


def kafka_python(bootstrap, topic, last, start):
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="compat-tests-kafka-python-compaction",
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=250,
        request_timeout_ms=TIMEOUT * 1000,
    )
    c.assign([tp])
    if start == -2:
        c.seek_to_beginning(tp)
    else:
        c.seek(tp, start)
    got = []
    deadline = time.time() + TIMEOUT
    try:
        while not got or got[-1]["o"] < last:
            if time.time() > deadline:
                raise RuntimeError("from %d: no record at offset %d in %d s; read %d records" % (start, last, TIMEOUT, len(got)))
            for msgs in c.poll(timeout_ms=500).values():
                for m in msgs:
                    got.append({"s": start, "o": m.offset, "k": text(m.key), "v": text(m.value), "t": m.timestamp})
    finally:
        c.close()
    return got


def confluent(bootstrap, topic, last, start):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "compat-tests-confluent-python-compaction",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "fetch.wait.max.ms": 250,
        "log_level": 3,
    })
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING if start == -2 else start)])
    got = []
    deadline = time.time() + TIMEOUT
    try:
        while not got or got[-1]["o"] < last:
            if time.time() > deadline:
                raise RuntimeError("from %d: no record at offset %d in %d s; read %d records" % (start, last, TIMEOUT, len(got)))
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise RuntimeError("consume from %d: %s" % (start, m.error()))
            got.append({"s": start, "o": m.offset(), "k": text(m.key()), "v": text(m.value()), "t": m.timestamp()[1]})
    finally:
        c.close()
    return got


def main():
    client, bootstrap, topic, last = sys.argv[1:5]
    fn = {"kafka-python": kafka_python, "confluent": confluent}[client]
    try:
        for start in sys.argv[5:]:
            for r in fn(bootstrap, topic, int(last), int(start)):
                print(json.dumps(r))
    except Exception as e:  # noqa: BLE001 - report anything
        sys.stderr.write("%s: %s: %s\n" % (client, type(e).__name__, e))
        sys.exit(1)


if __name__ == "__main__":
    main()
