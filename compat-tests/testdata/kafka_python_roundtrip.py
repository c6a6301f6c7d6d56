#!/usr/bin/python3
"""kafka-python round trip: python3 kafka_python_roundtrip.py BOOTSTRAP TOPIC

Written for Debian's python3-kafka (kafka-python 2.0.2), which only imports
under /usr/bin/python3. It sends Metadata v1 and relies on the broker
auto-creating the topic. Run by kafkapython_test.go; see roundtrip_common.py.
"""

import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

import roundtrip_common

TIMEOUT = 30


class KafkaPython:
    nulls_distinct = True

    def __init__(self, bootstrap, topic):
        self.bootstrap = bootstrap
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        self.producers = {}
        self.consumer = None

    def producer(self, codec):
        if codec not in self.producers:
            self.producers[codec] = KafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                compression_type=None if codec == "none" else codec,
                linger_ms=5,
                max_request_size=1048576,
                retries=5,
                request_timeout_ms=TIMEOUT * 1000,
                max_block_ms=TIMEOUT * 1000,
            )
        return self.producers[codec]

    def produce(self, codec, recs):
        p = self.producer(codec)
        futures = [p.send(self.topic, key=r["key"], value=r["value"], headers=r["headers"],
                          partition=0, timestamp_ms=r["ts"]) for r in recs]
        p.flush(TIMEOUT)
        for r, f in zip(recs, futures):
            md = f.get(timeout=TIMEOUT)
            r["offset"] = md.offset

    def get_consumer(self):
        if self.consumer is None:
            self.consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=250,
                max_partition_fetch_bytes=4 << 20,
                fetch_max_bytes=8 << 20,
                request_timeout_ms=TIMEOUT * 1000,
            )
            self.consumer.assign([self.tp])
        return self.consumer

    def consume(self, n):
        c = self.get_consumer()
        c.seek_to_beginning(self.tp)
        got = []
        deadline = time.time() + TIMEOUT
        while len(got) < n and time.time() < deadline:
            for msgs in c.poll(timeout_ms=500).values():
                for m in msgs:
                    got.append({"partition": m.partition, "offset": m.offset, "key": m.key,
                                "value": m.value, "headers": list(m.headers or []), "ts": m.timestamp})
        return got

    def list_offset(self, ts):
        c = self.get_consumer()
        if ts == -2:
            return c.beginning_offsets([self.tp])[self.tp]
        if ts == -1:
            return c.end_offsets([self.tp])[self.tp]
        found = c.offsets_for_times({self.tp: ts})[self.tp]
        return None if found is None else found.offset

    def close(self):
        for p in self.producers.values():
            p.close(timeout=5)
        if self.consumer is not None:
            self.consumer.close()


if __name__ == "__main__":
    roundtrip_common.run("kafka-python", KafkaPython)
