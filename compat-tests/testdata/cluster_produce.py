#!/usr/bin/python3
"""Produce through a leader's kill: python3 cluster_produce.py LIB BOOTSTRAP TOPIC N

LIB is kafka-python or confluent. N records "v-<i>" go to partition i % 3,
one every 10 ms, acks=all, retried for up to 60 s; each acknowledgement is
printed as "ACK <partition> <offset> <value>". Run by cluster_clients_test.go,
which kills a leader while this runs and reads everything back.
"""

import sys
import time


def kafka_python(bootstrap, topic, n):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=1000000,
                      retry_backoff_ms=100, request_timeout_ms=10000, max_block_ms=60000,
                      max_in_flight_requests_per_connection=1, metadata_max_age_ms=1000)
    futures = []
    for i in range(n):
        v = ("v-%d" % i).encode()
        futures.append((v, p.send(topic, value=v, partition=i % 3)))
        time.sleep(0.01)
    p.flush(60)
    for v, f in futures:
        md = f.get(timeout=60)
        print("ACK %d %d %s" % (md.partition, md.offset, v.decode()), flush=True)


def confluent(bootstrap, topic, n):
    from confluent_kafka import Producer
    acked = []

    def dr(err, msg):
        if err is None:
            acked.append((msg.partition(), msg.offset(), msg.value().decode()))
        else:
            print("FAIL %s %s" % (msg.value().decode(), err), flush=True)

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 60000, "retry.backoff.ms": 100})
    for i in range(n):
        p.produce(topic, value=("v-%d" % i).encode(), partition=i % 3, on_delivery=dr)
        p.poll(0)
        time.sleep(0.01)
    p.flush(60)
    for part, off, v in acked:
        print("ACK %d %d %s" % (part, off, v), flush=True)


def main():
    lib, bootstrap, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    {"kafka-python": kafka_python, "confluent": confluent}[lib](bootstrap, topic, n)


if __name__ == "__main__":
    main()
