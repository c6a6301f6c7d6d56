# librdkafka's test 0113 subtest h_delete_topic with confluent-kafka (Python,
# Debian's python3-confluent-kafka): one consumer, cooperative-sticky,
# subscribed to two one-partition topics; once it has both, the second is
# deleted; once it has only the first, close() is timed. The broker's
# answers decide how long close (which destroys the handle too) takes.
#
#   groups_delete_topic.py BOOTSTRAP TOPIC1 TOPIC2 GROUP [DEBUG]
#
# Prints JSON lines: {"librdkafka": version} first; {"closing": true,
# "assigns": [...], "revokes": [...]} just before close(); {"close_s":
# seconds} once close() returned. The topics exist beforehand (created by
# the test).
import json
import sys
import time

from confluent_kafka import Consumer, libversion
from confluent_kafka.admin import AdminClient

addr, t1, t2, group = sys.argv[1:5]
debug = sys.argv[5] if len(sys.argv) > 5 else ""

assigns, revokes = [], []


def say(**kw):
    print(json.dumps(kw), flush=True)


say(librdkafka=libversion()[0])


def on_assign(c, ps):
    assigns.append(sorted(p.topic for p in ps))


def on_revoke(c, ps):
    revokes.append(sorted(p.topic for p in ps))


conf = {
    "bootstrap.servers": addr,
    "group.id": group,
    "client.id": "compat-tests-0113-h_delete_topic",
    "partition.assignment.strategy": "cooperative-sticky",
    "topic.metadata.refresh.interval.ms": 3000,  # as 0113 sets it
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 15000,
}
if debug:
    conf["debug"] = debug
c = Consumer(conf)
c.subscribe([t1, t2], on_assign=on_assign, on_revoke=on_revoke)
adm = AdminClient({"bootstrap.servers": addr})
deleted = False
deadline = time.time() + 60
while True:
    c.poll(0.5)
    a = c.assignment()
    if len(a) == 2 and not deleted:
        for f in adm.delete_topics([t2], operation_timeout=10).values():
            f.result()
        deleted = True
    if len(a) == 1 and deleted:
        if a[0].topic != t1:
            sys.exit("left with %s, want %s" % (a[0].topic, t1))
        break
    if time.time() > deadline:
        sys.exit("no revoke of the deleted topic in 60 s (assignment %s, deleted %s)" % (a, deleted))
say(closing=True, assigns=assigns, revokes=revokes)
start = time.time()
c.close()
say(close_s=time.time() - start)
