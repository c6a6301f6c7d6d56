#!/usr/bin/python3
"""confluent-kafka (Python) round trip: python3 confluent_python_roundtrip.py BOOTSTRAP TOPIC

Written for Debian's python3-confluent-kafka (1.7.0 on the system librdkafka),
which only imports under /usr/bin/python3. The topic is auto-created by the
producer. Run by kafkapython_test.go; see roundtrip_common.py.
"""

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

import roundtrip_common

TIMEOUT = 30


class ConfluentPython:
    nulls_distinct = True

    def __init__(self, bootstrap, topic):
        self.bootstrap = bootstrap
        self.topic = topic
        self.producers = {}
        self.consumer = None

    def producer(self, codec):
        if codec not in self.producers:
            self.producers[codec] = Producer({
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "compression.codec": codec,
                "linger.ms": 5,
                "log_level": 3,
            })
        return self.producers[codec]

    def produce(self, codec, recs):
        p = self.producer(codec)
        errors = []

        def delivered(rec):
            def cb(err, msg):
                if err is not None:
                    errors.append("seq %d: %s" % (rec["seq"], err))
                else:
                    rec["offset"] = msg.offset()
            return cb

        for r in recs:
            p.produce(self.topic, key=r["key"], value=r["value"], headers=r["headers"],
                      partition=0, timestamp=r["ts"], on_delivery=delivered(r))
            p.poll(0)
        left = p.flush(TIMEOUT)
        if left or errors:
            raise RuntimeError("produce %s: %d not delivered, errors: %s" % (codec, left, errors))

    def get_consumer(self):
        if self.consumer is None:
            # group.id is required by the client; assign() joins no group.
            self.consumer = Consumer({
                "bootstrap.servers": self.bootstrap,
                "group.id": "compat-tests-confluent-python",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 250,
                "log_level": 3,
            })
        return self.consumer

    def consume(self, n):
        c = self.get_consumer()
        c.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        got = []
        deadline = time.time() + TIMEOUT
        while len(got) < n and time.time() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise RuntimeError("consume: %s" % m.error())
            got.append({"partition": m.partition(), "offset": m.offset(), "key": m.key(),
                        "value": m.value(), "headers": list(m.headers() or []), "ts": m.timestamp()[1]})
        return got

    def list_offset(self, ts):
        c = self.get_consumer()
        tp = TopicPartition(self.topic, 0)
        if ts in (-2, -1):
            low, high = c.get_watermark_offsets(tp, timeout=TIMEOUT)
            return low if ts == -2 else high
        found = c.offsets_for_times([TopicPartition(self.topic, 0, ts)], timeout=TIMEOUT)[0]
        return None if found.offset < 0 else found.offset

    def close(self):
        for p in self.producers.values():
            p.flush(5)
        if self.consumer is not None:
            self.consumer.close()


if __name__ == "__main__":
    roundtrip_common.run("confluent-kafka-python", ConfluentPython)
