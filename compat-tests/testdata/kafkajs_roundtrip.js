// KafkaJS against the broker: produce (plain and gzip, keys, headers,
// idempotent), consume everything back byte-exact without committing, then
// the group resume scenario: a first group member commits exactly
// p0=5 p1=12 p2=19 and leaves, kafka admin sees those offsets, a second
// member reads exactly the records after them. Exits non-zero with a
// message on any mismatch.
//
//   node kafkajs_roundtrip.js BROKER TOPIC GROUP
'use strict';
const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

const [broker, topic, group] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'compat-tests-kafkajs', brokers: [broker], logLevel: logLevel.ERROR, retry: { retries: 8 } });
const PARTITIONS = 3;
const PER_PARTITION = 30;
const COMMIT = { 0: 5, 1: 12, 2: 19 };

function fail(msg) {
  console.error('kafkajs: ' + msg);
  process.exit(1);
}

function value(p, i) { return `p${p}-o${i}`; }

// readGroup runs a group member until it has read up to the end of every
// partition, returning what it read.
async function readGroup(name, commitAt) {
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 1000, maxWaitTimeInMs: 200 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  const next = {};
  let resolve;
  const done = new Promise((r) => { resolve = r; });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      got.push({ p: partition, o: Number(message.offset), v: message.value.toString() });
      next[partition] = Math.max(next[partition] || 0, Number(message.offset) + 1);
      let all = true;
      for (let p = 0; p < PARTITIONS; p++) if ((next[p] || 0) < PER_PARTITION) all = false;
      if (all) resolve();
    },
  });
  const timer = setTimeout(() => fail(`${name}: did not read to the end within 30 s (read ${JSON.stringify(next)})`), 30000);
  await done;
  clearTimeout(timer);
  if (commitAt) {
    await consumer.commitOffsets(Object.entries(commitAt).map(([p, o]) => ({ topic, partition: Number(p), offset: String(o) })));
  }
  await consumer.disconnect(); // LeaveGroup
  return got;
}

async function main() {
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: PARTITIONS }], waitForLeaders: true });

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  for (let p = 0; p < PARTITIONS; p++) {
    for (let i = 0; i < PER_PARTITION; i += 10) {
      const messages = [];
      for (let j = i; j < i + 10; j++) {
        messages.push({ partition: p, key: `k${j}`, value: value(p, j), headers: { h: `v${j}`, empty: '' } });
      }
      const res = await producer.send({ topic, messages, acks: -1, compression: (i / 10) % 2 ? CompressionTypes.GZIP : CompressionTypes.None });
      if (Number(res[0].baseOffset) !== i) fail(`p${p}: batch at ${i} got base offset ${res[0].baseOffset}`);
    }
  }
  await producer.disconnect();

  // Offsets of an unused group: none committed (-1), no error. (kfake
  // answers GROUP_ID_NOT_FOUND instead; tolerated only there.)
  try {
    const none = await admin.fetchOffsets({ groupId: group, topics: [topic] });
    for (const t of none) for (const pp of t.partitions) {
      if (pp.offset !== '-1') fail(`unused group: p${pp.partition} offset ${pp.offset}, want -1`);
    }
  } catch (e) {
    if (process.env.KAFKAJS_TARGET !== 'kfake' || e.type !== 'GROUP_ID_NOT_FOUND') throw e;
    console.error('kafkajs: kfake answered OffsetFetch of an unused group with GROUP_ID_NOT_FOUND (tolerated on kfake)');
  }

  // A first member reads everything, commits part way and leaves.
  const first = await readGroup('first member', COMMIT);
  for (const r of first) {
    if (r.v !== value(r.p, r.o)) fail(`first member: p${r.p} offset ${r.o} has ${r.v}`);
  }
  const committed = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  for (const pp of committed[0].partitions) {
    if (Number(pp.offset) !== COMMIT[pp.partition]) fail(`committed p${pp.partition}=${pp.offset}, want ${COMMIT[pp.partition]}`);
  }
  const desc = await admin.describeGroups([group]);
  if (desc.groups[0].state !== 'Empty') fail(`group after the first member left: ${desc.groups[0].state}, want Empty`);

  // A second member resumes exactly at the commit.
  const second = await readGroup('second member', null);
  const seen = {};
  for (const r of second) {
    if (r.v !== value(r.p, r.o)) fail(`second member: p${r.p} offset ${r.o} has ${r.v}`);
    if (r.o < COMMIT[r.p]) fail(`second member read p${r.p} offset ${r.o}, below the commit ${COMMIT[r.p]}`);
    const k = `${r.p}/${r.o}`;
    if (seen[k]) fail(`second member read p${r.p} offset ${r.o} twice`);
    seen[k] = true;
  }
  const want = Object.values(COMMIT).reduce((n, c) => n + PER_PARTITION - c, 0);
  if (second.length !== want) fail(`second member read ${second.length} records, want ${want}`);
  const groups = await admin.listGroups();
  if (!groups.groups.some((g) => g.groupId === group)) fail(`listGroups lacks ${group}`);
  await admin.disconnect();
  console.log(JSON.stringify({ produced: PARTITIONS * PER_PARTITION, first: first.length, second: second.length }));
}

main().catch((e) => fail(e.stack || String(e)));
