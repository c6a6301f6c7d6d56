#!/usr/bin/python3
"""Read a topic with transactions: python3 txn_read.py CLIENT BOOTSTRAP TOPIC PARTITIONS ISOLATION

CLIENT is kafka-python (Debian's python3-kafka) or confluent (Debian's
python3-confluent-kafka); ISOLATION is read_committed or read_uncommitted.
The consumer is assigned every partition from the beginning (no group, no
commits) and reads until it has read the end record end-of-test-p<P> of each
partition; it prints the records before them, one JSON object per line:
{"P": p, "Off": o, "V": "..."}. Run by txn_clients_test.go, which compares
them with what was committed (or written).

Exit status 3 with a message on stderr: the client cannot read with that
isolation level (kafka-python before 2.1 has no isolation_level option and
does not skip control records). Exit status 1: anything else failed.
"""

import json
import sys
import time

TIMEOUT = 30


def end_value(p):
    return "end-of-test-p%d" % p


def kafka_python(bootstrap, topic, partitions, isolation):
    import kafka
    from kafka import KafkaConsumer, TopicPartition

    if "isolation_level" not in KafkaConsumer.DEFAULT_CONFIG:
        sys.stderr.write(
            "kafka-python %s has no isolation_level option (added in 2.1) and does not skip "
            "control records: it cannot read a topic with transactions\n" % kafka.__version__)
        sys.exit(3)
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="compat-tests-kafka-python-txn",
        enable_auto_commit=False,
        isolation_level=isolation,
        fetch_max_wait_ms=250,
        request_timeout_ms=TIMEOUT * 1000,
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got, done = [], set()
    deadline = time.time() + TIMEOUT
    try:
        while len(done) < partitions:
            if time.time() > deadline:
                raise RuntimeError("end records of %s of %d partitions in %d s; read %s" % (sorted(done), partitions, TIMEOUT, got))
            for msgs in c.poll(timeout_ms=500).values():
                for m in msgs:
                    v = None if m.value is None else m.value.decode("utf-8", "backslashreplace")
                    if m.partition in done:
                        raise RuntimeError("p%d offset %d %r after the end record" % (m.partition, m.offset, v))
                    if v == end_value(m.partition):
                        done.add(m.partition)
                        continue
                    got.append({"P": m.partition, "Off": m.offset, "V": v})
    finally:
        c.close()
    return got


def confluent(bootstrap, topic, partitions, isolation):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": "compat-tests-confluent-python-txn",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": False,
        "fetch.wait.max.ms": 250,
        "log_level": 3,
    })
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got, done = [], set()
    deadline = time.time() + TIMEOUT
    try:
        while len(done) < partitions:
            if time.time() > deadline:
                raise RuntimeError("end records of %s of %d partitions in %d s; read %s" % (sorted(done), partitions, TIMEOUT, got))
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise RuntimeError("consume: %s" % m.error())
            v = None if m.value() is None else m.value().decode("utf-8", "backslashreplace")
            if m.partition() in done:
                raise RuntimeError("p%d offset %d %r after the end record" % (m.partition(), m.offset(), v))
            if v == end_value(m.partition()):
                done.add(m.partition())
                continue
            got.append({"P": m.partition(), "Off": m.offset(), "V": v})
    finally:
        c.close()
    return got


def main():
    client, bootstrap, topic, partitions, isolation = sys.argv[1:6]
    fn = {"kafka-python": kafka_python, "confluent": confluent}[client]
    try:
        got = fn(bootstrap, topic, int(partitions), isolation)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - report anything
        sys.stderr.write("%s: %s: %s\n" % (client, type(e).__name__, e))
        sys.exit(1)
    for r in got:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
