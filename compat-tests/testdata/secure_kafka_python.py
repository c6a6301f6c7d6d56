#!/usr/bin/python3
"""kafka-python against a secure listener: python3 secure_kafka_python.py CONFIG_JSON

Written for Debian's python3-kafka (kafka-python 2.0.2, which authenticates
with a v0 SaslHandshake and bare SASL tokens). Run by security_python_test.go,
which decides what is right: this script only drives the client and prints,
as its last line, RESULT followed by a JSON object:

  {"ok": true, "consumed": [...]}             the action succeeded
  {"ok": false, "error": "ClassName", "message": "...", "auth_log": [...]}

CONFIG_JSON: {"bootstrap": "host:port", "client": {kafka-python security
keyword arguments}, "action": ACTION, "topic": ..., "group": ..., "values": [...]}

ACTION is one of
  roundtrip  produce values to topic (acks=all), read them back as a member
             of group and commit
  produce    produce values to topic
  group      consume topic as a member of group (fails or times out)
  connect    construct a producer (authenticates to the bootstrap broker)

auth_log has kafka.conn's log lines about how authentication ended: kafka-python
raises no error of its own for a failed v0 exchange (the broker closes the
connection), it logs it and reports the broker unusable.
"""

import json
import logging
import sys
import time

from kafka import KafkaConsumer, KafkaProducer

TIMEOUT = 20


class AuthLog(logging.Handler):
    """Keeps kafka.conn's records about SASL authentication."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        msg = record.getMessage()
        if any(k in msg for k in ("Authenticated as", "Error receiving reply from server", "Closing connection")):
            self.lines.append(msg)


def producer(cfg):
    return KafkaProducer(bootstrap_servers=cfg["bootstrap"], acks="all", retries=2,
                         request_timeout_ms=TIMEOUT * 1000, max_block_ms=TIMEOUT * 1000,
                         **cfg["client"])


def produce(cfg):
    p = producer(cfg)
    try:
        futures = [p.send(cfg["topic"], key=("k%d" % i).encode(), value=v.encode(), partition=0)
                   for i, v in enumerate(cfg["values"])]
        p.flush(TIMEOUT)
        for f in futures:
            f.get(timeout=TIMEOUT)
    finally:
        p.close(timeout=5)


def consume_group(cfg, n):
    c = KafkaConsumer(cfg["topic"], bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"],
                      auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=250,
                      session_timeout_ms=10000, heartbeat_interval_ms=1000,
                      request_timeout_ms=TIMEOUT * 1000 + 5000, **cfg["client"])
    got = []
    try:
        deadline = time.time() + TIMEOUT
        while len(got) < n and time.time() < deadline:
            for msgs in c.poll(timeout_ms=500).values():
                got.extend(m.value.decode() for m in msgs)
        if len(got) >= n:
            c.commit()
    finally:
        c.close()
    return got


def main():
    cfg = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.ERROR)
    for h in logging.getLogger().handlers:
        h.setLevel(logging.ERROR)  # stderr: errors only, from kafka.conn too
    auth = AuthLog()
    logging.getLogger("kafka.conn").addHandler(auth)
    logging.getLogger("kafka.conn").setLevel(logging.DEBUG)
    result = {"ok": True}
    try:
        action = cfg["action"]
        if action == "roundtrip":
            produce(cfg)
            result["consumed"] = consume_group(cfg, len(cfg["values"]))
        elif action == "produce":
            produce(cfg)
        elif action == "group":
            result["consumed"] = consume_group(cfg, 1)
        elif action == "connect":
            producer(cfg).close(timeout=5)
        else:
            raise ValueError("unknown action %r" % action)
    except Exception as e:  # reported to the Go test, which judges it
        result = {"ok": False, "error": type(e).__name__, "message": str(e)}
    result["auth_log"] = auth.lines
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
